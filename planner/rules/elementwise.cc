// Elementwise ops (binary with NumPy broadcasting, unary, convert, and the derivative ops
// unary_grad and max_grad): the result keeps the
// layout its operands share; JAX's broadcasting sharding rule merges a split dimension with an
// unsplit one and refuses two different splits of one dimension.
#include <algorithm>
#include <optional>

#include "collectives/dtype.h"
#include "planner/rules/sharding_rule.h"

namespace shardsim::planner {
namespace {

// Output dimension of operand dimension j of an operand of rank r, the result having rank R.
int OutDim(int j, int r, int rank) { return j + (rank - r); }

// Whether operand dim j is broadcast (size 1 against a larger result dimension).
bool Broadcast(const RuleContext& ctx, size_t i, int j) {
  const Shape& in = ctx.in_shapes[i];
  const Shape& out = ctx.out_shapes[0];
  const int rank = static_cast<int>(out.size());
  return in[static_cast<size_t>(j)] == 1 &&
         out[static_cast<size_t>(OutDim(j, static_cast<int>(in.size()), rank))] != 1;
}

// The partial axes the result may keep: the op is linear in its partial operands.
std::vector<int> KeptPartial(const RuleContext& ctx) {
  const OpKind kind = ctx.op.kind;
  const size_t n = ctx.in.size();
  std::vector<int> none;
  bool any = false;
  for (const ValueSharding& s : ctx.in) any = any || !s.partial.empty();
  if (!any) return none;
  if (kind == OpKind::kNeg) return ctx.in[0].partial;
  // A convert is linear too, but partial sums rounded to a narrower type (bf16 to f8e4m3)
  // would be summed in it: only a widening or equal-width convert keeps them partial.
  if (kind == OpKind::kConvert) {
    const std::optional<DType> to = ParseDType(ctx.op.dtype);
    const bool narrows = to && DTypeSize(*to) < DTypeSize(ctx.in_dtypes.at(0));
    return narrows ? none : ctx.in[0].partial;
  }
  // unary_grad and max_grad scale the cotangent g (operand 0) by a factor of the others.
  if (kind == OpKind::kUnaryGrad || kind == OpKind::kMaxGrad) {
    for (size_t i = 1; i < n; ++i) {
      if (!ctx.in[i].partial.empty()) return none;
    }
    return ctx.in[0].partial;
  }
  if (ctx.op.scalar && (kind == OpKind::kMul || kind == OpKind::kDiv)) return ctx.in[0].partial;
  if (n == 2 && (kind == OpKind::kAdd || kind == OpKind::kSub) &&
      ctx.in[0].partial == ctx.in[1].partial) {
    return ctx.in[0].partial;
  }
  // a * b with one factor partial, a / b with the numerator partial: still a sum of parts.
  if (n == 2 && kind == OpKind::kMul && (ctx.in[0].partial.empty() != ctx.in[1].partial.empty())) {
    return ctx.in[0].partial.empty() ? ctx.in[1].partial : ctx.in[0].partial;
  }
  if (n == 2 && kind == OpKind::kDiv && ctx.in[1].partial.empty()) return ctx.in[0].partial;
  return none;
}

// The strategy that gives the result the split dims `dims` (and `partial`).
Strategy With(const RuleContext& ctx, const std::vector<std::vector<int>>& dims,
              std::vector<int> partial, std::string why) {
  // A mesh axis cannot both split the result and hold partial sums of it: those are summed.
  for (const std::vector<int>& dim : dims) {
    for (int a : dim) {
      if (std::find(partial.begin(), partial.end(), a) != partial.end()) partial.clear();
    }
  }
  Strategy s;
  const int rank = static_cast<int>(ctx.out_shapes[0].size());
  for (size_t i = 0; i < ctx.in.size(); ++i) {
    const int r = static_cast<int>(ctx.in_shapes[i].size());
    ValueSharding want = Replicated(r);
    for (int j = 0; j < r; ++j) {
      if (!Broadcast(ctx, i, j)) {
        want.dims[static_cast<size_t>(j)] = dims[static_cast<size_t>(OutDim(j, r, rank))];
      }
    }
    if (!partial.empty() && !ctx.in[i].partial.empty()) want.partial = ctx.in[i].partial;
    s.operands.push_back(std::move(want));
  }
  ValueSharding result;
  result.dims = dims;
  result.partial = partial;
  s.results.push_back(std::move(result));
  s.why = std::move(why);
  return s;
}

}  // namespace

std::vector<Strategy> ElementwiseRule(const RuleContext& ctx, bool explicit_mode) {
  const int rank = static_cast<int>(ctx.out_shapes.at(0).size());
  const std::vector<int> partial = KeptPartial(ctx);
  // The merged layout: each result dimension split as the operands that split it agree.
  std::vector<std::vector<int>> merged(static_cast<size_t>(rank));
  std::string conflict;
  for (size_t i = 0; i < ctx.in.size() && conflict.empty(); ++i) {
    const int r = static_cast<int>(ctx.in_shapes[i].size());
    for (int j = 0; j < r; ++j) {
      const std::vector<int>& split = ctx.in[i].dims[static_cast<size_t>(j)];
      if (split.empty() || Broadcast(ctx, i, j)) continue;
      std::vector<int>& have = merged[static_cast<size_t>(OutDim(j, r, rank))];
      if (have.empty()) {
        have = split;
      } else if (have != split) {
        conflict = "dimension " + std::to_string(OutDim(j, r, rank)) + " is split differently";
      }
    }
  }
  if (conflict.empty() && !AxesDistinct(merged)) {
    conflict = "one mesh axis would split two dimensions";
  }
  // Explicit mode needs no implicit communication, reductions of partial sums aside (a
  // nonlinear op of a partial value sums it first, as JAX's types never hold partials).
  if (explicit_mode && !conflict.empty()) {
    std::string types;
    for (size_t i = 0; i < ctx.in.size(); ++i) types += (i ? " and " : "") + OperandType(ctx, i);
    throw RuleError("operands " + types + " are sharded incompatibly (" + conflict +
                    "); reshard one of them to the other's sharding");
  }
  std::vector<Strategy> candidates;
  if (conflict.empty()) candidates.push_back(With(ctx, merged, partial, "operands agree"));
  if (explicit_mode) return candidates;
  // Auto: each operand's layout imposed on the others, and the propagated preference.
  for (size_t i = 0; i < ctx.in.size(); ++i) {
    const int r = static_cast<int>(ctx.in_shapes[i].size());
    std::vector<std::vector<int>> dims(static_cast<size_t>(rank));
    for (int j = 0; j < r; ++j) {
      if (!Broadcast(ctx, i, j)) {
        dims[static_cast<size_t>(OutDim(j, r, rank))] = ctx.in[i].dims[static_cast<size_t>(j)];
      }
    }
    candidates.push_back(With(ctx, dims, partial, "operand " + std::to_string(i) + "'s layout"));
  }
  if (ctx.preferred && static_cast<int>(ctx.preferred->dims.size()) == rank) {
    candidates.push_back(With(ctx, ctx.preferred->dims, partial, "the layout wanted later"));
  }
  return candidates;
}

}  // namespace shardsim::planner

namespace shardsim::planner {

// full_like reads no element of its operand, only its shape: any layout of the operand will
// do, partial sums included (the cotangent seed of a loss still partial over dp needs no
// psum), and the constant is laid out as the operand's blocks.
std::vector<Strategy> FullLikeRule(const RuleContext& ctx, bool explicit_mode) {
  Strategy s;
  s.operands = {ctx.in[0]};
  s.results = {Reduced(ctx.in[0])};
  s.why = "laid out like its operand";
  return {s};
}

// move_to_host, move_to_device: a copy into the other memory takes its operand as it is laid
// out, partial sums included, and its result keeps that layout. The operand is never
// resharded: move_to_device's is in host memory, where no collective or slice runs (the
// partitioner reshards the copy back in device memory instead, for its readers).
std::vector<Strategy> HostCopyRule(const RuleContext& ctx, bool explicit_mode) {
  Strategy s;
  s.operands = {ctx.in[0]};
  s.results = {ctx.in[0]};
  s.why = "a copy keeps its operand's layout";
  return {s};
}

}  // namespace shardsim::planner
