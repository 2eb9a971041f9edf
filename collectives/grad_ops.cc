#include "collectives/grad_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "collectives/ir/op_registry.h"
#include "collectives/kernel_support.h"
#include "collectives/nn_ops.h"
#include "collectives/ragged_dot.h"

namespace shardsim {
namespace {

using kernel::Fail;
using kernel::ForEachRow;
using kernel::NormalizeAxis;
using kernel::One;
using kernel::Product;
using kernel::RowMax;
using kernel::Rows;
using kernel::RowsAlong;

// Row-major strides of `shape` read as the larger `out` shape through `dims` (input dimension
// i is output dimension dims[i]); 0 along output dimensions the input repeats over.
std::vector<int64_t> StridesIn(const Shape& shape, const Shape& out,
                               const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1) strides[static_cast<size_t>(dims[i])] = s;
    s *= shape[i];
  }
  return strides;
}

// Calls fn(k, offsets) for every row-major index k of `shape`, offsets[j] being the element
// of operand j through strides[j].
template <size_t N, typename Fn>
void ForEachIndex(const Shape& shape, const std::array<std::vector<int64_t>, N>& strides, Fn fn) {
  const int64_t n = NumElements(shape);
  const int r = static_cast<int>(shape.size());
  std::vector<int64_t> index(static_cast<size_t>(r), 0);
  std::array<int64_t, N> off{};
  for (int64_t k = 0; k < n; ++k) {
    fn(k, off);
    for (int d = r - 1; d >= 0; --d) {
      ++index[d];
      for (size_t j = 0; j < N; ++j) off[j] += strides[j][d];
      if (index[d] < shape[d]) break;
      for (size_t j = 0; j < N; ++j) off[j] -= strides[j][d] * shape[d];
      index[d] = 0;
    }
  }
}

// The values of a float or i32 array as floats (i32 converted; floats borrowed).
const float* FloatValues(const Array& a, std::vector<float>& holder) {
  if (a.dtype() != DType::kI32) return a.data();
  holder.resize(static_cast<size_t>(a.size()));
  for (int64_t i = 0; i < a.size(); ++i) holder[i] = a.at(i);
  return holder.data();
}

// Derivatives f'(x) of the elementwise ops unary_grad takes, times g. Each matches what JAX
// differentiates for the forward kernel in local_ops.cc.
struct ReluGrad {  // jax.nn.relu's custom JVP: select(x > 0, g, 0).
  float operator()(float g, float x) const { return x > 0 ? g : 0.0f; }
};
// gelu(x) = x s with s = sigmoid(2z), z = c (x + 0.044715 x^3) (the forward kernel's form of
// 0.5 x (1 + tanh z), since (1 + tanh z) / 2 = sigmoid(2z)); gelu' = s + x s (1 - s) 2 z'
// with z' = c (1 + 3 * 0.044715 x^2) (d sigmoid(u) / du = sigmoid (1 - sigmoid)).
struct GeluGrad {
  float operator()(float g, float x) const {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi).
    const float s = 1.0f / (1.0f + std::exp(-2.0f * kC * (x + 0.044715f * x * x * x)));
    const float dz = kC * (1.0f + 3.0f * 0.044715f * x * x);
    return g * (s + x * s * (1.0f - s) * 2.0f * dz);
  }
};
// silu(x) = x s, s = sigmoid(x): silu' = s + x s (1 - s) = s (1 + x (1 - s)).
struct SiluGrad {
  float operator()(float g, float x) const {
    const float s = 1.0f / (1.0f + std::exp(-x));
    return g * (s * (1.0f + x * (1.0f - s)));
  }
};
struct TanhGrad {  // tanh' = 1 - tanh^2.
  float operator()(float g, float x) const {
    const float t = std::tanh(x);
    return g * (1.0f - t * t);
  }
};
struct SqrtGrad {  // sqrt' = 0.5 / sqrt(x) (JAX: g * 0.5 / ans).
  float operator()(float g, float x) const { return g * (0.5f / std::sqrt(x)); }
};
struct RsqrtGrad {  // rsqrt' = -0.5 x^-1.5 (JAX: g * -0.5 * ans / x).
  float operator()(float g, float x) const { return g * (-0.5f * (1.0f / std::sqrt(x)) / x); }
};
struct SquareGrad {  // square' = 2x.
  float operator()(float g, float x) const { return g * (2.0f * x); }
};
struct AbsGrad {  // JAX: select(x >= 0, g, -g).
  float operator()(float g, float x) const { return x >= 0 ? g : -g; }
};
struct SinGrad {  // sin' = cos.
  float operator()(float g, float x) const { return g * std::cos(x); }
};
struct CosGrad {  // cos' = -sin.
  float operator()(float g, float x) const { return -g * std::sin(x); }
};

