#include "collectives/grad_ops.h"

#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "collectives/ir/op_registry.h"

namespace shardsim {
namespace {

// Throws std::invalid_argument("OP: WHAT").
[[noreturn]] void Fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// An axis in [-rank, rank) as an index in [0, rank).
int NormalizeAxis(const char* op, int64_t axis, const Array& a) {
  const int rank = a.rank();
  if (axis < -rank || axis >= rank) {
    Fail(op, "axis " + std::to_string(axis) + " is out of range for " + a.TypeString());
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// Product of shape[begin, end).
int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

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

// A one-output result.
std::vector<Array> One(Array a) {
  std::vector<Array> out;
  out.push_back(std::move(a));
  return out;
}

}  // namespace

bool IsGradOp(OpKind kind) {
  switch (kind) {
    case OpKind::kFullLike:
    case OpKind::kBroadcastInDim:
    case OpKind::kPad:
    case OpKind::kUnaryGrad:
    case OpKind::kMaxGrad:
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
    default:
      return OpCost{0, in_bytes + out_bytes};
  }
}

}  // namespace shardsim
