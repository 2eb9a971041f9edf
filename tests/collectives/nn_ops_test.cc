// The array ops of global programs as local ops (collectives/nn_ops.h): each op against closed
// forms, its shape and dtype rules and their errors, its FLOPs and bytes, its registry entry,
// and its error bounds in the numerics check.
#include "collectives/nn_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "collectives/ir/program_builder.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "sim/spec_error.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kLn2 = std::log(2.0);
const double kLn3 = std::log(3.0);

// An array of `dtype` holding `values` (rounded to the dtype).
Array A(DType dtype, Shape shape, std::vector<double> values) {
  return Array::FromNumbers(dtype, std::move(shape), values);
}
Array F32(Shape shape, std::vector<double> values) {
  return A(DType::kF32, std::move(shape), std::move(values));
}
Array I32(Shape shape, std::vector<double> values) {
  return A(DType::kI32, std::move(shape), std::move(values));
}
// 0, 1, 2, ... as f32 of `shape`.
Array Arange(Shape shape) {
  std::vector<double> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return F32(std::move(shape), v);
}

// An op of `kind` with its attributes at their defaults.
OpSpec MakeOp(OpKind kind) {
  OpSpec op;
  op.kind = kind;
  return op;
}
// A reduction over `axes`.
OpSpec Reduce(OpKind kind, std::vector<int64_t> axes, bool keepdims = false) {
  OpSpec op = MakeOp(kind);
  op.axes = std::move(axes);
  op.keepdims = keepdims;
  return op;
}
// softmax, log_softmax, rms_norm or layer_norm along `axis`, with `eps` when given.
OpSpec Along(OpKind kind, int64_t axis, std::optional<double> eps = std::nullopt) {
  OpSpec op = MakeOp(kind);
  op.norm_axis = axis;
  op.eps = eps;
  return op;
}
OpSpec TakeAlong(int64_t axis) {
  OpSpec op = MakeOp(OpKind::kTake);
  op.axis = axis;
  return op;
}
OpSpec RepeatOf(int64_t axis, int64_t total) {
  OpSpec op = MakeOp(OpKind::kRepeat);
  op.axis = axis;
  op.total_repeat_length = total;
  return op;
}
OpSpec TopKOf(int64_t k) {
  OpSpec op = MakeOp(OpKind::kTopK);
  op.k = k;
  return op;
}
OpSpec AttentionOp(bool causal) {
  OpSpec op = MakeOp(OpKind::kAttention);
  op.causal = causal;
  return op;
}

// Runs `op` through the local-op dispatcher, as the executor and the reference do.
std::vector<Array> Apply(const OpSpec& op, const std::vector<Array>& inputs) {
  static const Mesh mesh({{"d", 1}}, {0});
  std::vector<const Array*> ptrs;
  for (const Array& a : inputs) ptrs.push_back(&a);
  return ApplyLocalOp(op, ptrs, mesh, 0);
}

// One output's expected type and values (NaN expects NaN).
struct Expected {
  DType dtype;
  Shape shape;
  std::vector<double> values;
};

// A named closed-form case: an op on inputs and what each of its outputs must be.
struct KernelCase {
  std::string name;
  OpSpec op;
  std::vector<Array> inputs;
  std::vector<Expected> outputs;
};

std::ostream& operator<<(std::ostream& os, const KernelCase& c) { return os << c.name; }

// The float value v rounded to `dtype`.
double R(DType dtype, double v) { return RoundToDType(dtype, static_cast<float>(v)); }

// softmax of {0, ln 2} (the bf16 case: ln 2 rounded to bf16 first), rounded to `dtype`.
std::vector<double> SoftmaxOf0AndLn2(DType dtype) {
  const double l = R(dtype, kLn2);
  return {R(dtype, 1 / (1 + std::exp(l))), R(dtype, std::exp(l) / (1 + std::exp(l)))};
}

// Attention of q = 1 over keys {0, ln 2} (in f16) with values {0, 5}: the probabilities are
// rounded to f16 before they weight v, as JAX does; returns that output.
double F16AttentionOutput() {
  const double l = R(DType::kF16, kLn2);
  const double p1 = std::exp(l) / (1 + std::exp(l));
  return R(DType::kF16, R(DType::kF16, p1) * 5);
}