// Calls fn with the derivative functor of `kind`.
template <typename Fn>
void DispatchUnaryGrad(OpKind kind, Fn fn) {
  switch (kind) {
    case OpKind::kRelu:
      return fn(ReluGrad{});
    case OpKind::kGelu:
      return fn(GeluGrad{});
    case OpKind::kSilu:
      return fn(SiluGrad{});
    case OpKind::kTanh:
      return fn(TanhGrad{});
    case OpKind::kSqrt:
      return fn(SqrtGrad{});
    case OpKind::kRsqrt:
      return fn(RsqrtGrad{});
    case OpKind::kSquare:
      return fn(SquareGrad{});
    case OpKind::kAbs:
      return fn(AbsGrad{});
    case OpKind::kSin:
      return fn(SinGrad{});
    case OpKind::kCos:
      return fn(CosGrad{});
    default:
      Fail("unary_grad", std::string("no derivative kernel for ") + OpKindName(kind));
  }
}

// Refuses a g whose shape is not `shape` or that is not float.
void RequireCotangent(const char* op, const Array& g, const Shape& shape) {
  if (g.dtype() == DType::kI32) Fail(op, "g must be a float array, got " + g.TypeString());
  if (g.shape() != shape) {
    Fail(op, "g must have shape " + FormatShape(shape) + ", got " + g.TypeString());
  }
}

}  // namespace

bool IsGradOp(OpKind kind) {
  switch (kind) {
    case OpKind::kFullLike:
    case OpKind::kBroadcastInDim:
    case OpKind::kPad:
    case OpKind::kUnaryGrad:
    case OpKind::kMaxGrad:
    case OpKind::kReduceMaxGrad:
    case OpKind::kSoftmaxGrad:
    case OpKind::kLogSoftmaxGrad:
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad:
    case OpKind::kTakeGrad:
    case OpKind::kCrossEntropyGrad:
    case OpKind::kTopKGrad:
    case OpKind::kAttentionGrad:
    case OpKind::kRaggedDotRhsGrad:
      return true;
    default:
      return false;
  }
}

Array FullLike(const Array& x, double fill_value) {
  if (!x.has_data()) return Array::ShapeOnly(x.dtype(), x.shape());
  return Array::FromNumbers(x.dtype(), x.shape(),
                            std::vector<double>(static_cast<size_t>(x.size()), fill_value));
}

Array BroadcastInDim(const Array& x, const Shape& shape, const std::vector<int64_t>& dims) {
  const char* op = "broadcast_in_dim";
  const std::string what =
      x.TypeString() + " to " + FormatShape(shape) + " along " + FormatShape(dims);
  for (int64_t d : shape) {
    if (d < 0) Fail(op, "the shape " + FormatShape(shape) + " has a negative size");
  }
  if (static_cast<int>(dims.size()) != x.rank()) {
    Fail(op, "broadcast_dimensions needs one entry per input dimension: " + what);
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= static_cast<int64_t>(shape.size()) ||
        (i > 0 && dims[i] <= dims[i - 1])) {
      Fail(op, "broadcast_dimensions must be increasing result dimensions: " + what);
    }
    if (x.shape()[i] != 1 && x.shape()[i] != shape[static_cast<size_t>(dims[i])]) {
      Fail(op, "input dimension " + std::to_string(i) + " is neither 1 nor the size of result " +
                   "dimension " + std::to_string(dims[i]) + ": " + what);
    }
  }
  if (!x.has_data()) return Array::ShapeOnly(x.dtype(), shape);
  Array out(x.dtype(), shape);
  const float* src = x.data();
  float* dst = out.data();
  ForEachIndex<1>(shape, {StridesIn(x.shape(), shape, dims)},
                  [&](int64_t k, const std::array<int64_t, 1>& off) { dst[k] = src[off[0]]; });
  return out;
}

