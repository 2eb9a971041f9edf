#include "collectives/nn_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "collectives/ir/op_registry.h"
#include "collectives/kernel_support.h"
#include "collectives/moe_route.h"
#include "collectives/ragged_dot.h"

namespace shardsim {
namespace {

using kernel::AnyShapeOnly;
using kernel::Fail;
using kernel::NormalizeAxis;
using kernel::One;
using kernel::Product;
using kernel::RowMax;
using kernel::Rows;
using kernel::RowsAlong;

// Refuses an i32 array where a float one is needed.
void RequireFloat(const char* op, const char* what, const Array& a) {
  if (a.dtype() == DType::kI32) {
    Fail(op, std::string(what) + " must be a float array (f32, bf16, f16), got " + a.TypeString());
  }
}

// softmax (log = false) or log_softmax (log = true) along `axis`.
Array SoftmaxImpl(const char* op, const Array& x, int64_t axis, bool log) {
  const int ax = NormalizeAxis(op, axis, x);
  const DType dtype = x.dtype() == DType::kI32 ? DType::kF32 : x.dtype();
  if (!x.has_data()) return Array::ShapeOnly(dtype, x.shape());
  const Rows rows = RowsAlong(x.shape(), ax);
  std::vector<float> out(static_cast<size_t>(x.size()));
  std::vector<double> e(static_cast<size_t>(rows.n));
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t j = 0; j < rows.inner; ++j) {
      auto at = [&](int64_t i) { return x.ValueAt(rows.At(o, i, j)); };
      // Shifting by the row's max keeps exp <= 1 (jax.nn.softmax subtracts it too).
      const double m = RowMax(rows.n, at);
      double sum = 0;
      for (int64_t i = 0; i < rows.n; ++i) sum += e[i] = std::exp(at(i) - m);
      const double log_sum = std::log(sum);
      for (int64_t i = 0; i < rows.n; ++i) {
        out[rows.At(o, i, j)] = static_cast<float>(log ? (at(i) - m) - log_sum : e[i] / sum);
      }
    }
  }
  return Array::FromValues(dtype, x.shape(), std::move(out));
}

// rms_norm (center = false) or layer_norm (center = true).
Array NormImpl(const char* op, const Array& x, const Array& scale, int64_t axis, double eps,
               bool center) {
  RequireFloat(op, "x", x);
  RequireFloat(op, "scale", scale);
  const int ax = NormalizeAxis(op, axis, x);
  if (scale.shape() != Shape{x.shape()[ax]}) {
    Fail(op, "scale must have shape [" + std::to_string(x.shape()[ax]) + "] (axis " +
                 std::to_string(axis) + " of x " + x.TypeString() + "), got " + scale.TypeString());
  }
  if (!(std::isfinite(eps) && eps >= 0)) Fail(op, "eps must be finite and >= 0");
  const DType dtype = PromoteTypes(x.dtype(), scale.dtype());
  if (AnyShapeOnly({&x, &scale})) return Array::ShapeOnly(dtype, x.shape());
  const Rows rows = RowsAlong(x.shape(), ax);
  const double n = static_cast<double>(rows.n);
  std::vector<float> out(static_cast<size_t>(x.size()));
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t j = 0; j < rows.inner; ++j) {
      auto at = [&](int64_t i) { return x.ValueAt(rows.At(o, i, j)); };
      double mean = 0;
      if (center) {
        for (int64_t i = 0; i < rows.n; ++i) mean += at(i);
        mean /= n;
      }
      // Two passes (the deviations from the mean, then their squares): no cancellation.
      double var = 0;
      for (int64_t i = 0; i < rows.n; ++i) var += (at(i) - mean) * (at(i) - mean);
      const double inv = 1 / std::sqrt(var / n + eps);
      for (int64_t i = 0; i < rows.n; ++i) {
        out[rows.At(o, i, j)] = static_cast<float>((at(i) - mean) * inv * scale.ValueAt(i));
      }
    }
  }
  return Array::FromValues(dtype, x.shape(), std::move(out));
}

// The number of inputs op kind `kind` takes (its registry arity).
size_t InputCount(OpKind kind) {
  switch (Op(kind).arity) {
    case OpArity::kTwo:
      return 2;
    case OpArity::kThree:
      return 3;
    default:
      return 1;
  }
}

}  // namespace

bool IsNnOp(OpKind kind) {
  switch (kind) {
    case OpKind::kSum:
    case OpKind::kMean:
    case OpKind::kReduceMax:
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax:
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kTake:
    case OpKind::kCrossEntropy:
    case OpKind::kTopK:
    case OpKind::kAttention:
    case OpKind::kOneHot:
    case OpKind::kMoeRoute:
    case OpKind::kRaggedDot:
    case OpKind::kCumsum:
    case OpKind::kArgsort:
    case OpKind::kRepeat:
      return true;
    default:
      return false;
  }
}