std::vector<KernelCase> KernelCases() {
  const int32_t kMin = std::numeric_limits<int32_t>::min();
  const int32_t kMax = std::numeric_limits<int32_t>::max();
  const double rms = std::sqrt(12.5);  // rms of {3, 4}.
  const DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16, i32 = DType::kI32;
  return {
      // Reductions of [[0, 1, 2], [3, 4, 5]] and friends.
      {"SumAll", Reduce(OpKind::kSum, {}), {Arange({2, 3})}, {{f32, {}, {15}}}},
      {"SumAxis0", Reduce(OpKind::kSum, {0}), {Arange({2, 3})}, {{f32, {3}, {3, 5, 7}}}},
      {"SumLastAxisKeepdims",
       Reduce(OpKind::kSum, {-1}, true),
       {Arange({2, 3})},
       {{f32, {2, 1}, {3, 12}}}},
      // x[a, b, c] = 6a + 2b + c summed over a and c: 14 + 8b.
      {"SumTwoAxesOfThree",
       Reduce(OpKind::kSum, {0, 2}),
       {Arange({2, 3, 2})},
       {{f32, {3}, {14, 22, 30}}}},
      {"SumI32Wraps", Reduce(OpKind::kSum, {}), {I32({2}, {kMax, 1})}, {{i32, {}, {kMin}}}},
      // 256 + 1 + 0.5 = 257.5, rounded once to bf16 (spacing 2 there) is 258; adding in bf16
      // step by step would give 256.
      {"SumBf16RoundsOnce",
       Reduce(OpKind::kSum, {}),
       {A(bf16, {3}, {256, 1, 0.5})},
       {{bf16, {}, {258}}}},
      {"SumOfNothingIsZero", Reduce(OpKind::kSum, {0}), {F32({0, 3}, {})}, {{f32, {3}, {0, 0, 0}}}},
      {"MeanAxis1", Reduce(OpKind::kMean, {1}), {Arange({2, 3})}, {{f32, {2}, {1, 4}}}},
      {"MeanOfI32IsF32", Reduce(OpKind::kMean, {}), {I32({2}, {1, 2})}, {{f32, {}, {1.5}}}},
      {"MeanOfNothingIsNan",
       Reduce(OpKind::kMean, {0}),
       {F32({0, 2}, {})},
       {{f32, {2}, {kNan, kNan}}}},
      {"MaxAxis1",
       Reduce(OpKind::kReduceMax, {1}),
       {F32({2, 3}, {-1, -5, -2, 4, 0, 9})},
       {{f32, {2}, {-1, 9}}}},
      {"MaxPropagatesNan",
       Reduce(OpKind::kReduceMax, {}),
       {F32({3}, {1, kNan, 3})},
       {{f32, {}, {kNan}}}},
      {"MaxKeepsI32", Reduce(OpKind::kReduceMax, {0}), {I32({3}, {-3, 7, 2})}, {{i32, {}, {7}}}},
      {"MaxAllKeepdims",
       Reduce(OpKind::kReduceMax, {}, true),
       {Arange({2, 3})},
       {{f32, {1, 1}, {5}}}},
      // softmax([0, ln 2]) = [1/3, 2/3]; log_softmax = [-ln 3, ln 2 - ln 3].
      {"SoftmaxOf0AndLn2",
       MakeOp(OpKind::kSoftmax),
       {F32({2}, {0, kLn2})},
       {{f32, {2}, {1.0 / 3, 2.0 / 3}}}},
      {"LogSoftmaxOf0AndLn2",
       MakeOp(OpKind::kLogSoftmax),
       {F32({2}, {0, kLn2})},
       {{f32, {2}, {-kLn3, kLn2 - kLn3}}}},
      // Along axis 0 of [[0, 0], [ln 3, 0]]: columns [1/4, 3/4] and [1/2, 1/2].
      {"SoftmaxAxis0",
       Along(OpKind::kSoftmax, 0),
       {F32({2, 2}, {0, 0, kLn3, 0})},
       {{f32, {2, 2}, {0.25, 0.5, 0.75, 0.5}}}},
      // exp(1000) overflows: only the max's subtraction keeps these finite.
      {"SoftmaxOfLargeValuesIsStable",
       MakeOp(OpKind::kSoftmax),
       {F32({2}, {1000, 1000})},
       {{f32, {2}, {0.5, 0.5}}}},
      {"LogSoftmaxOfLargeValuesIsStable",
       MakeOp(OpKind::kLogSoftmax),
       {F32({2}, {1000, 1000})},
       {{f32, {2}, {-kLn2, -kLn2}}}},
      {"SoftmaxOfMinusInfIsZero",
       MakeOp(OpKind::kSoftmax),
       {F32({2}, {0, -kInf})},
       {{f32, {2}, {1, 0}}}},
      {"SoftmaxWithPlusInfIsNan",
       MakeOp(OpKind::kSoftmax),
       {F32({2}, {0, kInf})},
       {{f32, {2}, {kNan, kNan}}}},
      {"SoftmaxOfI32IsF32", MakeOp(OpKind::kSoftmax), {I32({2}, {0, 0})}, {{f32, {2}, {0.5, 0.5}}}},
      {"SoftmaxBf16Rounds",
       MakeOp(OpKind::kSoftmax),
       {A(bf16, {2}, {0, kLn2})},
       {{bf16, {2}, SoftmaxOf0AndLn2(bf16)}}},
      // rms_norm([3, 4]) = [3, 4] / sqrt(12.5); layer_norm([1, 2, 3]) = [-1, 0, 1] sqrt(1.5).
      {"RmsNorm",
       Along(OpKind::kRmsNorm, -1, 0.0),
       {F32({2}, {3, 4}), F32({2}, {1, 1})},
       {{f32, {2}, {3 / rms, 4 / rms}}}},
      {"RmsNormScale",
       Along(OpKind::kRmsNorm, -1, 0.0),
       {F32({2}, {3, 4}), F32({2}, {2, 0.5})},
       {{f32, {2}, {6 / rms, 2 / rms}}}},
      // Flax's default eps, 1e-6, doubles mean(x^2) = 1e-6 here: 1e-3 / sqrt(2e-6).
      {"RmsNormDefaultEps",
       MakeOp(OpKind::kRmsNorm),
       {F32({2}, {1e-3, 1e-3}), F32({2}, {1, 1})},
       {{f32, {2}, {1 / std::sqrt(2.0), 1 / std::sqrt(2.0)}}}},
      {"LayerNorm",
       Along(OpKind::kLayerNorm, -1, 0.0),
       {F32({3}, {1, 2, 3}), F32({3}, {1, 1, 1})},
       {{f32, {3}, {-std::sqrt(1.5), 0, std::sqrt(1.5)}}}},
      // Columns of [[1, 5], [3, 5]] along axis 0, eps 1: (x - mean) / sqrt(var + 1) * scale[row].
      {"LayerNormAxis0Scale",
       Along(OpKind::kLayerNorm, 0, 1.0),
       {F32({2, 2}, {1, 5, 3, 5}), F32({2}, {1, 2})},
       {{f32, {2, 2}, {-1 / std::sqrt(2.0), 0, 2 / std::sqrt(2.0), 0}}}},
      // Flax's default eps, 1e-5: var 1e-6, so +-1e-3 / sqrt(1.1e-5).
      {"LayerNormDefaultEps",
       MakeOp(OpKind::kLayerNorm),
       {F32({2}, {0, 2e-3}), F32({2}, {1, 1})},
       {{f32, {2}, {-1e-3 / std::sqrt(1.1e-5), 1e-3 / std::sqrt(1.1e-5)}}}},
      {"RmsNormBf16WithF32ScaleIsF32",
       Along(OpKind::kRmsNorm, -1, 0.0),
       {A(bf16, {2}, {3, 4}), F32({2}, {1, 1})},
       {{f32, {2}, {3 / rms, 4 / rms}}}},
      {"RmsNormBf16Rounds",
       Along(OpKind::kRmsNorm, -1, 0.0),
       {A(bf16, {2}, {3, 4}), A(bf16, {2}, {1, 1})},
       {{bf16, {2}, {R(bf16, 3 / rms), R(bf16, 4 / rms)}}}},
      // take of [[0, 1], [2, 3], [4, 5]].
      {"TakeRows",
       MakeOp(OpKind::kTake),
       {Arange({3, 2}), I32({2}, {2, 0})},
       {{f32, {2, 2}, {4, 5, 0, 1}}}},
      {"TakeAxis1With2dIds",
       TakeAlong(1),
       {Arange({3, 2}), I32({2, 1}, {1, 0})},
       {{f32, {3, 2, 1}, {1, 0, 3, 2, 5, 4}}}},
      {"TakeNegativeIdCountsFromTheEnd",
       MakeOp(OpKind::kTake),
       {Arange({3, 2}), I32({1}, {-1})},
       {{f32, {1, 2}, {4, 5}}}},
      {"TakeOutOfRangeFillsNan",
       MakeOp(OpKind::kTake),
       {Arange({3, 2}), I32({2}, {3, -4})},
       {{f32, {2, 2}, {kNan, kNan, kNan, kNan}}}},
      {"TakeI32FillsMostNegative",
       MakeOp(OpKind::kTake),
       {I32({2}, {7, 8}), I32({2}, {1, 2})},
       {{i32, {2}, {8, kMin}}}},
      {"TakeKeepsBf16",
       MakeOp(OpKind::kTake),
       {A(bf16, {2, 1}, {1.5, 2.5}), I32({1}, {1})},
       {{bf16, {1, 1}, {2.5}}}},
      // -log softmax([0, ln 2]) = [ln 3, ln 1.5].
      {"CrossEntropyOneRow",
       MakeOp(OpKind::kCrossEntropy),
       {F32({1, 2}, {0, kLn2}), I32({1}, {1})},
       {{f32, {}, {std::log(1.5)}}}},
      {"CrossEntropyMeansRows",
       MakeOp(OpKind::kCrossEntropy),
       {F32({2, 2}, {0, kLn2, 0, kLn2}), I32({2}, {1, 0})},
       {{f32, {}, {(std::log(1.5) + kLn3) / 2}}}},
      {"CrossEntropyRank3",
       MakeOp(OpKind::kCrossEntropy),
       {F32({1, 2, 2}, {0, kLn2, 0, kLn2}), I32({1, 2}, {1, 0})},
       {{f32, {}, {(std::log(1.5) + kLn3) / 2}}}},
      {"CrossEntropyUniformIsLnC",
       MakeOp(OpKind::kCrossEntropy),
       {F32({2, 4}, {0, 0, 0, 0, 0, 0, 0, 0}), I32({2}, {3, 0})},
       {{f32, {}, {std::log(4.0)}}}},
      {"CrossEntropyNegativeLabel",
       MakeOp(OpKind::kCrossEntropy),
       {F32({1, 2}, {0, kLn2}), I32({1}, {-1})},
       {{f32, {}, {std::log(1.5)}}}},
      {"CrossEntropyOutOfRangeLabelIsNan",
       MakeOp(OpKind::kCrossEntropy),
       {F32({1, 2}, {0, kLn2}), I32({1}, {2})},
       {{f32, {}, {kNan}}}},
      {"CrossEntropyLargeLogitsStable",
       MakeOp(OpKind::kCrossEntropy),
       {F32({1, 2}, {1000, 1000}), I32({1}, {0})},
       {{f32, {}, {kLn2}}}},
      {"CrossEntropyOfBf16IsF32",
       MakeOp(OpKind::kCrossEntropy),
       {A(bf16, {1, 2}, {0, 0}), I32({1}, {0})},
       {{f32, {}, {kLn2}}}},
      {"TopK3",
       TopKOf(3),
       {F32({5}, {3, 1, 4, 1, 5})},
       {{f32, {3}, {5, 4, 3}}, {i32, {3}, {4, 2, 0}}}},
      {"TopKTiesTakeTheLowerIndex",
       TopKOf(2),
       {F32({5}, {2, 7, 7, 1, 7})},
       {{f32, {2}, {7, 7}}, {i32, {2}, {1, 2}}}},
      {"TopKPerRow",
       TopKOf(1),
       {F32({2, 2}, {1, 2, 4, 3})},
       {{f32, {2, 1}, {2, 4}}, {i32, {2, 1}, {1, 0}}}},
      {"TopKNanRanksFirst",
       TopKOf(2),
       {F32({3}, {1, kNan, 2})},
       {{f32, {2}, {kNan, 2}}, {i32, {2}, {1, 2}}}},
      {"TopKOfI32", TopKOf(2), {I32({3}, {5, -1, 9})}, {{i32, {2}, {9, 5}}, {i32, {2}, {2, 0}}}},
      {"CumsumLastAxis",
       Along(OpKind::kCumsum, -1),
       {F32({2, 3}, {1, 2, 3, 4, 5, 6})},
       {{f32, {2, 3}, {1, 3, 6, 4, 9, 15}}}},
      {"CumsumAxis0",
       Along(OpKind::kCumsum, 0),
       {F32({2, 2}, {1, 2, 3, 4})},
       {{f32, {2, 2}, {1, 2, 4, 6}}}},
      {"CumsumReverse",
       [] {
         OpSpec op = Along(OpKind::kCumsum, -1);
         op.reverse = true;
         return op;
       }(),
       {F32({2, 3}, {1, 2, 3, 4, 5, 6})},
       {{f32, {2, 3}, {6, 5, 3, 15, 11, 6}}}},
      // int32 sums wrap as JAX's do: 2^31 - 1 + 1 is -2^31.
      {"CumsumI32Wraps",
       Along(OpKind::kCumsum, 0),
       {I32({2}, {2147483647, 1})},
       {{i32, {2}, {2147483647, -2147483648.0}}}},
      // Stable: equal keys keep their index order (5 at 0 before 5 at 3); NaN sorts last.
      {"ArgsortStable",
       Along(OpKind::kArgsort, -1),
       {F32({5}, {5, 1, kNan, 5, 0})},
       {{i32, {5}, {4, 1, 0, 3, 2}}}},
      {"ArgsortAxis0OfI32",
       Along(OpKind::kArgsort, 0),
       {I32({3, 2}, {3, 0, 1, 2, 2, 1})},
       {{i32, {3, 2}, {1, 0, 2, 2, 0, 1}}}},
      // jnp.repeat's docstring example with total_repeat_length: [1, 2, 0, 5] times gives runs
      // of 10, 20 20 and 40 x 5 (30 is repeated none); 10 slices are the 8 and two of the
      // last, JAX's fill.
      {"RepeatFillsWithTheLastSlice",
       RepeatOf(0, 10),
       {F32({4}, {10, 20, 30, 40}), I32({4}, {1, 2, 0, 5})},
       {{f32, {10}, {10, 20, 20, 40, 40, 40, 40, 40, 40, 40}}}},
      // Cut at 4: the runs past it are lost; a leading zero count starts on the next slice.
      {"RepeatCutsAtTheTotal",
       RepeatOf(0, 4),
       {F32({3}, {1, 2, 3}), I32({3}, {0, 3, 3})},
       {{f32, {4}, {2, 2, 2, 3}}}},
      // A last slice repeated none still fills what the sum leaves (the index past every run).
      {"RepeatFillIsTheLastSliceEvenIfRepeatedNone",
       RepeatOf(0, 3),
       {I32({2}, {7, 9}), I32({2}, {1, 0})},
       {{i32, {3}, {7, 9, 9}}}},
      // Along axis 1 of a [2, 2]: columns [1, 3] and [2, 4] twice and once.
      {"RepeatAxis1",
       RepeatOf(-1, 3),
       {F32({2, 2}, {1, 2, 3, 4}), I32({2}, {2, 1})},
       {{f32, {2, 3}, {1, 1, 2, 3, 3, 4}}}},
      {"TopKWholeAxis",
       TopKOf(2),
       {A(bf16, {2}, {1, 2})},
       {{bf16, {2}, {2, 1}}, {i32, {2}, {1, 0}}}},
      // One query q = 1 over keys {0, ln 2}: probabilities [1/3, 2/3], values {3, 6}: 5.
      {"AttentionOneQueryTwoKeys",
       AttentionOp(false),
       {F32({1, 1, 1, 1}, {1}), F32({1, 2, 1, 1}, {0, kLn2}), F32({1, 2, 1, 1}, {3, 6})},
       {{f32, {1, 1, 1, 1}, {5}}}},
      // Causal with T = 1 < S = 2: the last query is aligned with the last key and sees both
      // (JAX's top-left tril would show it key 0 only: 3).
      {"AttentionCausalAlignsBottomRight",
       AttentionOp(true),
       {F32({1, 1, 1, 1}, {1}), F32({1, 2, 1, 1}, {0, kLn2}), F32({1, 2, 1, 1}, {3, 6})},
       {{f32, {1, 1, 1, 1}, {5}}}},
      {"AttentionCausalSquare",
       AttentionOp(true),
       {F32({1, 2, 1, 1}, {1, 1}), F32({1, 2, 1, 1}, {0, kLn2}), F32({1, 2, 1, 1}, {3, 6})},
       {{f32, {1, 2, 1, 1}, {3, 5}}}},
      {"AttentionNotCausal",
       AttentionOp(false),
       {F32({1, 2, 1, 1}, {1, 1}), F32({1, 2, 1, 1}, {0, kLn2}), F32({1, 2, 1, 1}, {3, 6})},
       {{f32, {1, 2, 1, 1}, {5, 5}}}},
      // H = 4: q.k1 = 4 (ln 2 / 2) = 2 ln 2, scaled by 1 / sqrt(4) to ln 2.
      {"AttentionScalesBySqrtH",
       AttentionOp(false),
       {F32({1, 1, 1, 4}, {1, 1, 1, 1}),
        F32({1, 2, 1, 4}, {0, 0, 0, 0, kLn2 / 2, kLn2 / 2, kLn2 / 2, kLn2 / 2}),
        F32({1, 2, 1, 4}, {3, 3, 3, 3, 6, 6, 6, 6})},
       {{f32, {1, 1, 1, 4}, {5, 5, 5, 5}}}},
      // N = 4 query heads over K = 2 kv heads: heads 0, 1 read kv head 0, heads 2, 3 kv head 1.
      {"AttentionGroupedQuery",
       AttentionOp(false),
       {F32({1, 1, 4, 1}, {1, 1, 1, 1}), F32({1, 1, 2, 1}, {0, 0}), F32({1, 1, 2, 1}, {10, 20})},
       {{f32, {1, 1, 4, 1}, {10, 10, 20, 20}}}},
      {"AttentionPerBatch",
       AttentionOp(false),
       {F32({2, 1, 1, 1}, {1, 1}), F32({2, 2, 1, 1}, {0, kLn2, kLn2, 0}),
        F32({2, 2, 1, 1}, {3, 6, 3, 6})},
       {{f32, {2, 1, 1, 1}, {5, 4}}}},
      {"AttentionF16RoundsProbabilities",
       AttentionOp(false),
       {A(f16, {1, 1, 1, 1}, {1}), A(f16, {1, 2, 1, 1}, {0, kLn2}), A(f16, {1, 2, 1, 1}, {0, 5})},
       {{f16, {1, 1, 1, 1}, {F16AttentionOutput()}}}},
  };
}