Array Pad(const Array& x, int64_t low, int64_t high, int64_t axis) {
  const char* op = "pad";
  if (x.rank() == 0) Fail(op, "a zero-rank array cannot be padded: " + x.TypeString());
  const int ax = NormalizeAxis(op, axis, x);
  if (low < 0 || high < 0) Fail(op, "low and high must be >= 0");
  Shape shape = x.shape();
  const int64_t dim = shape[ax];
  shape[ax] += low + high;
  if (!x.has_data()) return Array::ShapeOnly(x.dtype(), shape);
  Array out(x.dtype(), shape);  // Zero words: 0 in every dtype.
  const int64_t outer = Product(shape, 0, ax);
  const int64_t inner = Product(shape, ax + 1, shape.size());
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + (o * shape[ax] + low) * inner, x.data() + o * dim * inner,
                static_cast<size_t>(dim * inner) * sizeof(float));
  }
  return out;
}

Array UnaryGrad(OpKind fn, const Array& g, const Array& x) {
  const char* op = "unary_grad";
  if (g.shape() != x.shape()) {
    Fail(op, "g and x differ in shape: " + g.TypeString() + " and " + x.TypeString());
  }
  if (g.dtype() == DType::kI32) Fail(op, "g must be a float array, got " + g.TypeString());
  DispatchUnaryGrad(fn, [](auto) {});  // Refuses an op without a derivative kernel.
  if (!g.has_data() || !x.has_data()) return Array::ShapeOnly(g.dtype(), g.shape());
  std::vector<float> holder;
  const float* xs = FloatValues(x, holder);
  const float* gs = g.data();
  Array out(g.dtype(), g.shape());
  float* o = out.data();
  const int64_t n = g.size();
  DispatchUnaryGrad(fn, [&](auto f) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(gs[i], xs[i]);
  });
  out.Round();
  return out;
}

Array MaxGrad(const Array& g, const Array& a, const Array& b) {
  const char* op = "max_grad";
  const std::string types = g.TypeString() + ", " + a.TypeString() + ", " + b.TypeString();
  if (g.dtype() == DType::kI32) Fail(op, "g must be a float array, got " + g.TypeString());
  const Shape& shape = g.shape();
  std::vector<int64_t> dims_a, dims_b;  // Trailing alignment, as NumPy broadcasting.
  for (const auto& [operand, dims] : {std::pair{&a, &dims_a}, std::pair{&b, &dims_b}}) {
    if (operand->rank() > g.rank()) Fail(op, "a and b must broadcast to g's shape: " + types);
    for (int i = 0; i < operand->rank(); ++i) {
      const int64_t d = g.rank() - operand->rank() + i;
      if (operand->shape()[i] != 1 && operand->shape()[i] != shape[d]) {
        Fail(op, "a and b must broadcast to g's shape: " + types);
      }
      dims->push_back(d);
    }
  }
  if (!g.has_data() || !a.has_data() || !b.has_data()) return Array::ShapeOnly(g.dtype(), shape);
  std::vector<float> hold_a, hold_b;
  const float* av = FloatValues(a, hold_a);
  const float* bv = FloatValues(b, hold_b);
  const float* gv = g.data();
  Array out(g.dtype(), shape);
  float* o = out.data();
  // m = [a == y] (1/2 if also b == y) with y = max(a, b), NaN-propagating as the forward max;
  // comparisons with a NaN y are false, so m = 0 there.
  ForEachIndex<2>(shape, {StridesIn(a.shape(), shape, dims_a), StridesIn(b.shape(), shape, dims_b)},
                  [&](int64_t k, const std::array<int64_t, 2>& off) {
                    const float x = av[off[0]], z = bv[off[1]];
                    const float y = (x > z || std::isnan(x)) ? x : z;
                    const float m = x == y ? (z == y ? 0.5f : 1.0f) : 0.0f;
                    o[k] = gv[k] * m;
                  });
  out.Round();
  return out;
}