std::vector<Array> ApplyNnOp(const OpSpec& op, const std::vector<const Array*>& inputs) {
  const size_t want = InputCount(op.kind);
  if (inputs.size() != want) {
    Fail(OpKindName(op.kind),
         "takes " + std::to_string(want) + " input(s), got " + std::to_string(inputs.size()));
  }
  const Array& x = *inputs[0];
  switch (op.kind) {
    case OpKind::kSum:
    case OpKind::kMean:
    case OpKind::kReduceMax:
      return One(Reduction(op.kind, x, op.axes, op.keepdims));
    case OpKind::kSoftmax:
      return One(Softmax(x, op.norm_axis));
    case OpKind::kLogSoftmax:
      return One(LogSoftmax(x, op.norm_axis));
    case OpKind::kRmsNorm:
      return One(RmsNorm(x, *inputs[1], op.norm_axis, op.eps.value_or(DefaultEps(op.kind))));
    case OpKind::kLayerNorm:
      return One(LayerNorm(x, *inputs[1], op.norm_axis, op.eps.value_or(DefaultEps(op.kind))));
    case OpKind::kTake:
      return One(Take(x, *inputs[1], op.axis));
    case OpKind::kCrossEntropy:
      return One(CrossEntropy(x, *inputs[1]));
    case OpKind::kTopK:
      return TopK(x, op.k);
    case OpKind::kAttention:
      return One(Attention(x, *inputs[1], *inputs[2], op.causal));
    case OpKind::kOneHot:
      return One(OneHot(x, op.num_classes, MaskDType(op)));
    case OpKind::kMoeRoute:
      return One(MoeRoute(x, op.experts, op.capacity, RoutePriorityOf(op), MaskDType(op)));
    case OpKind::kRaggedDot:
      return One(RaggedDot(x, *inputs[1], *inputs[2]));
    case OpKind::kCumsum:
      return One(Cumsum(x, op.norm_axis, op.reverse));
    case OpKind::kArgsort:
      return One(Argsort(x, op.norm_axis));
    case OpKind::kRepeat:
      return One(Repeat(x, *inputs[1], op.axis, op.total_repeat_length));
    default:
      Fail(OpKindName(op.kind), "is not an array op of nn_ops");
  }
}

Array Reduction(OpKind kind, const Array& x, const std::vector<int64_t>& axes, bool keepdims) {
  const char* op = OpKindName(kind);
  const int r = x.rank();
  std::vector<char> reduced(static_cast<size_t>(r), axes.empty());
  for (int64_t a : axes) {
    const int d = NormalizeAxis(op, a, x);
    if (reduced[d]) Fail(op, "axis " + std::to_string(a) + " names a dimension twice");
    reduced[d] = 1;
  }
  Shape shape;
  int64_t count = 1;  // Elements reduced into each output element.
  for (int d = 0; d < r; ++d) {
    if (reduced[d]) count *= x.shape()[d];
    if (!reduced[d] || keepdims) shape.push_back(reduced[d] ? 1 : x.shape()[d]);
  }
  const int64_t outputs = NumElements(shape);
  if (kind == OpKind::kReduceMax && count == 0 && outputs > 0) {
    Fail(op, "cannot reduce zero elements of " + x.TypeString() + " (max has no identity)");
  }
  const bool ints = x.dtype() == DType::kI32;
  const DType dtype = kind == OpKind::kMean && ints ? DType::kF32 : x.dtype();
  if (!x.has_data()) return Array::ShapeOnly(dtype, shape);

  // The output element of each input element: strides of the kept dimensions (0 if reduced).
  std::vector<int64_t> stride(static_cast<size_t>(r), 0);
  int64_t step = 1;
  for (int d = r - 1; d >= 0; --d) {
    if (!reduced[d]) {
      stride[d] = step;
      step *= x.shape()[d];
    }
  }
  auto for_each = [&](auto visit) {
    std::vector<int64_t> index(static_cast<size_t>(r), 0);
    int64_t out = 0;
    for (int64_t i = 0; i < x.size(); ++i) {
      visit(i, out);
      for (int d = r - 1; d >= 0; --d) {
        out += stride[d];
        if (++index[d] < x.shape()[d]) break;
        out -= stride[d] * x.shape()[d];
        index[d] = 0;
      }
    }
  };
  if (kind == OpKind::kSum && ints) {  // XLA's int32 adds wrap modulo 2^32.
    std::vector<uint32_t> acc(static_cast<size_t>(outputs), 0);
    for_each([&](int64_t i, int64_t o) { acc[o] += static_cast<uint32_t>(x.IntAt(i)); });
    std::vector<int32_t> values(acc.begin(), acc.end());
    return Array::FromInts(shape, values);
  }
  std::vector<double> acc(
      static_cast<size_t>(outputs),
      kind == OpKind::kReduceMax ? -std::numeric_limits<double>::infinity() : 0.0);
  if (kind == OpKind::kReduceMax) {
    for_each([&](int64_t i, int64_t o) {
      const double v = x.ValueAt(i);
      if (!std::isnan(acc[o]) && (std::isnan(v) || v > acc[o])) acc[o] = v;  // NaN sticks.
    });
  } else {
    for_each([&](int64_t i, int64_t o) { acc[o] += x.ValueAt(i); });
  }
  if (kind == OpKind::kMean) {
    for (double& a : acc) a /= static_cast<double>(count);  // 0 / 0 is NaN, as jnp.mean.
  }
  return Array::FromNumbers(dtype, shape, acc);
}

