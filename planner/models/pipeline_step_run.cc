#include "planner/models/pipeline_step_run.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/dtype.h"
#include "collectives/timing/collective_cost_model.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// The longest member time of `r` on `mesh` (zero for a request that moves nothing).
Time CollectiveTime(CollectiveCostModel& model, const Mesh& mesh, const CollectiveRequest& r) {
  return r.elements > 0 ? model.Estimate(mesh, r)->longest() : Time();
}

Time NonNegative(Time t) { return t > Time() ? t : Time(); }

}  // namespace

TrainStepReport SimulatePipelinedTrainStep(const Machine& machine, const TransformerConfig& model,
                                           const TrainConfig& train, const StepPlan& plan,
                                           const TrainStepOptions& options) {
  const PipelinePlan& pp = *plan.pipeline;
  const Mesh mesh = PlacePlanMesh(machine, plan);
  const int stage_axis = [&] {
    for (size_t a = 0; a < plan.mesh.size(); ++a) {
      if (plan.mesh[a].name == pp.axis) return static_cast<int>(a);
    }
    throw SpecError("plan.pipeline.axis", "'" + pp.axis + "' is not an axis of plan.mesh");
  }();
  const int p = plan.mesh[static_cast<size_t>(stage_axis)].size;
  const int v = pp.virtual_stages;
  const int64_t m = train.microbatches;
  const auto layers_rule = plan.rules.find("layers");
  if (layers_rule == plan.rules.end() || layers_rule->second != std::vector<std::string>{pp.axis}) {
    throw SpecError("plan.rules.layers",
                    "pipeline stages take the layers: give the rule layers: " + pp.axis);
  }
  if (model.experts > 0 && model.dense_layers > 0) {
    throw SpecError("plan.pipeline", "the model's " + std::to_string(model.dense_layers) +
                                         " leading dense layers would make the stages unequal: "
                                         "pipelines need identical layers");
  }
  if (model.layers % (static_cast<int64_t>(p) * v) != 0) {
    throw SpecError("plan.pipeline", "the " + std::to_string(model.layers) +
                                         " layers do not split into " + std::to_string(p) +
                                         " stages x " + std::to_string(v) + " virtual stages");
  }
  // Data axes: split only the batch. They and the stage axis leave the stage's mesh.
  std::set<std::string> data;
  if (const auto batch = plan.rules.find("batch"); batch != plan.rules.end()) {
    data.insert(batch->second.begin(), batch->second.end());
  }
  for (const auto& [name, axes] : plan.rules) {
    if (name == "batch" || name == "layers") continue;
    for (const std::string& a : axes) data.erase(a);
  }
  data.erase(pp.axis);
  int64_t replicas = 1;
  std::vector<int> data_axes;
  StepPlan stage;
  for (size_t a = 0; a < plan.mesh.size(); ++a) {
    const MeshAxis& axis = plan.mesh[a];
    if (data.count(axis.name)) {
      replicas *= axis.size;
      data_axes.push_back(static_cast<int>(a));
    } else if (static_cast<int>(a) != stage_axis) {
      stage.mesh.push_back(axis);
    }
  }
  for (int pos = 0; pos < mesh.size(); ++pos) {
    const std::vector<int> coords = mesh.Coords(pos);
    bool first = coords[static_cast<size_t>(stage_axis)] == 0;
    for (int a : data_axes) first = first && coords[static_cast<size_t>(a)] == 0;
    if (first) stage.devices.push_back(mesh.device(pos));
  }
  for (const auto& [name, axes] : plan.rules) {
    if (name == "layers") continue;
    std::vector<std::string> kept;
    for (const std::string& a : axes) {
      if (a != pp.axis && !data.count(a)) kept.push_back(a);
    }
    if (!kept.empty()) stage.rules[name] = kept;
  }
  stage.algorithms = plan.algorithms;
  stage.remat = plan.remat;
  stage.collective_matmul = plan.collective_matmul;
  if (train.batch % (m * replicas) != 0) {
    throw SpecError("plan.pipeline", "the batch (" + std::to_string(train.batch) +
                                         ") does not split into " + std::to_string(m) +
                                         " microbatches on " + std::to_string(replicas) +
                                         " data-parallel replicas");
  }
  TrainConfig micro = train;
  micro.batch = train.batch / (m * replicas);
  micro.microbatches = 1;
  const Mesh stage_mesh(stage.mesh, stage.devices);
  const LogicalRules rules = PlanRules(stage);
  StepCollectives owned(machine, options.collective_model);
  CollectiveCostModel* collectives = &owned.model();
  // One stage's microbatch with 2 and 3 layers: forward only, forward and backward, and the
  // step with the optimizer.
  auto figures = [&](int64_t layers, bool forward_only, Optimizer optimizer) {
    TransformerConfig mm = model;
    mm.layers = layers;
    TrainConfig t = micro;
    t.forward_only = forward_only;
    t.optimizer = optimizer;
    std::vector<std::vector<std::string>> values, head_tiles;
    const ProgramSpec global =
        BuildTrainStep(mm, t, stage.mesh, rules, &values, nullptr, &head_tiles);
    return SimulateStepFigures(machine, stage_mesh, global, values, stage, *collectives,
                               options.prefetch ? PrefetchGroups(mm.layers, t) : 0, {}, head_tiles);
  };
  const StepFigures fwd2 = figures(2, true, Optimizer::kNone);
  const StepFigures fwd3 = figures(3, true, Optimizer::kNone);
  const StepFigures fb2 = figures(2, false, Optimizer::kNone);
  const StepFigures fb3 = figures(3, false, Optimizer::kNone);
  const StepFigures opt2 = figures(2, false, train.optimizer);
  const StepFigures opt3 = figures(3, false, train.optimizer);
  // Per layer (slopes) and the rest (intercepts: embedding, final norm, logits, loss).
  const Time f_layer = NonNegative(fwd3.end - fwd2.end);
  const Time b_layer = NonNegative((fb3.end - fb2.end) - f_layer);
  const Time f_head = NonNegative(fwd2.end - f_layer * 2);
  const Time b_head = NonNegative(fb2.end - (f_layer + b_layer) * 2 - f_head);
  const Time opt_layer = NonNegative((opt3.end - opt2.end) - (fb3.end - fb2.end));
  const Time opt_head = NonNegative((opt2.end - fb2.end) - opt_layer * 2);
  const int64_t chunk_layers = model.layers / (static_cast<int64_t>(p) * v);
  const int64_t stage_layers = model.layers / p;
  // An activation [microbatch, seq, d] between stages: each device sends its block.
  int64_t splits = 1;
  for (const std::string& dim : {std::string("batch"), std::string("length")}) {
    for (const std::string& a : rules.Axes(dim)) {
      for (const MeshAxis& axis : stage.mesh) splits *= axis.name == a ? axis.size : 1;
    }
  }
  CollectiveRequest send;
  send.kind = CollectiveKind::kPermute;
  send.dtype = train.dtype;
  send.elements = micro.batch * train.seq_len * model.d_model / splits;
  send.axes = {stage_axis};
  for (int i = 0; i < p; ++i) send.destination.push_back(i + 1 < p ? i + 1 : -1);
  const Time send_time = p > 1 ? CollectiveTime(*collectives, mesh, send) : Time();
  std::vector<PipelineTaskTimes> chunks(
      static_cast<size_t>(p * v), {f_layer * chunk_layers, b_layer * chunk_layers, send_time});
  chunks.back().forward += f_head;
  chunks.back().backward += b_head;
  const PipelineTimeline timeline =
      SimulatePipeline(p, static_cast<int>(m), v, pp.schedule, chunks);
  // The stage's state at its layer count (the last stage's: it also holds the head).
  const StepFigures at_stage = ComposeFigures(opt2, opt3, stage_layers - 2);
  CollectiveRequest sync;
  sync.kind = CollectiveKind::kAllReduce;
  sync.dtype = train.param_dtype;
  sync.elements = at_stage.state.grads.count() / DTypeSize(train.param_dtype);
  sync.axes = data_axes;
  const Time sync_time = replicas > 1 ? CollectiveTime(*collectives, mesh, sync) : Time();
  const Time update = opt_layer * stage_layers + opt_head;
  StepFigures f;
  f.end = timeline.end + sync_time + update;
  // Compute and communication per layer from the forward-and-backward runs, scaled to the
  // stage's microbatches and layers, with the update's compute, the sends and the gradient
  // all-reduce; what the step spends beyond compute and the bubble is exposed communication.
  const int64_t per_layer = stage_layers * m;
  f.compute = NonNegative(fb3.compute - fb2.compute) * per_layer +
              NonNegative(opt3.compute - opt2.compute - (fb3.compute - fb2.compute)) * stage_layers;
  f.comm = NonNegative(fb3.comm - fb2.comm) * per_layer + send_time * (2 * m * v) + sync_time;
  f.exposed_comm = NonNegative(f.end - f.compute - timeline.bubble);
  // The exposed communication by collective: inside the stage's tasks, each class's exposed
  // time per layer (from the forward-and-backward runs) times the stage's layers and
  // microbatches; after the flush, the gradient all-reduce over the data axes, all exposed;
  // the rest of it is the schedule waiting on activations sent between stages. When the
  // first two exceed the total (the composed figures are slopes), they are scaled to fit, so
  // the classes always add up to exposed_comm.
  std::map<std::string, Time> by_class;
  for (const auto& [name, t3] : fb3.exposed_by_collective) {
    const auto t2 = fb2.exposed_by_collective.find(name);
    const Time slope =
        NonNegative(t3 - (t2 == fb2.exposed_by_collective.end() ? Time() : t2->second));
    if (slope > Time()) by_class[name] = slope * per_layer;
  }
  if (sync_time > Time()) {
    std::string name = "psum over";
    for (int a : data_axes) name += " " + plan.mesh[static_cast<size_t>(a)].name;
    by_class[name] = by_class[name] + sync_time;
  }
  Time named;
  for (const auto& [name, t] : by_class) named += t;
  if (named > f.exposed_comm && named > Time()) {
    const double scale = f.exposed_comm.seconds() / named.seconds();
    named = Time();
    for (auto& [name, t] : by_class) {
      t = Time::Picoseconds(static_cast<int64_t>(static_cast<double>(t.picoseconds()) * scale));
      named += t;
    }
  }
  if (f.exposed_comm > named) by_class["ppermute over " + pp.axis] = f.exposed_comm - named;
  for (const auto& [name, t] : by_class) {
    if (t > Time()) f.exposed_by_collective[name] = t;
  }
  f.recompute = NonNegative(fb3.recompute - fb2.recompute) * per_layer;
  // Memory: the stage's step holds one microbatch's activations; the schedule holds
  // in_flight[0] chunks' worth at once on the first stage. A layer's activations: the slope
  // of the bytes live as the backward pass starts (the parameters and every value the
  // forward kept for it; no gradient made yet) less its parameters.
  const Bytes forward_slope = fb2.phase_entry_live.size() > 1 && fb3.phase_entry_live.size() > 1
                                  ? fb3.phase_entry_live[1] - fb2.phase_entry_live[1]
                                  : fb3.peak - fb2.peak;
  const Bytes params_slope = fb3.state.params - fb2.state.params;
  const Bytes per_layer_act =
      forward_slope > params_slope ? forward_slope - params_slope : Bytes(0);
  const int extra = std::max(timeline.in_flight[0] - 1, 0);
  f.peak = at_stage.peak + per_layer_act * (chunk_layers * extra);
  f.state = at_stage.state;
  f.events = fwd2.events + fwd3.events + fb2.events + fb3.events + opt2.events + opt3.events;
  TrainStepReport r = MakeTrainStepReport(machine, mesh, model, train, f, {2, 3});
  r.remat = plan.remat;
  r.bubble = timeline.bubble;
  r.pipeline_stages = p;
  return r;
}

}  // namespace shardsim::planner
