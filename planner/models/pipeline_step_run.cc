#include "planner/models/pipeline_step_run.h"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/dtype.h"
#include "collectives/executor.h"
#include "collectives/lowering.h"
#include "collectives/program.h"
#include "collectives/timing/collective_cost_model.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// The timing of `r` on `mesh` (null for a request that moves nothing), run by the algorithm
// the plan gives `op` (what lowering would give the op: DefaultAlgorithm). An algorithm that
// cannot run it is the plan's error.
std::shared_ptr<const CollectiveTiming> TimeCollective(
    CollectiveCostModel& model, const Mesh& mesh, CollectiveRequest r, OpKind op,
    const std::map<std::string, std::string>& algorithms, const std::string& what) {
  if (r.elements <= 0) return nullptr;
  OpSpec spec;
  spec.kind = op;
  r.algorithm = DefaultAlgorithm(spec, algorithms);
  try {
    return model.Estimate(mesh, r);
  } catch (const std::invalid_argument& e) {
    throw SpecError("plan.algorithms", std::string(OpKindName(op)) + " " + what + ": " + e.what());
  }
}

// Its longest member time (zero for none).
Time Longest(const std::shared_ptr<const CollectiveTiming>& timing) {
  return timing ? timing->longest() : Time();
}

Time NonNegative(Time t) { return t > Time() ? t : Time(); }

// `t` * `times` / `per`, to the picosecond below.
Time Scaled(Time t, double times, double per = 1) {
  return Time::Picoseconds(
      static_cast<int64_t>(static_cast<double>(t.picoseconds()) * times / per));
}

// `a` + `k` x `b`, field by field.
StateBytes AddScaled(StateBytes a, const StateBytes& b, int64_t k) {
  a.params = a.params + b.params * k;
  a.grads = a.grads + b.grads * k;
  a.optimizer = a.optimizer + b.optimizer * k;
  return a;
}

}  // namespace

std::vector<int64_t> ChunkLayers(int64_t layers, int chunks) {
  if (chunks < 1 || layers < chunks) {
    throw SpecError("plan.pipeline", "the " + std::to_string(layers) + " layers do not fill " +
                                         std::to_string(chunks) +
                                         " pipeline chunks (stages x virtual stages) with a "
                                         "layer each");
  }
  std::vector<int64_t> out(static_cast<size_t>(chunks), layers / chunks);
  // The remainder (at most chunks - 1) one each to the middle chunks 1, 2, ..., chunks - 2,
  // then to the first: never to the last, which also runs the head.
  const int64_t extra = layers % chunks;
  for (int64_t k = 0; k < extra; ++k) {
    ++out[static_cast<size_t>(k + 1 < chunks - 1 ? k + 1 : 0)];
  }
  return out;
}

std::vector<int64_t> PipelineChunkLayers(int64_t layers, int stages, const PipelinePlan& pipeline) {
  const int v = pipeline.virtual_stages;
  const int64_t first = pipeline.first_stage_layers, last = pipeline.last_stage_layers;
  if (first == 0 && last == 0) return ChunkLayers(layers, stages * v);
  auto fail = [](const std::string& why) { throw SpecError("plan.pipeline", why); };
  if (stages < 2) {
    fail("first_stage_layers and last_stage_layers need 2 or more stages, not " +
         std::to_string(stages));
  }
  const int fixed = (first > 0) + (last > 0);
  const int64_t rest = layers - first - last;
  const int middle = stages - fixed;
  if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0)) {
    fail("the " + std::to_string(layers) + " layers less the first and last stages' (" +
         std::to_string(first) + " and " + std::to_string(last) + ") do not split evenly among " +
         std::to_string(middle) + " stages between");
  }
  std::vector<int64_t> stage_layers(static_cast<size_t>(stages), middle > 0 ? rest / middle : 0);
  if (first > 0) stage_layers.front() = first;
  if (last > 0) stage_layers.back() = last;
  std::vector<int64_t> chunks(static_cast<size_t>(stages) * static_cast<size_t>(v));
  for (int s = 0; s < stages; ++s) {
    const int64_t n = stage_layers[static_cast<size_t>(s)];
    if (n < v || n % v != 0) {
      fail("stage " + std::to_string(s) + "'s " + std::to_string(n) +
           " layers do not split evenly into its " + std::to_string(v) +
           " virtual stages, a layer or more each");
    }
    for (int c = 0; c < v; ++c) chunks[static_cast<size_t>(c * stages + s)] = n / v;
  }
  return chunks;
}

