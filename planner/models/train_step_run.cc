#include "planner/models/train_step_run.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "collectives/dtype.h"
#include "collectives/lowering.h"
#include "collectives/runtime/run_program.h"
#include "collectives/timing/collective_cost_model.h"
#include "planner/models/logical_rules.h"
#include "planner/models/model_flops.h"
#include "planner/partitioner.h"
#include "planner/prefetch.h"
#include "planner/value_sharding.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// Bytes of `array`'s block on one device (the plan's shardings divide every parameter: the
// step builder checks).
Bytes LocalBytes(const ArraySpec& array, const std::vector<MeshAxis>& axes) {
  const Shape local = LocalShape(
      array.shape, FromSpec(array.sharding, static_cast<int>(array.shape.size()), axes), axes);
  return Bytes(NumElements(local) * DTypeSize(array.dtype));
}

// a + (b - a) * k, field by field: the figures of a step with k layers more than a's, b being
// one layer more than a.
Time Extrapolate(Time a, Time b, int64_t k) { return a + (b - a) * k; }
Bytes Extrapolate(Bytes a, Bytes b, int64_t k) { return a + (b - a) * k; }

StepFigures Compose(const StepFigures& a, const StepFigures& b, int64_t k) {
  StepFigures f;
  f.end = Extrapolate(a.end, b.end, k);
  f.compute = Extrapolate(a.compute, b.compute, k);
  f.comm = Extrapolate(a.comm, b.comm, k);
  f.exposed_comm = Extrapolate(a.exposed_comm, b.exposed_comm, k);
  f.peak = Extrapolate(a.peak, b.peak, k);
  f.state.params = Extrapolate(a.state.params, b.state.params, k);
  f.state.grads = Extrapolate(a.state.grads, b.state.grads, k);
  f.state.optimizer = Extrapolate(a.state.optimizer, b.state.optimizer, k);
  f.events = a.events + b.events;  // The work done, not a figure of the step.
  return f;
}

// Simulates the step of `model` (whatever its layer count) and reads its figures.
StepFigures SimulateFigures(const Machine& machine, const Mesh& mesh,
                            const TransformerConfig& model, const TrainConfig& train,
                            const StepPlan& plan, const LogicalRules& rules,
                            CollectiveCostModel& collectives, bool prefetch) {
  const ProgramSpec global = BuildTrainStep(model, train, plan.mesh, rules);
  PartitionResult partitioned;
  try {
    partitioned = Partition(global, PartitionCosts{&mesh, &collectives, machine.compute_model()});
  } catch (const SpecError& e) {
    throw SpecError("plan", std::string("the plan cannot partition the step: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw SpecError("plan", std::string("the plan cannot partition the step: ") + e.what());
  }
  if (prefetch) PrefetchWeightCollectives(partitioned, PrefetchGroups(model, train));
  const LoweredProgram lowered = LowerProgram(mesh, partitioned.program, plan.algorithms);
  RunConfig config;
  config.algorithms = plan.algorithms;
  config.timing = TimingPath::kCached;
  config.collective_model = &collectives;
  const RunResult run = RunProgram(machine, mesh, partitioned.program, config, &lowered);
  return FiguresOfRun(run.end, run.per_device, run.peak_memory, run.events, global, mesh);
}

}  // namespace

StepFigures FiguresOfRun(Time end, const std::vector<DeviceTiming>& per_device, Bytes peak,
                         uint64_t events, const ProgramSpec& global, const Mesh& mesh) {
  StepFigures f;
  f.end = end;
  for (const DeviceTiming& d : per_device) {
    if (d.compute + d.exposed_comm > f.compute + f.exposed_comm) {
      f.compute = d.compute;
      f.comm = d.comm;
      f.exposed_comm = d.exposed_comm;
    }
  }
  f.peak = peak;
  f.state = StepStateBytes(global, mesh);
  f.events = events;
  return f;
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
    if (a.dtype == DType::kI32) continue;  // Token ids and labels: the batch, not state.
    Bytes& kind = params.count(a.name) ? s.params : s.optimizer;
    kind = kind + LocalBytes(a, mesh.axes());
  }
  // Gradients: one per parameter, in param_dtype, sharded as the parameter.
  s.grads = s.params;
  return s;
}

TrainStepReport MakeTrainStepReport(const Machine& machine, const Mesh& mesh,
                                    const TransformerConfig& model, const TrainConfig& train,
                                    const StepFigures& figures,
                                    std::vector<int64_t> simulated_layers) {
  TrainStepReport r;
  r.step_time = figures.end;
  r.devices = mesh.size();
  const double seconds = figures.end.seconds();
  const double tokens = static_cast<double>(train.batch) * static_cast<double>(train.seq_len);
  r.tokens_per_s = seconds > 0 ? tokens / seconds : 0;
  r.tokens_per_s_per_device = r.tokens_per_s / r.devices;
  r.model_flops = TrainStepModelFlops(model, train);
  const auto& rates = machine.topology().device_spec().flops;
  const auto rate = rates.find(std::string(DTypeName(train.dtype)));
  r.peak_flops = rate != rates.end() ? rate->second.per_second() : 0;
  r.mfu =
      seconds > 0 && r.peak_flops > 0 ? r.model_flops / (seconds * r.devices * r.peak_flops) : 0;
  r.compute = figures.compute;
  r.comm = figures.comm;
  r.exposed_comm = figures.exposed_comm;
  StepMemory& m = r.memory;
  m.params = figures.state.params;
  m.grads = figures.state.grads;
  m.optimizer = figures.state.optimizer;
  m.peak = figures.peak;
  const Bytes state = m.params + m.grads + m.optimizer;
  m.activations = m.peak > state ? m.peak - state : Bytes(0);
  m.capacity = machine.hbm_capacity();
  m.fits = m.peak <= m.capacity;
  r.events = figures.events;
  r.simulated_layers = std::move(simulated_layers);
  return r;
}

TrainStepReport SimulateTrainStep(const Machine& machine, const TransformerConfig& model,
                                  const TrainConfig& train, const StepPlan& plan,
                                  const TrainStepOptions& options) {
  Mesh mesh = [&] {
    try {
      return PlaceMesh(machine, plan.mesh, plan.devices);
    } catch (const SpecError& e) {
      throw SpecError("plan.mesh", e.what());
    }
  }();
  const LogicalRules rules = PlanRules(plan);
  std::unique_ptr<NetworkCollectiveModel> network;
  std::unique_ptr<CachedCollectiveModel> cache;
  CollectiveCostModel* collectives = options.collective_model;
  if (!collectives) {
    network = std::make_unique<NetworkCollectiveModel>(machine);
    cache = std::make_unique<CachedCollectiveModel>(*network);
    collectives = cache.get();
  }
  constexpr int64_t kShort = 2;  // Composed from kShort and kShort + 1 layers.
  if (!options.compose || model.layers <= kShort + 1) {
    const StepFigures f =
        SimulateFigures(machine, mesh, model, train, plan, rules, *collectives, options.prefetch);
    return MakeTrainStepReport(machine, mesh, model, train, f, {model.layers});
  }
  TransformerConfig shorter = model;
  shorter.layers = kShort;
  const StepFigures a =
      SimulateFigures(machine, mesh, shorter, train, plan, rules, *collectives, options.prefetch);
  shorter.layers = kShort + 1;
  const StepFigures b =
      SimulateFigures(machine, mesh, shorter, train, plan, rules, *collectives, options.prefetch);
  return MakeTrainStepReport(machine, mesh, model, train, Compose(a, b, model.layers - kShort),
                             {kShort, kShort + 1});
}

}  // namespace shardsim::planner