Array Softmax(const Array& x, int64_t axis) { return SoftmaxImpl("softmax", x, axis, false); }

Array LogSoftmax(const Array& x, int64_t axis) { return SoftmaxImpl("log_softmax", x, axis, true); }

double DefaultEps(OpKind kind) {
  // flax.linen.RMSNorm(epsilon=1e-6), flax.linen.LayerNorm(epsilon=1e-5).
  return kind == OpKind::kRmsNorm ? 1e-6 : 1e-5;
}

Array RmsNorm(const Array& x, const Array& scale, int64_t axis, double eps) {
  return NormImpl("rms_norm", x, scale, axis, eps, false);
}

Array LayerNorm(const Array& x, const Array& scale, int64_t axis, double eps) {
  return NormImpl("layer_norm", x, scale, axis, eps, true);
}

namespace {

// jnp.take, or (shard) its look-up in block `shard->block` of a table `shard->size` long.
struct TakeBlock {
  int64_t size;   // The whole table's length along the axis.
  int64_t block;  // Which block `table` is.
};

Array TakeImpl(const char* op, const Array& table, const Array& ids, int64_t axis,
               const TakeBlock* shard) {
  if (table.rank() == 0) Fail(op, "table must have rank >= 1, got " + table.TypeString());
  if (ids.dtype() != DType::kI32) Fail(op, "ids must be i32, got " + ids.TypeString());
  const int ax = NormalizeAxis(op, axis, table);
  Shape shape(table.shape().begin(), table.shape().begin() + ax);
  shape.insert(shape.end(), ids.shape().begin(), ids.shape().end());
  shape.insert(shape.end(), table.shape().begin() + ax + 1, table.shape().end());
  const int64_t local = table.shape()[static_cast<size_t>(ax)];
  const int64_t whole = shard ? shard->size : local;
  if (shard &&
      (local == 0 || whole % local != 0 || shard->block < 0 || shard->block >= whole / local)) {
    Fail(op, "a block of " + std::to_string(local) + " rows cannot be block " +
                 std::to_string(shard->block) + " of a table of " + std::to_string(whole));
  }
  if (AnyShapeOnly({&table, &ids})) return Array::ShapeOnly(table.dtype(), shape);
  const Rows rows = RowsAlong(table.shape(), ax);
  const float fill = table.dtype() == DType::kI32 ? IntToWord(std::numeric_limits<int32_t>::min())
                                                  : std::numeric_limits<float>::quiet_NaN();
  const int64_t offset = shard ? shard->block * local : 0;
  const bool fills = !shard || shard->block == 0;
  std::vector<float> words;
  words.reserve(static_cast<size_t>(NumElements(shape)));
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t t = 0; t < ids.size(); ++t) {
      int64_t id = ids.IntAt(t);
      if (id < 0) id += whole;  // [-n, 0) counts from the end.
      if (id < 0 || id >= whole) {
        words.insert(words.end(), static_cast<size_t>(rows.inner), fills ? fill : 0.0f);
      } else if (id < offset || id >= offset + local) {
        words.insert(words.end(), static_cast<size_t>(rows.inner), 0.0f);  // Another block's.
      } else {
        const float* row = table.data() + rows.At(o, id - offset, 0);
        words.insert(words.end(), row, row + rows.inner);
      }
    }
  }
  return Array::FromWords(table.dtype(), std::move(shape), std::move(words));
}

}  // namespace

