#include "collectives/ir/op_registry.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace shardsim {
namespace {

using A = OpArity;
using S = OpStream;
using C = CollectiveKind;
using R = ReduceOp;
using T = AttrType;

// An optional attribute.
AttrDef Opt(const char* name, AttrType type, AttrField field, const char* doc,
            const char* expected = nullptr) {
  return AttrDef{name, type, false, field, {}, expected, doc};
}

// A required attribute.
AttrDef Req(const char* name, AttrType type, AttrField field, const char* doc,
            const char* expected = nullptr) {
  return AttrDef{name, type, true, field, {}, expected, doc};
}

// An optional kOneOf attribute.
AttrDef OneOf(const char* name, AttrField field, std::vector<const char*> values, const char* doc) {
  return AttrDef{name, T::kOneOf, false, field, std::move(values), nullptr, doc};
}

// A contraction's preferred_element_type, when given, names a dtype.
std::string CheckElementType(const OpSpec& op) {
  const std::optional<DType> dtype = ParseDType(op.dtype);
  if (op.dtype.empty() || (dtype && *dtype != DType::kI32)) return "";
  std::string names;
  for (const std::string& n : DTypeNames()) {
    if (ParseDType(n) != DType::kI32) names += (names.empty() ? "" : ", ") + n;
  }
  return "preferred_element_type must be a floating type: one of " + names + ", got '" + op.dtype +
         "'";
}

// einsum's spec names exactly two operands.
std::string CheckEinsumSpec(const OpSpec& op) {
  const std::string operands = op.spec.substr(0, op.spec.find("->"));
  const size_t count = std::count(operands.begin(), operands.end(), ',') + 1;
  if (!op.spec.empty() && count == 2) return "";
  return "expected an einsum spec with two operands like \"bd,df->bf\", got \"" + op.spec + "\"";
}

// eps is a finite number >= 0 (rsqrt(var + eps) must stay defined where var is 0 or more).
std::string CheckEps(const OpSpec& op) {
  if (op.eps && std::isfinite(*op.eps) && *op.eps >= 0) return "";
  std::ostringstream got;
  if (op.eps) got << *op.eps;
  return "eps must be a finite number >= 0, got " + (op.eps ? got.str() : "none");
}

std::vector<OpDef> MakeRegistry() {
  const AttrDef tiled = Opt("tiled", T::kBool, &OpSpec::tiled,
                            "Concatenate blocks along the dimension instead of stacking");
  const AttrDef scatter_dimension = Opt("scatter_dimension", T::kInt, &OpSpec::scatter_dimension,
                                        "Dimension the result is scattered along (default 0)");
  const AttrDef axis = Opt("axis", T::kInt, &OpSpec::axis, "The dimension it works along");
  const AttrDef scalar =
      Opt("scalar", T::kNumber, &OpSpec::scalar, "The second operand as a number, with one input");
  const AttrDef variant =
      OneOf("variant", &OpSpec::variant, {"blocking", "unidirectional", "bidirectional"},
            "How communication overlaps the matmuls (default blocking)");
  const std::vector<AttrDef> binary = {scalar};
  std::vector<const char*> dtype_names;  // DTypeNames(), whose strings live on.
  for (const std::string& name : DTypeNames()) dtype_names.push_back(name.c_str());
  const AttrDef dtype{
      "dtype", T::kOneOf, true, &OpSpec::dtype, dtype_names, nullptr, "The result's element type"};
  // jax.lax.dot_general's preferred_element_type: the result's type, the product accumulated
  // in f32 (an FP8 GEMM with a bf16 result; FLOPs priced at the operands' rate).
  const std::vector<AttrDef> contraction = {
      AttrDef{"preferred_element_type",
              T::kString,
              false,
              &OpSpec::dtype,
              {},
              nullptr,
              "The result's element type (default: the operands', promoted)",
              CheckElementType}};
  // The array ops of global programs (collectives/nn_ops.h).
  const std::vector<AttrDef> reduction = {
      Opt("axis", T::kAxisList, &OpSpec::axes, "The axis or axes reduced (default: all)",
          "an axis or a list of axes like [0, -1]"),
      Opt("keepdims", T::kBool, &OpSpec::keepdims, "Keep reduced axes with size 1")};
  const AttrDef norm_axis =
      Opt("axis", T::kInt, &OpSpec::norm_axis, "The axis normalized over (default -1, the last)");
  const AttrDef eps{"eps",
                    T::kNumber,
                    false,
                    &OpSpec::eps,
                    {},
                    nullptr,
                    "Added to the variance (default 1e-6 rms_norm, 1e-5 layer_norm, as Flax)",
                    CheckEps};
  const AttrDef attention_kernel =
      OneOf("kernel", &OpSpec::kernel, {"flash", "unfused", "mmha"},
            "flash (scores stay on chip, the default), unfused (scores written to HBM) or mmha "
            "(each query head reads its kv head's keys and values from HBM)");
  const AttrDef expected_rows =
      Opt("expected_rows", T::kNonNegativeInt, &OpSpec::expected_rows,
          "Timing without data: the rows the groups fill (default 0: all of lhs's rows)");
  const std::vector<AttrDef> moe_route = {
      Req("experts", T::kPositiveInt, &OpSpec::experts, "The experts tokens are routed to"),
      Req("capacity", T::kPositiveInt, &OpSpec::capacity,
          "Slots per expert per group; assignments beyond them are dropped"),
      OneOf("priority", &OpSpec::priority, {"token", "choice"},
            "Which assignments take the slots first: token (each token's k choices in turn, "
            "MaxText) or choice (every token's first choice, then the second: GShard)"),
      dtype};
  // name, visible, arity, multi-output, stream, collective, reduce, axis_name, attrs,
  // elementwise, exactly-one-of groups, output count, global only, outputs, written as. One row
  // per op, laid out by hand.
  // clang-format off
  return {
      {OpKind::kPsum, "psum", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kSum, true,
       {}},
      {OpKind::kPmean, "pmean", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kSum, true,
       {}},
      {OpKind::kPmax, "pmax", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kMax, true,
       {}},
      {OpKind::kPmin, "pmin", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kMin, true,
       {}},
      {OpKind::kPsumScatter, "psum_scatter", true, A::kOne, false, S::kCollective,
       C::kReduceScatter, R::kSum, true, {scatter_dimension, tiled}},
      {OpKind::kAllGather, "all_gather", true, A::kOne, false, S::kCollective, C::kAllGather,
       R::kSum, true, {Opt("axis", T::kInt, &OpSpec::axis, "Dimension gathered along"), tiled}},
      {OpKind::kAllToAll, "all_to_all", true, A::kOne, false, S::kCollective, C::kAllToAll,
       R::kSum, true,
       {Req("split_axis", T::kInt, &OpSpec::split_axis, "Dimension split into blocks to send"),
        Req("concat_axis", T::kInt, &OpSpec::concat_axis,
            "Dimension the received blocks join along"),
        tiled}},
      {OpKind::kPpermute, "ppermute", true, A::kOne, false, S::kCollective, C::kPermute, R::kSum,
       true,
       {Opt("perm", T::kPerm, &OpSpec::perm, "(source, destination) pairs of group indices",
            "a list of [source, destination] pairs"),
        Opt("shift", T::kInt, &OpSpec::shift, "A ring shift by k along the named axes")},
       false,
       {{{"perm", "shift"}, "ppermute needs perm: [[src, dst], ...] or shift: k"}}},
      {OpKind::kAxisIndex, "axis_index", true, A::kNone, false, S::kFree, C::kAllReduce, R::kSum,
       true, {}},
      {OpKind::kMatmul, "matmul", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum, false,
       contraction},
      {OpKind::kEinsum, "einsum", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {AttrDef{"spec", T::kString, true, &OpSpec::spec, {}, nullptr,
                "The contraction, like \"bd,df->bf\"", CheckEinsumSpec},
        contraction[0]}},
      {OpKind::kAdd, "add", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       binary, true},
      {OpKind::kSub, "sub", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       binary, true},
      {OpKind::kMul, "mul", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       binary, true},
      {OpKind::kDiv, "div", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       binary, true},
      {OpKind::kMax, "max", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       binary, true},
      {OpKind::kRelu, "relu", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kGelu, "gelu", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kExp, "exp", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false, {}, true},
      {OpKind::kTanh, "tanh", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kNeg, "neg", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false, {}, true},
      // A reshape relabels the same buffer: no kernel runs.
      {OpKind::kReshape, "reshape", true, A::kOne, false, S::kFree, C::kAllReduce, R::kSum, false,
       {Req("shape", T::kShape, &OpSpec::shape, "The new shape; one size may be -1",
            "a list of sizes like [64, -1]")}},
      {OpKind::kTranspose, "transpose", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {Opt("axes", T::kIntList, &OpSpec::axes, "The permutation of dimensions (default: reverse)",
            "a list of axes like [1, 0]")}},
      {OpKind::kConcatenate, "concatenate", true, A::kAtLeastTwo, false, S::kCompute,
       C::kAllReduce, R::kSum, false, {axis}},
      {OpKind::kSplit, "split", true, A::kOne, true, S::kCompute, C::kAllReduce, R::kSum, false,
       {Req("sections", T::kPositiveInt, &OpSpec::sections, "Equal parts, one output each"),
        axis},
       false, {}, "sections"},
      {OpKind::kSlice, "slice", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {Req("start", T::kNonNegativeInt, &OpSpec::start, "First index taken along axis"),
        Req("size", T::kPositiveInt, &OpSpec::size, "Number of indices taken"), axis}},
      {OpKind::kAllgatherMatmul, "allgather_matmul", true, A::kTwo, false, S::kComposite,
       C::kAllGather, R::kSum, true,
       {OneOf("gather", &OpSpec::gather, {"lhs", "rhs"}, "The operand gathered (default rhs)"),
        Opt("axis", T::kInt, &OpSpec::axis,
            "The gathered operand's dimension (0: rhs contracting, lhs rows; 1: lhs "
            "contracting, rhs columns)"),
        variant}},
      {OpKind::kMatmulReduceScatter, "matmul_reduce_scatter", true, A::kTwo, false,
       S::kComposite, C::kReduceScatter, R::kSum, true, {scatter_dimension, variant}},
      // Internal ops of collective matmul loops: XLA fuses the slice into the consuming matmul
      // and writes the concatenation's blocks in place, so neither costs a kernel.
      // Also written by partitioned programs: the block of `sections` equal blocks along `axis`
      // that (block_scale * axis_index + block_offset) mod sections picks.
      {OpKind::kDynamicSlice, "dynamic_slice", true, A::kOne, false, S::kFree, C::kAllReduce,
       R::kSum, true,
       {Req("sections", T::kPositiveInt, &OpSpec::sections, "Equal blocks the axis is cut into"),
        Opt("axis", T::kInt, &OpSpec::axis, "The dimension it slices"),
        Opt("block_scale", T::kInt, &OpSpec::block_scale,
            "Block taken: block_scale * axis_index + block_offset, mod sections (default 1)"),
        Opt("block_offset", T::kInt, &OpSpec::block_offset, "See block_scale (default 0)")}},
      {OpKind::kDynamicConcat, "dynamic_concat", false, A::kAtLeastTwo, false, S::kFree,
       C::kAllReduce, R::kSum, true, {}},
      {OpKind::kSilu, "silu", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kLog, "log", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kSqrt, "sqrt", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kRsqrt, "rsqrt", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kSquare, "square", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {}, true},
      {OpKind::kAbs, "abs", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kSin, "sin", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kCos, "cos", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kConvert, "convert", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {dtype, Opt("saturate", T::kBool, &OpSpec::saturate,
                   "Clamp to the target's largest finite value first (FP8 casts; default false)")},
       true},
      {OpKind::kCustomCall, "custom_call", true, A::kOneOrMore, false, S::kCompute,
       C::kAllReduce, R::kSum, false,
       {Req("shape", T::kShape, &OpSpec::shape, "The result's shape",
            "a list of sizes like [64, 128]"),
        dtype,
        Opt("flops", T::kNumber, &OpSpec::flops, "Floating-point operations it costs"),
        Opt("bytes", T::kBytes, &OpSpec::bytes, "Bytes of HBM traffic it costs (\"2 MiB\")")}},
      {OpKind::kShardingConstraint, "sharding_constraint", true, A::kOne, false, S::kFree,
       C::kAllReduce, R::kSum, false,
       {Req("sharding", T::kSharding, &OpSpec::sharding, "The sharding the value must have here")},
       false, {}, nullptr, /*global_only=*/true},
      {OpKind::kReshard, "reshard", true, A::kOne, false, S::kFree, C::kAllReduce, R::kSum, false,
       {Req("sharding", T::kSharding, &OpSpec::sharding,
            "The new sharding (explicit mode's way to ask for a collective)")},
       false, {}, nullptr, /*global_only=*/true},
      {OpKind::kGrad, "grad", true, A::kNone, true, S::kFree, C::kAllReduce, R::kSum, false,
       {Req("of", T::kValueName, &OpSpec::of, "The scalar value differentiated (jax.grad's output)"),
        Req("wrt", T::kValueNames, &OpSpec::wrt,
            "The values it is differentiated with respect to, one output each",
            "a list of value names like [w1, w2]")},
       false, {}, "wrt", /*global_only=*/true},
      // Ops reverse mode emits (collectives/grad_ops.h).
      {OpKind::kFullLike, "full_like", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {Req("fill_value", T::kNumber, &OpSpec::fill_value,
            "The value of every element (shape and dtype are the input's)")}},
      {OpKind::kBroadcastInDim, "broadcast_in_dim", true, A::kOne, false, S::kCompute,
       C::kAllReduce, R::kSum, false,
       {Req("shape", T::kShape, &OpSpec::shape, "The result's shape",
            "a list of sizes like [8, 128]"),
        Req("broadcast_dimensions", T::kIntList, &OpSpec::broadcast_dimensions,
            "The result dimension of each input dimension, increasing",
            "a list of dimensions like [1]")}},
      {OpKind::kPad, "pad", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {axis, Opt("low", T::kNonNegativeInt, &OpSpec::low, "Zeros before, along axis"),
        Opt("high", T::kNonNegativeInt, &OpSpec::high, "Zeros after, along axis")}},
      {OpKind::kUnaryGrad, "unary_grad", true, A::kTwo, false, S::kCompute, C::kAllReduce,
       R::kSum, false,
       {AttrDef{"fn", T::kOneOf, true, &OpSpec::fn,
                {"relu", "gelu", "silu", "tanh", "sqrt", "rsqrt", "square", "abs", "sin", "cos"},
                nullptr, "The elementwise op f of in: [g, x]: the result is g * f'(x)"}},
       true},
      {OpKind::kMaxGrad, "max_grad", true, A::kThree, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {}, true},
      {OpKind::kSum, "sum", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       reduction},
      {OpKind::kMean, "mean", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       reduction},
      {OpKind::kReduceMax, "reduce_max", true, A::kOne, false, S::kCompute, C::kAllReduce,
       R::kSum, false, reduction, false, {}, nullptr, false, 1, /*written_as=*/"max"},
      {OpKind::kSoftmax, "softmax", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {norm_axis}},
      {OpKind::kLogSoftmax, "log_softmax", true, A::kOne, false, S::kCompute, C::kAllReduce,
       R::kSum, false, {norm_axis}},
      {OpKind::kRmsNorm, "rms_norm", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {norm_axis, eps}},
      {OpKind::kLayerNorm, "layer_norm", true, A::kTwo, false, S::kCompute, C::kAllReduce,
       R::kSum, false, {norm_axis, eps}},
      {OpKind::kTake, "take", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {Opt("axis", T::kInt, &OpSpec::axis, "The table axis the ids index (default 0)")}},
      {OpKind::kCrossEntropy, "cross_entropy", true, A::kTwo, false, S::kCompute, C::kAllReduce,
       R::kSum, false, {}},
      {OpKind::kTopK, "top_k", true, A::kOne, true, S::kCompute, C::kAllReduce, R::kSum, false,
       {Req("k", T::kPositiveInt, &OpSpec::k, "How many of the largest values (last axis) to keep")},
       false, {}, nullptr, false, /*outputs=*/2},
      {OpKind::kAttention, "attention", true, A::kThree, false, S::kCompute, C::kAllReduce,
       R::kSum, false,
       {Opt("causal", T::kBool, &OpSpec::causal,
            "Each query sees only the keys up to its position (default true)"),
        attention_kernel}},
      {OpKind::kOneHot, "one_hot", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {Req("num_classes", T::kPositiveInt, &OpSpec::num_classes,
            "The classes: the length of the new last axis"),
        dtype}},
      {OpKind::kMoeRoute, "moe_route", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false, moe_route},
      {OpKind::kReduceMaxGrad, "reduce_max_grad", true, A::kTwo, false, S::kCompute,
       C::kAllReduce, R::kSum, false, reduction},
      {OpKind::kSoftmaxGrad, "softmax_grad", true, A::kTwo, false, S::kCompute, C::kAllReduce,
       R::kSum, false, {norm_axis}},
      {OpKind::kLogSoftmaxGrad, "log_softmax_grad", true, A::kTwo, false, S::kCompute,
       C::kAllReduce, R::kSum, false, {norm_axis}},
      {OpKind::kRmsNormGrad, "rms_norm_grad", true, A::kThree, true, S::kCompute, C::kAllReduce,
       R::kSum, false, {norm_axis, eps}, false, {}, nullptr, false, /*outputs=*/2},
      {OpKind::kLayerNormGrad, "layer_norm_grad", true, A::kThree, true, S::kCompute,
       C::kAllReduce, R::kSum, false, {norm_axis, eps}, false, {}, nullptr, false, /*outputs=*/2},
      {OpKind::kTakeGrad, "take_grad", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {Opt("axis", T::kInt, &OpSpec::axis, "The table axis the ids index (default 0)"),
        Req("size", T::kPositiveInt, &OpSpec::size, "The table's length along axis")}},
      {OpKind::kCrossEntropyGrad, "cross_entropy_grad", true, A::kThree, false, S::kCompute,
       C::kAllReduce, R::kSum, false, {}},
      {OpKind::kTopKGrad, "top_k_grad", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {Req("size", T::kPositiveInt, &OpSpec::size, "The input's last axis length")}},
      {OpKind::kAttentionGrad, "attention_grad", true, A::kFour, true, S::kCompute, C::kAllReduce,
       R::kSum, false,
       {Opt("causal", T::kBool, &OpSpec::causal,
            "Each query sees only the keys up to its position (default true)"),
        attention_kernel},
       false, {}, nullptr, false, /*outputs=*/3},
      {OpKind::kRaggedAllToAll, "ragged_all_to_all", true, A::kSix, false, S::kCollective,
       C::kAllToAll, R::kSum, true,
       {Opt("expected_rows", T::kNonNegativeInt, &OpSpec::expected_rows,
            "Timing without data: the rows each pair moves (default 0: min(operand, output rows) "
            "/ group, a balanced routing)")}},
      {OpKind::kRaggedDot, "ragged_dot", true, A::kThree, false, S::kCompute, C::kAllReduce,
       R::kSum, false, {expected_rows}, false, {}, nullptr, false, 1, nullptr,
       /*cost_reads_data=*/true},
      {OpKind::kRaggedDotRhsGrad, "ragged_dot_rhs_grad", true, A::kThree, false, S::kCompute,
       C::kAllReduce, R::kSum, false, {expected_rows}, false, {}, nullptr, false, 1, nullptr,
       /*cost_reads_data=*/true},
      {OpKind::kTakeShard, "take_shard", true, A::kTwo, false, S::kCompute, C::kAllReduce,
       R::kSum, true,
       {Opt("axis", T::kInt, &OpSpec::axis, "The table axis the ids index (default 0)"),
        Req("size", T::kPositiveInt, &OpSpec::size, "The whole table's length along axis")}},
      {OpKind::kDevicePut, "device_put", true, A::kOne, false, S::kCollective, C::kPermute,
       R::kSum, false,
       {Req("sharding", T::kSharding, &OpSpec::sharding,
            "The layout on the destination mesh (`mesh:`)"),
        Opt("in_sharding", T::kSharding, &OpSpec::in_sharding,
            "A shard_map body's input layout on its own mesh (global programs know it)")}},
      {OpKind::kMoveToHost, "move_to_host", true, A::kOne, false, S::kHostTransfer,
       C::kAllReduce, R::kSum, false, {}},
      {OpKind::kMoveToDevice, "move_to_device", true, A::kOne, false, S::kHostTransfer,
       C::kAllReduce, R::kSum, false, {}},
      // Its outputs: as many as its body's (OutputCount); partitioning inlines the body. Not read
      // by attributes: C++ builds it with ProgramBuilder::ShardMap, and the run-file reader reads
      // its body and spec lists itself (ReadShardMap).
      {OpKind::kShardMap, "shard_map", false, A::kOneOrMore, true, S::kCompute, C::kAllReduce,
       R::kSum, false, {}, false, {}, nullptr, /*global_only=*/true},
      {OpKind::kCumsum, "cumsum", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {norm_axis, Opt("reverse", T::kBool, &OpSpec::reverse,
                       "Sum from the end of the axis (lax.cumsum's reverse; default false)")}},
      {OpKind::kArgsort, "argsort", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {norm_axis}},
      {OpKind::kRepeat, "repeat", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum,
       false,
       {Req("axis", T::kInt, &OpSpec::axis, "The axis whose slices repeat"),
        Req("total_repeat_length", T::kNonNegativeInt, &OpSpec::total_repeat_length,
            "The result's length along axis (cut, or filled with the last slice)")}},
  };
  // clang-format on
}

// "'x'" joined by ", " for messages.
std::string JoinValues(const std::vector<const char*>& values) {
  std::string text;
  for (const char* v : values) text += (text.empty() ? "" : ", ") + std::string(v);
  return text;
}

// Whether the field of `attr` holds a value in `op` that says it was given (a non-empty string
// or list, a set optional); integers and bools always count as given.
bool AttrGiven(const OpSpec& op, const AttrDef& attr) {
  return std::visit(
      [&](auto member) -> bool {
        const auto& v = op.*member;
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, bool> ||
                      std::is_same_v<V, PartitionSpec>) {
          return true;
        } else if constexpr (std::is_same_v<V, std::optional<int>> ||
                             std::is_same_v<V, std::optional<double>>) {
          return v.has_value();
        } else {
          return !v.empty();
        }
      },
      attr.field);
}