class KernelTest : public testing::TestWithParam<KernelCase> {};

// Values as the closed form, within an ulp of f32 where it is rounded from double (and
// exactly where the expectation is rounded to the dtype the same way); types exactly.
TEST_P(KernelTest, MatchesClosedForm) {
  const KernelCase& c = GetParam();
  std::vector<Array> out = Apply(c.op, c.inputs);
  ASSERT_EQ(out.size(), c.outputs.size());
  for (size_t o = 0; o < out.size(); ++o) {
    const Expected& want = c.outputs[o];
    SCOPED_TRACE("output " + std::to_string(o));
    EXPECT_EQ(out[o].dtype(), want.dtype);
    ASSERT_EQ(out[o].shape(), want.shape);
    ASSERT_TRUE(out[o].has_data());
    ASSERT_EQ(out[o].size(), static_cast<int64_t>(want.values.size()));
    for (size_t i = 0; i < want.values.size(); ++i) {
      const double got = out[o].ValueAt(static_cast<int64_t>(i)), w = want.values[i];
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(got)) << "element " << i << ": " << got;
      } else if (want.dtype == DType::kF32) {
        EXPECT_NEAR(got, w, 1.2e-7 * std::max(1.0, std::fabs(w))) << "element " << i;
      } else {
        EXPECT_EQ(got, w) << "element " << i;
      }
    }
  }
}

