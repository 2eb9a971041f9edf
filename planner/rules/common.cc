#include <algorithm>

#include "collectives/ir/op_registry.h"
#include "planner/rules/sharding_rule.h"

namespace shardsim::planner {

std::string OperandType(const RuleContext& ctx, size_t i) {
  return FormatType(ctx.in_dtypes.at(i), ctx.in_shapes.at(i), ctx.in.at(i), ctx.axes);
}

bool UsesAxis(const ValueSharding& s, int a) {
  for (const std::vector<int>& dim : s.dims) {
    if (std::find(dim.begin(), dim.end(), a) != dim.end()) return true;
  }
  return std::find(s.partial.begin(), s.partial.end(), a) != s.partial.end();
}

ValueSharding Unsplit(ValueSharding s, int dim) {
  s.dims.at(static_cast<size_t>(dim)).clear();
  return s;
}

ValueSharding Reduced(ValueSharding s) {
  s.partial.clear();
  return s;
}

int NormalAxis(int64_t axis, size_t rank) {
  return static_cast<int>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis);
}

int64_t AxesSize(const std::vector<int>& mesh_axes, const std::vector<MeshAxis>& axes) {
  int64_t n = 1;
  for (int a : mesh_axes) n *= axes.at(static_cast<size_t>(a)).size;
  return n;
}

bool AxesDistinct(const std::vector<std::vector<int>>& dims) {
  std::vector<int> used;
  for (const std::vector<int>& dim : dims) used.insert(used.end(), dim.begin(), dim.end());
  std::sort(used.begin(), used.end());
  return std::adjacent_find(used.begin(), used.end()) == used.end();
}

void Refuse(const RuleContext& ctx, size_t i, const std::string& what) {
  throw RuleError(std::string(OpKindName(ctx.op.kind)) + " of " + OperandType(ctx, i) + ": " +
                  what + "; reshard it first");
}

ShardingRule FindShardingRule(OpKind kind) {
  if (Op(kind).elementwise) return &ElementwiseRule;
  switch (kind) {
    case OpKind::kMoveToHost:  // A copy to the other memory: the layout stays.
    case OpKind::kMoveToDevice:
      return &HostCopyRule;
    case OpKind::kMatmul:
    case OpKind::kEinsum:
      return &ContractionRule;
    case OpKind::kTranspose:
      return &TransposeRule;
    case OpKind::kReshape:
      return &ReshapeRule;
    case OpKind::kFullLike:
      return &FullLikeRule;
    case OpKind::kUnaryGrad:
    case OpKind::kMaxGrad:
      return &ElementwiseRule;
    case OpKind::kSum:
    case OpKind::kMean:
    case OpKind::kReduceMax:
      return &ReductionRule;
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax:
    case OpKind::kSoftmaxGrad:
    case OpKind::kLogSoftmaxGrad:
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad:
    case OpKind::kTopK:
    case OpKind::kTopKGrad:
    case OpKind::kCrossEntropy:
    case OpKind::kCrossEntropyGrad:
    case OpKind::kReduceMaxGrad:
    case OpKind::kTakeGrad:
    case OpKind::kAttention:
    case OpKind::kAttentionGrad:
    case OpKind::kOneHot:
    case OpKind::kMoeRoute:
    case OpKind::kRaggedDot:
    case OpKind::kRaggedDotRhsGrad:
    case OpKind::kCumsum:
    case OpKind::kArgsort:
    case OpKind::kRepeat:
      return &MappedRule;
    case OpKind::kTake:
      return &TakeRule;
    case OpKind::kBroadcastInDim:
      return &BroadcastRule;
    case OpKind::kConcatenate:
    case OpKind::kSplit:
    case OpKind::kSlice:
    case OpKind::kPad:
      return &AlongAxisRule;
    default:
      return nullptr;
  }
}

}  // namespace shardsim::planner
