// The `model:`, `train:` and `plan:` sections of a run file (SPEC "Models, training and
// serving steps"), parsed at the edge into the planner's validated structs.
#pragma once

#include <optional>
#include <string>

#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"

namespace shardsim {

class YamlMap;

// A model run: which model, its batch, and the plan that shards it.
struct ModelRunSpec {
  std::string name;                           // The preset's name, or "transformer" for a map.
  planner::TransformerConfig model;           // `model:` (a transformer)
  std::optional<planner::MlpModel> mlp;       // `model: {kind: mlp, ...}` instead
  planner::TrainConfig train;                 // `train:` (unset when serving)
  std::optional<planner::ServeConfig> serve;  // `serve:` instead of train:
  planner::StepPlan plan;                     // `plan:`
};

// Reads `model:`, `train:` or `serve:`, and `plan:` from the run file's top-level mapping
// `top`. Throws InputError at the key for anything unknown, missing or out of range, and for
// what the simulator does not build yet (collective_matmul other than off), saying so.
ModelRunSpec ReadModelRun(const YamlMap& top);

}  // namespace shardsim
