// A plan search file (SPEC "Searching plans"): a model run file whose `plan:` may list
// candidates and whose `search:` says what the search varies, read into the planner's
// SearchSpace.
#pragma once

#include <string>

#include "planner/models/transformer.h"
#include "planner/search/search_space.h"

namespace shardsim {

class YamlMap;

// The model, its batch and the space to search.
struct PlanSearchSpec {
  std::string name;                  // The preset's name, or "transformer".
  planner::TransformerConfig model;  // `model:`
  planner::TrainConfig train;        // `train:`
  planner::SearchSpace space;        // `plan:` and `search:`
  // The key that asked for host offload ("plan.offload", "search.offload"; empty: none did).
  std::string offload_key;
};

// Reads `model:`, `train:`, `plan:` (optional: mesh a map or a list of maps, rules a map or a
// list, remat one or a list, offload one set of names, pipeline, collective_matmul, algorithms)
// and `search:` {axes, axis_orders, remat, offload (a list of sets), microbatches,
// collective_matmul, sequence_parallel, activation_embed, objective, memory_limit} from the
// top-level mapping. Throws InputError at the key for anything unknown, out of range, contradictory
// (search.axes and plan.mesh, search.remat and plan.remat) or not built yet (serving with remat,
// microbatches, pipelines or collective matmuls, kind: mlp, expert axes for dense models).
PlanSearchSpec ReadPlanSearch(const YamlMap& top);

}  // namespace shardsim