// Whether the field of `attr` in `op` differs from a default OpSpec's: how a C++-built op says
// it gives the attribute (ResolveOpKind).
bool AttrDiffersFromDefault(const OpSpec& op, const AttrDef& attr) {
  static const OpSpec kDefault;
  return std::visit([&](auto member) { return !(op.*member == kDefault.*member); }, attr.field);
}

// ResolveOp's rule: `named` (may be null) or the op written as its name, by which attributes
// given(attr) says the entry writes.
template <typename Given>
const OpDef* Resolve(std::string_view name, const OpDef* named, size_t inputs, const Given& given) {
  const OpDef* alias = OpWrittenAs(name);
  if (!alias || inputs != 1) return named;
  auto any_given = [&](const OpDef& def) {
    return std::any_of(def.attrs.begin(), def.attrs.end(), given);
  };
  if (any_given(*alias) && !(named && any_given(*named))) return alias;
  return named;
}

}  // namespace

const std::vector<OpDef>& OpRegistry() {
  static const std::vector<OpDef> registry = [] {
    std::vector<OpDef> r = MakeRegistry();
    // The table is indexed by OpKind: entry i must be kind i.
    for (size_t i = 0; i < r.size(); ++i) {
      if (static_cast<size_t>(r[i].kind) != i) {
        throw std::logic_error("internal error: op registry out of OpKind order at " +
                               std::string(r[i].name));
      }
    }
    return r;
  }();
  return registry;
}