Array Take(const Array& table, const Array& ids, int64_t axis) {
  return TakeImpl("take", table, ids, axis, nullptr);
}

Array TakeShard(const Array& table, const Array& ids, int64_t axis, int64_t size, int64_t block) {
  const TakeBlock shard{size, block};
  return TakeImpl("take_shard", table, ids, axis, &shard);
}

Array CrossEntropy(const Array& logits, const Array& labels) {
  const char* op = "cross_entropy";
  RequireFloat(op, "logits", logits);
  if (logits.rank() == 0) {
    Fail(op, "logits must have a class axis [..., C], got " + logits.TypeString());
  }
  if (labels.dtype() != DType::kI32) Fail(op, "labels must be i32, got " + labels.TypeString());
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  if (labels.shape() != lead) {
    Fail(op, "labels must have shape " + FormatShape(lead) + " (logits " + logits.TypeString() +
                 " without the class axis), got " + labels.TypeString());
  }
  if (AnyShapeOnly({&logits, &labels})) return Array::ShapeOnly(DType::kF32, {});
  const int64_t classes = logits.shape().back();
  double total = 0;
  for (int64_t row = 0; row < labels.size(); ++row) {
    auto at = [&](int64_t c) { return logits.ValueAt(row * classes + c); };
    // jax.nn.logsumexp: shift by the max where it is finite.
    double m = RowMax(classes, at);
    if (!std::isfinite(m)) m = 0;
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(at(c) - m);
    int64_t label = labels.IntAt(row);
    if (label < 0) label += classes;
    const double picked =
        label >= 0 && label < classes ? at(label) : std::numeric_limits<double>::quiet_NaN();
    total += m + std::log(sum) - picked;
  }
  // The mean over no positions is 0 / 0: NaN, as jnp.mean of an empty array.
  const double loss = total / static_cast<double>(labels.size());
  return Array::FromNumbers(DType::kF32, {}, {loss});
}

Array OneHot(const Array& x, int64_t num_classes, DType dtype) {
  const char* op = "one_hot";
  if (x.dtype() != DType::kI32) Fail(op, "x must be i32, got " + x.TypeString());
  if (num_classes < 1) Fail(op, "num_classes must be >= 1, got " + std::to_string(num_classes));
  Shape shape = x.shape();
  shape.push_back(num_classes);
  if (!x.has_data()) return Array::ShapeOnly(dtype, shape);
  std::vector<double> out(static_cast<size_t>(NumElements(shape)), 0.0);
  for (int64_t i = 0; i < x.size(); ++i) {
    const int64_t c = x.IntAt(i);
    if (c >= 0 && c < num_classes) out[static_cast<size_t>(i * num_classes + c)] = 1;
  }
  return Array::FromNumbers(dtype, shape, out);
}

Array Cumsum(const Array& x, int64_t axis, bool reverse) {
  const int ax = NormalizeAxis("cumsum", axis, x);
  if (!x.has_data()) return Array::ShapeOnly(x.dtype(), x.shape());
  const Rows rows = RowsAlong(x.shape(), ax);
  const bool ints = x.dtype() == DType::kI32;
  std::vector<double> sums(static_cast<size_t>(x.size()));
  std::vector<int32_t> int_sums(ints ? static_cast<size_t>(x.size()) : 0);
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t j = 0; j < rows.inner; ++j) {
      double sum = 0;
      uint32_t wrapped = 0;  // int32 addition as two's complement.
      for (int64_t step = 0; step < rows.n; ++step) {
        const int64_t at = rows.At(o, reverse ? rows.n - 1 - step : step, j);
        if (ints) {
          wrapped += static_cast<uint32_t>(static_cast<int32_t>(x.ValueAt(at)));
          int_sums[static_cast<size_t>(at)] = static_cast<int32_t>(wrapped);
        } else {
          sum += x.ValueAt(at);
          sums[static_cast<size_t>(at)] = sum;
        }
      }
    }
  }
  if (ints) return Array::FromInts(x.shape(), int_sums);
  return Array::FromNumbers(x.dtype(), x.shape(), sums);
}

