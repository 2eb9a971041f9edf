// Ops that move data without arithmetic: transpose permutes the split dimensions; reshape
// carries a split through dimensions it keeps, merges (the major one's split) or splits (onto
// the major part); concatenate, split and slice need their axis whole.
#include <algorithm>

#include "planner/rules/sharding_rule.h"

namespace shardsim::planner {

std::vector<Strategy> TransposeRule(const RuleContext& ctx, bool explicit_mode) {
  const size_t rank = ctx.in_shapes[0].size();
  std::vector<int64_t> perm = ctx.op.axes;
  if (perm.empty()) {
    for (size_t d = 0; d < rank; ++d) perm.push_back(static_cast<int64_t>(rank - 1 - d));
  }
  Strategy s;
  s.operands = {ctx.in[0]};
  ValueSharding result = Replicated(static_cast<int>(rank));
  for (size_t d = 0; d < rank; ++d) {
    result.dims[d] = ctx.in[0].dims[static_cast<size_t>(NormalAxis(perm[d], rank))];
  }
  result.partial = ctx.in[0].partial;  // Linear.
  s.results = {result};
  s.why = "dimensions permuted";
  return {s};
}

std::vector<Strategy> ReshapeRule(const RuleContext& ctx, bool explicit_mode) {
  const Shape& in = ctx.in_shapes[0];
  const Shape& out = ctx.out_shapes[0];
  const ValueSharding& from = ctx.in[0];
  // Walk both shapes in groups of equal products: (input dims [i0, i1), output dims [o0, o1)).
  ValueSharding operand = from;
  ValueSharding result = Replicated(static_cast<int>(out.size()));
  result.partial = from.partial;  // Linear.
  bool gathered = false;
  size_t i = 0, o = 0;
  while (i < in.size() || o < out.size()) {
    size_t i1 = i, o1 = o;
    int64_t pi = 1, po = 1;
    if (i1 < in.size()) pi *= in[i1++];
    if (o1 < out.size()) po *= out[o1++];
    while (pi != po) {
      if (pi < po && i1 < in.size()) {
        pi *= in[i1++];
      } else if (o1 < out.size()) {
        po *= out[o1++];
      } else {
        pi = po;  // Trailing ones: nothing left to match.
      }
    }
    // The group's split: only its first (major) input dimension may be split, and the split
    // moves to the first output dimension of the group when that dimension divides by it.
    int64_t blocks = 1;
    if (i < i1) {
      for (int a : from.dims[i]) blocks *= ctx.axes[static_cast<size_t>(a)].size;
    }
    bool minor_split = false;
    for (size_t d = i + 1; d < i1; ++d) minor_split = minor_split || !from.dims[d].empty();
    const bool carries =
        i < i1 && o < o1 && !from.dims[i].empty() && !minor_split && out[o] % blocks == 0;
    if (carries) {
      result.dims[o] = from.dims[i];
    } else {
      for (size_t d = i; d < i1; ++d) {
        if (!operand.dims[d].empty()) {
          if (explicit_mode) {
            Refuse(
                ctx,
                0, "dimension " + std::to_string(d) + "'s split cannot carry into shape [" + [&] {
                  std::string t;
                  for (size_t k = 0; k < out.size(); ++k)
                    t += (k ? "," : "") + std::to_string(out[k]);
                  return t;
                }() + "]");
          }
          operand.dims[d].clear();
          gathered = true;
        }
      }
    }
    i = i1;
    o = o1;
  }
  Strategy s;
  s.operands = {operand};
  s.results = {result};
  s.why = gathered ? "split dimensions gathered to reshape" : "splits carried through";
  std::vector<Strategy> candidates = {s};
  if (!explicit_mode && !gathered) {
    // Whole: always valid, the partitioner weighs it against carrying the splits.
    Strategy whole;
    whole.operands = {Reduced(Replicated(static_cast<int>(in.size())))};
    whole.results = {Replicated(static_cast<int>(out.size()))};
    whole.why = "reshaped whole";
    candidates.push_back(whole);
  }
  return candidates;
}

std::vector<Strategy> AlongAxisRule(const RuleContext& ctx, bool explicit_mode) {
  const size_t rank = ctx.in_shapes[0].size();
  const int axis = NormalAxis(ctx.op.axis, rank);
  Strategy s;
  // Operands: split as the first one, with the axis whole (concatenate: all alike).
  ValueSharding want = Reduced(Unsplit(ctx.in[0], axis));
  for (size_t i = 0; i < ctx.in.size(); ++i) {
    if (explicit_mode && !ctx.in[i].dims[static_cast<size_t>(axis)].empty()) {
      Refuse(ctx, i, "dimension " + std::to_string(axis) + " is split");
    }
    if (explicit_mode && i > 0 && Reduced(ctx.in[i]).dims != want.dims) {
      Refuse(ctx, i, "operands are split differently");
    }
    s.operands.push_back(want);
  }
  for (size_t r = 0; r < ctx.out_shapes.size(); ++r) s.results.push_back(want);
  s.why = "dimension " + std::to_string(axis) + " whole";
  return {s};
}

// broadcast_in_dim: input dimension j becomes result dimension broadcast_dimensions[j]; a
// split carries where the sizes match (a size-1 dimension broadcast against a larger one is
// read whole); new dimensions are whole.
std::vector<Strategy> BroadcastRule(const RuleContext& ctx, bool explicit_mode) {
  const Shape& in = ctx.in_shapes[0];
  const Shape& out = ctx.out_shapes[0];
  Strategy s;
  ValueSharding operand = Reduced(ctx.in[0]);
  ValueSharding result = Replicated(static_cast<int>(out.size()));
  for (size_t j = 0; j < in.size(); ++j) {
    const size_t d = static_cast<size_t>(ctx.op.broadcast_dimensions.at(j));
    if (in[j] == out[d]) {
      result.dims[d] = operand.dims[j];
    } else {
      operand.dims[j].clear();
    }
  }
  s.operands = {operand};
  s.results = {result};
  s.why = "splits carried to the broadcast dimensions";
  return {s};
}

}  // namespace shardsim::planner