// The same op on shape-only inputs gives shape-only outputs of the same types.
TEST_P(KernelTest, ShapeOnlyInputsGiveShapeOnlyOutputs) {
  const KernelCase& c = GetParam();
  std::vector<Array> inputs;
  for (const Array& a : c.inputs) inputs.push_back(Array::ShapeOnly(a.dtype(), a.shape()));
  std::vector<Array> out = Apply(c.op, inputs);
  ASSERT_EQ(out.size(), c.outputs.size());
  for (size_t o = 0; o < out.size(); ++o) {
    EXPECT_FALSE(out[o].has_data());
    EXPECT_EQ(out[o].dtype(), c.outputs[o].dtype);
    EXPECT_EQ(out[o].shape(), c.outputs[o].shape);
  }
}

INSTANTIATE_TEST_SUITE_P(NnOps, KernelTest, testing::ValuesIn(KernelCases()),
                         [](const testing::TestParamInfo<KernelCase>& info) {
                           return info.param.name;
                         });

// The f16 attention case means something: without rounding the probabilities first, the
// output would be another f16 value.
TEST(NnOpsTest, F16AttentionCaseTellsTheRoundingApart) {
  const double l = R(DType::kF16, kLn2);
  const double unrounded = R(DType::kF16, 5 * std::exp(l) / (1 + std::exp(l)));
  EXPECT_NE(F16AttentionOutput(), unrounded);
}

// A bad shape, dtype or attribute, and the start of the message it gets.
struct ErrorCase {
  std::string name;
  OpSpec op;
  std::vector<Array> inputs;
  std::string message;
};

std::ostream& operator<<(std::ostream& os, const ErrorCase& c) { return os << c.name; }