Array ReduceMaxGrad(const Array& g, const Array& x, const std::vector<int64_t>& axes,
                    bool keepdims) {
  const char* op = "reduce_max_grad";
  const int r = x.rank();
  std::vector<char> reduced(static_cast<size_t>(r), axes.empty());
  for (int64_t a : axes) {
    const int d = NormalizeAxis(op, a, x);
    if (reduced[d]) Fail(op, "axis " + std::to_string(a) + " names a dimension twice");
    reduced[d] = 1;
  }
  Shape g_shape;                                           // The reduction's result shape.
  std::vector<int64_t> stride(static_cast<size_t>(r), 0);  // Of g, by x's dimension.
  int64_t step = 1;
  for (int d = r - 1; d >= 0; --d) {
    if (!reduced[d]) {
      stride[d] = step;
      step *= x.shape()[d];
    }
  }
  for (int d = 0; d < r; ++d) {
    if (!reduced[d] || keepdims) g_shape.push_back(reduced[d] ? 1 : x.shape()[d]);
  }
  RequireCotangent(op, g, g_shape);
  if (!g.has_data() || !x.has_data()) return Array::ShapeOnly(g.dtype(), x.shape());
  const int64_t groups = NumElements(g_shape);
  std::vector<double> max(static_cast<size_t>(groups), -std::numeric_limits<double>::infinity());
  std::vector<double> count(static_cast<size_t>(groups), 0);
  // Visits every element of x with its group (the element of g it reduces into).
  auto for_each = [&](auto visit) {
    ForEachIndex<1>(x.shape(), {stride},
                    [&](int64_t i, const std::array<int64_t, 1>& o) { visit(i, o[0]); });
  };
  for_each([&](int64_t i, int64_t o) {
    const double v = x.ValueAt(i);
    if (!std::isnan(max[o]) && (std::isnan(v) || v > max[o])) max[o] = v;  // NaN sticks.
  });
  for_each([&](int64_t i, int64_t o) { count[o] += x.ValueAt(i) == max[o]; });
  Array out(g.dtype(), x.shape());
  float* dst = out.data();
  // g / count at the maxima (0 * (g / 0) = NaN where the maximum is NaN: JAX's transpose).
  for_each([&](int64_t i, int64_t o) {
    const double share = g.ValueAt(o) / count[o];
    dst[i] = static_cast<float>((x.ValueAt(i) == max[o] ? 1.0 : 0.0) * share);
  });
  out.Round();
  return out;
}

namespace {

// softmax_grad (log = false) or log_softmax_grad (log = true).
Array SoftmaxGradImpl(const char* op, const Array& g, const Array& y, int64_t axis, bool log) {
  RequireCotangent(op, g, y.shape());
  const int ax = NormalizeAxis(op, axis, y);
  if (!g.has_data() || !y.has_data()) return Array::ShapeOnly(g.dtype(), g.shape());
  const Rows rows = RowsAlong(y.shape(), ax);
  Array out(g.dtype(), g.shape());
  float* dst = out.data();
  ForEachRow(rows, [&](int64_t o, int64_t j) {
    double sum = 0;  // sum(g y) for softmax, sum(g) for log_softmax.
    for (int64_t i = 0; i < rows.n; ++i) {
      const int64_t at = rows.At(o, i, j);
      sum += g.ValueAt(at) * (log ? 1.0 : y.ValueAt(at));
    }
    for (int64_t i = 0; i < rows.n; ++i) {
      const int64_t at = rows.At(o, i, j);
      const double gi = g.ValueAt(at), yi = y.ValueAt(at);
      dst[at] = static_cast<float>(log ? gi - std::exp(yi) * sum : yi * (gi - sum));
    }
  });
  out.Round();
  return out;
}

}  // namespace

Array SoftmaxGrad(const Array& g, const Array& y, int64_t axis) {
  return SoftmaxGradImpl("softmax_grad", g, y, axis, false);
}

Array LogSoftmaxGrad(const Array& g, const Array& y, int64_t axis) {
  return SoftmaxGradImpl("log_softmax_grad", g, y, axis, true);
}

