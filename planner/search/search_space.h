// What a plan search may vary (SPEC "Searching plans"), the candidates it enumerates, and the
// rules that drop candidates before anything is simulated.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "planner/models/pipeline_schedule.h"
#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"
#include "planner/remat.h"
#include "sim/units.h"

namespace shardsim::planner {

// What the search ranks by (SPEC `search.objective`).
enum class SearchObjective {
  kStepTime,             // Shortest step first (serving: the whole generation).
  kTokensPerSPerDevice,  // Most tokens per second per device first (serving: output tokens).
  kTtft,                 // Serving: shortest time to first token first.
  kTpot,                 // Serving: shortest time per output token first.
};

// The name users type for `objective`.
const char* SearchObjectiveName(SearchObjective objective);

// The space: every list's entries are candidates; a plan is one choice from each.
struct SearchSpace {
  // Mesh axis names whose sizes the search chooses (`search.axes`), first major. Each size is a
  // factor of the device count; axes of size 1 leave the mesh.
  std::vector<std::string> axes;
  // Meshes to try instead of factorising the devices over `axes` (`plan.mesh`, one or a list).
  std::vector<std::vector<MeshAxis>> meshes;
  // Every order of each mesh's axes (`search.axis_orders: all`), not only the given one: the
  // order decides the placement (the first axis is major, the last takes the innermost torus
  // dimension or stays inside a node).
  bool all_axis_orders = false;
  // On a torus, every order of handing its dimensions to each mesh's axes
  // (`search.torus_orders: all`, TorusPlacement) that places the mesh differently, not only
  // the default one.
  bool all_torus_orders = false;
  // The torus order every mesh is placed with (`plan.torus_order` pinned; empty: the default).
  std::vector<int> torus_order;
  // Logical axis rules to try (`plan.rules`, one or a list); empty: each mesh's rules from its
  // axes' roles (DefaultRules).
  std::vector<std::map<std::string, std::vector<std::string>>> rules;
  // Remat policies (`search.remat`, or `plan.remat` pinned).
  std::vector<RematPolicy> remat = {RematPolicy::kNone, RematPolicy::kSelective,
                                    RematPolicy::kFull};
  // The checkpoint names a kCustom entry of `remat` keeps (`plan.remat: {save: [...]}`).
  std::vector<std::string> remat_save;
  // Microbatch counts (`search.microbatches`, or train's pinned).
  std::vector<int64_t> microbatches = {1};
  // The schedules to try on meshes with a stage axis (`plan.pipeline`, whose schedule and
  // virtual_stages may be lists; all share one axis, `stage` unless given).
  std::vector<PipelinePlan> pipelines = {PipelinePlan{}};
  // Whether to try each rule set without and with sequence parallelism
  // (`search.sequence_parallel: [off, on]`, a shardsim extension): with it, the sequence
  // (`length`) splits over the axes that split the heads, where some do and it is not split
  // already (otherwise the plan is the one without it, not tried twice).
  std::vector<bool> sequence_parallel = {false};
  // Whether to try each rule set without and with MaxText's activation_embed
  // (`search.activation_embed: [off, on]`, a shardsim extension): with it, the residual
  // stream's d_model splits over the axes that split the heads (tried once without them).
  std::vector<bool> activation_embed = {false};
  // Collective matmul modes to try (`search.collective_matmul` or `plan.collective_matmul`,
  // one or a list); serving plans take the first.
  std::vector<CollectiveMatmulMode> collective_matmul = {CollectiveMatmulMode::kOff};
  // Host offload sets to try (`search.offload`, or `plan.offload` pinned): each a list of
  // checkpoint names (StepPlan::offload); the empty set is no offload. Tried with every remat
  // policy; serving takes only the empty set.
  std::vector<std::vector<std::string>> offload = {{}};
  // Algorithm sets to try (`plan.algorithms`, whose values may be lists: every combination),
  // each an algorithm per collective kind (absent: auto); each set a family of its own.
  std::vector<std::map<std::string, std::string>> algorithms = {{}};
  // A plan fits when its peak is at most this fraction of HBM (`search.memory_limit`).
  double memory_limit = 1.0;
  SearchObjective objective = SearchObjective::kStepTime;
  // Serving: search plans for this prefill and decode (SimulateServe) instead of a training
  // step; remat and microbatches do not apply.
  std::optional<ServeConfig> serve;
};

// One plan to evaluate: the plan and its microbatches (train's, overridden).
struct PlanCandidate {
  StepPlan plan;
  int64_t microbatches = 1;
};

// A canonical one-line text of `candidate` ("mesh fsdp=64,tensor=4; rules batch=fsdp,...;
// remat selective; microbatches 2"): equal candidates give equal keys, so a resumed search
// recognises what it already evaluated.
std::string CandidateKey(const PlanCandidate& candidate);

// `mesh` in every order of its axes, the given order first, the rest in lexicographic order
// of the axes' positions in it (n! meshes for n axes).
std::vector<std::vector<MeshAxis>> AxisOrders(const std::vector<MeshAxis>& mesh);

// The mesh axis names whose roles DefaultRules knows, and the logical dimensions each takes:
// data -> batch; fsdp -> batch, embed (ZeRO-3: parameters split along d_model); tensor ->
// heads, kv_heads, mlp, vocab (Megatron); stage -> layers (pipeline stages);
// expert -> batch and expert (MaxText's: the expert axis splits the tokens too, which the
// all-to-alls then send to their experts).
const std::map<std::string, std::vector<std::string>>& AxisRoles();

// The rules of `mesh` from its axes' roles (AxisRoles), each logical dimension taking its
// axes in mesh order. Throws std::invalid_argument for an axis without a role.
std::map<std::string, std::vector<std::string>> DefaultRules(const std::vector<MeshAxis>& mesh);

// Every ordered way to write `devices` as a product of `axes.size()` factors, in lexicographic
// order of the factor lists; factors of 1 are left out of each mesh.
std::vector<std::vector<MeshAxis>> FactorMeshes(int64_t devices,
                                                const std::vector<std::string>& axes);

// Why a candidate is dropped before it is simulated (nullopt: keep it): a logical dimension
// its rules do not divide ("heads (64) over tensor=128"), microbatches that do not divide the
// batch, a pipeline whose layers or batch do not split.
std::optional<std::string> Indivisible(const TransformerConfig& model, const TrainConfig& train,
                                       const PlanCandidate& candidate);

}  // namespace shardsim::planner