void ThrowUnregisteredOpKind() {
  throw std::logic_error("internal error: OpKind without a registry entry");
}

const OpDef* FindOp(std::string_view name) {
  for (const OpDef& def : OpRegistry()) {
    if (def.user_visible && name == def.name) return &def;
  }
  return nullptr;
}

const OpDef* OpWrittenAs(std::string_view name) {
  for (const OpDef& def : OpRegistry()) {
    if (def.user_visible && def.written_as && name == def.written_as) return &def;
  }
  return nullptr;
}

const OpDef* ResolveOp(std::string_view name, size_t inputs, const std::vector<std::string>& keys) {
  return Resolve(name, FindOp(name), inputs, [&](const AttrDef& attr) {
    return std::find(keys.begin(), keys.end(), attr.name) != keys.end();
  });
}

OpKind ResolveOpKind(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  if (!def.user_visible) return op.kind;
  return Resolve(def.name, &def, op.in.size(),
                 [&](const AttrDef& attr) { return AttrDiffersFromDefault(op, attr); })
      ->kind;
}

std::vector<std::string> UserOpNames() {
  std::vector<std::string> names;
  for (const OpDef& def : OpRegistry()) {
    if (def.user_visible) names.emplace_back(def.name);
  }
  return names;
}

std::vector<std::string> OpKeys(OpKind kind) {
  const OpDef& def = Op(kind);
  std::vector<std::string> keys = {"op"};
  if (def.arity != OpArity::kNone) keys.push_back("in");
  keys.insert(keys.end(), {"out", "name", "where", "mesh"});
  if (def.takes_axis_name) keys.push_back("axis_name");
  for (const AttrDef& attr : def.attrs) keys.emplace_back(attr.name);
  if (def.stream == OpStream::kCollective || def.stream == OpStream::kComposite) {
    keys.push_back("algorithm");
  }
  return keys;
}