std::vector<Array> NormGrad(bool center, const Array& g, const Array& x, const Array& scale,
                            int64_t axis, double eps) {
  const char* op = center ? "layer_norm_grad" : "rms_norm_grad";
  RequireCotangent(op, g, x.shape());
  if (x.dtype() == DType::kI32 || scale.dtype() == DType::kI32) {
    Fail(op, "x and scale must be float arrays, got " + x.TypeString() + ", " + scale.TypeString());
  }
  const int ax = NormalizeAxis(op, axis, x);
  if (scale.shape() != Shape{x.shape()[ax]}) {
    Fail(op, "scale must have shape [" + std::to_string(x.shape()[ax]) + "], got " +
                 scale.TypeString());
  }
  if (!(std::isfinite(eps) && eps >= 0)) Fail(op, "eps must be finite and >= 0");
  std::vector<Array> out;
  if (!g.has_data() || !x.has_data() || !scale.has_data()) {
    out.push_back(Array::ShapeOnly(g.dtype(), x.shape()));
    out.push_back(Array::ShapeOnly(g.dtype(), x.shape()));
    return out;
  }
  const Rows rows = RowsAlong(x.shape(), ax);
  const double n = static_cast<double>(rows.n);
  Array dx(g.dtype(), x.shape()), gxhat(g.dtype(), x.shape());
  std::vector<double> xhat(static_cast<size_t>(rows.n)), gs(static_cast<size_t>(rows.n));
  ForEachRow(rows, [&](int64_t o, int64_t j) {
    // The forward pass's statistics, as nn_ops computes them (two passes, in double).
    double mean = 0;
    if (center) {
      for (int64_t i = 0; i < rows.n; ++i) mean += x.ValueAt(rows.At(o, i, j));
      mean /= n;
    }
    double var = 0;
    for (int64_t i = 0; i < rows.n; ++i) {
      const double c = x.ValueAt(rows.At(o, i, j)) - mean;
      var += c * c;
    }
    const double r = 1 / std::sqrt(var / n + eps);
    // dL/dxhat = g s; d xhat_i / d x_j = r (delta_ij - [center] / n - xhat_i xhat_j / n), so
    // dx_j = r (gs_j - [center] mean(gs) - xhat_j mean(gs xhat)).
    double mean_gs = 0, mean_gs_xhat = 0;
    for (int64_t i = 0; i < rows.n; ++i) {
      const int64_t at = rows.At(o, i, j);
      xhat[i] = (x.ValueAt(at) - mean) * r;
      gs[i] = g.ValueAt(at) * scale.ValueAt(i);
      mean_gs += gs[i];
      mean_gs_xhat += gs[i] * xhat[i];
    }
    mean_gs = center ? mean_gs / n : 0;
    mean_gs_xhat /= n;
    for (int64_t i = 0; i < rows.n; ++i) {
      const int64_t at = rows.At(o, i, j);
      dx.data()[at] = static_cast<float>(r * (gs[i] - mean_gs - xhat[i] * mean_gs_xhat));
      gxhat.data()[at] = static_cast<float>(g.ValueAt(at) * xhat[i]);
    }
  });
  dx.Round();
  gxhat.Round();
  out.push_back(std::move(dx));
  out.push_back(std::move(gxhat));
  return out;
}

Array TakeGrad(const Array& g, const Array& ids, int64_t axis, int64_t size) {
  const char* op = "take_grad";
  if (ids.dtype() != DType::kI32) Fail(op, "ids must be i32, got " + ids.TypeString());
  if (size < 1) Fail(op, "size must be >= 1, got " + std::to_string(size));
  // g is table.shape[:axis] + ids.shape + table.shape[axis+1:]; axis counts in the table.
  const int64_t table_rank = g.rank() - ids.rank() + 1;
  if (table_rank < 1 || axis < -table_rank || axis >= table_rank) {
    Fail(op, "axis " + std::to_string(axis) + " does not fit g " + g.TypeString() + " and ids " +
                 ids.TypeString());
  }
  const size_t ax = static_cast<size_t>(axis < 0 ? axis + table_rank : axis);
  const Shape& gs = g.shape();
  if (!std::equal(ids.shape().begin(), ids.shape().end(), gs.begin() + ax)) {
    Fail(op, "g " + g.TypeString() + " does not hold ids " + ids.TypeString() + " at axis " +
                 std::to_string(axis));
  }
  if (g.dtype() == DType::kI32) Fail(op, "g must be a float array, got " + g.TypeString());
  Shape shape(gs.begin(), gs.begin() + ax);
  shape.push_back(size);
  shape.insert(shape.end(), gs.begin() + ax + ids.rank(), gs.end());
  if (!g.has_data() || !ids.has_data()) return Array::ShapeOnly(g.dtype(), shape);
  const int64_t outer = Product(gs, 0, ax);
  const int64_t inner = Product(shape, ax + 1, shape.size());
  std::vector<double> acc(static_cast<size_t>(NumElements(shape)), 0.0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < ids.size(); ++t) {
      int64_t id = ids.IntAt(t);
      if (id < 0) id += size;
      if (id < 0 || id >= size) continue;  // Read as the fill value: nothing flows back.
      const int64_t from = (o * ids.size() + t) * inner, to = (o * size + id) * inner;
      for (int64_t j = 0; j < inner; ++j) acc[to + j] += g.ValueAt(from + j);
    }
  }
  return Array::FromNumbers(g.dtype(), shape, acc);
}