std::vector<ErrorCase> ErrorCases() {
  const DType bf16 = DType::kBF16;
  return {
      {"SumAxisOutOfRange",
       Reduce(OpKind::kSum, {2}),
       {Arange({2, 3})},
       "sum: axis 2 is out of range for f32[2,3]"},
      {"MeanAxisNamedTwice",
       Reduce(OpKind::kMean, {1, -1}),
       {Arange({2, 3})},
       "mean: axis -1 names a dimension twice"},
      {"MaxOfNothing",
       Reduce(OpKind::kReduceMax, {0}),
       {F32({0, 3}, {})},
       "reduce_max: cannot reduce zero elements of f32[0,3] (max has no identity)"},
      {"SoftmaxOfScalar",
       MakeOp(OpKind::kSoftmax),
       {F32({}, {1})},
       "softmax: axis -1 is out of range for f32[]"},
      {"LogSoftmaxAxisOutOfRange",
       Along(OpKind::kLogSoftmax, 1),
       {F32({3}, {1, 2, 3})},
       "log_softmax: axis 1 is out of range for f32[3]"},
      {"RmsNormScaleShape",
       MakeOp(OpKind::kRmsNorm),
       {Arange({2, 3}), F32({2}, {1, 1})},
       "rms_norm: scale must have shape [3] (axis -1 of x f32[2,3]), got f32[2]"},
      {"LayerNormOfI32",
       MakeOp(OpKind::kLayerNorm),
       {I32({2}, {1, 2}), F32({2}, {1, 1})},
       "layer_norm: x must be a float array (f32, bf16, f16), got i32[2]"},
      {"RmsNormI32Scale",
       MakeOp(OpKind::kRmsNorm),
       {F32({2}, {1, 2}), I32({2}, {1, 1})},
       "rms_norm: scale must be a float array (f32, bf16, f16), got i32[2]"},
      {"RmsNormNegativeEps",
       Along(OpKind::kRmsNorm, -1, -1.0),
       {F32({2}, {1, 2}), F32({2}, {1, 1})},
       "rms_norm: eps must be finite and >= 0"},
      {"TakeFloatIds",
       MakeOp(OpKind::kTake),
       {Arange({3, 2}), F32({1}, {0})},
       "take: ids must be i32, got f32[1]"},
      {"TakeFromScalar",
       MakeOp(OpKind::kTake),
       {F32({}, {1}), I32({1}, {0})},
       "take: table must have rank >= 1, got f32[]"},
      {"TakeAxisOutOfRange",
       TakeAlong(2),
       {Arange({3, 2}), I32({1}, {0})},
       "take: axis 2 is out of range for f32[3,2]"},
      {"CrossEntropyLabelShape",
       MakeOp(OpKind::kCrossEntropy),
       {Arange({2, 3}), I32({3}, {0, 0, 0})},
       "cross_entropy: labels must have shape [2] (logits f32[2,3] without the class axis), got "
       "i32[3]"},
      {"CrossEntropyFloatLabels",
       MakeOp(OpKind::kCrossEntropy),
       {Arange({2, 3}), F32({2}, {0, 0})},
       "cross_entropy: labels must be i32, got f32[2]"},
      {"CrossEntropyI32Logits",
       MakeOp(OpKind::kCrossEntropy),
       {I32({1, 2}, {0, 0}), I32({1}, {0})},
       "cross_entropy: logits must be a float array"},
      {"CrossEntropyScalarLogits",
       MakeOp(OpKind::kCrossEntropy),
       {F32({}, {0}), I32({}, {0})},
       "cross_entropy: logits must have a class axis [..., C], got f32[]"},
      {"TopKTooMany",
       TopKOf(4),
       {Arange({2, 3})},
       "top_k: k = 4 exceeds the last axis of f32[2,3] (3)"},
      {"TopKOfScalar", TopKOf(1), {F32({}, {1})}, "top_k: x must have rank >= 1"},
      {"TopKZero", TopKOf(0), {Arange({3})}, "top_k: k must be >= 1, got 0"},
      {"AttentionRank",
       AttentionOp(true),
       {Arange({2, 2}), Arange({1, 1, 1, 2}), Arange({1, 1, 1, 2})},
       "attention: q must be [B, T, N, H], got f32[2,2]"},
      {"AttentionValueShape",
       AttentionOp(true),
       {Arange({1, 1, 1, 2}), Arange({1, 2, 1, 2}), Arange({1, 1, 1, 2})},
       "attention: v must have k's shape [B, S, K, H] [1,2,1,2], got f32[1,1,1,2]"},
      {"AttentionHeadDims",
       AttentionOp(false),
       {Arange({1, 1, 1, 4}), Arange({1, 2, 1, 2}), Arange({1, 2, 1, 2})},
       "attention: q f32[1,1,1,4] and k f32[1,2,1,2] must agree in B (dimension 0) and H "
       "(dimension 3)"},
      {"AttentionGroups",
       AttentionOp(false),
       {Arange({1, 1, 3, 2}), Arange({1, 2, 2, 2}), Arange({1, 2, 2, 2})},
       "attention: the query heads N = 3 must be a multiple of the key/value heads K = 2"},
      {"AttentionDtypes",
       AttentionOp(false),
       {A(bf16, {1, 1, 1, 2}, {0, 0}), Arange({1, 2, 1, 2}), A(bf16, {1, 2, 1, 2}, {0, 0, 0, 0})},
       "attention: q must be a float and k and v share one float dtype, got bf16, f32, bf16"},
      {"AttentionCausalNeedsTAtMostS",
       AttentionOp(true),
       {Arange({1, 3, 1, 2}), Arange({1, 2, 1, 2}), Arange({1, 2, 1, 2})},
       "attention: causal attention aligns the last query with the last key, so it needs T <= "
       "S, got T = 3, S = 2"},
      {"AttentionInputCount",
       AttentionOp(true),
       {Arange({1, 1, 1, 2}), Arange({1, 2, 1, 2})},
       "attention: takes 3 input(s), got 2"},
      {"RepeatCountsOnePerSlice",
       RepeatOf(0, 4),
       {Arange({3, 2}), I32({2}, {1, 1})},
       "repeat: repeats must be i32[3] (one count per slice of f32[3,2] along axis 0), got "
       "i32[2]"},
      {"RepeatCountsAreI32",
       RepeatOf(1, 4),
       {Arange({3, 2}), Arange({2})},
       "repeat: repeats must be i32[2] (one count per slice of f32[3,2] along axis 1), got "
       "f32[2]"},
      {"RepeatAxisOutOfRange",
       RepeatOf(2, 4),
       {Arange({3, 2}), I32({2}, {1, 1})},
       "repeat: axis 2 is out of range for f32[3,2]"},
  };
}

class ErrorTest : public testing::TestWithParam<ErrorCase> {};

// Refused with invalid_argument and a message naming what is wrong, with data or without
// (the shape rules need no values).
TEST_P(ErrorTest, RefusedWithItsMessage) {
  const ErrorCase& c = GetParam();
  std::vector<Array> shape_only;
  for (const Array& a : c.inputs) shape_only.push_back(Array::ShapeOnly(a.dtype(), a.shape()));
  for (const std::vector<Array>& inputs : {c.inputs, shape_only}) {
    try {
      Apply(c.op, inputs);
      ADD_FAILURE() << (inputs[0].has_data() ? "accepted" : "accepted without data");
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).substr(0, c.message.size()), c.message) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(NnOps, ErrorTest, testing::ValuesIn(ErrorCases()),
                         [](const testing::TestParamInfo<ErrorCase>& info) {
                           return info.param.name;
                         });

// A negative count is data: refused where the counts are known, with the count named.
TEST(RepeatTest, RefusesANegativeCount) {
  try {
    Apply(RepeatOf(0, 2), {F32({2}, {1, 2}), I32({2}, {1, -1})});
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "repeat: repeats[1] is -1: counts must be >= 0");
  }
}

// An op on shape-only inputs, and its FLOPs and bytes in closed form.
struct CostCase {
  std::string name;
  OpSpec op;
  std::vector<Array> inputs;
  double flops;
  double bytes;
};

std::ostream& operator<<(std::ostream& os, const CostCase& c) { return os << c.name; }

Array S(DType dtype, Shape shape) { return Array::ShapeOnly(dtype, std::move(shape)); }

