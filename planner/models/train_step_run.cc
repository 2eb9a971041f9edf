#include "planner/models/train_step_run.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "collectives/dtype.h"
#include "collectives/lowering.h"
#include "collectives/runtime/run_program.h"
#include "collectives/timing/collective_cost_model.h"
#include "planner/collective_shadow.h"
#include "planner/defer_readers.h"
#include "planner/grad.h"
#include "planner/models/logical_rules.h"
#include "planner/models/model_flops.h"
#include "planner/models/pipeline_step_run.h"
#include "planner/offload.h"
#include "planner/partitioner.h"
#include "planner/prefetch.h"
#include "planner/value_sharding.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// a + (b - a) * k, field by field: the figures of a step with k layers more than a's, b being
// one layer more than a.
Time Extrapolate(Time a, Time b, int64_t k) { return a + (b - a) * k; }
Bytes Extrapolate(Bytes a, Bytes b, int64_t k) { return a + (b - a) * k; }

// A peak composed from the peaks `a` and `b` and, where both runs have the same memory phases,
// from each phase's (extrapolated into `phases`): the largest of them.
Bytes ExtrapolatePhases(Bytes a, Bytes b, const std::vector<Bytes>& a_phases,
                        const std::vector<Bytes>& b_phases, int64_t k, std::vector<Bytes>* phases) {
  if (a_phases.empty() || a_phases.size() != b_phases.size()) return Extrapolate(a, b, k);
  Bytes peak;
  for (size_t p = 0; p < a_phases.size(); ++p) {
    phases->push_back(Extrapolate(a_phases[p], b_phases[p], k));
    peak = std::max(peak, phases->back());
  }
  return peak;
}

// Extrapolate per key (a key missing from one side counts zero there); zeros left out.
template <typename K, typename T>
std::map<K, T> ExtrapolateEach(const std::map<K, T>& a, const std::map<K, T>& b, int64_t k) {
  std::set<K> keys;
  for (const auto& [key, v] : a) keys.insert(key);
  for (const auto& [key, v] : b) keys.insert(key);
  std::map<K, T> out;
  for (const K& key : keys) {
    const auto in_a = a.find(key);
    const auto in_b = b.find(key);
    const T v =
        Extrapolate(in_a == a.end() ? T() : in_a->second, in_b == b.end() ? T() : in_b->second, k);
    if (v > T()) out[key] = v;
  }
  return out;
}

// ExtrapolateEach over two lists ascending by key, merged in one pass (a pod's links are tens
// of thousands).
template <typename K, typename T>
std::vector<std::pair<K, T>> ExtrapolateSorted(const std::vector<std::pair<K, T>>& a,
                                               const std::vector<std::pair<K, T>>& b, int64_t k) {
  std::vector<std::pair<K, T>> out;
  out.reserve(std::max(a.size(), b.size()));
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    K key;
    T va{}, vb{};
    if (j == b.size() || (i < a.size() && a[i].first < b[j].first)) {
      key = a[i].first;
      va = a[i++].second;
    } else if (i == a.size() || b[j].first < a[i].first) {
      key = b[j].first;
      vb = b[j++].second;
    } else {
      key = a[i].first;
      va = a[i++].second;
      vb = b[j++].second;
    }
    const T v = Extrapolate(va, vb, k);
    if (v > T()) out.push_back({key, v});
  }
  return out;
}

}  // namespace

bool PeakFalls(const StepFigures& a, const StepFigures& b) {
  if (b.peak < a.peak) return true;
  for (size_t p = 0; p < a.phase_peaks.size() && p < b.phase_peaks.size(); ++p) {
    if (b.phase_peaks[p] < a.phase_peaks[p]) return true;
  }
  return false;
}

bool PeakChangesPhase(const StepFigures& a, const StepFigures& b, int64_t k) {
  if (a.phase_peaks.size() != b.phase_peaks.size() || b.phase_peaks.empty()) return false;
  size_t measured = 0, composed = 0;
  Bytes most;
  for (size_t p = 0; p < b.phase_peaks.size(); ++p) {
    if (b.phase_peaks[p] > b.phase_peaks[measured]) measured = p;
    const Bytes extrapolated = Extrapolate(a.phase_peaks[p], b.phase_peaks[p], k);
    if (extrapolated > most) {
      most = extrapolated;
      composed = p;
    }
  }
  return composed != measured;
}

bool SlopesAgree(const StepFigures& a, const StepFigures& b, const StepFigures& c) {
  auto agree = [](double first, double second) {
    return std::abs(second - first) <= kSettledSlope * std::abs(second);
  };
  return agree((b.end - a.end).seconds(), (c.end - b.end).seconds()) &&
         agree(static_cast<double>((b.peak - a.peak).count()),
               static_cast<double>((c.peak - b.peak).count()));
}

