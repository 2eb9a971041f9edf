// The `model:`, `train:` and `plan:` sections of a run file (SPEC "Models, training and
// serving steps"), parsed at the edge into the planner's validated structs.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"

namespace shardsim {

class YamlMap;
class YamlValue;

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

// The section readers ReadModelRun uses, for plan search files (sim/cli/plan_search_file.h).
// Each throws InputError at the key for anything unknown, missing or out of range.

// `model:` a preset name or a `kind: transformer` map: its name ("transformer" for a map) and
// configuration.
std::pair<std::string, planner::TransformerConfig> ReadModel(const YamlValue& value);
// Whether `value` is a `model:` map of kind mlp.
bool IsMlp(const YamlValue& value);
// `train:`; seq_len required when `sequences` (transformers), refused otherwise.
planner::TrainConfig ReadTrain(const YamlValue& value, bool sequences);
// `serve:` {batch, prompt_len, decode_len, dtype, kv_dtype}.
planner::ServeConfig ReadServe(const YamlValue& value);
// One rule's mesh axes (a name, a list, or null), each an axis of `mesh`.
std::vector<std::string> ReadRuleAxes(const YamlValue& value, const std::vector<MeshAxis>& mesh);
// `plan.rules`: logical dimension -> axes of `mesh`.
std::map<std::string, std::vector<std::string>> ReadRules(const YamlValue& value,
                                                          const std::vector<MeshAxis>& mesh);
// `plan.remat`: none, selective or full (a custom policy's map, which only ReadModelRun's plan
// takes, is refused with a located error).
planner::RematPolicy ReadRemat(const YamlValue& value);
// A pipeline schedule's name: gpipe, 1f1b or interleaved.
planner::PipelineSchedule ReadPipelineSchedule(const YamlValue& value);
// `plan.pipeline` {axis (an axis of `mesh`), schedule, virtual_stages, first_stage_layers,
// last_stage_layers}.
planner::PipelinePlan ReadPipeline(const YamlValue& value, const std::vector<MeshAxis>& mesh);
// `plan.torus_order`: a list of torus dimensions, innermost first (each >= 0; TorusPlacement
// checks that they are the torus's, once each).
std::vector<int> ReadTorusOrder(const YamlValue& value);
// "data=2 x fsdp=16 x tensor=4", then " (torus_order [1, 2, 0])" when one places the mesh.
std::string DescribePlanMesh(const planner::StepPlan& plan);
// `first_stage_layers` and `last_stage_layers` of a `plan.pipeline` map (each >= 1) into `pp`.
void ReadStageLayers(const YamlMap& pipeline, planner::PipelinePlan& pp);
// `plan.collective_matmul`: off, unidirectional, bidirectional or auto.
planner::CollectiveMatmulMode ReadCollectiveMatmul(const YamlValue& value);
// `plan.offload` (or a custom remat's `save`): a list of MaxText checkpoint names
// (planner::CheckpointNames()), each once.
std::vector<std::string> ReadOffload(const YamlValue& value);
// Refuses (a located error at `where`) an offloaded name that a custom remat also saves.
void RefuseSavedAndOffloaded(const std::vector<std::string>& saved,
                             const std::vector<std::string>& offloaded, const YamlValue& where);
// `plan.algorithms`: collective -> algorithm name.
std::map<std::string, std::string> ReadPlanAlgorithms(const YamlValue& value);

}  // namespace shardsim
