// Flax-style logical axis rules (flax.linen.logical_axis_rules, MaxText's `logical_axis_rules`):
// each logical dimension name maps to mesh axes, and an array named by its logical dimensions
// gets the PartitionSpec the rules give it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/partition_spec.h"

namespace shardsim::planner {

// Rules from logical dimension names (SPEC: batch, length, embed, mlp, heads, kv_heads,
// head_dim, vocab, expert, layers; and MaxText's activation_embed, a shardsim extension: the
// residual stream's d_model, which `embed` (the parameters') leaves whole) to mesh axes; a
// name without a rule is replicated.
class LogicalRules {
 public:
  // No rules: everything replicated.
  LogicalRules() = default;
  // `rules` over the mesh `axes`; throws std::invalid_argument naming an unknown logical name,
  // an axis the mesh lacks, or an axis given twice in one rule.
  LogicalRules(std::map<std::string, std::vector<std::string>> rules,
               const std::vector<MeshAxis>& axes);

  // The spec of an array whose dimensions are `dims` (logical names; "" for a dimension no rule
  // shards). A mesh axis an earlier dimension took is dropped from a later one, as Flax does,
  // so a spec never names an axis twice. Throws std::invalid_argument for an unknown name.
  PartitionSpec Spec(const std::vector<std::string>& dims) const;
  // The mesh axes logical dimension `name` maps to (empty: replicated).
  const std::vector<std::string>& Axes(const std::string& name) const;

  // The logical dimension names SPEC defines, in its order.
  static const std::vector<std::string>& Names();

  bool operator==(const LogicalRules&) const = default;

 private:
  std::map<std::string, std::vector<std::string>> rules_;
};

// The product of the sizes of the axes of `mesh` named in `names` (names it lacks count 1).
int64_t NamedAxesSize(const std::vector<MeshAxis>& mesh, const std::vector<std::string>& names);

}  // namespace shardsim::planner