StepFigures ComposeShortSteps(int64_t from, int64_t layers,
                              const std::function<StepFigures(int64_t)>& run,
                              std::vector<int64_t>* simulated, bool settle) {
  // The first layers of a step settle before every further layer adds the same: collectives
  // in flight build up, prefetches reach their steady lead. So the pair composed from is the
  // first whose slope the next layer repeats (SlopesAgree), probing up to kSettleProbes
  // layers past `from` + 1 (or the whole step, which is then exact). Llama-3-70B on 2048 v5p
  // chips (FSDP 64 x TP 4 x data 8, selective remat): 420.2, 494.1, 560.8, 630.9, 701.0 ms
  // at 2 to 6 layers, slopes 73.9, 66.7, 70.1, 70.1; from 2 and 3 the 80-layer step was
  // 6.187 s, 5.0% above the whole step's 5.891 s; from 5 and 6, within 0.1%. Mixtral 8x7B
  // (FSDP 8 x EP 8 on H100) settles from 3: from 2 and 3 it was 8.3% short. The peak's
  // slope must repeat too: MaxText's 128B model on 256 v5e (FSDP 16 x TP 16, full remat)
  // peaks at 5.253, 5.380, 5.429, 5.556, 5.683 GiB at 2 to 6 layers, its time long settled;
  // from 3 and 4 (0.049 GiB a layer) its 64 layers peaked at 8.36 GiB against the whole
  // step's 13.05 (0.127 a layer from 4 on).
  // Memory too: a peak that falls from one layer count to the next shows the first layers
  // settling differently (prefetches and host copies the shortest step overlaps otherwise),
  // and extrapolated it would fall without bound (Llama-3-70B on 256 v6e with full remat and
  // its inputs offloaded: 24.1 GiB at 2 layers, 23.7 at 3, 24.0 at 12; from 2 and 3, 6.1 GiB
  // at 80); and where the composed peak falls in another phase than the measured one's, that
  // phase may overtake by its slope or still be settling (Mixtral 8x7B's dropless step with
  // full remat: its first backward pass peaks at 18.5 GiB with 2 layers and 23.4 with 3,
  // while the last, the step's peak, grows from 23.3 to 23.8; from 2 and 3, 166 GiB at 32
  // layers). Such pairs do not count as settled either. When the probes run out (or reach
  // `layers`), the last pair is composed from whatever it shows; without settling, the next
  // pair is taken once, as it is.
  StepFigures a = run(from);
  StepFigures b = run(from + 1);
  int64_t at = from;  // a's layers; b has one more.
  if (!settle) {
    if (PeakFalls(a, b) || PeakChangesPhase(a, b, layers - from)) {
      a = std::move(b);
      b = run(from + 2);
      ++at;
    }
    *simulated = {at, at + 1};
    return ComposeFigures(a, b, layers - at);
  }
  while (at + 2 <= layers && at + 1 < from + 1 + kSettleProbes) {
    StepFigures c = run(at + 2);
    const bool settled =
        SlopesAgree(a, b, c) && !PeakFalls(b, c) && !PeakChangesPhase(b, c, layers - at - 1);
    a = std::move(b);
    b = std::move(c);
    ++at;
    if (settled) break;
  }
  *simulated = {at, at + 1};
  return ComposeFigures(a, b, layers - at);
}

StepFigures ComposeFigures(const StepFigures& a, const StepFigures& b, int64_t k) {
  StepFigures f;
  f.end = Extrapolate(a.end, b.end, k);
  f.compute = Extrapolate(a.compute, b.compute, k);
  f.comm = Extrapolate(a.comm, b.comm, k);
  // Communication a layer hides can shorten what the short steps expose (their last layers'
  // reduce-scatters overlap the layer added): never below none, for the whole and for each
  // collective class. A class whose exposure shrinks with the layers reaches none and stays
  // there, so the composed whole is at least the sum of the classes' (which the short steps'
  // exposure splits into exactly): never less than the parts it lists.
  f.exposed_by_collective = ExtrapolateEach(a.exposed_by_collective, b.exposed_by_collective, k);
  Time parts;
  for (const auto& [name, t] : f.exposed_by_collective) parts += t;
  f.exposed_comm = std::max(parts, Extrapolate(a.exposed_comm, b.exposed_comm, k));
  f.recompute = Extrapolate(a.recompute, b.recompute, k);
  f.bytes_by_collective = ExtrapolateEach(a.bytes_by_collective, b.bytes_by_collective, k);
  f.link_busy = ExtrapolateSorted(a.link_busy, b.link_busy, k);
  f.peak = ExtrapolatePhases(a.peak, b.peak, a.phase_peaks, b.phase_peaks, k, &f.phase_peaks);
  f.forced_peak = ExtrapolatePhases(a.forced_peak, b.forced_peak, a.phase_forced_peaks,
                                    b.phase_forced_peaks, k, &f.phase_forced_peaks);
  f.state.params = Extrapolate(a.state.params, b.state.params, k);
  f.state.grads = Extrapolate(a.state.grads, b.state.grads, k);
  f.state.optimizer = Extrapolate(a.state.optimizer, b.state.optimizer, k);
  f.host_peak = Extrapolate(a.host_peak, b.host_peak, k);
  f.host_transfer = Extrapolate(a.host_transfer, b.host_transfer, k);
  f.events = a.events + b.events;  // The work done, not a figure of the step.
  return f;
}