Array Repeat(const Array& a, const Array& repeats, int64_t axis, int64_t total) {
  const char* op = "repeat";
  if (a.rank() == 0) Fail(op, "a must have rank >= 1, got " + a.TypeString());
  const int ax = NormalizeAxis(op, axis, a);
  const int64_t m = a.shape()[static_cast<size_t>(ax)];
  if (repeats.dtype() != DType::kI32 || repeats.shape() != Shape{m}) {
    Fail(op, "repeats must be i32[" + std::to_string(m) + "] (one count per slice of " +
                 a.TypeString() + " along axis " + std::to_string(axis) + "), got " +
                 repeats.TypeString());
  }
  if (total < 0) Fail(op, "total_repeat_length must be >= 0, got " + std::to_string(total));
  if (m == 0 && total > 0) Fail(op, "cannot fill " + std::to_string(total) + " slices from none");
  Shape shape = a.shape();
  shape[static_cast<size_t>(ax)] = total;
  if (AnyShapeOnly({&a, &repeats})) return Array::ShapeOnly(a.dtype(), shape);
  // JAX's construction: output slice i takes slice (the number of j whose exclusive prefix sum
  // of repeats is <= i) - 1, the last slice whose run starts at or before i. Slices repeated
  // zero times start where the next one does and lose to it; past the sum every run has
  // started, so the index is the last one.
  for (int64_t j = 0; j < m; ++j) {
    if (repeats.IntAt(j) < 0) {
      Fail(op, "repeats[" + std::to_string(j) + "] is " + std::to_string(repeats.IntAt(j)) +
                   ": counts must be >= 0");
    }
  }
  std::vector<int32_t> index(static_cast<size_t>(total));
  int64_t start = 0;  // Where slice j's run starts: the sum of the counts before it.
  int64_t j = 0;      // Slices whose runs start at or before i.
  for (int64_t i = 0; i < total; ++i) {
    for (; j < m && start <= i; ++j) start += repeats.IntAt(j);
    index[static_cast<size_t>(i)] = static_cast<int32_t>(j - 1);
  }
  return Take(a, Array::FromInts({total}, index), ax);
}

Array Argsort(const Array& x, int64_t axis) {
  const int ax = NormalizeAxis("argsort", axis, x);
  if (!x.has_data()) return Array::ShapeOnly(DType::kI32, x.shape());
  const Rows rows = RowsAlong(x.shape(), ax);
  std::vector<int32_t> out(static_cast<size_t>(x.size()));
  std::vector<int64_t> order(static_cast<size_t>(rows.n));
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t j = 0; j < rows.inner; ++j) {
      std::iota(order.begin(), order.end(), int64_t{0});
      auto value = [&](int64_t i) { return x.ValueAt(rows.At(o, i, j)); };
      // Ascending, NaN last; stable keeps equal values in index order.
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        const double va = value(a), vb = value(b);
        if (std::isnan(va) || std::isnan(vb)) return !std::isnan(va) && std::isnan(vb);
        return va < vb;
      });
      for (int64_t i = 0; i < rows.n; ++i) {
        out[static_cast<size_t>(rows.At(o, i, j))] =
            static_cast<int32_t>(order[static_cast<size_t>(i)]);
      }
    }
  }
  return Array::FromInts(x.shape(), out);
}

std::vector<Array> TopK(const Array& x, int64_t k) {
  const char* op = "top_k";
  if (x.rank() == 0) {
    Fail(op, "x must have rank >= 1 (top_k works along the last axis), got " + x.TypeString());
  }
  if (k < 1) Fail(op, "k must be >= 1, got " + std::to_string(k));
  const int64_t n = x.shape().back();
  if (k > n) {
    Fail(op, "k = " + std::to_string(k) + " exceeds the last axis of " + x.TypeString() + " (" +
                 std::to_string(n) + ")");
  }
  Shape shape = x.shape();
  shape.back() = k;
  std::vector<Array> out;
  if (!x.has_data()) {
    out.push_back(Array::ShapeOnly(x.dtype(), shape));
    out.push_back(Array::ShapeOnly(DType::kI32, shape));
    return out;
  }
  const int64_t rows = n == 0 ? 0 : x.size() / n;
  std::vector<float> values;
  std::vector<int32_t> indices;
  values.reserve(static_cast<size_t>(rows * k));
  indices.reserve(static_cast<size_t>(rows * k));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * n;
    std::iota(order.begin(), order.end(), int64_t{0});
    // A strict order: NaN first, then larger values, then the lower index.
    auto before = [&](int64_t a, int64_t b) {
      const double va = x.ValueAt(base + a), vb = x.ValueAt(base + b);
      if (std::isnan(va) != std::isnan(vb)) return std::isnan(va);
      if (!std::isnan(va) && va != vb) return va > vb;
      return a < b;
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    for (int64_t i = 0; i < k; ++i) {
      values.push_back(x.data()[base + order[i]]);  // The word itself: exact in every dtype.
      indices.push_back(static_cast<int32_t>(order[i]));
    }
  }
  out.push_back(Array::FromWords(x.dtype(), shape, std::move(values)));
  out.push_back(Array::FromInts(shape, indices));
  return out;
}

