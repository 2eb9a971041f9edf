// Ops whose operands' and results' dimensions each correspond to one dimension of a common
// "layout space" (or are read whole), so one split of that space lays out all of them. The
// space is the dimensions of the op's main array:
// - rows along one axis (softmax, log_softmax, rms_norm, layer_norm, top_k, cross_entropy and
//   their derivative ops; reduce_max_grad reads the reduced axes whole): that axis must be
//   whole on a device, every other dimension may stay split, since rows never mix;
// - take (the result's dimensions: the table's, the ids' in place of the table's axis, which
//   is read whole) and take_grad (its cotangent's dimensions: the table's rows receive sums
//   over every id position, so a split of the ids leaves partial sums over its axes);
// - attention (q's [B, T, N, H]: batch and heads may split, the sequences and head size are
//   whole; k and v split their kv heads K as q's heads N, so a device holding heads
//   [s N/a, (s+1) N/a) holds kv heads [s K/a, (s+1) K/a), exactly the ones they read, when a
//   divides K) and attention_grad (g like q; [dq, dk, dv] like [q, k, v]);
// - one_hot (the ids' dimensions; the classes whole) and moe_route (the groups: each routes
//   its tokens alone);
// - repeat (a's dimensions; its axis, and the counts, whole: every output slice may come from
//   any input slice).
//
// cross_entropy is a mean over every label position: a device holding a block of the rows
// computes its block's mean, n times its share of the global mean when the rows are split
// over n positions, so its result is a partial sum over those axes scaled by 1/n;
// cross_entropy_grad's g / N uses the local N, n times too large, and is scaled alike.
#include <algorithm>

#include "planner/rules/sharding_rule.h"