std::vector<std::string> AllOpKeys() {
  std::vector<std::string> all;
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    for (std::string& key : OpKeys(def.kind)) {
      if (std::find(all.begin(), all.end(), key) == all.end()) all.push_back(std::move(key));
    }
  }
  return all;
}

const AttrDef* FindAttr(const OpDef& def, std::string_view name) {
  for (const AttrDef& attr : def.attrs) {
    if (name == attr.name) return &attr;
  }
  return nullptr;
}

void SetAttr(OpSpec& op, const AttrDef& attr, const AttrValue& value) {
  std::visit(
      [&](auto member, const auto& v) {
        auto& field = op.*member;
        using F = std::decay_t<decltype(field)>;
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<F, V> ||
                      (std::is_same_v<F, std::optional<double>> && std::is_same_v<V, double>)) {
          field = v;
        } else if constexpr (std::is_same_v<F, std::optional<int>> && std::is_same_v<V, int64_t>) {
          if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
            throw std::logic_error("internal error: " + std::string(attr.name) +
                                   " out of int range");
          }
          field = static_cast<int>(v);
        } else {
          throw std::logic_error("internal error: attribute " + std::string(attr.name) +
                                 " read as a type its OpSpec field does not hold");
        }
      },
      attr.field, value);
}

int64_t IntAttr(const OpSpec& op, const AttrDef& attr) {
  return std::visit(
      [&](auto member) -> int64_t {
        const auto& v = op.*member;
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, int64_t>) {
          return v;
        } else if constexpr (std::is_same_v<V, std::optional<int>>) {
          return v.value_or(0);
        } else {
          throw std::logic_error("internal error: " + std::string(attr.name) +
                                 " is not an integer attribute");
        }
      },
      attr.field);
}