std::vector<CostCase> CostCases() {
  const DType f32 = DType::kF32, bf16 = DType::kBF16, i32 = DType::kI32;
  // Attention shapes: B 2, T 8, N 4, H 16 and S 8, K 2 (bf16): q and the output 1024
  // elements, k and v 512 each: 3072 elements, 6144 bytes.
  const std::vector<Array> qkv = {S(bf16, {2, 8, 4, 16}), S(bf16, {2, 8, 2, 16}),
                                  S(bf16, {2, 8, 2, 16})};
  return {
      // 32 adds; reads 32 and writes 4 f32.
      {"SumAxis1", Reduce(OpKind::kSum, {1}), {S(f32, {4, 8})}, 32, (32 + 4) * 4},
      // 32 adds and one division.
      {"MeanAll", Reduce(OpKind::kMean, {}), {S(f32, {4, 8})}, 33, (32 + 1) * 4},
      {"MaxAxis0Bf16", Reduce(OpKind::kReduceMax, {0}), {S(bf16, {4, 8})}, 32, (32 + 8) * 2},
      // 5 per element.
      {"Softmax", MakeOp(OpKind::kSoftmax), {S(f32, {4, 8})}, 160, 256},
      // 5 per element and a log per row: 8 rows along axis 0.
      {"LogSoftmaxAxis0", Along(OpKind::kLogSoftmax, 0), {S(f32, {4, 8})}, 168, 256},
      // 4 per element and 3 per row; reads x and scale, writes y.
      {"RmsNorm",
       MakeOp(OpKind::kRmsNorm),
       {S(f32, {4, 8}), S(f32, {8})},
       4 * 32 + 3 * 4,
       (32 + 8 + 32) * 4},
      {"LayerNormBf16",
       MakeOp(OpKind::kLayerNorm),
       {S(bf16, {4, 8}), S(bf16, {8})},
       6 * 32 + 4 * 4,
       (32 + 8 + 32) * 2},
      // No arithmetic; the ids (40 B) and the rows taken (640 B) read, those rows written.
      {"Take", MakeOp(OpKind::kTake), {S(f32, {100, 16}), S(i32, {10})}, 0, 40 + 2 * 640},
      // An add per count (10) and per result row (50); the counts (40 B) and the rows taken
      // (50 x 64 B) read, those rows written.
      {"Repeat", RepeatOf(0, 50), {S(f32, {10, 16}), S(i32, {10})}, 10 + 50, 40 + 2 * 50 * 64},
      // 4 per logit, 4 per position, one division; reads logits and labels, writes 4 B.
      {"CrossEntropyBf16",
       MakeOp(OpKind::kCrossEntropy),
       {S(bf16, {4, 10}), S(i32, {4})},
       4 * 40 + 4 * 4 + 1,
       80 + 16 + 4},
      // 64 elements, each compared and sifted through log2(4) = 2 levels.
      {"TopK4", TopKOf(4), {S(f32, {4, 16})}, 64 * 3, 256 + 64 + 64},
      // 4 B N H T S = 4 * 2 * 4 * 16 * 64.
      {"Attention", AttentionOp(false), qkv, 32768, 6144},
      // Causal pairs T S - T (T - 1) / 2 = 64 - 28 = 36.
      {"AttentionCausal", AttentionOp(true), qkv, 4.0 * 2 * 4 * 16 * 36, 6144},
      // A decode step against a cache: T 2, S 8 causal: 16 - 1 = 15 pairs.
      {"AttentionCausalDecode",
       AttentionOp(true),
       {S(bf16, {2, 2, 4, 16}), S(bf16, {2, 8, 2, 16}), S(bf16, {2, 8, 2, 16})},
       4.0 * 2 * 4 * 16 * 15,
       (256 + 512 + 512 + 256) * 2},
  };
}

class CostTest : public testing::TestWithParam<CostCase> {};

TEST_P(CostTest, MatchesClosedForm) {
  const CostCase& c = GetParam();
  std::vector<Array> out = Apply(c.op, c.inputs);
  std::vector<const Array*> ins, outs;
  for (const Array& a : c.inputs) ins.push_back(&a);
  for (const Array& a : out) outs.push_back(&a);
  OpCost cost = LocalOpCost(c.op, ins, outs);
  EXPECT_DOUBLE_EQ(cost.flops, c.flops);
  EXPECT_DOUBLE_EQ(cost.bytes, c.bytes);
}

INSTANTIATE_TEST_SUITE_P(NnOps, CostTest, testing::ValuesIn(CostCases()),
                         [](const testing::TestParamInfo<CostCase>& info) {
                           return info.param.name;
                         });

TEST(NnOpsCostTest, CausalIsAboutHalf) {
  // S (S + 1) / 2 of S^2 pairs: the halving plus the diagonal.
  EXPECT_DOUBLE_EQ(AttentionPairs(1024, 1024, true) / AttentionPairs(1024, 1024, false),
                   1025.0 / 2048);
  // Decoding one token sees the whole cache: nothing to skip.
  EXPECT_DOUBLE_EQ(AttentionPairs(1, 4096, true), 4096);
}

// The kind-only overload prices attention at its default (causal), and the executor times an
// attention op on the roofline from the op's own attribute.
TEST(NnOpsCostTest, ExecutorTimesAttentionFromItsAttributes) {
  Array q = S(DType::kBF16, {1, 512, 8, 64}), kv = S(DType::kBF16, {1, 512, 8, 64});
  Array o = S(DType::kBF16, {1, 512, 8, 64});
  const std::vector<const Array*> ins = {&q, &kv, &kv}, outs = {&o};
  EXPECT_EQ(LocalOpCost(OpKind::kAttention, ins, outs).flops,
            LocalOpCost(AttentionOp(true), ins, outs).flops);

  Machine machine(BuildPreset("tpu-v5e", {2, 1}));
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal);
    ProgramBuilder b({{"dp", 2}});
    b.Input("q", {2, 512, 8, 64}, DType::kBF16, PartitionSpec{{{"dp"}}});
    OpSpec att = AttentionOp(causal);
    att.in = {"q", "q", "q"};
    att.out = {"o"};
    b.Add(att);
    b.Output("o", PartitionSpec{{{"dp"}}});
    ProgramSpec program = std::move(b).Build();
    RunResult r = RunProgram(machine, PlaceMesh(machine, program.mesh_axes), program, {});
    const Time want = machine.compute_model()->OpTime(
        OpKind::kAttention, LocalOpCost(AttentionOp(causal), ins, outs), DType::kBF16);
    EXPECT_EQ(r.ops.at(0).end - r.ops.at(0).start, want);
  }
}

// kernel: unfused writes the B N T S scores to HBM (Megatron-LM before FlashAttention): forward
// 6e + 1 bytes per score (e = 2 for bf16: the scores written, the softmax's read and write,
// dropout's read, write and 1-byte mask, p v's read), backward 9e + 1; the FLOPs are the same.
TEST(NnOpsCostTest, UnfusedAttentionPaysForItsScores) {
  Array q = S(DType::kBF16, {2, 256, 4, 64}), kv = S(DType::kBF16, {2, 512, 4, 64});
  Array o = S(DType::kBF16, {2, 256, 4, 64});
  const std::vector<const Array*> ins = {&q, &kv, &kv}, outs = {&o};
  OpSpec unfused = AttentionOp(true);
  unfused.kernel = "unfused";
  const OpCost flash = LocalOpCost(AttentionOp(true), ins, outs);
  const OpCost with = LocalOpCost(unfused, ins, outs);
  const double scores = 2.0 * 4 * 256 * 512;
  EXPECT_EQ(with.flops, flash.flops);
  EXPECT_DOUBLE_EQ(with.bytes - flash.bytes, scores * 13);
  Array g = o;
  const std::vector<const Array*> grad_ins = {&g, &q, &kv, &kv}, grad_outs = {&q, &kv, &kv};
  OpSpec grad = unfused;
  grad.kind = OpKind::kAttentionGrad;
  OpSpec grad_flash = AttentionOp(true);
  grad_flash.kind = OpKind::kAttentionGrad;
  EXPECT_DOUBLE_EQ(LocalOpCost(grad, grad_ins, grad_outs).bytes -
                       LocalOpCost(grad_flash, grad_ins, grad_outs).bytes,
                   scores * 19);
  // The fused kernel's FLOPs run at the attention efficiency, the unfused ones' at the
  // matmul efficiency (cuBLAS's batched products).
  EXPECT_TRUE(flash.fused_attention);
  EXPECT_FALSE(with.fused_attention);
  EXPECT_TRUE(LocalOpCost(grad_flash, grad_ins, grad_outs).fused_attention);
  EXPECT_FALSE(LocalOpCost(grad, grad_ins, grad_outs).fused_attention);
}