namespace {

// The B N T S scores of an attention of q [B, T, N, H] over `s` keys.
double Scores(const Array& q, int64_t s) {
  const Shape& qs = q.shape();
  return static_cast<double>(qs.at(0)) * static_cast<double>(qs.at(2)) *
         static_cast<double>(qs.at(1)) * static_cast<double>(s);
}

}  // namespace

bool UnfusedAttention(const OpSpec& op) { return op.kernel == "unfused"; }

double UnfusedAttentionBytes(const OpSpec& op, const Array& q, int64_t s, bool backward) {
  if (!UnfusedAttention(op)) return 0;
  // Megatron-LM's attention before FlashAttention, per element of the B N T S scores (all of
  // them: the mask is applied to the full square), e the dtype's bytes: forward, the scores
  // written by the batched q k^T, read and the probabilities written by the fused
  // scale-mask-softmax, read and written by dropout with its one-byte mask, read by p v: 6e + 1;
  // backward, p read for dv, dp written, dropout's backward (dp and the mask read, written),
  // softmax's backward (p and the gradient read, written), ds read for dq and for dk: 9e + 1.
  const double e = static_cast<double>(DTypeSize(q.dtype()));
  return Scores(q, s) * (backward ? 9 * e + 1 : 6 * e + 1);
}

double UnfusedAttentionWorkspace(const OpSpec& op, const Array& q, int64_t s, bool backward) {
  if (!UnfusedAttention(op)) return 0;
  // Per score, e the dtype's bytes: the forward holds the scores and the probabilities the
  // softmax writes from them at once, with dropout's one-byte mask (2e + 1; the dropped
  // probabilities overwrite the scores); the backward, which recomputes the probabilities,
  // holds them with dp and ds (softmax's backward reads p and dp and writes ds) and the mask
  // (3e + 1). What a forward keeps for its backward is not held: the op recomputes it.
  const double e = static_cast<double>(DTypeSize(q.dtype()));
  return Scores(q, s) * (backward ? 3 * e + 1 : 2 * e + 1);
}

double AttentionPairs(int64_t t, int64_t s, bool causal) {
  const double td = static_cast<double>(t), sd = static_cast<double>(s);
  // Causal, aligned bottom-right: query i sees S - T + i + 1 keys; summed over i < T that is
  // T S - T (T - 1) / 2 (S (S + 1) / 2 when T = S: half the square and its diagonal).
  return causal ? td * sd - td * (td - 1) / 2 : td * sd;
}