Array CrossEntropyGrad(const Array& g, const Array& logits, const Array& labels) {
  const char* op = "cross_entropy_grad";
  RequireCotangent(op, g, {});
  if (logits.dtype() == DType::kI32 || logits.rank() == 0) {
    Fail(op, "logits must be a float array [..., C], got " + logits.TypeString());
  }
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  if (labels.dtype() != DType::kI32 || labels.shape() != lead) {
    Fail(op, "labels must be i32 of shape " + FormatShape(lead) + ", got " + labels.TypeString());
  }
  if (!g.has_data() || !logits.has_data() || !labels.has_data()) {
    return Array::ShapeOnly(logits.dtype(), logits.shape());
  }
  const int64_t classes = logits.shape().back();
  const double w = g.ValueAt(0) / static_cast<double>(labels.size());  // d loss / d row loss.
  std::vector<double> out(static_cast<size_t>(logits.size()));
  for (int64_t row = 0; row < labels.size(); ++row) {
    auto at = [&](int64_t c) { return logits.ValueAt(row * classes + c); };
    // The row loss is logsumexp(x) - x[label]: its derivative softmax(x) - onehot(label).
    double m = RowMax(classes, at);
    if (!std::isfinite(m)) m = 0;  // jax.nn.logsumexp's shift.
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(at(c) - m);
    int64_t label = labels.IntAt(row);
    if (label < 0) label += classes;
    for (int64_t c = 0; c < classes; ++c) {
      out[row * classes + c] = w * (std::exp(at(c) - m) / sum - (c == label ? 1.0 : 0.0));
    }
  }
  return Array::FromNumbers(logits.dtype(), logits.shape(), out);
}

Array TopKGrad(const Array& g, const Array& indices, int64_t size) {
  const char* op = "top_k_grad";
  RequireCotangent(op, g, indices.shape());
  if (indices.dtype() != DType::kI32 || indices.rank() == 0) {
    Fail(op, "indices must be i32 with a last axis, got " + indices.TypeString());
  }
  if (size < indices.shape().back()) {
    Fail(op, "size " + std::to_string(size) +
                 " is below k = " + std::to_string(indices.shape().back()));
  }
  Shape shape = g.shape();
  shape.back() = size;
  if (!g.has_data() || !indices.has_data()) return Array::ShapeOnly(g.dtype(), shape);
  const int64_t k = g.shape().back();
  const int64_t rows = k == 0 ? 0 : g.size() / k;
  std::vector<double> acc(static_cast<size_t>(NumElements(shape)), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const int64_t to = indices.IntAt(r * k + i);
      if (to < 0 || to >= size) Fail(op, "index " + std::to_string(to) + " is outside the row");
      acc[r * size + to] += g.ValueAt(r * k + i);
    }
  }
  return Array::FromNumbers(g.dtype(), shape, acc);
}

