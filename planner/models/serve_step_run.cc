#include "planner/models/serve_step_run.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "collectives/timing/collective_cost_model.h"

namespace shardsim::planner {
namespace {

// The figures of one serving step of `model`, composed from short steps (ComposeShortSteps,
// `settle` as TrainStepOptions says) unless `compose` is off or the model is that short.
StepFigures StepOf(const Machine& machine, const Mesh& mesh, const TransformerConfig& model,
                   const ServeConfig& serve, ServeStep step, const StepPlan& plan,
                   const LogicalRules& rules, CollectiveCostModel& collectives, bool compose,
                   bool settle, std::vector<int64_t>* simulated) {
  auto run = [&](int64_t layers) {
    TransformerConfig m = model;
    m.layers = layers;
    std::vector<std::vector<std::string>> values;
    const ProgramSpec global = BuildServeStep(m, serve, step, plan.mesh, rules, &values);
    return SimulateStepFigures(machine, mesh, global, values, plan, collectives,
                               static_cast<int>(layers));
  };
  const int64_t short_layers = ComposedFrom(model);
  if (!compose || model.layers <= short_layers + 1) {
    *simulated = {model.layers};
    return run(model.layers);
  }
  return ComposeShortSteps(short_layers, model.layers, run, simulated, settle);
}

}  // namespace

ServeReport SimulateServe(const Machine& machine, const TransformerConfig& model,
                          const ServeConfig& serve, const StepPlan& plan,
                          const TrainStepOptions& options) {
  const Mesh mesh = PlacePlanMesh(machine, plan);
  const LogicalRules rules = PlanRules(plan);
  StepPlan no_remat = plan;
  no_remat.remat = RematPolicy::kNone;
  StepCollectives owned(machine, options.collective_model);
  CollectiveCostModel* collectives = &owned.model();
  ServeReport r;
  r.devices = mesh.size();
  const StepFigures prefill =
      StepOf(machine, mesh, model, serve, ServeStep::kPrefill, no_remat, rules, *collectives,
             options.compose, options.settle, &r.prefill_layers);
  ServeConfig mean = serve;
  r.mean_context = serve.prompt_len + serve.decode_len / 2;
  mean.context = r.mean_context;
  const StepFigures decode =
      StepOf(machine, mesh, model, mean, ServeStep::kDecode, no_remat, rules, *collectives,
             options.compose, options.settle, &r.simulated_layers);
  r.ttft = prefill.end;
  r.tpot = decode.end;
  r.total = r.ttft + r.tpot * std::max<int64_t>(serve.decode_len - 1, 0);
  const double seconds = r.total.seconds();
  r.tokens_per_s = seconds > 0 ? static_cast<double>(serve.batch * serve.decode_len) / seconds : 0;
  r.tokens_per_s_per_device = r.tokens_per_s / r.devices;
  r.decode_compute = decode.compute;
  r.decode_exposed_comm = decode.exposed_comm;
  r.events = prefill.events + decode.events;
  // Weights and the cache, per device, from the programs' arrays (one layer's worth times the
  // layers: every layer's arrays are alike).
  ServeConfig full = serve;
  full.context = serve.prompt_len + serve.decode_len;
  const ProgramSpec at_full = BuildServeStep(model, full, ServeStep::kDecode, plan.mesh, rules);
  const ProgramSpec at_mean = BuildServeStep(model, mean, ServeStep::kDecode, plan.mesh, rules);
  auto cache_bytes = [&](const ProgramSpec& p) {
    Bytes b;
    for (const ArraySpec& a : p.arrays)
      b = b + (IsKvCache(a.name) ? DeviceBytes(a, mesh.axes()) : Bytes(0));
    return b;
  };
  ServeMemory& m = r.memory;
  m.kv_cache = cache_bytes(at_full);
  for (const ArraySpec& a : at_full.arrays) {
    if (a.dtype != DType::kI32 && !IsKvCache(a.name))
      m.params = m.params + DeviceBytes(a, mesh.axes());
  }
  const Bytes decode_peak = decode.peak + (m.kv_cache - cache_bytes(at_mean));
  m.peak = std::max(prefill.peak, decode_peak);
  const Bytes held = m.params + m.kv_cache;
  m.activations = m.peak > held ? m.peak - held : Bytes(0);
  m.capacity = machine.hbm_capacity();
  m.fits = m.peak <= m.capacity;
  return r;
}

}  // namespace shardsim::planner