Array Attention(const Array& q, const Array& k, const Array& v, bool causal) {
  const char* op = "attention";
  if (q.rank() != 4) Fail(op, "q must be [B, T, N, H], got " + q.TypeString());
  if (k.rank() != 4) Fail(op, "k must be [B, S, K, H], got " + k.TypeString());
  if (v.shape() != k.shape()) {
    Fail(op, "v must have k's shape [B, S, K, H] " + FormatShape(k.shape()) + ", got " +
                 v.TypeString());
  }
  const int64_t b = q.shape()[0], t = q.shape()[1], heads = q.shape()[2], h = q.shape()[3];
  const int64_t s = k.shape()[1], kv_heads = k.shape()[2];
  if (k.shape()[0] != b || k.shape()[3] != h) {
    Fail(op, "q " + q.TypeString() + " and k " + k.TypeString() +
                 " must agree in B (dimension 0) and H (dimension 3)");
  }
  if (kv_heads < 1 || heads % kv_heads != 0) {
    Fail(op, "the query heads N = " + std::to_string(heads) +
                 " must be a multiple of the key/value heads K = " + std::to_string(kv_heads));
  }
  // k and v share one float dtype, which may differ from q's: a cache stored narrower (f8e4m3,
  // say) is read as stored, as fused kernels dequantize it; the result has q's dtype.
  if (v.dtype() != k.dtype() || q.dtype() == DType::kI32 || k.dtype() == DType::kI32) {
    Fail(op, std::string("q must be a float and k and v share one float dtype, got ") +
                 DTypeName(q.dtype()) + ", " + DTypeName(k.dtype()) + ", " + DTypeName(v.dtype()));
  }
  if (causal && t > s) {
    const std::string got = "T = " + std::to_string(t) + ", S = " + std::to_string(s);
    Fail(op, "causal attention aligns the last query with the last key, so it needs T <= S, got " +
                 got);
  }
  const DType dtype = q.dtype();
  if (AnyShapeOnly({&q, &k, &v})) return Array::ShapeOnly(dtype, q.shape());
  const int64_t group = heads / kv_heads;
  const double scale = 1 / std::sqrt(static_cast<double>(h));  // JAX's default scale.
  std::vector<float> out(static_cast<size_t>(q.size()));
  std::vector<double> score(static_cast<size_t>(s)), acc(static_cast<size_t>(h));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t n = 0; n < heads; ++n) {
      const int64_t g = n / group;  // jax.nn.dot_product_attention's grouped-query mapping.
      for (int64_t ti = 0; ti < t; ++ti) {
        // Keys [0, seen): all, or causally up to the query's place counted from the end. JAX's
        // own mask (_get_causal_mask in jax/_src/nn/functions.py) is jnp.tril(ones((T, S))),
        // aligned top-left: the same when T = S, but for T < S (decoding against a cache) it
        // would hide the cache; shardsim aligns bottom-right as FlashAttention >= 2.1 does.
        const int64_t seen = causal ? s - t + ti + 1 : s;
        const float* qrow = q.data() + ((bi * t + ti) * heads + n) * h;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < seen; ++j) {
          const float* krow = k.data() + ((bi * s + j) * kv_heads + g) * h;
          double dot = 0;
          for (int64_t d = 0; d < h; ++d) dot += static_cast<double>(qrow[d]) * krow[d];
          score[j] = dot * scale;
          m = std::isnan(score[j]) || std::isnan(m) ? std::numeric_limits<double>::quiet_NaN()
                                                    : std::max(m, score[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < seen; ++j) sum += score[j] = std::exp(score[j] - m);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < seen; ++j) {
          // JAX casts the float32 probabilities to the inputs' dtype before the second einsum.
          const double p = RoundToDType(dtype, static_cast<float>(score[j] / sum));
          const float* vrow = v.data() + ((bi * s + j) * kv_heads + g) * h;
          for (int64_t d = 0; d < h; ++d) acc[d] += p * vrow[d];
        }
        float* orow = out.data() + ((bi * t + ti) * heads + n) * h;
        for (int64_t d = 0; d < h; ++d) orow[d] = static_cast<float>(acc[d]);
      }
    }
  }
  return Array::FromValues(dtype, q.shape(), std::move(out));
}

double SmallestNormScale(const OpSpec& op, const Array& x) {
  double smallest = std::numeric_limits<double>::infinity();
  if (!x.has_data() || x.rank() == 0) return smallest;
  const int ax = NormalizeAxis(OpKindName(op.kind), op.norm_axis, x);
  const Rows rows = RowsAlong(x.shape(), ax);
  const double eps = op.eps.value_or(DefaultEps(op.kind));
  const bool center = op.kind == OpKind::kLayerNorm;
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t j = 0; j < rows.inner; ++j) {
      double mean = 0, var = 0;
      if (center) {
        for (int64_t i = 0; i < rows.n; ++i) mean += x.ValueAt(rows.At(o, i, j));
        mean /= static_cast<double>(rows.n);
      }
      for (int64_t i = 0; i < rows.n; ++i) {
        const double c = x.ValueAt(rows.At(o, i, j)) - mean;
        var += c * c;
      }
      smallest = std::min(smallest, std::sqrt(var / static_cast<double>(rows.n) + eps));
    }
  }
  return smallest;
}