std::vector<Array> AttentionGrad(const Array& g, const Array& q, const Array& k, const Array& v,
                                 bool causal) {
  const char* op = "attention_grad";
  if (q.rank() != 4 || k.rank() != 4 || v.shape() != k.shape()) {
    Fail(op, "q must be [B, T, N, H] and k, v [B, S, K, H], got " + q.TypeString() + ", " +
                 k.TypeString() + ", " + v.TypeString());
  }
  RequireCotangent(op, g, q.shape());
  const int64_t b = q.shape()[0], t = q.shape()[1], heads = q.shape()[2], h = q.shape()[3];
  const int64_t s = k.shape()[1], kv_heads = k.shape()[2];
  if (k.shape()[0] != b || k.shape()[3] != h || kv_heads < 1 || heads % kv_heads != 0) {
    Fail(op, "q " + q.TypeString() + " and k " + k.TypeString() +
                 " must agree in B and H, with N a multiple of K");
  }
  if (causal && t > s) Fail(op, "causal attention needs T <= S");
  std::vector<Array> out;
  if (!g.has_data() || !q.has_data() || !k.has_data() || !v.has_data()) {
    out.push_back(Array::ShapeOnly(q.dtype(), q.shape()));
    out.push_back(Array::ShapeOnly(k.dtype(), k.shape()));
    out.push_back(Array::ShapeOnly(v.dtype(), v.shape()));
    return out;
  }
  const int64_t group = heads / kv_heads;
  const double scale = 1 / std::sqrt(static_cast<double>(h));
  std::vector<double> dq(static_cast<size_t>(q.size()), 0.0),
      dk(static_cast<size_t>(k.size()), 0.0), dv(static_cast<size_t>(v.size()), 0.0);
  std::vector<double> p(static_cast<size_t>(s)), dp(static_cast<size_t>(s));
  auto qi = [&](int64_t bi, int64_t ti, int64_t n) { return ((bi * t + ti) * heads + n) * h; };
  auto ki = [&](int64_t bi, int64_t j, int64_t kv) { return ((bi * s + j) * kv_heads + kv) * h; };
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t n = 0; n < heads; ++n) {
      const int64_t kv = n / group;
      for (int64_t ti = 0; ti < t; ++ti) {
        const int64_t seen = causal ? ti + 1 + (s - t) : s;  // The forward kernel's mask.
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < seen; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < h; ++d)
            dot += q.ValueAt(qi(bi, ti, n) + d) * k.ValueAt(ki(bi, j, kv) + d);
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < seen; ++j) sum += p[j] = std::exp(p[j] - m);
        double pdp = 0;  // sum(p dp).
        for (int64_t j = 0; j < seen; ++j) {
          p[j] /= sum;
          double dot = 0;  // dp_j = g . v_j.
          for (int64_t d = 0; d < h; ++d) {
            const double gd = g.ValueAt(qi(bi, ti, n) + d);
            dot += gd * v.ValueAt(ki(bi, j, kv) + d);
            dv[ki(bi, j, kv) + d] += p[j] * gd;
          }
          dp[j] = dot;
          pdp += p[j] * dot;
        }
        for (int64_t j = 0; j < seen; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;  // d loss / d (q . k_j).
          for (int64_t d = 0; d < h; ++d) {
            dq[qi(bi, ti, n) + d] += ds * k.ValueAt(ki(bi, j, kv) + d);
            dk[ki(bi, j, kv) + d] += ds * q.ValueAt(qi(bi, ti, n) + d);
          }
        }
      }
    }
  }
  out.push_back(Array::FromNumbers(q.dtype(), q.shape(), dq));
  out.push_back(Array::FromNumbers(k.dtype(), k.shape(), dk));
  out.push_back(Array::FromNumbers(v.dtype(), v.shape(), dv));
  return out;
}

std::vector<Array> ApplyGradOp(const OpSpec& op, const std::vector<const Array*>& inputs) {
  auto need = [&](size_t n) {
    if (inputs.size() != n) {
      throw std::invalid_argument(std::string(OpKindName(op.kind)) + " takes " + std::to_string(n) +
                                  " input(s), got " + std::to_string(inputs.size()));
    }
  };
  switch (op.kind) {
    case OpKind::kFullLike:
      need(1);
      return One(FullLike(*inputs[0], op.fill_value.value_or(0.0)));
    case OpKind::kBroadcastInDim:
      need(1);
      return One(BroadcastInDim(*inputs[0], op.shape, op.broadcast_dimensions));
    case OpKind::kPad:
      need(1);
      return One(Pad(*inputs[0], op.low, op.high, op.axis));
    case OpKind::kUnaryGrad: {
      need(2);
      std::optional<OpKind> fn = ParseOpKind(op.fn);
      if (!fn) Fail("unary_grad", "unknown fn '" + op.fn + "'");
      return One(UnaryGrad(*fn, *inputs[0], *inputs[1]));
    }
    case OpKind::kMaxGrad:
      need(3);
      return One(MaxGrad(*inputs[0], *inputs[1], *inputs[2]));
    case OpKind::kReduceMaxGrad:
      need(2);
      return One(ReduceMaxGrad(*inputs[0], *inputs[1], op.axes, op.keepdims));
    case OpKind::kSoftmaxGrad:
      need(2);
      return One(SoftmaxGrad(*inputs[0], *inputs[1], op.norm_axis));
    case OpKind::kLogSoftmaxGrad:
      need(2);
      return One(LogSoftmaxGrad(*inputs[0], *inputs[1], op.norm_axis));
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad: {
      need(3);
      const bool layer = op.kind == OpKind::kLayerNormGrad;
      const double eps = op.eps.value_or(DefaultEps(layer ? OpKind::kLayerNorm : OpKind::kRmsNorm));
      return NormGrad(layer, *inputs[0], *inputs[1], *inputs[2], op.norm_axis, eps);
    }
    case OpKind::kTakeGrad:
      need(2);
      return One(TakeGrad(*inputs[0], *inputs[1], op.axis, op.size));
    case OpKind::kCrossEntropyGrad:
      need(3);
      return One(CrossEntropyGrad(*inputs[0], *inputs[1], *inputs[2]));
    case OpKind::kTopKGrad:
      need(2);
      return One(TopKGrad(*inputs[0], *inputs[1], op.size));
    case OpKind::kAttentionGrad:
      need(4);
      return AttentionGrad(*inputs[0], *inputs[1], *inputs[2], *inputs[3], op.causal);
    case OpKind::kRaggedDotRhsGrad:
      need(3);
      return One(RaggedDotRhsGrad(*inputs[0], *inputs[1], *inputs[2]));
    default:
      throw std::logic_error(std::string("internal error: ") + OpKindName(op.kind) +
                             " is not a grad op");
  }
}