std::optional<AttrError> CheckAttrs(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  const std::string name = def.name;
  for (const AttrDef& attr : def.attrs) {
    const bool given = AttrGiven(op, attr);
    // Only a string, an optional or a list of value names can say "not given": another empty
    // list is a value ([] is a reshape to a scalar), and an integer's default is one.
    const bool tells_missing =
        std::holds_alternative<std::string OpSpec::*>(attr.field) ||
        std::holds_alternative<std::optional<int> OpSpec::*>(attr.field) ||
        std::holds_alternative<std::optional<double> OpSpec::*>(attr.field) ||
        attr.type == AttrType::kValueNames;
    if (attr.required && tells_missing && !given) {
      return AttrError{attr.name, name + " needs " + attr.name};
    }
    if (attr.type == AttrType::kPositiveInt || attr.type == AttrType::kNonNegativeInt) {
      const int64_t v = IntAttr(op, attr);
      const int64_t min = attr.type == AttrType::kPositiveInt ? 1 : 0;
      if (v < min) {
        return AttrError{attr.name, name + " needs " + attr.name + " >= " + std::to_string(min) +
                                        ", got " + std::to_string(v)};
      }
    }
    if (attr.type == AttrType::kOneOf) {
      const std::string& v = op.*std::get<std::string OpSpec::*>(attr.field);
      const bool allowed = std::any_of(attr.values.begin(), attr.values.end(),
                                       [&](const char* a) { return v == a; });
      if (!allowed) {
        return AttrError{attr.name, std::string(attr.name) + " must be one of " +
                                        JoinValues(attr.values) + ", got '" + v + "'"};
      }
    }
    if (attr.check && given) {
      std::string wrong = attr.check(op);
      if (!wrong.empty()) return AttrError{attr.name, std::move(wrong)};
    }
  }
  for (const ExactlyOneOf& group : def.exactly_one_of) {
    std::vector<const char*> given;
    for (const char* attr : group.names) {
      if (AttrGiven(op, *FindAttr(def, attr))) given.push_back(attr);
    }
    if (given.size() > 1) {
      return AttrError{given.back(),
                       "give either " + std::string(given[0]) + " or " + given[1] + ", not both"};
    }
  }
  return std::nullopt;
}