// kernel: mmha reads a kv head's keys and values once per query head: with 8 query heads over
// 2 kv heads (groups of 4), 3 more reads of k and v than flash's one; a cache in f8e4m3 read
// as stored (1 B an element) beside bf16 queries. FLOPs unchanged.
TEST(NnOpsCostTest, MmhaReadsTheCacheOncePerQueryHead) {
  Array q = S(DType::kBF16, {4, 1, 8, 64}), kv = S(DType::kF8E4M3, {4, 1024, 2, 64});
  Array o = S(DType::kBF16, {4, 1, 8, 64});
  const std::vector<const Array*> ins = {&q, &kv, &kv}, outs = {&o};
  OpSpec mmha = AttentionOp(true);
  mmha.kernel = "mmha";
  const OpCost flash = LocalOpCost(AttentionOp(true), ins, outs);
  const OpCost with = LocalOpCost(mmha, ins, outs);
  EXPECT_EQ(with.flops, flash.flops);
  EXPECT_DOUBLE_EQ(flash.bytes, 2.0 * 4 * 8 * 64 * 2 + 2.0 * 4 * 1024 * 2 * 64 * 1);
  EXPECT_DOUBLE_EQ(with.bytes - flash.bytes, 3 * 2.0 * 4 * 1024 * 2 * 64 * 1);
}

// take_shard in a shard_map body: each device's block of an [8, 4] table split over Y takes the
// rows of its ids and psum assembles jnp.take of the whole table; a group whose blocks do not
// make `size` rows is refused when the program is lowered.
TEST(TakeShardTest, BlocksSumToTheWholeTake) {
  Machine machine(BuildPreset("tpu-v5e", {2, 1}));
  auto program = [](int64_t size) {
    ProgramBuilder b({{"Y", 2}});
    InitSpec arange;
    arange.kind = InitSpec::Kind::kArange;
    b.Input("table", {8, 4}, DType::kF32, PartitionSpec{{{"Y"}}}, arange);
    ArraySpec ids;
    ids.name = "ids";
    ids.shape = {4};
    ids.dtype = DType::kI32;
    ids.init.kind = InitSpec::Kind::kValue;
    ids.init.values = {7, 0, -3, 4};
    b.Input(std::move(ids));
    OpSpec take;
    take.kind = OpKind::kTakeShard;
    take.in = {"table", "ids"};
    take.out = {"part"};
    take.axis_name = {"Y"};
    take.size = size;
    b.Add(take);
    OpSpec psum;
    psum.kind = OpKind::kPsum;
    psum.in = {"part"};
    psum.out = {"e"};
    psum.axis_name = {"Y"};
    b.Add(psum);
    b.Output("e", PartitionSpec{});
    return std::move(b).Build();
  };
  const ProgramSpec good = program(8);
  RunConfig config;
  config.numerics = true;
  const RunResult r = RunProgram(machine, PlaceMesh(machine, good.mesh_axes), good, config);
  // Rows 7, 0, 5 (-3 from the end) and 4 of arange(32) as [8, 4].
  const std::vector<float> want = {28, 29, 30, 31, 0, 1, 2, 3, 20, 21, 22, 23, 16, 17, 18, 19};
  const Array& e = r.outputs.at("e");
  for (int64_t i = 0; i < e.size(); ++i) EXPECT_EQ(e.at(i), want[static_cast<size_t>(i)]) << i;
  const ProgramSpec bad = program(16);
  try {
    RunProgram(machine, PlaceMesh(machine, bad.mesh_axes), bad, config);
    ADD_FAILURE() << "a table of 2 blocks of 4 rows is not 16 rows";
  } catch (const SpecError& err) {
    EXPECT_NE(std::string(err.what()).find("do not make a table of size 16"), std::string::npos)
        << err.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The registry entries.

TEST(NnOpsRegistryTest, EntriesComputeAndAreNotElementwise) {
  const std::vector<std::string> names = {"sum",           "mean",     "reduce_max", "softmax",
                                          "log_softmax",   "rms_norm", "layer_norm", "take",
                                          "cross_entropy", "top_k",    "attention",  "repeat"};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const OpDef* def = FindOp(name);
    ASSERT_NE(def, nullptr);
    EXPECT_TRUE(IsNnOp(def->kind));
    EXPECT_EQ(def->stream, OpStream::kCompute);
    EXPECT_FALSE(def->elementwise);
    EXPECT_FALSE(def->global_only);  // Local ops: shard_map bodies use them too.
    EXPECT_FALSE(def->takes_axis_name);
    for (const AttrDef& attr : def->attrs) EXPECT_NE(std::string(attr.doc), "") << attr.name;
  }
  EXPECT_EQ(FindOp("attention")->arity, OpArity::kThree);
  EXPECT_EQ(FindOp("rms_norm")->arity, OpArity::kTwo);
  EXPECT_EQ(FindOp("repeat")->arity, OpArity::kTwo);
  EXPECT_EQ(FindOp("top_k")->outputs, 2);
  EXPECT_EQ(FindAttr(*FindOp("sum"), "axis")->type, AttrType::kAxisList);
  EXPECT_EQ(FindAttr(*FindOp("softmax"), "axis")->type, AttrType::kInt);
  EXPECT_FALSE(IsNnOp(OpKind::kMax));
  EXPECT_EQ(DefaultEps(OpKind::kRmsNorm), 1e-6);
  EXPECT_EQ(DefaultEps(OpKind::kLayerNorm), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// Error bounds in the numerics check.

// A program on a 4-device data-parallel mesh: every op of nn_ops.h on y = pmax of x @
// all_gather(w) (an overlapped allgather_matmul: each device adds four partial products
// rounded to the dtype in its own order, the reference rounds one matmul; pmax makes the
// devices agree), so y and everything after it differ a little from the reference; or, when
// `exact`, on x itself.
ProgramSpec EveryOpProgram(DType dtype, bool exact) {
  ProgramBuilder b({{"dp", 4}});
  InitSpec normal;
  normal.kind = InitSpec::Kind::kNormal;
  normal.seed = 5;
  b.Input("x", {4, 32}, dtype, PartitionSpec{}, normal);
  normal.seed = 7;
  b.Input("w", {32, 32}, dtype, PartitionSpec{{{"dp"}}}, normal);
  normal.seed = 6;
  b.Input("scale", {32}, dtype, PartitionSpec{}, normal);
  InitSpec ids;
  ids.kind = InitSpec::Kind::kValue;
  ids.values = {3, 0, -1};
  b.Input("ids", {3}, DType::kI32, PartitionSpec{}, ids);
  InitSpec labels;
  labels.kind = InitSpec::Kind::kValue;
  labels.values = {31, 0, 7, 2};
  b.Input("labels", {4}, DType::kI32, PartitionSpec{}, labels);
  auto add = [&](OpSpec op, std::vector<std::string> in, std::vector<std::string> out) {
    op.in = std::move(in);
    op.out = std::move(out);
    b.Add(op);
  };
  const std::string x = exact ? "x" : "y";
  if (!exact) {
    OpSpec matmul = MakeOp(OpKind::kAllgatherMatmul);
    matmul.axis_name = {"dp"};
    matmul.variant = "unidirectional";
    add(matmul, {"x", "w"}, {"partial"});
    b.Reduce(OpKind::kPmax, "partial", {"dp"}, "y");  // One of the devices' variants: replicated.
  }
  add(Reduce(OpKind::kSum, {1}), {x}, {"sum"});
  add(Reduce(OpKind::kMean, {}), {x}, {"mean"});
  OpSpec max = MakeOp(OpKind::kMax);  // Read as reduce_max.
  max.axes = {0};
  add(max, {x}, {"max"});
  add(MakeOp(OpKind::kSoftmax), {x}, {"softmax"});
  add(Along(OpKind::kLogSoftmax, 0), {x}, {"log_softmax"});
  add(MakeOp(OpKind::kRmsNorm), {x, "scale"}, {"rms_norm"});
  add(MakeOp(OpKind::kLayerNorm), {x, "scale"}, {"layer_norm"});
  add(MakeOp(OpKind::kTake), {x, "ids"}, {"take"});
  add(MakeOp(OpKind::kCrossEntropy), {x, "labels"}, {"cross_entropy"});
  add(TopKOf(5), {x}, {"top_values", "top_indices"});
  OpSpec reshape = MakeOp(OpKind::kReshape);
  reshape.shape = {1, 4, 2, 16};
  add(reshape, {x}, {"q"});
  reshape.shape = {1, 8, 1, 16};
  add(reshape, {x}, {"kv"});
  add(AttentionOp(true), {"q", "kv", "kv"}, {"attention"});
  // Scores of order 1 (y / 20), and exact values: only the probabilities carry y's error.
  OpSpec shrink = MakeOp(OpKind::kMul);
  shrink.scalar = 0.05;
  add(shrink, {x}, {"small"});
  add(reshape, {"small"}, {"small_kv"});
  reshape.shape = {1, 4, 2, 16};
  add(reshape, {"small"}, {"small_q"});
  reshape.shape = {1, 8, 1, 16};
  add(reshape, {"x"}, {"v"});
  add(AttentionOp(false), {"small_q", "small_kv", "v"}, {"attention_scores"});
  for (const char* name :
       {"sum", "mean", "max", "softmax", "log_softmax", "rms_norm", "layer_norm", "take",
        "cross_entropy", "top_values", "top_indices", "attention", "attention_scores"}) {
    b.Output(name, PartitionSpec{});
  }
  if (!exact) b.Output("y", PartitionSpec{});
  return std::move(b).Build();
}

// Runs `program` with data on 4 TPU v5e chips and returns the check of its outputs.
NumericsReport RunAndCheck(const ProgramSpec& program) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, program, config);
  return CheckNumerics(r.outputs, mesh, program, "", &r.inputs);
}

std::map<std::string, double> Bounds(const ProgramSpec& program) {
  std::map<std::string, double> bounds;
  ReferenceOutputs(Mesh(program.mesh_axes, {0, 1, 2, 3}), program, "", nullptr, &bounds);
  return bounds;
}

TEST(NnOpsNumericsTest, ExactInputsGiveExactResults) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ProgramSpec program = EveryOpProgram(dtype, /*exact=*/true);
    for (const auto& [name, bound] : Bounds(program)) EXPECT_EQ(bound, 0.0) << name;
    NumericsReport r = RunAndCheck(program);
    EXPECT_TRUE(r.passed) << r.worst_output;
    EXPECT_EQ(r.max_abs_error, 0.0);
  }
}

