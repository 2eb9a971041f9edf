// One training step of a model under a plan, simulated: the step time, MFU and memory per
// device that `shardsim run` reports for a `model:` run file and that plan search compares.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/executor.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "planner/collective_matmul.h"
#include "planner/models/logical_rules.h"
#include "planner/models/pipeline_schedule.h"
#include "planner/models/step_build_cache.h"
#include "planner/models/transformer.h"
#include "planner/partitioner.h"
#include "planner/remat.h"
#include "sim/observer.h"
#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"

namespace shardsim {
class CollectiveCostModel;
}  // namespace shardsim

namespace shardsim::planner {

// A plan (SPEC `plan:`): the mesh and the logical axis rules that shard the step.
struct StepPlan {
  std::vector<MeshAxis> mesh;  // Mesh axes in order, first major.
  std::vector<int> devices;    // Each mesh position's device (empty: the default placement).
  // On a torus, the order its dimensions are handed to the mesh axes, innermost first
  // (TorusPlacement; empty: DefaultTorusOrder). A shardsim extension: `plan.torus_order`.
  std::vector<int> torus_order;
  std::map<std::string, std::vector<std::string>> rules;  // Logical dimension -> mesh axes.
  std::map<std::string, std::string> algorithms;          // Default algorithm per collective.
  RematPolicy remat = RematPolicy::kNone;                 // What each layer's backward recomputes.
  std::optional<PipelinePlan> pipeline;                   // Pipeline parallelism (none: off).
  // Which all-gathers become collective matmuls (FuseCollectiveMatmuls).
  CollectiveMatmulMode collective_matmul = CollectiveMatmulMode::kOff;
  // MaxText checkpoint names (CheckpointNames()) of the layer values kept in host memory
  // between forward and backward (ApplyOffload), whatever `remat` recomputes.
  std::vector<std::string> offload;
  // With remat kCustom: the checkpoint names of the layer values kept in device memory.
  std::vector<std::string> remat_save;
};

// The bytes one device holds for the step's state (the largest over devices), by kind.
struct StateBytes {
  Bytes params;     // Parameters, in param_dtype, as the plan shards them.
  Bytes grads;      // Their gradients (param_dtype, sharded as the parameters).
  Bytes optimizer;  // Optimizer state: Adam's two moments (none for SGD).
};

// What a simulation of (some layers of) the step gives; every field adds up over layers.
struct StepFigures {
  Time end;           // Step time: when the last device finished.
  Time compute;       // Busiest device's compute.
  Time comm;          // Its time inside collectives.
  Time exposed_comm;  // Its communication not hidden under compute.
  Time recompute;     // Compute spent on remat's recomputation (part of compute).
  // Its exposed communication by collective (\"all_gather over fsdp\"; DeviceTiming's).
  std::map<std::string, Time> exposed_by_collective;
  // Bytes one device puts into each collective class per step (each op's input block).
  std::map<std::string, Bytes> bytes_by_collective;
  // Per directed link, the time the step's collective bytes take there at full bandwidth
  // (RunResult::link_busy), ascending by link; / step time = the link's utilisation.
  std::vector<std::pair<LinkId, Time>> link_busy;
  Bytes peak;  // Largest per-device peak of live buffers.
  // The peak within each memory phase (the forward, each backward pass, what follows), so
  // that composition extrapolates each and takes the largest: which phase holds the peak can
  // change with the layer count (activations at the backward's start, gradients at its end).
  std::vector<Bytes> phase_peaks;
  std::vector<Bytes> phase_entry_live;  // RunResult's: live bytes as each phase began.
  // RunResult::phase_forced_peaks, and the largest of them (composed as the peaks are): what
  // no order of the same ops would peak below.
  std::vector<Bytes> phase_forced_peaks;
  Bytes forced_peak;
  StateBytes state;     // Parameters, gradients and optimizer state.
  Bytes host_peak;      // Most bytes one device offloaded to host memory.
  Time host_transfer;   // Most time one device copied to or from its host.
  uint64_t events = 0;  // Events the engine dispatched.
};

// How much of a training step's communication its schedule runs beside its compute, as XLA's
// latency-hiding scheduler overlaps it within the memory limit it keeps to. Each level overlaps
// less than the one before, and mostly holds fewer buffers early (not always: program order
// can peak a little higher than kNoPrefetch, so TrainStepOptions::within_memory tries both).
enum class StepOverlap {
  // Each layer's weight collectives issued while the layer before it computes
  // (PrefetchWeightCollectives); the gradients' collectives run beside the next layer's
  // backward (DeferCollectiveReaders); independent compute fills collectives' shadows
  // (FillCollectiveShadows).
  kFull,
  // As kFull, but each weight collective issued where the partitioner put it, just before
  // its first reader: no layer's gathered weights are live while the layer before it runs.
  kNoPrefetch,
  // Program order: every collective where the partitioner put it.
  kNone,
};

// The name of `overlap` as `run --json` writes it (`schedule`): "prefetch", "no_prefetch",
// "program_order".
const char* StepOverlapName(StepOverlap overlap);

// The schedule StepOverlapName calls `name`; none for any other name.
std::optional<StepOverlap> StepOverlapNamed(std::string_view name);

// Memory per device (SPEC `memory:`).
struct StepMemory {
  Bytes params;
  Bytes grads;
  Bytes optimizer;
  // The rest of the peak: activations saved for the backward pass and temporaries live at
  // the peak (peak - params - grads - optimizer, at least 0).
  Bytes activations;
  Bytes peak;  // Liveness peak of the simulated step (program inputs included).
  // What no other order of the step's ops peaks below (StepFigures::forced_peak; 0 where not
  // known, as for pipelines).
  Bytes forced_peak;
  Bytes capacity;    // HBM per device.
  bool fits = true;  // peak <= capacity.
  Bytes host;        // Most bytes held in host memory at once (plan.offload's values).
};

// The step report (SPEC "Models, training and serving steps").
struct TrainStepReport {
  Time step_time;           // Simulated time of one step.
  double tokens_per_s = 0;  // batch x seq_len / step_time.
  double tokens_per_s_per_device = 0;
  double model_flops = 0;        // TrainStepModelFlops: PaLM's definition.
  std::string model_flops_rule;  // How model_flops counts ("6N + 12·L·H·hd·T per token").
  double mfu = 0;                // model_flops / (step_time x devices x peak FLOP/s).
  double peak_flops = 0;         // One device's peak FLOP/s in the compute dtype.
  int devices = 0;               // Mesh positions.
  Time compute;                  // Busiest device's compute.
  Time comm;                     // Its time in collectives.
  Time exposed_comm;             // Communication not hidden under compute.
  Time recompute;                // Compute spent recomputing what remat did not keep.
  Time host_transfer;            // Copying offloaded values to and from host memory.
  Time bubble;                   // Pipelines: the busiest stage's idle time inside the schedule.
  int pipeline_stages = 1;       // Pipelines: the stages (1: none).
  std::vector<int64_t> pipeline_layers;  // Pipelines: each stage's layers, by stage.
  std::vector<Bytes> pipeline_peaks;     // Pipelines: each stage's peak HBM bytes, by stage.
  // exposed_comm by collective and mesh axes (\"all_gather over fsdp\").
  std::map<std::string, Time> exposed_by_collective;
  // Bytes one device puts into each collective class per step (StepFigures').
  std::map<std::string, Bytes> bytes_by_collective;
  // Per directed link, collective bytes / bandwidth over the step (StepFigures'); empty for
  // pipelined steps. Ascending by link.
  std::vector<std::pair<LinkId, Time>> link_busy;
  RematPolicy remat = RematPolicy::kNone;  // The plan's remat.
  std::vector<std::string> remat_save;     // Its saved checkpoint names, with kCustom.
  StepMemory memory;
  // The schedule the step ran (TrainStepOptions::within_memory may take one overlapping less
  // than asked for), and, when it did, the peak of the schedule asked for, over the limit.
  StepOverlap overlap = StepOverlap::kFull;
  Bytes overlapped_peak;
  uint64_t events = 0;  // Events dispatched (summed over the simulations made).
  // Layers simulated: {L} for the whole step, {a, b} when composed from two shorter ones.
  std::vector<int64_t> simulated_layers;
  // Pipelines of a mixture of experts with leading dense layers: the layer counts also
  // simulated with the first layer dense (the rest expert layers), for a dense layer's slopes.
  std::vector<int64_t> simulated_dense_first;
};

// How a step is simulated.
struct TrainStepOptions {
  // Layers are identical, so the step's figures are affine in the layer count: simulate the
  // step with 2 and 3 layers and extrapolate (times: exact up to the timeline's settling in,
  // within 1% of the whole step in tests; the peak of live memory: within 5%, as the moment
  // it peaks can move between near-equal candidates). Off: simulate all layers.
  bool compose = true;
  // Composing: take the first pair of layer counts where the step has settled (ComposeShortSteps
  // probes a few more layers); off: the first pair whose peaks extrapolate, as a search's
  // screening does (faster, up to several percent off where the first layers settle slowly).
  bool settle = true;
  // How much communication the step's schedule overlaps (the most it may).
  StepOverlap overlap = StepOverlap::kFull;
  // Keep the schedule within `memory_limit` of HBM, as XLA's latency-hiding scheduler keeps
  // to its memory limit: where the schedule `overlap` asks for peaks over it, the step runs
  // the first schedule overlapping less (StepOverlap's order) that stays within it; when none
  // does, the one asked for (which then does not fit). Off: the schedule asked for.
  bool within_memory = true;
  double memory_limit = 1.0;  // Fraction of each device's HBM the schedule keeps within.
  // Prices collectives (not owned; null: a cache over the network model, private to the call).
  CollectiveCostModel* collective_model = nullptr;
  // Pipelines: receives the composed step as a trace (not owned; null: none): a process per
  // stage, its tasks in the schedule's order, the sends between stages as flows, and after the
  // flush its gradient all-reduce and update.
  Observer* observer = nullptr;
  // Per-link busy times (TrainStepReport::link_busy); off: left empty (a search keeps none).
  bool link_busy = true;
  // Steps built and expanded for earlier plans, taken where they serve and added to (not
  // owned; null: each step built afresh): a search worker's.
  StepBuildCache* build_cache = nullptr;
};

// Per device, the bytes of parameters, gradients and optimizer state `global` (a
// BuildTrainStep program) holds on `mesh`: the values its grad ops differentiate are the
// parameters, its other float inputs (Adam's moments) the optimizer state; gradients match
// the parameters.
StateBytes StepStateBytes(const ProgramSpec& global, const Mesh& mesh);

// The collective model a step run prices with: the caller's (TrainStepOptions::
// collective_model), or else a cache over the network model that this object owns.
class StepCollectives {
 public:
  StepCollectives(const Machine& machine, CollectiveCostModel* given);
  CollectiveCostModel& model() { return *model_; }