const char* ArityBlamesAttr(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  if (def.arity == OpArity::kBinary && op.in.size() == 2 && op.scalar) return "scalar";
  return nullptr;
}

namespace {

// A collective of one input: ragged_all_to_all (six inputs, always direct) is not swept and
// takes no run default.
bool OneInputCollective(const OpDef& def) {
  return def.user_visible && def.stream == OpStream::kCollective && def.arity == OpArity::kOne &&
         def.takes_axis_name;
}

}  // namespace

std::vector<std::string> CollectiveOpNames() {
  std::vector<std::string> names;
  for (const OpDef& def : OpRegistry()) {
    if (OneInputCollective(def)) names.emplace_back(def.name);
  }
  return names;
}

std::vector<std::string> CollectiveOpNames(CollectiveKind kind) {
  std::vector<std::string> names;
  for (const OpDef& def : OpRegistry()) {
    if (OneInputCollective(def) && def.collective == kind) {
      names.emplace_back(def.name);
    }
  }
  return names;
}

std::string NamedOnce(const OpSpec& op, const std::string& what) {
  const std::string named = std::string(Op(op.kind).name) + ": ";
  return what.rfind(named, 0) == 0 ? what : named + what;
}

int64_t OutputCount(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  // shard_map: its body's outputs (a program, not an attribute, gives them).
  if (op.kind == OpKind::kShardMap) {
    return op.body ? static_cast<int64_t>(op.body->outputs.size()) : 0;
  }
  if (!def.output_count) return def.outputs;
  const AttrDef& attr = *FindAttr(def, def.output_count);
  if (attr.type == AttrType::kValueNames) {
    return static_cast<int64_t>(
        (op.*std::get<std::vector<std::string> OpSpec::*>(attr.field)).size());
  }
  return IntAttr(op, attr);
}