OpCost GradOpCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                  const std::vector<const Array*>& outputs) {
  double in_bytes = 0, out_bytes = 0, out_elements = 0;
  for (const Array* a : inputs) in_bytes += static_cast<double>(a->bytes().count());
  for (const Array* a : outputs) {
    out_bytes += static_cast<double>(a->bytes().count());
    out_elements += static_cast<double>(a->size());
  }
  switch (op.kind) {
    case OpKind::kFullLike:
      return OpCost{0, out_bytes};
    case OpKind::kUnaryGrad:
    case OpKind::kMaxGrad:
      return OpCost{out_elements, in_bytes + out_bytes};
    case OpKind::kReduceMaxGrad:
      // Per element of x: the max's compare, the count's compare and add, the product.
      return OpCost{4 * out_elements, in_bytes + out_bytes};
    case OpKind::kSoftmaxGrad:
      // Per element: g y and its sum's add, the subtraction, the product with y.
      return OpCost{4 * out_elements, in_bytes + out_bytes};
    case OpKind::kLogSoftmaxGrad:
      // Per element: the sum's add, exp, the product, the subtraction.
      return OpCost{4 * out_elements, in_bytes + out_bytes};
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad: {
      // Per element of x: the statistics (square, add; layer_norm also the mean's add and the
      // centring), xhat, g s, the two means' adds and product, dx's three, g xhat.
      const double x_elements = static_cast<double>(inputs.at(1)->size());
      const double per = op.kind == OpKind::kLayerNormGrad ? 13 : 10;
      return OpCost{per * x_elements, in_bytes + out_bytes};
    }
    case OpKind::kTakeGrad:
    case OpKind::kTopKGrad:
      // A scatter-add: one add per element of g; the result is written whole (zeros included).
      return OpCost{static_cast<double>(inputs.at(0)->size()), in_bytes + out_bytes};
    case OpKind::kCrossEntropyGrad:
      // Per logit: the softmax's compare, subtract, exp and add, then divide, subtract and the
      // product with g / N.
      return OpCost{7 * static_cast<double>(inputs.at(1)->size()), in_bytes + out_bytes};
    case OpKind::kAttentionGrad: {
      // Five matmul-like passes over the scored (query, key) pairs, 2 H FLOPs each: the scores
      // again, dv = p^T g, dp = g v^T, dq = ds k, dk = ds^T q: 10 B N H pairs (the forward's
      // 4 B N H pairs times 2.5, FlashAttention's backward count). Bytes: g, q, k, v read, dq,
      // dk, dv written; the scores stay on chip.
      const Shape& qs = inputs.at(1)->shape();
      const int64_t s_len = inputs.at(2)->shape().at(1);
      return OpCost{
          10.0 * static_cast<double>(qs.at(0)) * static_cast<double>(qs.at(2)) *
              static_cast<double>(qs.at(3)) * AttentionPairs(qs.at(1), s_len, op.causal),
          in_bytes + out_bytes + UnfusedAttentionBytes(op, *inputs.at(1), s_len, /*backward=*/true),
          UnfusedAttentionWorkspace(op, *inputs.at(1), s_len, /*backward=*/true),
          !UnfusedAttention(op)};
    }
    case OpKind::kRaggedDotRhsGrad:
      return RaggedDotCost(op, inputs, outputs);
    default:
      return OpCost{0, in_bytes + out_bytes};
  }
}

}  // namespace shardsim
