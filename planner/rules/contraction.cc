// Contractions (einsum, matmul): every dimension is a letter; a letter in both operands and
// the result is a batch letter, in one operand and the result a free letter, in both operands
// only a contracting letter. A layout gives each letter the mesh axes splitting it (each axis
// at most once); operands are split as their letters are, the result as its letters are, and
// the local products are partial sums over the axes of contracting letters (the psum or
// psum_scatter that resolves them is the consumer's reshard).
#include <algorithm>
#include <map>
#include <set>

#include "planner/rules/sharding_rule.h"

namespace shardsim::planner {
namespace {

// The letters of each operand and of the result.
struct Letters {
  std::string lhs, rhs, out;
};

Letters LettersOf(const RuleContext& ctx) {
  if (ctx.op.kind == OpKind::kEinsum) {
    const std::string& spec = ctx.op.spec;
    const size_t comma = spec.find(','), arrow = spec.find("->");
    return {spec.substr(0, comma), spec.substr(comma + 1, arrow - comma - 1),
            spec.substr(arrow + 2)};
  }
  // matmul: a [batch..., m, k] @ b [batch..., k, n] (vectors: no m or no n). Batch letters are
  // shared where both operands have them with equal sizes; a broadcast batch dimension gets a
  // letter of its own (the operand is then used whole along it).
  const Shape& a = ctx.in_shapes[0];
  const Shape& b = ctx.in_shapes[1];
  char next = 'a';
  auto fresh = [&] { return next++; };
  Letters l;
  const char k = 'K', m = 'M', n = 'N';
  const size_t ab = a.size() >= 2 ? a.size() - 2 : 0, bb = b.size() >= 2 ? b.size() - 2 : 0;
  const size_t batch = std::max(ab, bb);
  std::string a_batch(ab, ' '), b_batch(bb, ' '), out_batch(batch, ' ');
  for (size_t i = 0; i < batch; ++i) {
    // Right-aligned batch dimension i of the result.
    const bool in_a = i >= batch - ab, in_b = i >= batch - bb;
    const int64_t sa = in_a ? a[i - (batch - ab)] : 1, sb = in_b ? b[i - (batch - bb)] : 1;
    if (in_a && in_b && sa == sb) {
      const char c = fresh();
      a_batch[i - (batch - ab)] = b_batch[i - (batch - bb)] = out_batch[i] = c;
    } else {
      const char c = fresh();
      out_batch[i] = c;
      if (in_a) a_batch[i - (batch - ab)] = sa == 1 ? fresh() : c;
      if (in_b) b_batch[i - (batch - bb)] = sb == 1 ? fresh() : c;
    }
  }
  l.lhs = a_batch + (a.size() >= 2 ? std::string{m, k} : std::string{k});
  l.rhs = b_batch + (b.size() >= 2 ? std::string{k, n} : std::string{k});
  l.out = out_batch + (a.size() >= 2 ? std::string{m} : "") + (b.size() >= 2 ? std::string{n} : "");
  return l;
}

// Letter -> mesh axes.
using Layout = std::map<char, std::vector<int>>;

// The sharding of an operand or result whose dimensions are `letters`.
ValueSharding Of(const std::string& letters, const Layout& layout) {
  ValueSharding s = Replicated(static_cast<int>(letters.size()));
  for (size_t d = 0; d < letters.size(); ++d) {
    auto it = layout.find(letters[d]);
    if (it != layout.end()) s.dims[d] = it->second;
  }
  return s;
}

// Whether every axis is used once, and each split letter divides.
bool Valid(const Layout& layout, const std::map<char, int64_t>& sizes,
           const std::vector<MeshAxis>& axes) {
  std::set<int> used;
  for (const auto& [c, list] : layout) {
    int64_t blocks = 1;
    for (int a : list) {
      if (!used.insert(a).second) return false;
      blocks *= axes[static_cast<size_t>(a)].size;
    }
    if (sizes.at(c) % blocks != 0) return false;
  }
  return true;
}

}  // namespace

std::vector<Strategy> ContractionRule(const RuleContext& ctx, bool explicit_mode) {
  const Letters l = LettersOf(ctx);
  std::map<char, int64_t> sizes;
  for (size_t d = 0; d < l.lhs.size(); ++d) sizes[l.lhs[d]] = ctx.in_shapes[0][d];
  for (size_t d = 0; d < l.rhs.size(); ++d) sizes[l.rhs[d]] = ctx.in_shapes[1][d];
  for (size_t d = 0; d < l.out.size(); ++d) sizes[l.out[d]] = ctx.out_shapes[0][d];
  auto in_out = [&](char c) { return l.out.find(c) != std::string::npos; };
  auto strategy = [&](const Layout& layout, std::string why) {
    Strategy s;
    s.operands = {Of(l.lhs, layout), Of(l.rhs, layout)};
    ValueSharding result = Of(l.out, layout);
    for (const auto& [c, list] : layout) {
      if (!in_out(c)) result.partial.insert(result.partial.end(), list.begin(), list.end());
    }
    std::sort(result.partial.begin(), result.partial.end());
    s.results = {result};
    s.why = std::move(why);
    return s;
  };
  // Each operand's letters as they are split now.
  Layout from_lhs, from_rhs;
  for (size_t d = 0; d < l.lhs.size(); ++d) {
    if (!ctx.in[0].dims[d].empty()) from_lhs[l.lhs[d]] = ctx.in[0].dims[d];
  }
  for (size_t d = 0; d < l.rhs.size(); ++d) {
    if (!ctx.in[1].dims[d].empty()) from_rhs[l.rhs[d]] = ctx.in[1].dims[d];
  }
  // The merged layout: a letter split in one operand (or alike in both) keeps that split.
  Layout merged = from_lhs;
  std::string conflict;
  for (const auto& [c, list] : from_rhs) {
    auto it = merged.find(c);
    if (it == merged.end()) {
      merged[c] = list;
    } else if (it->second != list) {
      conflict = "letter '" + std::string(1, c) + "' is split differently in the two operands";
    }
  }
  // A contracting letter split on one side only needs the other side split alike (auto
  // slices it) or the split side gathered: JAX's explicit rule refuses both.
  for (const auto& [c, list] : merged) {
    if (in_out(c) || !conflict.empty()) continue;
    const bool a = from_lhs.count(c) > 0, b = from_rhs.count(c) > 0;
    if (a != b) {
      conflict = "contracting dimension '" + std::string(1, c) + "' is split in " +
                 (a ? "the first" : "the second") + " operand only";
    }
  }
  if (conflict.empty() && !Valid(merged, sizes, ctx.axes)) {
    conflict = "one mesh axis would split two dimensions of the result";
  }
  if (explicit_mode) {
    if (!conflict.empty()) {
      throw RuleError(std::string(OpKindName(ctx.op.kind)) + " of " + OperandType(ctx, 0) +
                      " and " + OperandType(ctx, 1) + ": " + conflict +
                      "; reshard an operand so both agree");
    }
    return {strategy(merged, "operands agree")};
  }
  // Auto: candidate layouts, each kept if valid: the merged one, each operand's alone, each
  // operand's with the other's non-conflicting letters, the layout wanted for the result (its
  // letters) with either operand's contracting splits, and every letter whole.
  std::vector<std::pair<Layout, std::string>> layouts;
  layouts.push_back({merged, "operands agree"});
  layouts.push_back({from_lhs, "the first operand's layout"});
  layouts.push_back({from_rhs, "the second operand's layout"});
  for (int first = 0; first < 2; ++first) {
    Layout base = first == 0 ? from_lhs : from_rhs;
    const Layout& other = first == 0 ? from_rhs : from_lhs;
    std::set<int> used;
    for (const auto& [c, list] : base) used.insert(list.begin(), list.end());
    for (const auto& [c, list] : other) {
      if (base.count(c)) continue;
      bool free = true;
      for (int a : list) free = free && !used.count(a);
      if (!free) continue;
      base[c] = list;
      used.insert(list.begin(), list.end());
    }
    layouts.push_back({base, first == 0 ? "the first operand's layout, the second's where free"
                                        : "the second operand's layout, the first's where free"});
  }
  // Where the operands split a contracting letter over different axes: both operands' splits
  // of the result's letters, the contraction whole (each operand gathers its contracting
  // dimension, nothing stays partial): the backward's activation gradient of a layer whose
  // residual stream splits d_model over the axis its weights split the MLP with, the weight's
  // d_model split over FSDP (the activation's d gathered, the weight's FSDP split gathered as
  // in the forward). Operands that agree on their contraction keep their local products and
  // reduce them (a data-parallel weight gradient's psum, tensor parallelism's all-reduce), as
  // XLA does.
  bool contraction_conflict = false;
  for (const auto& [c, list] : from_lhs) {
    const auto it = from_rhs.find(c);
    contraction_conflict =
        contraction_conflict || (!in_out(c) && it != from_rhs.end() && it->second != list);
  }
  for (int first = 0; first < 2 && contraction_conflict; ++first) {
    Layout free_splits;
    std::set<int> used;
    for (const Layout* side : first == 0 ? std::vector<const Layout*>{&from_lhs, &from_rhs}
                                         : std::vector<const Layout*>{&from_rhs, &from_lhs}) {
      for (const auto& [c, list] : *side) {
        if (!in_out(c) || free_splits.count(c)) continue;
        bool free = true;
        for (int a : list) free = free && !used.count(a);
        if (!free) continue;
        free_splits[c] = list;
        used.insert(list.begin(), list.end());
      }
    }
    layouts.push_back({free_splits, "both operands' splits of the result, the contraction whole"});
  }
  if (ctx.preferred && ctx.preferred->dims.size() == l.out.size()) {
    Layout wanted;
    std::set<int> used;
    for (size_t d = 0; d < l.out.size(); ++d) {
      if (!ctx.preferred->dims[d].empty()) {
        wanted[l.out[d]] = ctx.preferred->dims[d];
        used.insert(ctx.preferred->dims[d].begin(), ctx.preferred->dims[d].end());
      }
    }
    for (const Layout* side : {&from_lhs, &from_rhs}) {
      Layout with = wanted;
      for (const auto& [c, list] : *side) {
        if (in_out(c)) continue;
        bool free = true;
        for (int a : list) free = free && !used.count(a);
        if (free) with[c] = list;
      }
      layouts.push_back({with, "the layout wanted for the result"});
    }
  }
  layouts.push_back({Layout{}, "every dimension whole"});
  std::vector<Strategy> out;
  for (const auto& [layout, why] : layouts) {
    if (!Valid(layout, sizes, ctx.axes)) continue;
    Strategy s = strategy(layout, why);
    bool seen = false;
    for (const Strategy& t : out)
      seen = seen || (t.operands == s.operands && t.results == s.results);
    if (!seen) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace shardsim::planner