std::string CheckOutputCount(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  const int64_t count = OutputCount(op);
  const size_t got = op.out.size();
  if (static_cast<int64_t>(got) == count) return "";
  const std::string name = def.name;
  const std::string names = std::to_string(got) + " names";
  if (!def.output_count) {
    if (count == 1) return name + " makes one output, got " + names;
    return name + " makes " + std::to_string(count) + " outputs, got " + names;
  }
  const AttrDef& attr = *FindAttr(def, def.output_count);
  if (attr.type == AttrType::kValueNames) {
    return name + " makes one output per " + attr.name + " entry (" + std::to_string(count) +
           "), got " + names;
  }
  return name + " makes " + std::to_string(count) + " outputs (" + attr.name + ": " +
         std::to_string(count) + "), got " + names;
}

std::string CheckMemoryKind(const OpSpec& op, const std::string& name, bool in_host) {
  if (op.kind == OpKind::kMoveToDevice) {
    return in_host ? ""
                   : "move_to_device: '" + name +
                         "' is in device memory already (move_to_host puts a value in host "
                         "memory)";
  }
  if (!in_host) return "";
  return std::string(Op(op.kind).name) + ": '" + name + "' is in host memory" +
         (op.kind == OpKind::kMoveToHost ? " already"
                                         : "; ops read device memory (move_to_device it first)");
}

