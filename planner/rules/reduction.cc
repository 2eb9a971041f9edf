// Reductions (jnp.sum, jnp.mean, jnp.max over axes): dimensions kept keep their splits; a
// reduced dimension split over mesh axes A leaves each device the reduction of its block, so
// the result is a partial sum over A (sum), a partial sum of n-times-too-large means over A
// (mean: scaled by 1/n, n the positions A spans, since every block has the same count), or a
// maximum still to be taken over A (max: pmax over A, exact).
#include <algorithm>

#include "planner/rules/sharding_rule.h"

namespace shardsim::planner {

std::vector<Strategy> ReductionRule(const RuleContext& ctx, bool explicit_mode) {
  const size_t rank = ctx.in_shapes[0].size();
  std::vector<bool> reduced(rank, ctx.op.axes.empty());
  for (int64_t a : ctx.op.axes) reduced[static_cast<size_t>(NormalAxis(a, rank))] = true;
  const bool is_max = ctx.op.kind == OpKind::kReduceMax;
  Strategy s;
  // max is not linear: partial sums are summed first.
  s.operands = {is_max ? Reduced(ctx.in[0]) : ctx.in[0]};
  ValueSharding result;
  std::vector<int> over;  // Axes splitting reduced dimensions.
  for (size_t d = 0; d < rank; ++d) {
    const std::vector<int>& split = ctx.in[0].dims[d];
    if (!reduced[d]) {
      result.dims.push_back(split);
      continue;
    }
    over.insert(over.end(), split.begin(), split.end());
    if (ctx.op.keepdims) result.dims.emplace_back();  // Size 1: whole.
  }
  std::sort(over.begin(), over.end());
  if (is_max) {
    s.result_max_over = over;
  } else {
    result.partial = s.operands[0].partial;
    result.partial.insert(result.partial.end(), over.begin(), over.end());
    std::sort(result.partial.begin(), result.partial.end());
    if (ctx.op.kind == OpKind::kMean) {
      s.result_scale = 1.0 / static_cast<double>(AxesSize(over, ctx.axes));
    }
  }
  s.results = {result};
  s.why = over.empty() ? "reduced dimensions whole" : "each device reduces its block";
  return {s};
}

}  // namespace shardsim::planner
