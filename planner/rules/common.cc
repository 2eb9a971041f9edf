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

ShardingRule FindShardingRule(OpKind kind) {
  if (Op(kind).elementwise) return &ElementwiseRule;
  switch (kind) {
    case OpKind::kMatmul:
    case OpKind::kEinsum:
      return &ContractionRule;
    case OpKind::kTranspose:
      return &TransposeRule;
    case OpKind::kReshape:
      return &ReshapeRule;
    case OpKind::kFullLike:  // Shaped like its input: laid out like it too.
      return &ElementwiseRule;
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