StepFigures SimulateStepFigures(const Machine& machine, const Mesh& mesh, const ProgramSpec& global,
                                const std::vector<std::vector<std::string>>& layers,
                                const StepPlan& plan, CollectiveCostModel& collectives,
                                int prefetch_groups,
                                const std::vector<std::vector<std::string>>& offloaded,
                                const std::vector<std::vector<std::string>>& head_tiles,
                                const std::vector<std::vector<std::string>>& saved, bool link_busy,
                                StepOverlap overlap, PartitionedStep* step) {
  std::vector<size_t> phases;
  const PartitionCosts costs{&mesh, &collectives, machine.compute_model(),
                             DeviceInBytesPerSecond(machine), &machine};
  // Without collective matmuls the scheduling passes only reorder ops: they reorder the step's
  // own partition, put back in its order once the run is done, for the other schedules a plan
  // may try (and, if the run throws, as the exception leaves). Otherwise they rewrite a copy:
  // its program alone (its ops' reasons and types, for tables, no run reads).
  struct PutBack {
    PartitionResult* reordered = nullptr;
    void Now() {
      if (reordered) RestoreOrder(*reordered);
      reordered = nullptr;
    }
    ~PutBack() {
      try {
        Now();
      } catch (...) {  // Already leaving with an exception; the step is dropped with it.
      }
    }
  } put_back;
  std::optional<PartitionResult> apart;
  const ProgramSpec* program = nullptr;
  if (step && plan.collective_matmul == CollectiveMatmulMode::kOff) {
    KeepOrigin(step->partitioned);
    put_back.reordered = &step->partitioned;
    ScheduleStepInPlace(*step->expanded, step->boundaries, step->partitioned, layers, costs,
                        prefetch_groups, &phases, plan.collective_matmul, overlap);
    program = &step->partitioned.program;
  } else if (step) {
    PartitionResult copy;
    copy.program = step->partitioned.program;
    apart = ScheduleStep(*step->expanded, step->boundaries, std::move(copy), layers, costs,
                         prefetch_groups, &phases, plan.collective_matmul, overlap);
    program = &apart->program;
  } else {
    apart = PartitionTrainStep(global, layers, plan.remat, costs, prefetch_groups, &phases,
                               plan.collective_matmul, offloaded, head_tiles, saved, overlap);
    program = &apart->program;
  }
  const LoweredProgram lowered = LowerProgram(mesh, *program, plan.algorithms);
  RunConfig config;
  config.algorithms = plan.algorithms;
  config.timing = TimingPath::kCached;
  config.collective_model = &collectives;
  config.memory_phases = phases;
  config.donated_inputs = UpdatedInputs(global);
  config.device_rows = false;
  config.link_busy = link_busy;
  const RunResult run = RunProgram(machine, mesh, *program, config, &lowered);
  put_back.Now();
  StepFigures f = FiguresOfRun(run.end, run.per_simulated_device, RecomputeTime(run.ops),
                               run.peak_memory, run.events, global, mesh);
  f.bytes_by_collective = CollectiveBytes(run.ops);
  f.link_busy = run.link_busy;
  f.phase_peaks = run.phase_peaks;
  f.phase_entry_live = run.phase_entry_live;
  f.phase_forced_peaks = run.phase_forced_peaks;
  for (Bytes p : f.phase_forced_peaks) f.forced_peak = std::max(f.forced_peak, p);
  f.host_peak = run.host_peak;
  f.host_transfer = run.host_transfer;
  return f;
}