namespace shardsim::planner {
namespace {

constexpr int kWhole = -1;

// How an op's operands and results sit on the layout space.
struct Mapping {
  size_t rank = 0;                        // Dimensions of the layout space.
  std::vector<std::vector<int>> operand;  // Per operand, per dimension: layout dim or kWhole.
  std::vector<std::vector<int>> result;   // Per result, per dimension: layout dim or kWhole.
  std::vector<int> whole;                 // Layout dimensions read whole.
  bool linear_in_first = false;           // Linear in operand 0 (a cotangent).
  std::vector<int> summed;                // Layout dims whose splits leave partial sums.
  bool mean_of_rows = false;              // Scaled by 1/n for n positions splitting the space.
};

std::vector<int> Identity(size_t rank) {
  std::vector<int> m(rank);
  for (size_t d = 0; d < rank; ++d) m[d] = static_cast<int>(d);
  return m;
}

std::vector<int> AllWhole(size_t rank) { return std::vector<int>(rank, kWhole); }

// take's maps onto its result's dimensions: the table's (its `axis` read whole, the ids'
// dimensions in its place) and the ids'.
struct TakeMaps {
  std::vector<int> table;
  std::vector<int> ids;
};

TakeMaps TakeMapsOf(size_t table_rank, size_t ids_rank, int64_t take_axis) {
  const int axis = NormalAxis(take_axis, table_rank);
  const int ids = static_cast<int>(ids_rank);
  TakeMaps t;
  for (int j = 0; j < static_cast<int>(table_rank); ++j) {
    t.table.push_back(j < axis ? j : j == axis ? kWhole : j - 1 + ids);
  }
  for (int j = 0; j < ids; ++j) t.ids.push_back(axis + j);
  return t;
}

Mapping MappingOf(const RuleContext& ctx) {
  Mapping m;
  const OpSpec& op = ctx.op;
  const auto& s = ctx.in_shapes;
  switch (op.kind) {
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax:
    case OpKind::kCumsum:  // Prefixes and orders run along the axis: it stays whole.
    case OpKind::kArgsort:
      m.rank = s[0].size();
      m.operand = {Identity(m.rank)};
      m.result = {Identity(m.rank)};
      m.whole = {NormalAxis(op.norm_axis, m.rank)};
      break;
    case OpKind::kSoftmaxGrad:
    case OpKind::kLogSoftmaxGrad:  // (g, y).
      m.rank = s[0].size();
      m.operand = {Identity(m.rank), Identity(m.rank)};
      m.result = {Identity(m.rank)};
      m.whole = {NormalAxis(op.norm_axis, m.rank)};
      m.linear_in_first = true;
      break;
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:  // (x, scale): the scale runs along the normalized axis.
      m.rank = s[0].size();
      m.operand = {Identity(m.rank), AllWhole(s[1].size())};
      m.result = {Identity(m.rank)};
      m.whole = {NormalAxis(op.norm_axis, m.rank)};
      break;
    case OpKind::kRmsNormGrad:
    case OpKind::kLayerNormGrad:  // (g, x, scale) -> [dx, g xhat].
      m.rank = s[0].size();
      m.operand = {Identity(m.rank), Identity(m.rank), AllWhole(s[2].size())};
      m.result = {Identity(m.rank), Identity(m.rank)};
      m.whole = {NormalAxis(op.norm_axis, m.rank)};
      m.linear_in_first = true;
      break;
    case OpKind::kTopK:  // x -> [values, indices], k along the last axis.
      m.rank = s[0].size();
      m.operand = {Identity(m.rank)};
      m.result = {Identity(m.rank), Identity(m.rank)};
      m.whole = {static_cast<int>(m.rank) - 1};
      break;
    case OpKind::kTopKGrad:  // (g, indices), both k long along the last axis.
      m.rank = s[0].size();
      m.operand = {Identity(m.rank), Identity(m.rank)};
      m.result = {Identity(m.rank)};
      m.whole = {static_cast<int>(m.rank) - 1};
      m.linear_in_first = true;
      break;
    case OpKind::kCrossEntropy:  // (logits [..., C], labels [...]) -> scalar.
      m.rank = s[0].size();
      m.operand = {Identity(m.rank), Identity(m.rank - 1)};
      m.result = std::vector<std::vector<int>>(1);
      m.whole = {static_cast<int>(m.rank) - 1};
      m.summed = Identity(m.rank - 1);
      m.mean_of_rows = true;
      break;
    case OpKind::kCrossEntropyGrad:  // (g scalar, logits, labels) -> logits' shape.
      m.rank = s[1].size();
      m.operand = {{}, Identity(m.rank), Identity(m.rank - 1)};
      m.result = {Identity(m.rank)};
      m.whole = {static_cast<int>(m.rank) - 1};
      m.linear_in_first = true;
      m.mean_of_rows = true;
      break;
    case OpKind::kReduceMaxGrad: {  // (g, x): g has x's shape without (or with 1 for) the axes.
      m.rank = s[1].size();
      std::vector<bool> reduced(m.rank, op.axes.empty());
      for (int64_t a : op.axes) reduced[static_cast<size_t>(NormalAxis(a, m.rank))] = true;
      std::vector<int> g;
      for (size_t d = 0; d < m.rank; ++d) {
        if (reduced[d]) {
          m.whole.push_back(static_cast<int>(d));
          if (op.keepdims) g.push_back(kWhole);
        } else {
          g.push_back(static_cast<int>(d));
        }
      }
      m.operand = {g, Identity(m.rank)};
      m.result = {Identity(m.rank)};
      m.linear_in_first = true;
      break;
    }
    case OpKind::kTake: {  // (table, ids) -> table[:axis] + ids + table[axis+1:].
      const TakeMaps t = TakeMapsOf(s[0].size(), s[1].size(), op.axis);
      m.rank = t.table.size() - 1 + t.ids.size();
      m.operand = {t.table, t.ids};
      m.result = {Identity(m.rank)};
      m.linear_in_first = true;
      break;
    }
    case OpKind::kTakeGrad: {  // (g, ids) -> the table, `size` long along `axis`.
      m.rank = s[0].size();
      const TakeMaps t = TakeMapsOf(m.rank + 1 - s[1].size(), s[1].size(), op.axis);
      m.operand = {Identity(m.rank), t.ids};
      m.result = {t.table};
      m.summed = t.ids;
      m.linear_in_first = true;
      break;
    }
    case OpKind::kAttention:        // (q, k, v) -> like q.
    case OpKind::kAttentionGrad: {  // (g, q, k, v) -> [dq, dk, dv].
      m.rank = 4;
      // q [B, T, N, H] and k, v [B, S, K, H] alike: batch, then heads (N or K).
      const std::vector<int> q = {0, kWhole, 2, kWhole};
      const std::vector<int>& kv = q;
      if (op.kind == OpKind::kAttention) {
        m.operand = {q, kv, kv};
        m.result = {q};
      } else {
        m.operand = {q, q, kv, kv};
        m.result = {q, kv, kv};
        m.linear_in_first = true;
      }
      m.whole = {1, 3};
      break;
    }
    case OpKind::kRaggedDot:           // (lhs [m, k], rhs [g, k, n], sizes) -> [m, n].
    case OpKind::kRaggedDotRhsGrad: {  // (lhs [m, k], g [m, n], sizes) -> [g, k, n].
      // Layout [m, k, n]. Group e's rows are [sum of the sizes before e, + size e) of the whole
      // lhs, so the rows (and the groups) are whole; n splits with rhs's (or g's) columns;
      // a split of k contracts locally: ragged_dot's result is then a partial sum over it.
      m.rank = 3;
      m.whole = {0};
      const std::vector<int> lhs = {kWhole, 1};
      if (op.kind == OpKind::kRaggedDot) {
        m.operand = {lhs, {kWhole, 1, 2}, {kWhole}};
        m.result = {{kWhole, 2}};
        m.summed = {1};
      } else {
        m.operand = {lhs, {kWhole, 2}, {kWhole}};
        m.result = {{kWhole, 1, 2}};
      }
      m.linear_in_first = true;
      break;
    }
    case OpKind::kRepeat: {  // (a, repeats) -> a, its axis remade whole from all the counts.
      m.rank = s[0].size();
      std::vector<int> dims = Identity(m.rank);
      dims[static_cast<size_t>(NormalAxis(op.axis, m.rank))] = kWhole;
      m.operand = {dims, {kWhole}};
      m.result = {dims};
      m.whole = {NormalAxis(op.axis, m.rank)};
      m.linear_in_first = true;
      break;
    }
    case OpKind::kOneHot:  // x -> x's dimensions + [classes], whole.
      m.rank = s[0].size();
      m.operand = {Identity(m.rank)};
      m.result = {Identity(m.rank)};
      m.result[0].push_back(kWhole);
      break;
    case OpKind::kMoeRoute: {  // indices [G..., S, k] -> [G..., S, E, C].
      // Each group routes alone: the groups may split; a group's tokens, choices, experts and
      // slots are whole.
      m.rank = s[0].size() - 2;
      m.operand = {Identity(m.rank)};
      m.operand[0].insert(m.operand[0].end(), 2, kWhole);
      m.result = {Identity(m.rank)};
      m.result[0].insert(m.result[0].end(), 3, kWhole);
      break;
    }
    default:
      throw std::logic_error("internal error: MappedRule has no mapping for " +
                             std::string(OpKindName(op.kind)));
  }
  return m;
}

// The dimensions of an operand or result of map `map` under `layout` (per layout dim, its
// mesh axes).
std::vector<std::vector<int>> Place(const std::vector<int>& map,
                                    const std::vector<std::vector<int>>& layout) {
  std::vector<std::vector<int>> dims(map.size());
  for (size_t j = 0; j < map.size(); ++j) {
    if (map[j] != kWhole) dims[j] = layout[static_cast<size_t>(map[j])];
  }
  return dims;
}

// The strategy running the op with the layout space split as `layout`.
Strategy WithLayout(const RuleContext& ctx, const Mapping& m, std::vector<std::vector<int>> layout,
                    const std::string& why) {
  for (int d : m.whole) layout[static_cast<size_t>(d)].clear();
  std::vector<int> split;
  for (const std::vector<int>& dim : layout) split.insert(split.end(), dim.begin(), dim.end());
  std::sort(split.begin(), split.end());
  // The cotangent's partial sums pass through a linear op, unless another operand is partial
  // too or a split of the layout uses one of their axes.
  std::vector<int> kept;
  if (m.linear_in_first && !ctx.in[0].partial.empty()) {
    kept = ctx.in[0].partial;
    for (size_t i = 1; i < ctx.in.size(); ++i) {
      if (!ctx.in[i].partial.empty()) kept.clear();
    }
    for (int a : kept) {
      if (std::binary_search(split.begin(), split.end(), a)) kept.clear();
    }
  }
  Strategy s;
  for (size_t i = 0; i < ctx.in.size(); ++i) {
    ValueSharding want;
    want.dims = Place(m.operand[i], layout);
    if (i == 0) want.partial = kept;
    s.operands.push_back(std::move(want));
  }
  for (size_t r = 0; r < m.result.size(); ++r) {
    ValueSharding result;
    result.dims = Place(m.result[r], layout);
    result.partial = kept;
    for (int d : m.summed) {
      const std::vector<int>& axes = layout[static_cast<size_t>(d)];
      result.partial.insert(result.partial.end(), axes.begin(), axes.end());
    }
    std::sort(result.partial.begin(), result.partial.end());
    s.results.push_back(std::move(result));
  }
  if (m.mean_of_rows) s.result_scale = 1.0 / static_cast<double>(AxesSize(split, ctx.axes));
  s.why = why;
  return s;
}

// The layout space as an operand or result of map `map` with sharding `s` splits it.
std::vector<std::vector<int>> LayoutOf(const Mapping& m, const std::vector<int>& map,
                                       const ValueSharding& s) {
  std::vector<std::vector<int>> layout(m.rank);
  for (size_t j = 0; j < map.size(); ++j) {
    if (map[j] != kWhole) layout[static_cast<size_t>(map[j])] = s.dims[j];
  }
  return layout;
}

// Merges layout `own` into `layout` (a dimension split by one and whole in the other takes the
// split); returns the first dimension they split differently, or -1.
int MergeInto(std::vector<std::vector<int>>& layout, const std::vector<std::vector<int>>& own) {
  for (size_t d = 0; d < layout.size(); ++d) {
    if (own[d].empty()) continue;
    if (layout[d].empty()) {
      layout[d] = own[d];
    } else if (layout[d] != own[d]) {
      return static_cast<int>(d);
    }
  }
  return -1;
}

std::string AxisWords(const Mapping& m) {
  std::string words;
  for (int d : m.whole) words += (words.empty() ? "" : ", ") + std::to_string(d);
  if (m.whole.empty()) return "no layout dimension";
  return (m.whole.size() == 1 ? "dimension " : "dimensions ") + words;
}

}  // namespace

std::vector<std::vector<int>> WholeOperandDims(const OpSpec& op,
                                               const std::vector<Shape>& in_shapes) {
  std::vector<std::vector<int>> whole(in_shapes.size());
  // take (TakeRule) reads nothing whole: its table may stay split along the indexed axis.
  if (FindShardingRule(op.kind) != &MappedRule) return whole;
  const std::vector<MeshAxis> no_axes;
  RuleContext ctx{op, in_shapes, {}, {}, {}, no_axes, std::nullopt};
  const Mapping m = MappingOf(ctx);
  for (size_t i = 0; i < in_shapes.size() && i < m.operand.size(); ++i) {
    for (size_t j = 0; j < m.operand[i].size(); ++j) {
      const int d = m.operand[i][j];
      if (d == kWhole || std::find(m.whole.begin(), m.whole.end(), d) != m.whole.end()) {
        whole[i].push_back(static_cast<int>(j));
      }
    }
  }
  return whole;
}

std::vector<Strategy> MappedRule(const RuleContext& ctx, bool explicit_mode) {
  const Mapping m = MappingOf(ctx);
  const std::string whole = AxisWords(m) + " whole";
  if (explicit_mode) {
    // Every operand must agree on the layout and leave the row axes whole (JAX's composite
    // would reduce rows across devices; shardsim's fused kernel wants them on one device).
    std::vector<std::vector<int>> layout(m.rank);
    for (size_t i = 0; i < ctx.in.size(); ++i) {
      const std::vector<std::vector<int>> own = LayoutOf(m, m.operand[i], ctx.in[i]);
      for (size_t j = 0; j < m.operand[i].size(); ++j) {
        if (m.operand[i][j] == kWhole && !ctx.in[i].dims[j].empty()) {
          Refuse(ctx, i, "dimension " + std::to_string(j) + " is split");
        }
      }
      for (int d : m.whole) {
        if (!own[static_cast<size_t>(d)].empty()) {
          Refuse(ctx, i, "the op reads dimension " + std::to_string(d) + " whole but it is split");
        }
      }
      if (const int d = MergeInto(layout, own); d >= 0) {
        Refuse(ctx, i, "the operands split dimension " + std::to_string(d) + " differently");
      }
    }
    return {WithLayout(ctx, m, layout, whole)};
  }
  // Auto: each operand's layout imposed on the others, and the one wanted later.
  std::vector<Strategy> candidates;
  std::vector<std::vector<std::vector<int>>> seen;
  auto add = [&](std::vector<std::vector<int>> layout, const std::string& why) {
    for (int d : m.whole) layout[static_cast<size_t>(d)].clear();
    if (!AxesDistinct(layout) || std::find(seen.begin(), seen.end(), layout) != seen.end()) {
      return;
    }
    seen.push_back(layout);
    candidates.push_back(WithLayout(ctx, m, std::move(layout), why));
  };
  // The operands' layouts merged where they agree (a dimension split by one and whole in the
  // others takes the split), as explicit mode would run it.
  std::vector<std::vector<int>> merged(m.rank);
  bool agree = true;
  for (size_t i = 0; i < ctx.in.size() && agree; ++i) {
    agree = MergeInto(merged, LayoutOf(m, m.operand[i], ctx.in[i])) < 0;
  }
  if (agree) add(merged, whole + ", operands merged");
  for (size_t i = 0; i < ctx.in.size(); ++i) {
    add(LayoutOf(m, m.operand[i], ctx.in[i]),
        whole + ", operand " + std::to_string(i) + "'s layout");
  }
  if (ctx.preferred && ctx.preferred->dims.size() == m.result[0].size()) {
    add(LayoutOf(m, m.result[0], *ctx.preferred), whole + ", the layout wanted later");
  }
  if (candidates.empty()) add(std::vector<std::vector<int>>(m.rank), whole + ", replicated");
  return candidates;
}

std::vector<Strategy> TakeRule(const RuleContext& ctx, bool explicit_mode) {
  std::vector<Strategy> out = MappedRule(ctx, explicit_mode);
  if (explicit_mode) return out;
  const ValueSharding& table = ctx.in[0];
  const size_t table_rank = ctx.in_shapes[0].size();
  const int axis = NormalAxis(ctx.op.axis, table_rank);
  const std::vector<int>& split = table.dims[static_cast<size_t>(axis)];
  if (split.empty() || !table.partial.empty()) return out;
  // The ids whole on the table axis's mesh axes (every device looks up every id there).
  ValueSharding ids = Reduced(ctx.in[1]);
  for (std::vector<int>& dim : ids.dims) {
    dim.erase(std::remove_if(
                  dim.begin(), dim.end(),
                  [&](int a) { return std::find(split.begin(), split.end(), a) != split.end(); }),
              dim.end());
  }
  ValueSharding result;
  for (size_t d = 0; d < table_rank; ++d) {
    if (static_cast<int>(d) == axis) {
      result.dims.insert(result.dims.end(), ids.dims.begin(), ids.dims.end());
    } else {
      result.dims.push_back(table.dims[d]);
    }
  }
  std::vector<std::vector<int>> used = result.dims;
  used.push_back(split);
  if (!AxesDistinct(used)) return out;
  result.partial = split;
  std::sort(result.partial.begin(), result.partial.end());
  Strategy s;
  s.operands = {table, ids};
  s.results = {result};
  std::string names;
  for (int a : split) names += (names.empty() ? "" : ", ") + ctx.axes[static_cast<size_t>(a)].name;
  s.why = "each device takes the rows of its table block over " + names + ", partial sums";
  OpSpec local;
  local.kind = OpKind::kTakeShard;
  local.axis = axis;
  local.size = ctx.in_shapes[0][static_cast<size_t>(axis)];
  for (int a : split) local.axis_name.push_back(ctx.axes[static_cast<size_t>(a)].name);
  s.local_op = std::move(local);
  out.push_back(std::move(s));
  return out;
}

}  // namespace shardsim::planner