TEST(NnOpsNumericsTest, InexactInputsPassWithinFiniteBounds) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    ProgramSpec program = EveryOpProgram(dtype, /*exact=*/false);
    std::map<std::string, double> bounds = Bounds(program);
    const double y = bounds.at("y");
    ASSERT_GT(y, 0.0);
    for (const auto& [name, bound] : bounds) {
      EXPECT_GT(bound, 0.0) << name;
      EXPECT_TRUE(std::isfinite(bound)) << name;
    }
    // Closed forms of the propagation: the max and the top values move no more than y; the
    // indices of inexact values may be any of the 32.
    EXPECT_LE(bounds.at("max"), y);
    EXPECT_LE(bounds.at("top_values"), y);
    EXPECT_EQ(bounds.at("top_indices"), 31.0);
    // softmax moves at most half as far as its input, plus one rounding of values <= 1.
    EXPECT_LE(bounds.at("softmax"), y / 2 + 2 * std::ldexp(1.0, dtype == DType::kF32 ? -24 : -8));
    NumericsReport r = RunAndCheck(program);
    EXPECT_TRUE(r.passed) << r.worst_output << ": " << r.max_abs_error << " > " << r.tolerance;
    EXPECT_GT(r.max_abs_error, 0.0);  // The run really differs from the reference.
  }
}

// A row far smaller than its error's bound (1e-30 beside values near 1) normalized with eps 0:
// its scale may be anything, so no finite bound holds; Flax's eps keeps the bound finite.
TEST(NnOpsNumericsTest, NormOfATinyRowIsUnbounded) {
  ProgramBuilder b({{"dp", 4}});
  InitSpec rows;  // Each device's [2, 4] block: a row near 1, a row near 1e-30.
  rows.kind = InitSpec::Kind::kValue;
  for (int i = 0; i < 32; ++i) {
    rows.values.push_back((i / 4) % 2 == 0 ? 1.0f + 0.1f * static_cast<float>(i % 7)
                                           : 1e-30f * static_cast<float>(i % 5 + 1));
  }
  b.Input("x", {8, 4}, DType::kF32, PartitionSpec{{{"dp"}}}, rows);
  InitSpec ones;
  ones.kind = InitSpec::Kind::kOnes;
  b.Input("scale", {4}, DType::kF32, PartitionSpec{}, ones);
  const std::string xs = b.Reduce(OpKind::kPsum, "x", {"dp"});
  OpSpec norm = Along(OpKind::kRmsNorm, -1, 0.0);
  norm.in = {xs, "scale"};
  norm.out = {"y"};
  b.Add(norm);
  OpSpec norm_eps = MakeOp(OpKind::kRmsNorm);  // eps 1e-6 keeps it finite.
  norm_eps.in = {xs, "scale"};
  norm_eps.out = {"z"};
  b.Add(norm_eps);
  b.Output("y", PartitionSpec{});
  b.Output("z", PartitionSpec{});
  ProgramSpec program = std::move(b).Build();
  std::map<std::string, double> bounds = Bounds(program);
  EXPECT_EQ(bounds.at("y"), kInf);
  EXPECT_TRUE(std::isfinite(bounds.at("z")));
  EXPECT_TRUE(RunAndCheck(program).passed);
}

}  // namespace
}  // namespace shardsim