OpCost NnOpCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                const std::vector<const Array*>& outputs) {
  double in_bytes = 0, out_bytes = 0;
  for (const Array* a : inputs) in_bytes += static_cast<double>(a->bytes().count());
  for (const Array* a : outputs) out_bytes += static_cast<double>(a->bytes().count());
  // Every op reads its inputs once and writes its outputs once (the fused kernel XLA emits),
  // except take, which reads only the rows it gathers.
  OpCost cost{0, in_bytes + out_bytes};
  const Array& x = *inputs.at(0);
  const double n = static_cast<double>(x.size());
  // Rows of x along the op's normalization axis (softmax, norms), for per-row work.
  auto rows = [&] {
    if (x.rank() == 0) return n;
    const int ax = static_cast<int>(op.norm_axis < 0 ? op.norm_axis + x.rank() : op.norm_axis);
    const double len = static_cast<double>(x.shape().at(static_cast<size_t>(ax)));
    return len == 0 ? 0.0 : n / len;
  };
  switch (op.kind) {
    case OpKind::kSum:
    case OpKind::kReduceMax:
      cost.flops = n;  // One add (or compare) per element reduced.
      return cost;
    case OpKind::kMean:
      cost.flops = n + static_cast<double>(outputs.at(0)->size());  // The adds, one divide each.
      return cost;
    case OpKind::kSoftmax:
      // Per element: the max's compare, the subtraction, exp, the sum's add, the division.
      cost.flops = 5 * n;
      return cost;
    case OpKind::kLogSoftmax:
      // Per element: compare, subtract, exp, add, the final subtraction; a log per row.
      cost.flops = 5 * n + rows();
      return cost;
    case OpKind::kRmsNorm:
      // Per element: square, add, times rsqrt, times scale; per row: / n, + eps, rsqrt.
      cost.flops = 4 * n + 3 * rows();
      return cost;
    case OpKind::kLayerNorm:
      // Per element: the mean's add, subtract it, square, add, times rsqrt, times scale; per
      // row: two divisions by n, + eps, rsqrt.
      cost.flops = 6 * n + 4 * rows();
      return cost;
    case OpKind::kTake:
      // A gather: no arithmetic; reads the ids and the rows taken, writes them.
      return OpCost{0, static_cast<double>(inputs.at(1)->bytes().count()) + 2 * out_bytes};
    case OpKind::kCrossEntropy: {
      // Per logit: compare, subtract, exp, add; per position: log, add the max back, subtract
      // the label's logit, add to the total; one division for the mean.
      const double positions = static_cast<double>(inputs.at(1)->size());
      cost.flops = 4 * n + 4 * positions + 1;
      return cost;
    }
    case OpKind::kTopK: {
      // Comparisons count as FLOPs: a heap selection compares every element with the current
      // k-th largest and sifts the ones that enter through log2(k) levels: <= n (1 + log2 k).
      const double k = static_cast<double>(outputs.at(0)->shape().back());
      cost.flops = n * (1 + std::log2(std::max(k, 1.0)));
      return cost;
    }
    case OpKind::kAttention: {
      // The two matmuls (q k^T and p v): 2 H FLOPs each per scored (query, key) pair, so
      // 4 B N H T S in all, the pairs halved (plus the diagonal) when causal: flash-style
      // kernels skip the masked blocks. The softmax's few FLOPs per pair are left out, as in
      // the usual count. Bytes: q, k, v read and the output written once; the T x S scores
      // stay on chip (flash attention).
      const Shape& qs = x.shape();
      const int64_t s = inputs.at(1)->shape().at(1);
      cost.flops = 4.0 * static_cast<double>(qs.at(0)) * static_cast<double>(qs.at(2)) *
                   static_cast<double>(qs.at(3)) * AttentionPairs(qs.at(1), s, op.causal);
      cost.bytes += UnfusedAttentionBytes(op, x, s, /*backward=*/false);
      cost.workspace = UnfusedAttentionWorkspace(op, x, s, /*backward=*/false);
      cost.fused_attention = !UnfusedAttention(op);
      if (op.kernel == "mmha") {
        // Each of the N query heads reads its kv head's keys and values (no sharing within a
        // group of N / K): k and v cross HBM N / K times, once counted above.
        const double group =
            static_cast<double>(qs.at(2)) / static_cast<double>(inputs.at(1)->shape().at(2));
        cost.bytes += (group - 1) * static_cast<double>(inputs.at(1)->bytes().count() +
                                                        inputs.at(2)->bytes().count());
      }
      return cost;
    }
    case OpKind::kOneHot:
      // One compare per element of the result, the ids read and the result written.
      cost.flops = static_cast<double>(outputs.at(0)->size());
      return cost;
    case OpKind::kMoeRoute:
      return MoeRouteCost(inputs, outputs);
    case OpKind::kRaggedDot:
      return RaggedDotCost(op, inputs, outputs);
    case OpKind::kCumsum:
      // One add per element.
      cost.flops = n;
      return cost;
    case OpKind::kRepeat:
      // XLA's: prefix sums of the counts and of the run starts they mark (an add per count and
      // per output slice), then a gather of the slices, as take's bytes.
      cost.flops = static_cast<double>(
          inputs.at(1)->size() +
          outputs.at(0)->shape().at(static_cast<size_t>(NormalizeAxis("repeat", op.axis, x))));
      cost.bytes = static_cast<double>(inputs.at(1)->bytes().count()) + 2 * out_bytes;
      return cost;
    case OpKind::kArgsort: {
      // A comparison sort: n log2(rows' length) comparisons, counted as FLOPs (as top_k's).
      const Shape& shape = x.shape();
      const double len =
          shape.empty()
              ? 1
              : static_cast<double>(
                    shape[static_cast<size_t>(NormalizeAxis("argsort", op.norm_axis, x))]);
      cost.flops = n * std::log2(std::max(len, 2.0));
      return cost;
    }
    default:
      return cost;
  }
}

}  // namespace shardsim