std::string CheckArity(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  const size_t n = op.in.size();
  const std::string_view name = def.name;  // Made into a string only for a message.
  // "NAME takes WHAT, got N".
  auto takes = [&](const char* what) {
    return std::string(name) + " takes " + what + ", got " + std::to_string(n);
  };
  switch (def.arity) {
    case OpArity::kNone:
      return n == 0 ? "" : takes("no input");
    case OpArity::kOne:
      return n == 1 ? "" : takes("one input");
    case OpArity::kTwo:
      return n == 2 ? "" : takes("2 inputs (in: [a, b])");
    case OpArity::kThree:
      return n == 3 ? "" : takes("3 inputs (in: [a, b, c])");
    case OpArity::kFour:
      return n == 4 ? "" : takes("4 inputs (in: [a, b, c, d])");
    case OpArity::kSix:
      return n == 6 ? ""
                    : takes(
                          "6 inputs (in: [operand, output, input_offsets, send_sizes, "
                          "output_offsets, recv_sizes])");
    case OpArity::kBinary:
      if (n == 2 && op.scalar) return "scalar applies only with one input (in: a, scalar: 1.0)";
      if (n == 2 || (n == 1 && op.scalar)) return "";
      return takes("in: [a, b], or in: a with scalar:") + " input" + (n == 1 ? "" : "s") +
             (op.scalar ? "" : " and no scalar") +
             (OpWrittenAs(name) && n == 1 && !op.scalar
                  ? " (the reduction " + std::string(name) +
                        " of one input needs axis: or keepdims:, or is " + OpWrittenAs(name)->name +
                        ")"
                  : "");
    case OpArity::kAtLeastTwo:
      return n >= 2 ? "" : takes("at least 2 inputs");
    case OpArity::kOneOrMore:
      return n >= 1 ? "" : std::string(name) + " takes at least one input, got none";
  }
  return "";
}

}  // namespace shardsim