 private:
  std::unique_ptr<NetworkCollectiveModel> network_;
  std::unique_ptr<CachedCollectiveModel> cache_;
  CollectiveCostModel* model_;
};

// Bytes of `array`'s block on one device (its sharding over `axes` divides it).
Bytes DeviceBytes(const ArraySpec& array, const std::vector<MeshAxis>& axes);

// The plan's mesh placed on `machine`; throws SpecError "plan.mesh" when it does not fit.
Mesh PlacePlanMesh(const Machine& machine, const StepPlan& plan);

// Refuses (SpecError at plan.offload) a plan.offload that cannot run: with a pipeline (not
// modelled), or on devices without a host link (hardware.device.host_bandwidth).
void CheckOffload(const Machine& machine, const StepPlan& plan);

// Refuses (SpecError at `key`) host offload on devices without a host link
// (hardware.device.host_bandwidth).
void CheckHostLink(const DeviceSpec& device, const std::string& key);

// The plan's logical axis rules; throws SpecError "plan.rules" for an unknown name or axis.
LogicalRules PlanRules(const StepPlan& plan);

// The figures of a run of `global` (a BuildTrainStep program, partitioned) on `mesh`: its end,
// the times of the busiest device (most compute plus exposed communication; the first of
// `per_device` with it: rows by mesh position, or RunResult::per_simulated_device, which gives
// the same), the compute of its recomputation (`recompute`: RecomputeTime), the peak, the
// events, and the state bytes.
StepFigures FiguresOfRun(Time end, const std::vector<DeviceTiming>& per_device, Time recompute,
                         Bytes peak, uint64_t events, const ProgramSpec& global, const Mesh& mesh);

// The shorter of the two layer counts a composed step simulates (and that plus one): 2, after
// a MoE model's leading dense layers (DeepSeek-V3's 3), which both runs keep, so that what
// the extra layer adds is one MoE layer.
int64_t ComposedFrom(const TransformerConfig& model);
// The figures of a step k layers longer than a's, b being one layer longer than a: every
// figure extrapolated (a + (b - a) k; the peak per memory phase, then the largest), the
// events summed.
StepFigures ComposeFigures(const StepFigures& a, const StepFigures& b, int64_t k);
// Whether b's peak (overall or in some memory phase) is below a's, b being one layer longer:
// such peaks cannot be extrapolated (ComposeShortSteps composes from the next pair then).
bool PeakFalls(const StepFigures& a, const StepFigures& b);
// Whether composing a and b over k more layers (ComposeFigures) puts the peak in another memory
// phase than the one holding b's: two points cannot tell a phase that overtakes by its slope
// from one still settling (ComposeShortSteps composes from the next pair then).
bool PeakChangesPhase(const StepFigures& a, const StepFigures& b, int64_t k);
// How far apart two consecutive layers' slopes of the step time (and of its peak memory) may
// be, relative to the later, for the step to count as settled (SlopesAgree).
inline constexpr double kSettledSlope = 0.005;
// The most layers ComposeShortSteps probes beyond its first pair.
inline constexpr int64_t kSettleProbes = 4;
// Whether the step time and the peak grow by the same from b to c as from a to b (within
// kSettledSlope), each one layer longer than the one before.
bool SlopesAgree(const StepFigures& a, const StepFigures& b, const StepFigures& c);
// The figures of a step of `layers` layers composed (ComposeFigures) from `run`'s steps of
// n and n + 1 layers for the first n from `from` on where the step has settled: the step of
// n + 2 layers grows by what n + 1 grew (SlopesAgree) and the peaks neither fall (PeakFalls)
// nor move to another phase (PeakChangesPhase); at most kSettleProbes layers past `from` + 1
// (the last pair probed then, settled or not),
// and never past `layers` (the step itself, then exact). `layers` must exceed `from` + 1;
// `simulated` receives the pair composed from.
// Without `settle`, the first pair whose peaks extrapolate: `from` and `from` + 1, or the next
// pair when the peaks fall or move to another phase between them.
StepFigures ComposeShortSteps(int64_t from, int64_t layers,
                              const std::function<StepFigures(int64_t)>& run,
                              std::vector<int64_t>* simulated, bool settle = true);

// A training step partitioned but not yet scheduled (PartitionTrainStep's first half: grads
// expanded, remat and offload applied, auto-partitioned): what every StepOverlap of the step
// shares.
struct PartitionedStep {
  // The global step, grads expanded, remat and offload applied (shared: ExpandedTrainStep).
  std::shared_ptr<const ProgramSpec> expanded;
  std::vector<size_t> boundaries;  // Its backward passes' first and last ops (ExpandGrads').
  PartitionResult partitioned;     // It partitioned.
};

// Partitions `global` (its `layers` as BuildTrainStep or BuildServeStep list them) with
// PartitionTrainStep, simulates it on the cached timing path and reads its figures.
// `offloaded` lists per layer the values plan.offload names and `saved` those a custom remat
// keeps (CheckpointValues); `head_tiles` BuildTrainStep's vocabulary tiles. Without
// `link_busy`, StepFigures::link_busy stays empty (RunConfig::link_busy). `prefetch_groups`
// and `overlap` schedule it as PartitionTrainStep says; `partitioned`, when given, is
// `global`'s PartitionStep (on these layers, remat, offload and costs), not made again: its
// ops are reordered during the call and put back in their order before it returns.
StepFigures SimulateStepFigures(const Machine& machine, const Mesh& mesh, const ProgramSpec& global,
                                const std::vector<std::vector<std::string>>& layers,
                                const StepPlan& plan, CollectiveCostModel& collectives,
                                int prefetch_groups,
                                const std::vector<std::vector<std::string>>& offloaded = {},
                                const std::vector<std::vector<std::string>>& head_tiles = {},
                                const std::vector<std::vector<std::string>>& saved = {},
                                bool link_busy = true, StepOverlap overlap = StepOverlap::kFull,
                                PartitionedStep* partitioned = nullptr);

// A training step built and expanded (ExpandedTrainStep) and partitioned (PartitionStep):
// what every StepOverlap of it shares.
struct BuiltTrainStep {
  std::shared_ptr<const ExpandedTrainStep> built;
  PartitionedStep partitioned;  // Its `expanded` is built's.
};

// Builds `model`'s step on `train` for `plan`'s mesh axes and `rules`, its `offload` checkpoint
// names (plan.offload, or none) held in host memory and plan.remat_save's kept, and partitions
// it on `mesh` with plan.remat, collectives priced by `collectives`. With `cache`, a step built
// for another plan of the same axis names serves where it can (StepBuildCache), and one built
// here is kept there. `choices`, when given, are the partitioner's kept choices of layout on
// `mesh` (PartitionChoices), shared by the steps a plan partitions.
BuiltTrainStep BuildPartitionedStep(const Machine& machine, const Mesh& mesh,
                                    const TransformerConfig& model, const TrainConfig& train,
                                    const StepPlan& plan, const LogicalRules& rules,
                                    CollectiveCostModel& collectives,
                                    const std::vector<std::string>& offload,
                                    StepBuildCache* cache = nullptr,
                                    PartitionChoices* choices = nullptr);

// Per layer of `checkpoints` (BuildTrainStep's), the values of the checkpoint `names`; throws
// SpecError at `key` (plan.offload, plan.remat.save) for a name some layer lacks (an MoE
// layer's MLP, a GELU's mlpwi_1).
std::vector<std::vector<std::string>> CheckpointValues(
    const std::vector<std::map<std::string, std::string>>& checkpoints,
    const std::vector<std::string>& names, const std::string& key);

// The inputs a step replaces: those with an output <name>_new (BuildTrainStep's updated
// parameters and Adam moments). Model runs donate them (RunConfig::donated_inputs), as a JAX
// training loop donates its state, so the old state's buffers die after their last reader.
std::set<std::string> UpdatedInputs(const ProgramSpec& global);

// Per collective class ("all_gather over fsdp"), the bytes of its ops' input blocks on one
// device, from a run's per-op rows.
std::map<std::string, Bytes> CollectiveBytes(const std::vector<OpTiming>& ops);

// One device's compute on the recomputation remat inserted: the compute times of the ops
// IsRecompute names, from a run's per-op rows.
Time RecomputeTime(const std::vector<OpTiming>& ops);

// PartitionTrainStep's first half, on the same arguments.
PartitionedStep PartitionStep(const ProgramSpec& global,
                              const std::vector<std::vector<std::string>>& layers,
                              RematPolicy remat, const PartitionCosts& costs,
                              const std::vector<std::vector<std::string>>& offloaded = {},
                              const std::vector<std::vector<std::string>>& head_tiles = {},
                              const std::vector<std::vector<std::string>>& saved = {});

// PartitionTrainStep's second half: `partitioned` (a PartitionStep's, of `expanded` with its
// pass `boundaries`, on the same `layers`) scheduled.
PartitionResult ScheduleStep(const ProgramSpec& expanded, const std::vector<size_t>& boundaries,
                             PartitionResult partitioned,
                             const std::vector<std::vector<std::string>>& layers,
                             const PartitionCosts& costs, int prefetch_groups,
                             std::vector<size_t>* phases, CollectiveMatmulMode collective_matmul,
                             StepOverlap overlap);

// ScheduleStep on `partitioned` itself.
void ScheduleStepInPlace(const ProgramSpec& expanded, const std::vector<size_t>& boundaries,
                         PartitionResult& partitioned,
                         const std::vector<std::vector<std::string>>& layers,
                         const PartitionCosts& costs, int prefetch_groups,
                         std::vector<size_t>* phases, CollectiveMatmulMode collective_matmul,
                         StepOverlap overlap);

// The partitioned step as model runs simulate it: `global` (a BuildTrainStep program) with its
// grads expanded, what `remat` does not keep of `layers` (BuildTrainStep's layer values)
// recomputed in each backward pass (ApplyRemat), partitioned (auto, priced by `costs`), and
// scheduled, after the all-gathers `collective_matmul` asks for became collective matmuls with
// their products (FuseCollectiveMatmuls on costs.mesh): as `overlap` says, its weight
// collectives prefetched a layer ahead over `prefetch_groups` (PrefetchWeightCollectives)
// with kFull; `prefetch_groups` 0 is program order whatever `overlap` asks. `phases`,
// when given, receives the partitioned program's op indices where each backward pass starts
// and ends (RunConfig::memory_phases). The values of `offloaded` (per layer) are kept whatever
// `remat` recomputes and live in host memory between their forward and backward uses
// (ApplyOffload, after remat); with a custom `remat`, those of `saved` (per layer) are kept in
// device memory; each of `head_tiles` (vocabulary tiles) is recomputed fully in the backward
// whatever `remat` says (MaxText's tiled loss is checkpointed so).
PartitionResult PartitionTrainStep(
    const ProgramSpec& global, const std::vector<std::vector<std::string>>& layers,
    RematPolicy remat, const PartitionCosts& costs, int prefetch_groups,
    std::vector<size_t>* phases = nullptr,
    CollectiveMatmulMode collective_matmul = CollectiveMatmulMode::kOff,
    const std::vector<std::vector<std::string>>& offloaded = {},
    const std::vector<std::vector<std::string>>& head_tiles = {},
    const std::vector<std::vector<std::string>>& saved = {},
    StepOverlap overlap = StepOverlap::kFull);

// The report of `figures` (of the whole step, or composed) for `model` on `train`'s batch on
// `mesh` of `machine`.
TrainStepReport MakeTrainStepReport(const Machine& machine, const Mesh& mesh,
                                    const TransformerConfig& model, const TrainConfig& train,
                                    const StepFigures& figures,
                                    std::vector<int64_t> simulated_layers);

// The report of `figures` for a step of `model_flops` on `tokens` (or examples) in `dtype`.
TrainStepReport MakeStepReport(const Machine& machine, const Mesh& mesh, double model_flops,
                               double tokens, DType dtype, const StepFigures& figures,
                               std::vector<int64_t> simulated_layers);

// Builds (BuildMlpTrainStep), partitions and simulates one training step of the MLP `mlp`
// under `plan` (remat does not apply), every layer simulated: MFU from 6 FLOPs per weight per
// example, tokens/s counting examples.
// How an MLP step's model FLOPs count.
inline constexpr const char* kMlpFlopsRule = "6 per weight per example";

TrainStepReport SimulateMlpTrainStep(const Machine& machine, const MlpModel& mlp,
                                     const TrainConfig& train, const StepPlan& plan,
                                     const TrainStepOptions& options = {});

// Builds, partitions (auto) and simulates (cached collective timing, timing only) one
// training step of `model` under `plan` on `machine`. Throws SpecError ("plan.mesh", ...) for a
// plan the machine or partitioner refuses and std::invalid_argument for a model that does not
// fit together.
TrainStepReport SimulateTrainStep(const Machine& machine, const TransformerConfig& model,
                                  const TrainConfig& train, const StepPlan& plan,
                                  const TrainStepOptions& options = {});

}  // namespace shardsim::planner