namespace {

// `global` with its grads expanded, what `remat` does not keep of `layers` recomputed (the
// `saved` values kept with kCustom), the head's vocabulary tiles fully recomputed and the
// `offloaded` values held in host memory; its backward passes' boundaries into `boundaries`.
ProgramSpec ExpandStep(const ProgramSpec& global,
                       const std::vector<std::vector<std::string>>& layers, RematPolicy remat,
                       const std::vector<std::vector<std::string>>& offloaded,
                       const std::vector<std::vector<std::string>>& head_tiles,
                       const std::vector<std::vector<std::string>>& saved,
                       std::vector<size_t>* boundaries) {
  ProgramSpec expanded = ExpandGrads(global, boundaries);
  std::set<std::string> kept;
  for (const std::vector<std::string>& values : offloaded)
    kept.insert(values.begin(), values.end());
  const bool offloads = !kept.empty();
  if (remat == RematPolicy::kCustom) {
    for (const std::vector<std::string>& values : saved) kept.insert(values.begin(), values.end());
  }
  ApplyRemat(expanded, *boundaries, layers, remat, kept);
  ApplyRemat(expanded, *boundaries, head_tiles, RematPolicy::kFull);
  if (offloads) ApplyOffload(expanded, *boundaries, offloaded);
  return expanded;
}

// `expanded` (ExpandStep's, with its `boundaries`) partitioned, over `sizes` where given
// (PartitionExpanded); what keeps it from partitioning is the plan's fault.
PartitionResult PartitionExpandedStep(const ProgramSpec& expanded,
                                      const std::vector<size_t>& boundaries,
                                      const PartitionCosts& costs,
                                      const std::vector<MeshAxis>* sizes = nullptr,
                                      PartitionChoices* choices = nullptr,
                                      PartitionAnalysis* analysis = nullptr) {
  try {
    return PartitionExpanded(expanded, boundaries, costs, sizes, choices, analysis);
  } catch (const SpecError& e) {
    throw SpecError("plan", std::string("the plan cannot partition the step: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw SpecError("plan", std::string("the plan cannot partition the step: ") + e.what());
  }
}

}  // namespace

BuiltTrainStep BuildPartitionedStep(const Machine& machine, const Mesh& mesh,
                                    const TransformerConfig& model, const TrainConfig& train,
                                    const StepPlan& plan, const LogicalRules& rules,
                                    CollectiveCostModel& collectives,
                                    const std::vector<std::string>& offload, StepBuildCache* cache,
                                    PartitionChoices* choices) {
  BuiltTrainStep b;
  std::optional<StepBuildCache::Key> key;
  if (cache) {
    key =
        StepBuildCache::KeyOf(model, train, rules, plan.mesh, plan.remat, plan.remat_save, offload);
    b.built = cache->Find(*key, plan.mesh);
  }
  if (!b.built) {
    auto made = std::make_shared<ExpandedTrainStep>();
    std::vector<std::map<std::string, std::string>> checkpoints;
    made->global = BuildTrainStep(model, train, plan.mesh, rules, &made->layers, &checkpoints,
                                  &made->head_tiles);
    made->offloaded = CheckpointValues(checkpoints, offload, "plan.offload");
    made->saved = CheckpointValues(checkpoints, plan.remat_save, "plan.remat.save");
    made->expanded = std::make_shared<const ProgramSpec>(
        ExpandStep(made->global, made->layers, plan.remat, made->offloaded, made->head_tiles,
                   made->saved, &made->boundaries));
    b.built = std::move(made);
    if (cache) cache->Insert(std::move(*key), b.built);
  }
  b.partitioned.expanded = b.built->expanded;
  b.partitioned.boundaries = b.built->boundaries;
  b.partitioned.partitioned =
      PartitionExpandedStep(*b.built->expanded, b.built->boundaries,
                            PartitionCosts{&mesh, &collectives, machine.compute_model(),
                                           DeviceInBytesPerSecond(machine), &machine,
                                           /*describe=*/false},
                            &plan.mesh, choices, b.built->analysis.get());
  return b;
}

std::vector<std::vector<std::string>> CheckpointValues(
    const std::vector<std::map<std::string, std::string>>& checkpoints,
    const std::vector<std::string>& names, const std::string& key) {
  std::vector<std::vector<std::string>> out;
  for (const std::map<std::string, std::string>& layer : checkpoints) {
    std::vector<std::string>& values = out.emplace_back();
    for (const std::string& name : names) {
      const auto it = layer.find(name);
      if (it == layer.end()) {
        throw SpecError(key,
                        "'" + name +
                            "' is not a value of every decoder layer (mlpwi_0, mlpwi_1 and mlpwo "
                            "name a dense MLP's projections, which mixture-of-experts layers do "
                            "not have; mlpwi_1 a SwiGLU's up projection)");
      }
      values.push_back(it->second);
    }
  }
  return out;
}

namespace {

// Each layer count's built and partitioned step, shared by the schedules a step tries
// (ScheduleWithinMemory), and the partitioner's choices of layout, shared by those partitions.
struct BuiltSteps {
  std::map<int64_t, BuiltTrainStep> by_layers;
  PartitionChoices own_choices;
  PartitionChoices* choices = &own_choices;  // Its own, or those kept for its mesh.
};

// Simulates the training step of `model` (whatever its layer count) scheduled as `overlap`
// says and reads its figures; what it builds and partitions is kept in `built` by layer count
// (its expanded step taken from and added to `build_cache` where given).
StepFigures SimulateFigures(const Machine& machine, const Mesh& mesh,
                            const TransformerConfig& model, const TrainConfig& train,
                            const StepPlan& plan, const LogicalRules& rules,
                            CollectiveCostModel& collectives, StepOverlap overlap, bool link_busy,
                            BuiltSteps& built, StepBuildCache* build_cache) {
  auto it = built.by_layers.find(model.layers);
  if (it == built.by_layers.end()) {
    it = built.by_layers
             .emplace(model.layers,
                      BuildPartitionedStep(machine, mesh, model, train, plan, rules, collectives,
                                           plan.offload, build_cache, built.choices))
             .first;
  }
  BuiltTrainStep& b = it->second;
  const ExpandedTrainStep& e = *b.built;
  return SimulateStepFigures(machine, mesh, e.global, e.layers, plan, collectives,
                             PrefetchGroups(model.layers, train), e.offloaded, e.head_tiles,
                             e.saved, link_busy, overlap, &b.partitioned);
}

}  // namespace

PartitionedStep PartitionStep(const ProgramSpec& global,
                              const std::vector<std::vector<std::string>>& layers,
                              RematPolicy remat, const PartitionCosts& costs,
                              const std::vector<std::vector<std::string>>& offloaded,
                              const std::vector<std::vector<std::string>>& head_tiles,
                              const std::vector<std::vector<std::string>>& saved) {
  PartitionedStep step;
  step.expanded = std::make_shared<const ProgramSpec>(
      ExpandStep(global, layers, remat, offloaded, head_tiles, saved, &step.boundaries));
  step.partitioned = PartitionExpandedStep(*step.expanded, step.boundaries, costs);
  return step;
}

PartitionResult ScheduleStep(const ProgramSpec& expanded, const std::vector<size_t>& boundaries,
                             PartitionResult partitioned,
                             const std::vector<std::vector<std::string>>& layers,
                             const PartitionCosts& costs, int prefetch_groups,
                             std::vector<size_t>* phases, CollectiveMatmulMode collective_matmul,
                             StepOverlap overlap) {
  ScheduleStepInPlace(expanded, boundaries, partitioned, layers, costs, prefetch_groups, phases,
                      collective_matmul, overlap);
  return partitioned;
}

void ScheduleStepInPlace(const ProgramSpec& expanded, const std::vector<size_t>& boundaries,
                         PartitionResult& partitioned,
                         const std::vector<std::vector<std::string>>& layers,
                         const PartitionCosts& costs, int prefetch_groups,
                         std::vector<size_t>* phases, CollectiveMatmulMode collective_matmul,
                         StepOverlap overlap) {
  const int groups = overlap == StepOverlap::kNone ? 0 : prefetch_groups;
  const bool prefetch = overlap == StepOverlap::kFull && groups > 0;
  if (collective_matmul != CollectiveMatmulMode::kOff) {
    if (!costs.mesh) throw std::logic_error("internal error: collective matmuls need the mesh");
    FuseCollectiveMatmuls(partitioned, *costs.mesh, collective_matmul, costs.machine,
                          costs.collectives, prefetch);
  }
  // The passes find the ops' data flow from their names' ids, hashed once here: each op is
  // numbered by its place now (the caller's numbers, if any, are composed back at the end).
  std::vector<size_t> caller_origin = std::move(partitioned.origin);
  KeepOrigin(partitioned);
  const OpNameIds ids = NameIdsOf(partitioned.program);
  // Each op's name as an id (by the op's place when `ids` were made: partitioned.origin
  // follows it), and each op of `expanded`'s (-1: no op of the partition has it); made
  // before any op moves (the table views the names).
  std::vector<int> op_name, expanded_name;
  size_t op_names = 0;
  {
    std::unordered_map<std::string_view, int> name_id;
    op_name.reserve(partitioned.program.ops.size());
    for (const OpSpec& op : partitioned.program.ops) {
      op_name.push_back(
          name_id.try_emplace(op.name, static_cast<int>(name_id.size())).first->second);
    }
    expanded_name.reserve(expanded.ops.size());
    for (const OpSpec& op : expanded.ops) {
      const auto it = name_id.find(op.name);
      expanded_name.push_back(it == name_id.end() ? -1 : it->second);
    }
    op_names = name_id.size();
  }
  if (prefetch) PrefetchWeightCollectives(partitioned, groups, &ids);
  // Ops of `expanded` (ascending indices) located in the partitioned program as it is now, in
  // order: each at the first op, from it on in `expanded`, that the partitioned program has
  // by name at or after the previous one located (the partitioner keeps the global ops'
  // names and puts the reshards it inserts for an op just before it; an op it emits nothing
  // for, such as a layer's first op, its residual stream's sharding constraint, where the
  // stream already meets it, is located at the next op it does emit).
  // Per name id, its first position in the partitioned program as it is now, and per op its
  // next position under the same name (ops.size(): none), made afresh once the ops move.
  std::vector<size_t> first, next_same;
  auto index = [&] {
    const size_t n = partitioned.program.ops.size();
    first.assign(op_names, n);
    next_same.assign(n, n);
    for (size_t i = n; i-- > 0;) {
      const auto id = static_cast<size_t>(op_name[partitioned.origin[i]]);
      next_same[i] = first[id];
      first[id] = i;
    }
  };
  auto located = [&](const std::vector<size_t>& at_expanded) {
    const size_t n = partitioned.program.ops.size();
    std::vector<size_t> found;
    size_t from = 0;
    for (size_t at : at_expanded) {
      size_t i = n;
      for (size_t e = at; e < expanded.ops.size() && i == n; ++e) {
        if (expanded_name[e] < 0) continue;
        size_t p = first[static_cast<size_t>(expanded_name[e])];
        while (p < from) p = next_same[p];  // The first at or after `from` (n: none).
        i = p;
      }
      if (i == n) break;
      found.push_back(i);
      from = i;
    }
    return found;
  };
  // Scheduled as XLA's latency-hiding scheduler would: the gradients' collectives run while
  // the backward goes on, and independent compute runs while the collectives the next ops
  // wait for are in flight.
  if (groups > 0) {
    const std::vector<size_t> backward = LayerBackwardStarts(expanded, boundaries, layers);
    index();
    DeferCollectiveReaders(partitioned, located(boundaries), located(backward), &ids);
    index();
    std::vector<size_t> segments = LayerForwardStarts(expanded, boundaries, layers);
    segments.insert(segments.end(), backward.begin(), backward.end());
    segments.insert(segments.end(), boundaries.begin(), boundaries.end());
    std::sort(segments.begin(), segments.end());
    segments.erase(std::unique(segments.begin(), segments.end()), segments.end());
    FillCollectiveShadows(partitioned, located(segments), &ids);
  }
  if (phases) {
    index();
    *phases = located(boundaries);
  }
  if (caller_origin.empty()) {
    partitioned.origin.clear();
  } else {
    for (size_t& o : partitioned.origin) o = caller_origin[o];
  }
}

PartitionResult PartitionTrainStep(const ProgramSpec& global,
                                   const std::vector<std::vector<std::string>>& layers,
                                   RematPolicy remat, const PartitionCosts& costs,
                                   int prefetch_groups, std::vector<size_t>* phases,
                                   CollectiveMatmulMode collective_matmul,
                                   const std::vector<std::vector<std::string>>& offloaded,
                                   const std::vector<std::vector<std::string>>& head_tiles,
                                   const std::vector<std::vector<std::string>>& saved,
                                   StepOverlap overlap) {
  PartitionedStep step = PartitionStep(global, layers, remat, costs, offloaded, head_tiles, saved);
  return ScheduleStep(*step.expanded, step.boundaries, std::move(step.partitioned), layers, costs,
                      prefetch_groups, phases, collective_matmul, overlap);
}

std::set<std::string> UpdatedInputs(const ProgramSpec& global) {
  std::set<std::string> outputs;
  for (const OutputSpec& o : global.outputs) outputs.insert(o.name);
  std::set<std::string> updated;
  for (const ArraySpec& a : global.arrays) {
    if (outputs.count(a.name + "_new")) updated.insert(a.name);
  }
  return updated;
}

std::map<std::string, Bytes> CollectiveBytes(const std::vector<OpTiming>& ops) {
  std::map<std::string, Bytes> bytes;
  for (const OpTiming& op : ops) {
    if (!op.comm_class.empty()) bytes[op.comm_class] = bytes[op.comm_class] + op.bytes;
  }
  return bytes;
}

Time RecomputeTime(const std::vector<OpTiming>& ops) {
  Time total;
  for (const OpTiming& op : ops) {
    if (IsRecompute(op.name)) total += op.compute;
  }
  return total;
}

StepFigures FiguresOfRun(Time end, const std::vector<DeviceTiming>& per_device, Time recompute,
                         Bytes peak, uint64_t events, const ProgramSpec& global, const Mesh& mesh) {
  StepFigures f;
  f.end = end;
  f.recompute = recompute;
  for (const DeviceTiming& d : per_device) {
    if (d.compute + d.exposed_comm > f.compute + f.exposed_comm) {
      f.compute = d.compute;
      f.comm = d.comm;
      f.exposed_comm = d.exposed_comm;
      f.exposed_by_collective = d.exposed_by_collective;
    }
    f.host_peak = std::max(f.host_peak, d.host_peak);
    f.host_transfer = std::max(f.host_transfer, d.host_transfer);
  }
  f.peak = peak;
  f.state = StepStateBytes(global, mesh);
  f.events = events;
  return f;
}

StepCollectives::StepCollectives(const Machine& machine, CollectiveCostModel* given)
    : model_(given) {
  if (model_) return;
  network_ = std::make_unique<NetworkCollectiveModel>(machine);
  cache_ = std::make_unique<CachedCollectiveModel>(*network_);
  model_ = cache_.get();
}

Bytes DeviceBytes(const ArraySpec& array, const std::vector<MeshAxis>& axes) {
  const Shape local = LocalShape(
      array.shape, FromSpec(array.sharding, static_cast<int>(array.shape.size()), axes), axes);
  return Bytes(NumElements(local) * DTypeSize(array.dtype));
}

void CheckOffload(const Machine& machine, const StepPlan& plan) {
  if (plan.offload.empty()) return;
  CheckHostLink(machine.topology().device_spec(), "plan.offload");
}

void CheckHostLink(const DeviceSpec& device, const std::string& key) {
  if (!(device.host_bandwidth.bytes_per_second() > 0)) {
    throw SpecError(key,
                    "the devices have no host link to offload over (hardware.md gives none for "
                    "this preset): set hardware.device.host_bandwidth");
  }
}

Mesh PlacePlanMesh(const Machine& machine, const StepPlan& plan) {
  std::vector<int> devices = plan.devices;
  if (!plan.torus_order.empty()) {
    if (!devices.empty()) {
      throw SpecError("plan.torus_order", "give the mesh's devices or a torus_order, not both");
    }
    try {
      devices = machine.Placement(plan.mesh, plan.torus_order);
    } catch (const std::invalid_argument& e) {
      throw SpecError("plan.torus_order", e.what());
    }
  }
  try {
    return PlaceMesh(machine, plan.mesh, devices);
  } catch (const SpecError& e) {
    throw SpecError("plan.mesh", e.what());
  }
}

LogicalRules PlanRules(const StepPlan& plan) {
  try {
    return LogicalRules(plan.rules, plan.mesh);
  } catch (const std::invalid_argument& e) {
    throw SpecError("plan.rules", e.what());
  }
}

StateBytes StepStateBytes(const ProgramSpec& global, const Mesh& mesh) {
  // The parameters are what the step differentiates (every grad op's wrt is the same list).
  std::set<std::string> params;
  for (const OpSpec& op : global.ops) {
    if (op.kind == OpKind::kGrad) params.insert(op.wrt.begin(), op.wrt.end());
  }
  StateBytes s;
  for (const ArraySpec& a : global.arrays) {
    // Token ids and labels, or a stage's activation and cotangent: the batch, not state.
    if (a.dtype == DType::kI32 || IsStageBoundary(a.name)) continue;
    Bytes& kind = params.count(a.name) ? s.params : s.optimizer;
    kind = kind + DeviceBytes(a, mesh.axes());
  }
  // Gradients: one per parameter, in param_dtype, sharded as the parameter.
  s.grads = s.params;
  return s;
}

TrainStepReport MakeTrainStepReport(const Machine& machine, const Mesh& mesh,
                                    const TransformerConfig& model, const TrainConfig& train,
                                    const StepFigures& figures,
                                    std::vector<int64_t> simulated_layers) {
  TrainStepReport r =
      MakeStepReport(machine, mesh, TrainStepModelFlops(model, train),
                     static_cast<double>(train.batch) * static_cast<double>(train.seq_len),
                     train.dtype, figures, std::move(simulated_layers));
  r.model_flops_rule = "6N + 12·L·H·hd·T per token, PaLM's definition";
  return r;
}

TrainStepReport MakeStepReport(const Machine& machine, const Mesh& mesh, double model_flops,
                               double tokens, DType dtype, const StepFigures& figures,
                               std::vector<int64_t> simulated_layers) {
  TrainStepReport r;
  r.step_time = figures.end;
  r.devices = mesh.size();
  const double seconds = figures.end.seconds();
  r.tokens_per_s = seconds > 0 ? tokens / seconds : 0;
  r.tokens_per_s_per_device = r.tokens_per_s / r.devices;
  r.model_flops = model_flops;
  const auto& rates = machine.topology().device_spec().flops;
  const auto rate = rates.find(std::string(DTypeName(dtype)));
  r.peak_flops = rate != rates.end() ? rate->second.per_second() : 0;
  r.mfu =
      seconds > 0 && r.peak_flops > 0 ? r.model_flops / (seconds * r.devices * r.peak_flops) : 0;
  r.compute = figures.compute;
  r.comm = figures.comm;
  r.exposed_comm = figures.exposed_comm;
  r.recompute = figures.recompute;
  r.exposed_by_collective = figures.exposed_by_collective;
  r.bytes_by_collective = figures.bytes_by_collective;
  r.link_busy = figures.link_busy;
  StepMemory& m = r.memory;
  m.params = figures.state.params;
  m.grads = figures.state.grads;
  m.optimizer = figures.state.optimizer;
  m.peak = figures.peak;
  m.forced_peak = figures.forced_peak;
  const Bytes state = m.params + m.grads + m.optimizer;
  m.activations = m.peak > state ? m.peak - state : Bytes(0);
  m.capacity = machine.hbm_capacity();
  m.fits = m.peak <= m.capacity;
  m.host = figures.host_peak;
  r.host_transfer = figures.host_transfer;
  r.events = figures.events;
  r.simulated_layers = std::move(simulated_layers);
  return r;
}

namespace {

// Every schedule with its name, each overlapping less than the one before.
constexpr std::pair<StepOverlap, const char*> kStepOverlaps[] = {
    {StepOverlap::kFull, "prefetch"},
    {StepOverlap::kNoPrefetch, "no_prefetch"},
    {StepOverlap::kNone, "program_order"}};

// The report `simulate` gives for options.overlap or, with options.within_memory where that
// schedule peaks over options.memory_limit of HBM, for the first schedule overlapping less
// that peaks within it (the one asked for when none does). XLA's latency-hiding scheduler
// likewise starts no asynchronous collective early that would take the program over its
// memory limit (a tier per schedule here, where XLA decides collective by collective).
// `reorders`: the schedules run the same ops in other orders (no collective matmuls, whose
// fusion depends on the schedule, and no pipeline). Then where even the schedule asked for
// peaks over the limit in what every order of its ops holds (StepMemory::forced_peak), no
// other schedule is tried: none could keep within it.
TrainStepReport ScheduleWithinMemory(const TrainStepOptions& options, bool reorders,
                                     const std::function<TrainStepReport(StepOverlap)>& simulate) {
  auto within = [&](Bytes bytes, const TrainStepReport& r) {
    return static_cast<double>(bytes.count()) <=
           options.memory_limit * static_cast<double>(r.memory.capacity.count());
  };
  TrainStepReport asked = simulate(options.overlap);
  asked.overlap = options.overlap;
  if (!options.within_memory || within(asked.memory.peak, asked)) return asked;
  if (reorders && !within(asked.memory.forced_peak, asked)) return asked;
  uint64_t events = asked.events;
  for (const auto& [less, name] : kStepOverlaps) {
    if (less <= options.overlap) continue;
    TrainStepReport r = simulate(less);
    events += r.events;
    if (within(r.memory.peak, r)) {
      r.overlap = less;
      r.overlapped_peak = asked.memory.peak;
      r.events = events;
      return r;
    }
  }
  asked.events = events;
  return asked;
}

}  // namespace

TrainStepReport SimulateMlpTrainStep(const Machine& machine, const MlpModel& mlp,
                                     const TrainConfig& train, const StepPlan& plan,
                                     const TrainStepOptions& options) {
  const Mesh mesh = PlacePlanMesh(machine, plan);
  const LogicalRules rules = PlanRules(plan);
  StepCollectives owned(machine, options.collective_model);
  const ProgramSpec global = BuildMlpTrainStep(mlp, train, plan.mesh, rules);
  const int64_t layers = static_cast<int64_t>(mlp.layer_sizes.size()) - 1;
  StepPlan no_remat = plan;
  no_remat.remat = RematPolicy::kNone;
  const bool reorders = plan.collective_matmul == CollectiveMatmulMode::kOff;
  return ScheduleWithinMemory(options, reorders, [&](StepOverlap overlap) {
    const StepFigures f =
        SimulateStepFigures(machine, mesh, global, {}, no_remat, owned.model(),
                            PrefetchGroups(layers, train), {}, {}, {}, options.link_busy, overlap);
    TrainStepReport r = MakeStepReport(machine, mesh, MlpTrainStepModelFlops(mlp, train),
                                       static_cast<double>(train.batch), train.dtype, f, {layers});
    r.model_flops_rule = kMlpFlopsRule;
    return r;
  });
}

int64_t ComposedFrom(const TransformerConfig& model) {
  return (model.experts > 0 ? model.dense_layers : 0) + 2;
}

const char* StepOverlapName(StepOverlap overlap) {
  for (const auto& [each, name] : kStepOverlaps) {
    if (each == overlap) return name;
  }
  return "";
}

std::optional<StepOverlap> StepOverlapNamed(std::string_view name) {
  for (const auto& [each, each_name] : kStepOverlaps) {
    if (name == each_name) return each;
  }
  return std::nullopt;
}

namespace {

// The step of SimulateTrainStep without a pipeline, scheduled as options.overlap says.
TrainStepReport SimulateUnpipelinedTrainStep(const Machine& machine, const Mesh& mesh,
                                             const TransformerConfig& model,
                                             const TrainConfig& train, const StepPlan& plan,
                                             const TrainStepOptions& options, BuiltSteps& built) {
  const LogicalRules rules = PlanRules(plan);
  StepCollectives owned(machine, options.collective_model);
  CollectiveCostModel* collectives = &owned.model();
  const int64_t short_layers = ComposedFrom(model);  // Composed from it and one more.
  if (!options.compose || model.layers <= short_layers + 1) {
    const StepFigures f =
        SimulateFigures(machine, mesh, model, train, plan, rules, *collectives, options.overlap,
                        options.link_busy, built, options.build_cache);
    TrainStepReport r = MakeTrainStepReport(machine, mesh, model, train, f, {model.layers});
    r.remat = plan.remat;
    r.remat_save = plan.remat_save;
    return r;
  }
  TransformerConfig shorter = model;
  std::vector<int64_t> simulated;
  const StepFigures f = ComposeShortSteps(
      short_layers, model.layers,
      [&](int64_t layers) {
        shorter.layers = layers;
        return SimulateFigures(machine, mesh, shorter, train, plan, rules, *collectives,
                               options.overlap, options.link_busy, built, options.build_cache);
      },
      &simulated, options.settle);
  TrainStepReport r = MakeTrainStepReport(machine, mesh, model, train, f, simulated);
  r.remat = plan.remat;
  r.remat_save = plan.remat_save;
  return r;
}

}  // namespace

TrainStepReport SimulateTrainStep(const Machine& machine, const TransformerConfig& model,
                                  const TrainConfig& train, const StepPlan& plan,
                                  const TrainStepOptions& options) {
  CheckOffload(machine, plan);
  // The schedules tried share the collectives' prices, the mesh and each layer count's
  // partition.
  StepCollectives owned(machine, options.collective_model);
  BuiltSteps built;
  PipelineBuilds pipeline_built;
  std::optional<Mesh> mesh;
  if (!plan.pipeline) mesh.emplace(PlacePlanMesh(machine, plan));
  // A search worker's plans on one mesh share their choices of layout.
  if (mesh && options.build_cache) built.choices = &options.build_cache->Choices(*mesh);
  const bool reorders = !plan.pipeline && plan.collective_matmul == CollectiveMatmulMode::kOff;
  return ScheduleWithinMemory(options, reorders, [&](StepOverlap overlap) {
    TrainStepOptions scheduled = options;
    scheduled.overlap = overlap;
    scheduled.collective_model = &owned.model();
    return plan.pipeline
               ? SimulatePipelinedTrainStep(machine, model, train, plan, scheduled, &pipeline_built)
               : SimulateUnpipelinedTrainStep(machine, *mesh, model, train, plan, scheduled, built);
  });
}

}  // namespace shardsim::planner