TrainStepReport SimulatePipelinedTrainStep(const Machine& machine, const TransformerConfig& model,
                                           const TrainConfig& train, const StepPlan& plan,
                                           const TrainStepOptions& options,
                                           PipelineBuilds* builds) {
  PipelineBuilds own_builds;
  PipelineBuilds& built = builds ? *builds : own_builds;
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
  const std::vector<int64_t> chunk_layers = PipelineChunkLayers(model.layers, p, pp);
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
  stage.remat_save = plan.remat_save;
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
  // One stage's microbatch with base and base + 1 layers (below), of a model whose layers are
  // all of one kind (a mixture of experts with leading dense layers: every layer an expert
  // layer) and, with dense layers, the base + 1-layer runs once more with the first layer
  // dense (their difference: a dense layer's less an expert layer's). A run simulates a
  // microbatch's forward; its forward and backward, the gradients left unreduced partial sums
  // as accumulation over the microbatches keeps them (the psums of those of weights the
  // stage's mesh replicates over an axis that splits the batch, expert say, run once, in the
  // step that updates: its slope over this one's counts them); or that step, the gradients
  // summed and the optimizer's update.
  enum class Run { kForward, kMicrobatch, kStep };
  auto simulate = [&](const TransformerConfig& kind, int64_t layers, Run run, bool offload,
                      bool layers_only) {
    TransformerConfig mm = kind;
    mm.layers = layers;
    TrainConfig t = micro;
    t.forward_only = run == Run::kForward;
    t.optimizer = run == Run::kStep ? train.optimizer : Optimizer::kNone;
    t.unreduced_gradients = run == Run::kMicrobatch;
    t.layers_only = layers_only;
    if (layers_only) t.vocab_tiling = 1;  // No logits.
    const auto key = std::make_tuple(kind.dense_layers, kind.experts, layers, static_cast<int>(run),
                                     offload, layers_only);
    auto it = built.steps.find(key);
    if (it == built.steps.end()) {
      it = built.steps
               .emplace(key,
                        BuildPartitionedStep(machine, stage_mesh, mm, t, stage, rules, *collectives,
                                             offload ? plan.offload : std::vector<std::string>{},
                                             options.build_cache, &built.choices))
               .first;
    }
    BuiltTrainStep& b = it->second;
    const ExpandedTrainStep& e = *b.built;
    return SimulateStepFigures(machine, stage_mesh, e.global, e.layers, stage, *collectives,
                               PrefetchGroups(mm.layers, t), e.offloaded, e.head_tiles, e.saved,
                               options.link_busy, options.overlap, &b.partitioned);
  };
  // Each run simulated once (the settling probes ask again), all counted in the events.
  std::map<std::tuple<const TransformerConfig*, int64_t, Run, bool, bool>, StepFigures> made;
  auto figures = [&](const TransformerConfig& kind, int64_t layers, Run run, bool offload = true,
                     bool layers_only = false) -> const StepFigures& {
    const auto key = std::make_tuple(&kind, layers, run, offload, layers_only);
    auto it = made.find(key);
    if (it == made.end()) {
      it = made.emplace(key, simulate(kind, layers, run, offload, layers_only)).first;
    }
    return it->second;
  };
  // A mixture of experts whose layers are all dense is a dense model.
  const bool all_dense = model.experts > 0 && model.dense_layers >= model.layers;
  const int64_t dense = model.experts > 0 && !all_dense ? model.dense_layers : 0;
  TransformerConfig uniform = model;
  uniform.dense_layers = 0;
  if (all_dense) uniform.experts = 0;
  // The runs' layer counts, base and base + 1: 2 and 3, or with options.settle the first base
  // from 2 on where every run has settled, base + 2 layers growing by what base + 1 grew
  // (SlopesAgree, as ComposeShortSteps settles an unpipelined step: FSDP's prefetch inside a
  // stage takes a few layers to), probing at most kSettleProbes layers past 3 and no further
  // than the longest stage's layers.
  int64_t longest = 0;
  for (int s = 0; s < p; ++s) {
    int64_t layers = 0;
    for (int c = 0; c < v; ++c) layers += chunk_layers[static_cast<size_t>(c * p + s)];
    longest = std::max(longest, layers);
  }
  auto settled_at = [&](int64_t k) {
    for (Run run : {Run::kForward, Run::kMicrobatch, Run::kStep}) {
      if (!SlopesAgree(figures(uniform, k, run), figures(uniform, k + 1, run),
                       figures(uniform, k + 2, run))) {
        return false;
      }
    }
    return p == 1 || SlopesAgree(figures(uniform, k, Run::kStep, true, true),
                                 figures(uniform, k + 1, Run::kStep, true, true),
                                 figures(uniform, k + 2, Run::kStep, true, true));
  };
  int64_t base = 2;
  if (options.settle) {
    while (base + 2 <= longest && base + 2 <= 3 + kSettleProbes && !settled_at(base)) ++base;
  }
  const StepFigures fwd_a = figures(uniform, base, Run::kForward);
  const StepFigures fwd_b = figures(uniform, base + 1, Run::kForward);
  const StepFigures fb_a = figures(uniform, base, Run::kMicrobatch);
  const StepFigures fb_b = figures(uniform, base + 1, Run::kMicrobatch);
  const StepFigures opt_a = figures(uniform, base, Run::kStep);
  const StepFigures opt_b = figures(uniform, base + 1, Run::kStep);
  // Without dense layers the "mixed" steps are the uniform ones (every difference zero).
  TransformerConfig mixed = uniform;
  mixed.dense_layers = 1;
  const StepFigures fwd_bd = dense > 0 ? figures(mixed, base + 1, Run::kForward) : fwd_b;
  const StepFigures fb_bd = dense > 0 ? figures(mixed, base + 1, Run::kMicrobatch) : fb_b;
  const StepFigures opt_bd = dense > 0 ? figures(mixed, base + 1, Run::kStep) : opt_b;
  // A stage's memory: the last stage's is the whole step's (composed from the runs above) less
  // the embedding table; a middle stage's that of a step of its layers alone (fed an
  // activation and its output's cotangent, as the stages beside it send); the first stage's
  // that with the embedding table's parameters, gradient, optimizer state and its update's
  // temporary (all counted at the peak: the gradient is made last in the backward and kept
  // for the update). Every stage used to count the whole step's head and embedding: on
  // DeepSeek-V3 with the head replicated over the expert axis, 30 GB a device of tables that
  // only the first and last stages hold.
  const StepFigures mid_a = p > 1 ? figures(uniform, base, Run::kStep, true, true) : opt_a;
  const StepFigures mid_b = p > 1 ? figures(uniform, base + 1, Run::kStep, true, true) : opt_b;
  StateBytes embedding;
  ArraySpec table_spec;
  table_spec.shape = {model.vocab, model.d_model};
  table_spec.dtype = train.param_dtype;
  table_spec.sharding = rules.Spec({"vocab", "embed"});
  embedding.params = DeviceBytes(table_spec, stage.mesh);
  embedding.grads = embedding.params;
  embedding.optimizer = train.optimizer == Optimizer::kAdam ? embedding.params * 2 : Bytes(0);
  // Per layer of each kind (slopes; a dense layer's: the expert layer's plus the difference
  // of the mixed step) and the rest (intercepts: embedding, final norm, logits, loss).
  struct PerLayer {
    Time forward, backward, update, compute, update_compute, comm, update_comm, recompute;
    Bytes activations;  // Kept from its forward for its backward.
    Bytes host;         // Offloaded to host memory from its forward for its backward.
  };
  PerLayer moe, dns;
  moe.forward = NonNegative(fwd_b.end - fwd_a.end);
  moe.backward = NonNegative((fb_b.end - fb_a.end) - moe.forward);
  moe.update = NonNegative((opt_b.end - opt_a.end) - (fb_b.end - fb_a.end));
  moe.compute = NonNegative(fb_b.compute - fb_a.compute);
  moe.update_compute = NonNegative(opt_b.compute - opt_a.compute - (fb_b.compute - fb_a.compute));
  moe.comm = NonNegative(fb_b.comm - fb_a.comm);
  moe.update_comm = NonNegative(opt_b.comm - opt_a.comm - (fb_b.comm - fb_a.comm));
  moe.recompute = NonNegative(fb_b.recompute - fb_a.recompute);
  moe.host = std::max(fb_b.host_peak - fb_a.host_peak, Bytes(0));
  const Time dense_forward = fwd_bd.end - fwd_b.end;
  dns.forward = NonNegative(moe.forward + dense_forward);
  dns.backward = NonNegative(moe.backward + (fb_bd.end - fb_b.end) - dense_forward);
  dns.update = NonNegative(moe.update + (opt_bd.end - fb_bd.end) - (opt_b.end - fb_b.end));
  dns.compute = NonNegative(moe.compute + fb_bd.compute - fb_b.compute);
  dns.update_compute = NonNegative(moe.update_compute + (opt_bd.compute - fb_bd.compute) -
                                   (opt_b.compute - fb_b.compute));
  dns.comm = NonNegative(moe.comm + fb_bd.comm - fb_b.comm);
  dns.update_comm =
      NonNegative(moe.update_comm + (opt_bd.comm - fb_bd.comm) - (opt_b.comm - fb_b.comm));
  dns.recompute = NonNegative(moe.recompute + fb_bd.recompute - fb_b.recompute);
  dns.host = std::max(moe.host + (fb_bd.host_peak - fb_b.host_peak), Bytes(0));
  const Time f_head = NonNegative(fwd_a.end - moe.forward * base);
  const Time b_head = NonNegative(fb_a.end - (moe.forward + moe.backward) * base - f_head);
  const Time opt_head = NonNegative((opt_a.end - fb_a.end) - moe.update * base);
  // Of the head's update (an elementwise pass over each of its weights: time in proportion to
  // their elements), the share of stage s: the first holds the embedding table, the last the
  // final norm and the unembedding (with tied embeddings, the table again), one stage both.
  const double table = static_cast<double>(model.vocab) * static_cast<double>(model.d_model);
  const double head_weights = table * (model.tied_embeddings ? 1 : 2) + model.d_model;
  auto head_share = [&](int s) {
    const bool holds_embedding = s == 0, holds_head = s + 1 == p;
    double held = (holds_embedding ? table : 0) + (holds_head ? table + model.d_model : 0);
    if (model.tied_embeddings && holds_embedding && holds_head) held -= table;
    return std::min(1.0, held / head_weights);
  };
  // A layer's activations: the slope of the bytes live as the backward pass starts (the
  // parameters and every value the forward kept for it; no gradient made yet) less its
  // parameters.
  auto entry_live = [](const StepFigures& x) {
    return x.phase_entry_live.size() > 1 ? std::optional<Bytes>(x.phase_entry_live[1])
                                         : std::nullopt;
  };
  auto kept = [](Bytes forward_slope, Bytes params_slope) {
    return forward_slope > params_slope ? forward_slope - params_slope : Bytes(0);
  };
  // With offload, read from the steps without it (the bytes live as a backward starts count
  // offloaded values whose copies are still queued, as many as the host link is slow), less
  // what a layer offloads: a chunk waiting in flight has long finished its copies.
  const bool offloads = !plan.offload.empty();
  const StepFigures kept_a = offloads ? figures(uniform, base, Run::kMicrobatch, false) : fb_a;
  const StepFigures kept_b = offloads ? figures(uniform, base + 1, Run::kMicrobatch, false) : fb_b;
  const StepFigures kept_bd =
      offloads && dense > 0 ? figures(mixed, base + 1, Run::kMicrobatch, false) : fb_bd;
  const bool entries = entry_live(kept_a) && entry_live(kept_b) && entry_live(kept_bd);
  const Bytes forward_slope =
      entries ? *entry_live(kept_b) - *entry_live(kept_a) : kept_b.peak - kept_a.peak;
  const Bytes params_slope = kept_b.state.params - kept_a.state.params;
  moe.activations = kept(forward_slope, params_slope + moe.host);
  dns.activations = kept(forward_slope + (entries ? *entry_live(kept_bd) - *entry_live(kept_b)
                                                  : kept_bd.peak - kept_b.peak),
                         params_slope + (kept_bd.state.params - kept_b.state.params) + dns.host);
  // Each virtual stage's layers of each kind: the model's layers in order, the first `dense`
  // of them dense.
  const int chunks = p * v;
  std::vector<int64_t> chunk_dense(static_cast<size_t>(chunks));
  int64_t first_layer = 0;
  for (int j = 0; j < chunks; ++j) {
    const int64_t n = chunk_layers[static_cast<size_t>(j)];
    chunk_dense[static_cast<size_t>(j)] = std::clamp<int64_t>(dense - first_layer, 0, n);
    first_layer += n;
  }
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
  const std::shared_ptr<const CollectiveTiming> send_timing =
      p > 1 ? TimeCollective(*collectives, mesh, send, OpKind::kPpermute, plan.algorithms,
                             "between pipeline stages")
            : nullptr;
  const Time send_time = Longest(send_timing);
  std::vector<PipelineTaskTimes> tasks;
  for (int j = 0; j < chunks; ++j) {
    const int64_t d = chunk_dense[static_cast<size_t>(j)];
    const int64_t e = chunk_layers[static_cast<size_t>(j)] - d;
    tasks.push_back(
        {dns.forward * d + moe.forward * e, dns.backward * d + moe.backward * e, send_time});
  }
  tasks.back().forward += f_head;
  tasks.back().backward += b_head;
  const PipelineTimeline timeline = SimulatePipeline(p, static_cast<int>(m), v, pp.schedule, tasks);
  // Per stage (its chunks j = c * p + s): its layers of each kind; its state and peak as a
  // step of its layers (composed from the uniform steps, each dense layer adding the mixed
  // step's difference; the first stage's with the embedding table, the last's with the head,
  // the others' with neither) with the schedule's in-flight chunks holding their activations
  // (the stage's largest chunk's, times the chunks held beyond the step's own); its gradient
  // all-reduce over the data axes and its update after its last backward (the first and last
  // stages' with the head's). The step ends when the last update does.
  struct Stage {
    int64_t dense = 0, layers = 0;
    StepFigures figures;
    Bytes peak;
    int64_t grads = 0;  // Gradient elements.
    Time done;          // When its last backward ends in the schedule.
    Time sync, update, compute;
  };
  std::vector<Stage> stages(static_cast<size_t>(p));
  StepFigures f;
  for (int s = 0; s < p; ++s) {
    Stage& st = stages[static_cast<size_t>(s)];
    Bytes largest_chunk, largest_host;
    for (int c = 0; c < v; ++c) {
      const size_t j = static_cast<size_t>(c * p + s);
      const int64_t d = chunk_dense[j], e = chunk_layers[j] - chunk_dense[j];
      st.dense += d;
      st.layers += chunk_layers[j];
      largest_chunk = std::max(largest_chunk, dns.activations * d + moe.activations * e);
      largest_host = std::max(largest_host, dns.host * d + moe.host * e);
    }
    const bool first = s == 0, last = s + 1 == p;
    st.figures = last ? ComposeFigures(opt_a, opt_b, st.layers - base)
                      : ComposeFigures(mid_a, mid_b, st.layers - base);
    StepFigures& x = st.figures;
    if (last && !first && !model.tied_embeddings) {
      // The whole step's less the embedding table the first stage holds instead (its
      // gradient counted at the peak as the first stage's is).
      x.peak = x.peak - embedding.params - embedding.grads - embedding.optimizer;
      x.state = AddScaled(x.state, embedding, -1);
    } else if (first && !last) {
      // With the table's update's temporary (one value of its size, as the whole step's peak
      // shows beyond its state).
      x.peak = x.peak + embedding.params + embedding.grads + embedding.optimizer +
               (train.optimizer != Optimizer::kNone ? embedding.params : Bytes(0));
      x.state = AddScaled(x.state, embedding, 1);
    }
    x.peak = x.peak + (opt_bd.peak - opt_b.peak) * st.dense;
    x.state = AddScaled(AddScaled(x.state, opt_bd.state, st.dense), opt_b.state, -st.dense);
    x.host_peak = x.host_peak + (opt_bd.host_peak - opt_b.host_peak) * st.dense;
    x.host_transfer = x.host_transfer + (opt_bd.host_transfer - opt_b.host_transfer) * st.dense;
    const int extra = std::max(timeline.in_flight[static_cast<size_t>(s)] - 1, 0);
    st.peak = x.peak + largest_chunk * extra;
    // Host memory likewise: each chunk held in flight keeps what its forward offloaded; every
    // microbatch copies out and back what one step of the stage's layers does.
    f.host_peak = std::max(f.host_peak, x.host_peak + largest_host * extra);
    f.host_transfer = std::max(f.host_transfer, x.host_transfer * m);
    st.grads = x.state.grads.count() / DTypeSize(train.param_dtype);
    for (const PipelineTaskRun& t : timeline.runs[static_cast<size_t>(s)]) {
      st.done = std::max(st.done, t.end);
    }
    const int64_t e = st.layers - st.dense;
    st.update = dns.update * st.dense + moe.update * e + Scaled(opt_head, head_share(s));
    st.compute = (dns.compute * st.dense + moe.compute * e) * m + dns.update_compute * st.dense +
                 moe.update_compute * e;
  }
  // Each stage all-reduces its gradients over the data axes once its last backward is done
  // (as Megatron's overlapped gradient reduction starts a stage's while earlier stages still
  // run backwards), then updates; the step ends with the last to finish. The all-reduces are
  // simulated for the stages that can end the step: those that no other stage matches in
  // gradients, update time and end of schedule (with equal layers under 1F1B, the first).
  // Another stage's (its own figures, never the step's end) is the simulated one with the most
  // gradients scaled by its gradients: the all-reduce of gigabytes is bandwidth-bound, its
  // latency microseconds against seconds.
  std::map<int64_t, std::shared_ptr<const CollectiveTiming>> sync_times;  // By gradient elements.
  auto dominated = [&](size_t s) {
    for (size_t t = 0; t < stages.size(); ++t) {
      const Stage& a = stages[t];
      const Stage& b = stages[s];
      if (t != s && a.grads >= b.grads && a.update >= b.update && a.done >= b.done &&
          (a.grads > b.grads || a.update > b.update || a.done > b.done || t < s)) {
        return true;
      }
    }
    return false;
  };
  for (size_t s = 0; s < stages.size() && replicas > 1; ++s) {
    const int64_t grads = stages[s].grads;
    if (dominated(s) || sync_times.count(grads)) continue;
    CollectiveRequest sync;
    sync.kind = CollectiveKind::kAllReduce;
    sync.dtype = train.param_dtype;
    sync.elements = grads;
    sync.axes = data_axes;
    sync_times[grads] = TimeCollective(*collectives, mesh, sync, OpKind::kPsum, plan.algorithms,
                                       "of the gradients over the data axes");
  }
  for (Stage& st : stages) {
    if (replicas == 1 || st.grads == 0) {
      // Nothing to all-reduce: the update alone.
    } else if (const auto it = sync_times.find(st.grads); it != sync_times.end()) {
      st.sync = Longest(it->second);
    } else {
      const auto& [grads, timing] = *sync_times.rbegin();
      st.sync = Scaled(Longest(timing), static_cast<double>(st.grads), static_cast<double>(grads));
    }
    f.end = std::max(f.end, st.done + st.sync + st.update);
  }
  if (options.observer) {
    // The composed step as a trace: a process per stage (its first data replica's devices run
    // it, the others alike), its tasks as the schedule ran them, each send between stages a
    // flow from the task that made it to the task that takes it (none with one stage: its
    // chunks pass their activations on in place); after its last backward the stage's gradient
    // all-reduce and its update.
    Observer& o = *options.observer;
    auto flow = [&](int microbatch, int vs, bool forward) {
      return 1 +
             (static_cast<uint64_t>(microbatch) * static_cast<uint64_t>(chunks) +
              static_cast<uint64_t>(vs)) *
                 2 +
             (forward ? 0 : 1);
    };
    std::vector<std::string> data_names;
    for (int a : data_axes) data_names.push_back(plan.mesh[static_cast<size_t>(a)].name);
    for (int s = 0; s < p; ++s) {
      const Stage& st = stages[static_cast<size_t>(s)];
      o.OnProcess(s, "stage " + std::to_string(s) + " (" + std::to_string(st.layers) + " layers)",
                  s);
      o.OnThread(s, 0, "schedule", 0);
      o.OnThread(s, 1, "after its backwards", 1);
      o.OnThread(s, 2, "sends", 2);
      for (const PipelineTaskRun& t : timeline.runs[static_cast<size_t>(s)]) {
        const int vs = t.chunk * p + s;
        SliceRecord r;
        r.pid = s;
        r.name = std::string(t.forward ? "forward" : "backward") + " microbatch " +
                 std::to_string(t.microbatch) +
                 (v > 1 ? " chunk " + std::to_string(t.chunk) : std::string());
        r.category = "compute";
        r.start = t.start;
        r.end = t.end;
        // A forward's activation goes to the next virtual stage, a backward's gradient to the
        // one before: a send after the task, a flow from it to the task that takes it.
        if (p > 1 && (t.forward ? vs > 0 : vs + 1 < chunks)) {
          r.flow_in = flow(t.microbatch, t.forward ? vs - 1 : vs + 1, t.forward);
        }
        o.OnSlice(r);
        if (p > 1 && (t.forward ? vs + 1 < chunks : vs > 0)) {
          SliceRecord send_slice;
          send_slice.pid = s;
          send_slice.tid = 2;
          send_slice.name = std::string(t.forward ? "send activation" : "send gradient") +
                            " microbatch " + std::to_string(t.microbatch) + " to stage " +
                            std::to_string((t.forward ? vs + 1 : vs - 1) % p);
          send_slice.category = "collective";
          send_slice.start = t.end;
          send_slice.end = t.end + send_time;
          send_slice.flow_out = flow(t.microbatch, vs, t.forward);
          o.OnSlice(send_slice);
        }
      }
      Time at = st.done;
      if (st.sync > Time()) {
        SliceRecord r;
        r.pid = s;
        r.tid = 1;
        r.name = CommClassName(OpKind::kPsum, data_names) + " (gradients)";
        r.category = "collective";
        r.start = at;
        r.end = at + st.sync;
        o.OnSlice(r);
        at = r.end;
      }
      if (st.update > Time()) {
        SliceRecord r;
        r.pid = s;
        r.tid = 1;
        r.name = "optimizer update";
        r.category = "compute";
        r.start = at;
        r.end = at + st.update;
        o.OnSlice(r);
      }
    }
  }
  // The figures of the busiest stage (the most time in its tasks; the first such: with equal
  // chunks the last, which also runs the head), so that its compute, its exposed communication
  // and its idle time in the schedule (the bubble) add up to the step: its compute and
  // communication per layer of each kind from the forward-and-backward runs times its layers
  // and microbatches (the last stage's also the head's: the base-layer step less its layers), with
  // its update's compute, the sends and its gradient all-reduce; what the step spends beyond
  // compute and the bubble is exposed communication.
  size_t busiest = 0;
  for (size_t s = 1; s < stages.size(); ++s) {
    if (timeline.busy[s] > timeline.busy[busiest]) busiest = s;
  }
  const Stage& b = stages[busiest];
  // The classes of the sends between stages and of the gradient all-reduce over the data axes.
  const std::string send_class = CommClassName(OpKind::kPpermute, {pp.axis});
  std::vector<std::string> data_names;
  for (int a : data_axes) data_names.push_back(plan.mesh[static_cast<size_t>(a)].name);
  const std::string sync_class = CommClassName(OpKind::kPsum, data_names);
  const bool head = busiest + 1 == stages.size();
  const int64_t b_moe = b.layers - b.dense;
  // The head's share of a `base`-layer step's figure `xa` whose per-layer slope is `slope`.
  auto head_part = [&](Time xa, Time slope) {
    return head ? NonNegative(xa - slope * base) : Time();
  };
  // A figure (a time or bytes) of the busiest stage from its values in the runs of base and
  // base + 1 layers and the dense-first one of base + 1: per layer of each kind (the slopes, at
  // least zero) times the stage's layers of that kind, and the head's share on the last stage.
  auto stage_total = [&](auto va, auto vb, auto vbd) {
    using T = decltype(va);
    auto at_least_zero = [](T x) { return x > T() ? x : T(); };
    const T slope = at_least_zero(vb - va);
    const T dense_slope = at_least_zero(slope + vbd - vb);
    return dense_slope * b.dense + slope * b_moe + (head ? at_least_zero(va - slope * base) : T());
  };
  // Its idle time in the step: neither in its tasks, nor in its gradient all-reduce and update
  // (the schedule's fill and drain, waits for sends, and for the stage that ends the step).
  const Time bubble = NonNegative(f.end - timeline.busy[busiest] - b.sync - b.update);
  // Its share of the head's update (Stage::update).
  const Time head_update_compute =
      Scaled(NonNegative(opt_a.compute - fb_a.compute - moe.update_compute * base),
             head_share(static_cast<int>(busiest)));
  f.compute = b.compute + head_part(fb_a.compute, moe.compute) * m + head_update_compute;
  // Communication per microbatch (the gradients-only runs'), and once a step what the runs
  // that update add (the psums of gradients accumulated unreduced).
  f.comm = (dns.comm * b.dense + moe.comm * b_moe + head_part(fb_a.comm, moe.comm)) * m +
           dns.update_comm * b.dense + moe.update_comm * b_moe +
           head_part(opt_a.comm - fb_a.comm, moe.update_comm) + send_time * (2 * m * v) + b.sync;
  f.exposed_comm = NonNegative(f.end - f.compute - bubble);
  // The exposed communication by collective: inside the stage's tasks, each class's exposed
  // time per layer of each kind (from the gradients-only runs) times the stage's layers and
  // microbatches, and the head's; once, what the runs that update add to it; after its last
  // backward, its gradient all-reduce over the data axes, all exposed; the rest (what the
  // composed slopes leave) to the sends between stages. When the first three exceed the total
  // they are scaled to fit, so the classes always add up to exposed_comm.
  auto exposed = [](const StepFigures& x, const std::string& name) {
    const auto it = x.exposed_by_collective.find(name);
    return it == x.exposed_by_collective.end() ? Time() : it->second;
  };
  const std::vector<const StepFigures*> runs = {&fb_a, &fb_b, &fb_bd, &opt_a, &opt_b, &opt_bd};
  std::set<std::string> classes;
  for (const StepFigures* x : runs) {
    for (const auto& [name, t] : x->exposed_by_collective) classes.insert(name);
  }
  std::map<std::string, Time> by_class;
  for (const std::string& name : classes) {
    const Time t = stage_total(exposed(fb_a, name), exposed(fb_b, name), exposed(fb_bd, name)) * m +
                   stage_total(exposed(opt_a, name) - exposed(fb_a, name),
                               exposed(opt_b, name) - exposed(fb_b, name),
                               exposed(opt_bd, name) - exposed(fb_bd, name));
    if (t > Time()) by_class[name] = t;
  }
  // Its gradient all-reduce, after its last backward: all exposed.
  if (b.sync > Time()) by_class[sync_class] = by_class[sync_class] + b.sync;
  Time named;
  for (const auto& [name, t] : by_class) named += t;
  if (named > f.exposed_comm && named > Time()) {
    const double scale = f.exposed_comm.seconds() / named.seconds();
    named = Time();
    for (auto& [name, t] : by_class) {
      t = Scaled(t, scale);
      named += t;
    }
  }
  if (f.exposed_comm > named) by_class[send_class] = f.exposed_comm - named;
  for (const auto& [name, t] : by_class) {
    if (t > Time()) f.exposed_by_collective[name] = t;
  }
  // The bytes the busiest stage's devices put into each collective class a step: per layer of
  // each kind and the head's (from the gradients-only runs) times the microbatches, and once
  // what the runs that update add; the gradient all-reduce's input once; one activation or
  // gradient for each send its chunks make (forward out of every chunk but the last, backward
  // out of every chunk but the first).
  auto bytes_of = [](const StepFigures& x, const std::string& name) {
    const auto it = x.bytes_by_collective.find(name);
    return it == x.bytes_by_collective.end() ? Bytes(0) : it->second;
  };
  std::set<std::string> byte_classes;
  for (const StepFigures* x : runs) {
    for (const auto& [name, n] : x->bytes_by_collective) byte_classes.insert(name);
  }
  for (const std::string& name : byte_classes) {
    const Bytes n =
        stage_total(bytes_of(fb_a, name), bytes_of(fb_b, name), bytes_of(fb_bd, name)) * m +
        stage_total(bytes_of(opt_a, name) - bytes_of(fb_a, name),
                    bytes_of(opt_b, name) - bytes_of(fb_b, name),
                    bytes_of(opt_bd, name) - bytes_of(fb_bd, name));
    if (n > Bytes(0)) f.bytes_by_collective[name] = n;
  }
  if (b.sync > Time()) {
    f.bytes_by_collective[sync_class] = f.bytes_by_collective[sync_class] + b.figures.state.grads;
  }
  int64_t sends = 0;  // The busiest stage's sends a microbatch: forward and back.
  if (p > 1) {
    for (int c = 0; c < v; ++c) {
      const int j = c * p + static_cast<int>(busiest);
      sends += (j + 1 < chunks ? 1 : 0) + (j > 0 ? 1 : 0);
    }
    const Bytes per_send(send.elements * DTypeSize(send.dtype));
    f.bytes_by_collective[send_class] = per_send * (sends * m);
  }
  f.recompute =
      (dns.recompute * b.dense + moe.recompute * b_moe + head_part(fb_a.recompute, moe.recompute)) *
      m;
  // Per-link figures: the busiest stage's, on the links of the devices its runs were simulated
  // on (the first stage's, of the first data replica; every stage and replica links alike):
  // each busy per layer of each kind (the slopes of the gradients-only runs) times the stage's
  // layers and microbatches, with the head's on the last stage, and once with what the runs
  // that update add; then its sends between stages (priced as the activations' sends forward)
  // and its gradient all-reduce over the data axes (the simulated one with the most
  // gradients, scaled by the stage's own). Not wanted (TrainStepOptions::link_busy): none.
  if (options.link_busy) {
    const Topology& topo = machine.topology();
    std::set<VertexId> own;
    for (int d : stage.devices) own.insert(topo.device_vertex(d));
    std::map<LinkId, Time> busy;
    std::map<LinkId, std::array<Time, 6>> runs_busy;  // fb_a, fb_b, fb_bd, opt_a, opt_b, opt_bd.
    for (size_t i = 0; i < runs.size(); ++i) {
      for (const auto& [link, t] : runs[i]->link_busy) runs_busy[link][i] = t;
    }
    for (const auto& [link, t] : runs_busy) {
      const Time n =
          stage_total(t[0], t[1], t[2]) * m + stage_total(t[3] - t[0], t[4] - t[1], t[5] - t[2]);
      if (n > Time()) busy[link] = n;
    }
    auto add = [&](const std::shared_ptr<const CollectiveTiming>& timing, double times) {
      if (!timing) return;
      const LinkProfile& profile = *timing->profile;
      const double longest = static_cast<double>(timing->longest().picoseconds());
      for (size_t i = 0; i < profile.links.size(); ++i) {
        const Link& l = topo.link(profile.links[i]);
        if (!own.count(l.src) && !own.count(l.dst)) continue;
        busy[profile.links[i]] +=
            Time::Picoseconds(static_cast<int64_t>(profile.link_share[i] * longest * times));
      }
    };
    add(send_timing, static_cast<double>(sends * m));
    if (!sync_times.empty() && b.grads > 0) {
      const auto& [grads, timing] = *sync_times.rbegin();
      add(timing, static_cast<double>(b.grads) / static_cast<double>(grads));
    }
    for (const auto& [link, t] : busy) f.link_busy.push_back({link, t});
  }
  // Memory: the stage with the highest peak (the first such).
  size_t fullest = 0;
  for (size_t s = 1; s < stages.size(); ++s) {
    if (stages[s].peak > stages[fullest].peak) fullest = s;
  }
  f.peak = stages[fullest].peak;
  f.state = stages[fullest].figures.state;
  f.events = 0;
  for (const auto& [key, run] : made) f.events += run.events;
  TrainStepReport r = MakeTrainStepReport(machine, mesh, model, train, f, {base, base + 1});
  r.remat = plan.remat;
  r.remat_save = plan.remat_save;
  r.bubble = bubble;
  r.pipeline_stages = p;
  if (dense > 0) r.simulated_dense_first = {base + 1};
  for (const Stage& st : stages) {
    r.pipeline_layers.push_back(st.layers);
    r.pipeline_peaks.push_back(st.peak);
  }
  return r;
}

}  // namespace shardsim::planner
