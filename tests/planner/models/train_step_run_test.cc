// Simulated training steps: parameter counts and model FLOPs against published and
// hand-derived figures, the state bytes a plan leaves on a device, and the composed step (two
// and three layers, extrapolated) against the whole step.
#include "planner/models/train_step_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "planner/models/model_flops.h"
#include "planner/models/model_presets.h"
#include "tests/planner/models/small_model.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

const TransformerConfig& Preset(const std::string& name) {
  const ModelPreset* p = FindModelPreset(name);
  EXPECT_NE(p, nullptr) << name;
  return p->config;
}

// The parameter counts Meta's Hugging Face checkpoints report (safetensors metadata):
// Llama-2-7B 6,738,415,616; Llama-3-8B 8,030,261,248; Llama-3-70B 70,553,706,496.
TEST(ModelFlopsTest, ParameterCountsMatchThePublishedCheckpoints) {
  EXPECT_EQ(CountParameters(Preset("llama-2-7b")).total, 6'738'415'616);
  EXPECT_EQ(CountParameters(Preset("llama-3-8b")).total, 8'030'261'248);
  EXPECT_EQ(CountParameters(Preset("llama-3-70b")).total, 70'553'706'496);
  // GPT-3's "175B" (Brown et al. 2020, Table 2.1: 175.0B) with Megatron's padded vocabulary.
  EXPECT_NEAR(static_cast<double>(CountParameters(Preset("gpt3-175b")).total), 175.0e9, 0.5e9);
}

// Mixtral-8x7B: 46,702,792,704 parameters in all (the Hugging Face checkpoint's count); active
// per token, by hand: 32 layers x (attention 4096·4096·2 + 4096·1024·2 = 41,943,040, router
// 4096·8 = 32,768, two experts 2·3·4096·14336 = 352,321,536) + the unembedding 4096·32000 =
// 131,072,000: 12,748,587,008 (12.9B with the embedding, Mistral's "12.9B active").
TEST(ModelFlopsTest, MixtralCountsEveryExpertAndActivatesTwo) {
  const ParameterCounts c = CountParameters(Preset("mixtral-8x7b"));
  EXPECT_EQ(c.total, 46'702'792'704);
  EXPECT_EQ(c.matmul, int64_t{32} * (41'943'040 + 32'768 + 352'321'536) + 131'072'000);
  EXPECT_EQ(c.matmul, 12'748'587'008);
  EXPECT_EQ(c.per_layer, 0 + 41'943'040 + 3 * 4096 * 14336 + 2 * 4096);  // A dense layer's.
}

// DeepSeek-V3 with its attention approximated (model_presets.cc): 671B parameters and 37B
// active per token in the report; the approximation's 674.2B is within 1%, its 39.8B active
// matmul weights within 10% (full-rank attention projections in place of MLA's low rank).
TEST(ModelFlopsTest, DeepSeekV3IsCloseToTheReportedSizes) {
  const ParameterCounts c = CountParameters(Preset("deepseek-v3"));
  EXPECT_NEAR(static_cast<double>(c.total), 671e9, 0.01 * 671e9);
  EXPECT_NEAR(static_cast<double>(c.matmul), 37e9, 0.10 * 37e9);
}

// MaxText's 2023 models are named for their sizes (models.md: head_dim 256, ReLU, vocabulary
// 32768, tied embeddings): within 2% of 16, 22, 32, 64 and 128 billion parameters; tied, the
// head is the final norm alone, while the logits' matmul still counts among the FLOPs.
TEST(ModelFlopsTest, MaxTextModelsHaveTheirNamedSizes) {
  const std::vector<std::pair<std::string, double>> sizes = {{"maxtext-16b", 16e9},
                                                             {"maxtext-22b", 22e9},
                                                             {"maxtext-32b", 32e9},
                                                             {"maxtext-64b", 64e9},
                                                             {"maxtext-128b", 128e9}};
  for (const auto& [name, size] : sizes) {
    SCOPED_TRACE(name);
    const TransformerConfig& m = Preset(name);
    const ParameterCounts c = CountParameters(m);
    EXPECT_NEAR(static_cast<double>(c.total), size, 0.02 * size);
    EXPECT_EQ(c.head, m.d_model);
    EXPECT_EQ(c.matmul, m.layers * (4 * m.d_model * m.heads * 256 + 2 * m.d_model * m.d_ff) +
                            m.d_model * m.vocab);
  }
}

// By hand, 1 layer, d 64, 8 heads of 8, SwiGLU ff 128, vocabulary 128: matmul weights
// 4·64·64 (q, k, v, o) + 3·64·128 (MLP) + 64·128 (unembedding) = 49,152; per token
// 6·49,152 + 12·1·8·8·16 = 307,200; 8 x 16 tokens: 39,321,600 FLOPs.
TEST(ModelFlopsTest, TrainStepFlopsByHand) {
  TransformerConfig m;
  m.layers = 1;
  m.d_model = 64;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 8;
  m.d_ff = 128;
  m.vocab = 128;
  TrainConfig t;
  t.batch = 8;
  t.seq_len = 16;
  EXPECT_EQ(CountParameters(m).matmul, 49'152);
  EXPECT_DOUBLE_EQ(TrainStepModelFlops(m, t), 39'321'600.0);
}

TEST(ModelPresetsTest, EveryPresetIsWholeAndCited) {
  for (const ModelPreset& p : ModelPresets()) {
    SCOPED_TRACE(p.name);
    const TransformerConfig& c = p.config;
    EXPECT_EQ(c.heads % c.kv_heads, 0);
    // MaxText's 2023 models keep head_dim 256 whatever d is (models.md), DeepSeek-V3's
    // attention stand-in 128 (MLA's v head size); the rest d / heads.
    const int64_t head_dim = p.name.rfind("maxtext-", 0) == 0 ? 256
                             : p.name == "deepseek-v3"        ? 128
                                                              : c.d_model / c.heads;
    EXPECT_EQ(c.head_dim, head_dim);
    EXPECT_FALSE(p.source.empty());
    EXPECT_EQ(FindModelPreset(p.name), &p);
  }
  EXPECT_EQ(FindModelPreset("llama-9"), nullptr);
}

// A model small enough to simulate whole, big enough that its layers cost more than fixed
// latencies: 8 layers, d 256, 8 heads of 32 (2 kv heads), SwiGLU ff 512, vocabulary 512;
// batch 16 x 128, bf16 compute on f32 parameters, Adam.
TransformerConfig Small() { return test::SmallTransformer(8); }

using test::FsdpTensorRules;
using test::SmallTrain;

// Under FSDP over all 8 chips with every parameter's d_model dimension split (norms and
// embedding included: all divide by 8), a device holds an eighth of the parameters in f32,
// as many gradient bytes, and Adam's two moments.
TEST(TrainStepRunTest, StateBytesAreTheShardedParameters) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"fsdp", 8}};
  plan.rules = {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}};
  const TransformerConfig m = Small();
  const TrainStepReport r = SimulateTrainStep(machine, m, SmallTrain(), plan);
  const int64_t params = CountParameters(m).total * 4 / 8;
  EXPECT_EQ(r.memory.params.count(), params);
  EXPECT_EQ(r.memory.grads.count(), params);
  EXPECT_EQ(r.memory.optimizer.count(), 2 * params);
  EXPECT_GE(r.memory.peak, r.memory.params + r.memory.optimizer);
  EXPECT_EQ(r.memory.capacity, Bytes(16'000'000'000));  // v5e: 16 GB (hardware.md).
  EXPECT_TRUE(r.memory.fits);
}

// MFU is model FLOPs over the step time times the devices' peak: v5e's 197 TFLOP/s in bf16.
TEST(TrainStepRunTest, MfuIsModelFlopsOverPeak) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"data", 8}};
  plan.rules = {{"batch", {"data"}}};
  const TrainStepReport r = SimulateTrainStep(machine, Small(), SmallTrain(), plan);
  EXPECT_EQ(r.peak_flops, 197e12);
  EXPECT_EQ(r.model_flops, TrainStepModelFlops(Small(), SmallTrain()));
  EXPECT_DOUBLE_EQ(r.mfu, r.model_flops / (r.step_time.seconds() * 8 * 197e12));
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 16 * 128 / r.step_time.seconds());
  EXPECT_DOUBLE_EQ(r.tokens_per_s_per_device, r.tokens_per_s / 8);
  EXPECT_GT(r.mfu, 0);
  EXPECT_LT(r.mfu, 1);
}

// Prefetching FSDP's weight gathers a layer ahead overlaps them with the layer before: less
// exposed communication (this communication-bound model: 0.89 ms vs 1.62 ms, bound 75%), a
// shorter step, the same compute.
TEST(TrainStepRunTest, PrefetchHidesWeightGathers) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"fsdp", 8}};
  plan.rules = {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}};
  TrainStepOptions late;
  late.overlap = StepOverlap::kNone;
  const TrainStepReport ahead = SimulateTrainStep(machine, Small(), SmallTrain(), plan);
  const TrainStepReport at_use = SimulateTrainStep(machine, Small(), SmallTrain(), plan, late);
  EXPECT_EQ(ahead.compute, at_use.compute);
  EXPECT_LT(ahead.exposed_comm.seconds(), 0.75 * at_use.exposed_comm.seconds());
  EXPECT_LT(ahead.step_time, at_use.step_time);
}

// After the three scheduling passes move ops, the memory phases a step reports start at its
// pass boundaries: each at the first op of the partition, at or after the previous phase's,
// named as the first op of the expanded step from the boundary on that the partition has.
// Found here by scanning names; the scheduler finds them by name ids it made before the ops
// moved. FSDP 8 over 8 layers, prefetching: the passes move ops across the boundaries' ops.
TEST(TrainStepRunTest, PhasesStartAtTheBoundariesAfterTheOpsMove) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const std::vector<MeshAxis> axes = {{"fsdp", 8}};
  const LogicalRules rules({{"batch", {"fsdp"}}, {"embed", {"fsdp"}}}, axes);
  std::vector<std::vector<std::string>> layers;
  const ProgramSpec global = BuildTrainStep(Small(), SmallTrain(), axes, rules, &layers);
  const Mesh mesh = PlaceMesh(machine, axes);
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  const PartitionCosts costs{&mesh, &cache, machine.compute_model(), 0, &machine};
  const PartitionedStep step = PartitionStep(global, layers, RematPolicy::kNone, costs);
  std::vector<size_t> phases;
  const PartitionResult scheduled =
      ScheduleStep(*step.expanded, step.boundaries, step.partitioned, layers, costs,
                   PrefetchGroups(Small().layers, SmallTrain()), &phases,
                   CollectiveMatmulMode::kOff, StepOverlap::kFull);
  std::vector<std::string> before, after;
  for (const OpSpec& op : step.partitioned.program.ops) before.push_back(op.name);
  for (const OpSpec& op : scheduled.program.ops) after.push_back(op.name);
  ASSERT_NE(before, after);  // The passes moved ops.
  const std::vector<OpSpec>& ops = scheduled.program.ops;
  const std::vector<OpSpec>& expanded = step.expanded->ops;
  std::vector<size_t> expected;
  size_t from = 0;
  for (size_t at : step.boundaries) {
    size_t found = ops.size();
    for (size_t e = at; e < expanded.size() && found == ops.size(); ++e) {
      for (size_t i = from; i < ops.size(); ++i) {
        if (ops[i].name == expanded[e].name) {
          found = i;
          break;
        }
      }
    }
    if (found == ops.size()) break;
    expected.push_back(found);
    from = found;
  }
  ASSERT_EQ(expected.size(), step.boundaries.size());
  EXPECT_EQ(phases, expected);
}

// The schedule keeps to the memory limit as XLA's latency-hiding scheduler does: where
// prefetching the next layer's weight gathers peaks over it, the step runs with each gather
// issued where its layer reads it (the same step as asking for that schedule, to the
// picosecond and the byte); where that peaks over it too, in program order; where nothing
// does, as asked (and over the limit). Every simulation made counts in the events. FSDP 4 x
// TP 2 with full remat: peaks 18.12, 17.56 and 17.29 MB.
TEST(TrainStepRunTest, SchedulesLessOverlapToStayWithinTheMemoryLimit) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"fsdp", 4}, {"tensor", 2}};
  plan.rules = FsdpTensorRules();
  plan.remat = RematPolicy::kFull;
  TrainConfig train = SmallTrain();
  train.batch = 32;
  auto with = [&](StepOverlap overlap, bool within, double limit) {
    TrainStepOptions o;
    o.overlap = overlap;
    o.within_memory = within;
    o.memory_limit = limit;
    return SimulateTrainStep(machine, Small(), train, plan, o);
  };
  const TrainStepReport full = with(StepOverlap::kFull, false, 1);
  const TrainStepReport unprefetched = with(StepOverlap::kNoPrefetch, false, 1);
  const TrainStepReport ordered = with(StepOverlap::kNone, false, 1);
  ASSERT_GT(full.memory.peak, unprefetched.memory.peak);
  ASSERT_GT(unprefetched.memory.peak, ordered.memory.peak);
  ASSERT_LT(full.step_time, unprefetched.step_time);
  const double capacity = static_cast<double>(full.memory.capacity.count());
  auto between = [&](const TrainStepReport& low, const TrainStepReport& high) {
    return (static_cast<double>(low.memory.peak.count()) +
            static_cast<double>(high.memory.peak.count())) /
           2 / capacity;
  };
  const TrainStepReport kept = with(StepOverlap::kFull, true, between(unprefetched, full));
  EXPECT_EQ(kept.overlap, StepOverlap::kNoPrefetch);
  EXPECT_EQ(kept.step_time, unprefetched.step_time);
  EXPECT_EQ(kept.memory.peak, unprefetched.memory.peak);
  EXPECT_EQ(kept.overlapped_peak, full.memory.peak);
  EXPECT_EQ(kept.events, full.events + unprefetched.events);
  const TrainStepReport in_order = with(StepOverlap::kFull, true, between(ordered, unprefetched));
  EXPECT_EQ(in_order.overlap, StepOverlap::kNone);
  EXPECT_EQ(in_order.step_time, ordered.step_time);
  EXPECT_EQ(in_order.overlapped_peak, full.memory.peak);
  EXPECT_EQ(in_order.events, full.events + unprefetched.events + ordered.events);
  // Asked for no prefetching, the step never prefetches.
  const TrainStepReport asked =
      with(StepOverlap::kNoPrefetch, true, between(ordered, unprefetched));
  EXPECT_EQ(asked.overlap, StepOverlap::kNone);
  EXPECT_EQ(asked.overlapped_peak, unprefetched.memory.peak);
  // What every order of the step's ops holds (forced_peak, whichever schedule measured it)
  // is no more than any schedule's peak.
  for (const TrainStepReport* a : {&full, &unprefetched, &ordered}) {
    EXPECT_GT(a->memory.forced_peak, Bytes(0));
    for (const TrainStepReport* b : {&full, &unprefetched, &ordered}) {
      EXPECT_LE(a->memory.forced_peak, b->memory.peak);
    }
  }
  // Under every schedule's peak but over the forced one: each schedule is tried, none fits.
  ASSERT_LT(full.memory.forced_peak, ordered.memory.peak);
  const double under = (static_cast<double>(full.memory.forced_peak.count()) +
                        static_cast<double>(ordered.memory.peak.count())) /
                       2 / capacity;
  const TrainStepReport none_fits = with(StepOverlap::kFull, true, under);
  EXPECT_EQ(none_fits.overlap, StepOverlap::kFull);
  EXPECT_EQ(none_fits.step_time, full.step_time);
  EXPECT_EQ(none_fits.memory.peak, full.memory.peak);
  EXPECT_EQ(none_fits.overlapped_peak, Bytes(0));
  EXPECT_EQ(none_fits.events, full.events + unprefetched.events + ordered.events);
  // Under the forced peak no order of the ops fits: the other schedules are not simulated.
  const double below = 0.9 * static_cast<double>(full.memory.forced_peak.count()) / capacity;
  const TrainStepReport hopeless = with(StepOverlap::kFull, true, below);
  EXPECT_EQ(hopeless.overlap, StepOverlap::kFull);
  EXPECT_EQ(hopeless.step_time, full.step_time);
  EXPECT_EQ(hopeless.memory.peak, full.memory.peak);
  EXPECT_EQ(hopeless.overlapped_peak, Bytes(0));
  EXPECT_EQ(hopeless.events, full.events);
  // Within the limit, the schedule asked for.
  const TrainStepReport roomy = with(StepOverlap::kFull, true, 1);
  EXPECT_EQ(roomy.overlap, StepOverlap::kFull);
  EXPECT_EQ(roomy.step_time, full.step_time);
  EXPECT_EQ(roomy.events, full.events);
}

// With 4 microbatches under FSDP, the overlapping schedule holds at most one layer's gathered
// weights (prefetched a layer ahead, in bf16) more than program order: 19.38 against 18.95 MB
// here. Before each layer's first op was located in the partitioned program (a layer starts
// with its residual stream's sharding constraint, which the partitioner emits nothing for when
// the stream is already so laid out), the collectives' shadows found no layer or microbatch
// boundary and moved whole forward passes: 29.21 MB and a slower step.
TEST(TrainStepRunTest, OverlapHoldsAtMostALayersWeightsMoreThanProgramOrder) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"fsdp", 8}};
  plan.rules = {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}};
  TrainConfig train = SmallTrain();
  train.batch = 32;
  train.microbatches = 4;
  TrainStepOptions overlapping, ordered;
  overlapping.within_memory = ordered.within_memory = false;
  ordered.overlap = StepOverlap::kNone;
  const TransformerConfig m = Small();
  const TrainStepReport a = SimulateTrainStep(machine, m, train, plan, overlapping);
  const TrainStepReport b = SimulateTrainStep(machine, m, train, plan, ordered);
  // One layer's q, k, v, o and SwiGLU weights, gathered in bf16.
  const int64_t qo = m.d_model * m.heads * m.head_dim, kv = m.d_model * m.kv_heads * m.head_dim;
  const Bytes layer(2 * (2 * qo + 2 * kv + 3 * m.d_model * m.d_ff));
  EXPECT_LE(a.memory.peak, b.memory.peak + layer);
  EXPECT_LT(a.step_time, b.step_time);
}

// A custom remat (MaxText's `custom` policy: the checkpoint names kept, the rest of each layer
// recomputed) spans the named policies: saving nothing is full remat and saving every
// projection is selective, to the picosecond and the byte; torchtitan's op-level selective AC
// (every other projection of a layer saved, and the attention's output) recomputes more and
// holds less than saving every projection and the attention's output, and less and more than
// full remat.
TEST(TrainStepRunTest, CustomRematSpansTheNamedPolicies) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"fsdp", 4}, {"tensor", 2}};
  plan.rules = FsdpTensorRules();
  auto step = [&](RematPolicy remat, std::vector<std::string> save = {}) {
    StepPlan p = plan;
    p.remat = remat;
    p.remat_save = std::move(save);
    return SimulateTrainStep(machine, Small(), SmallTrain(), p);
  };
  const std::vector<std::string> projections = {"query_proj", "key_proj", "value_proj", "out_proj",
                                                "mlpwi_0",    "mlpwi_1",  "mlpwo"};
  std::vector<std::string> with_context = projections;
  with_context.push_back("context");
  const TrainStepReport full = step(RematPolicy::kFull);
  const TrainStepReport nothing = step(RematPolicy::kCustom);
  EXPECT_EQ(nothing.step_time, full.step_time);
  EXPECT_EQ(nothing.recompute, full.recompute);
  EXPECT_EQ(nothing.memory.peak, full.memory.peak);
  const TrainStepReport selective = step(RematPolicy::kSelective);
  const TrainStepReport every = step(RematPolicy::kCustom, projections);
  EXPECT_EQ(every.step_time, selective.step_time);
  EXPECT_EQ(every.recompute, selective.recompute);
  EXPECT_EQ(every.memory.peak, selective.memory.peak);
  const TrainStepReport most = step(RematPolicy::kCustom, with_context);
  const TrainStepReport op_sac =
      step(RematPolicy::kCustom, {"query_proj", "value_proj", "context", "mlpwi_0", "mlpwo"});
  EXPECT_GT(op_sac.recompute, most.recompute);
  EXPECT_LT(op_sac.recompute, full.recompute);
  EXPECT_LT(op_sac.memory.peak, most.memory.peak);
  EXPECT_GT(op_sac.memory.peak, full.memory.peak);
  EXPECT_EQ(op_sac.remat_save.size(), 5u);
}

// The exposed communication splits by collective and mesh axes and the parts add up to it
// (within a picosecond per part and layer: each is rounded once per simulated run, then
// extrapolated); under FSDP x TP the FSDP gathers and reduce-scatters and the TP psums are
// among them.
TEST(TrainStepRunTest, ExposedCommunicationSplitsByCollective) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"fsdp", 4}, {"tensor", 2}};
  plan.rules = FsdpTensorRules();
  const TrainStepReport r = SimulateTrainStep(machine, Small(), SmallTrain(), plan);
  Time sum;
  for (const auto& [name, t] : r.exposed_by_collective) sum += t;
  EXPECT_NEAR(sum.seconds(), r.exposed_comm.seconds(),
              1e-12 * 8 * static_cast<double>(r.exposed_by_collective.size()));
  for (const char* key : {"all_gather over fsdp", "psum_scatter over fsdp", "psum over tensor"}) {
    EXPECT_TRUE(r.exposed_by_collective.count(key)) << key;
  }
}

struct ComposeCase {
  std::string name;
  std::vector<MeshAxis> mesh;
  std::map<std::string, std::vector<std::string>> rules;
  int64_t microbatches = 1;
  RematPolicy remat = RematPolicy::kNone;
  int64_t experts = 0;                    // MoE layers: 4 experts of ff 256, top 2.
  int64_t dense_layers = 0;               // Leading dense layers before the MoE ones.
  std::vector<std::string> offload = {};  // plan.offload.
  // How far the screening composition's peak may be from the whole step's (the settled one's
  // stays within 5%).
  double screening_peak_tolerance = 0.05;
};

class ComposedStepTest : public ::testing::TestWithParam<ComposeCase> {};

// The composed step (2 and 3 layers simulated, extrapolated to 8; MoE models after their
// leading dense layers; 3 and 4 where the peak changes phase between 2 and 3, as screening
// does) against the whole 8-layer step: step time, compute and exposed communication within 1%
// (the bound; what differs is the first layers' settling of prefetches), state bytes
// exactly, and the peak of live memory within 5%: the peak falls at one of two moments a few
// percent apart (the end of the forward, or a layer's backward with the gradients made so
// far), which one depending on the layer count, so the peak is affine in the layers only
// piecewise (FSDP 8: 7.72, 10.47, 13.34, 16.35 MB at 2 to 5 layers, the forward's from 5;
// 24.85 MB at 8).
void ExpectComposedNear(const TrainStepReport& composed, const TrainStepReport& full,
                        const ComposeCase& c);

// Both compositions: the screening one (2 and 3 layers, as searches screen plans) and the
// settled one (from where the step's slope repeats, as runs compose).
TEST_P(ComposedStepTest, MatchesTheWholeStepWithinOnePercent) {
  const ComposeCase& c = GetParam();
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = c.mesh;
  plan.rules = c.rules;
  plan.remat = c.remat;
  plan.offload = c.offload;
  TrainConfig train = SmallTrain();
  train.microbatches = c.microbatches;
  TransformerConfig model = Small();
  model.experts = c.experts;
  model.expert_d_ff = 256;
  model.dense_layers = c.dense_layers;
  TrainStepOptions whole;
  whole.compose = false;
  const TrainStepReport full = SimulateTrainStep(machine, model, train, plan, whole);
  ASSERT_EQ(full.simulated_layers, std::vector<int64_t>{8});
  TrainStepOptions screening;
  screening.settle = false;
  for (const TrainStepOptions& options : {screening, TrainStepOptions{}}) {
    SCOPED_TRACE(options.settle ? "settled" : "screening");
    const TrainStepReport composed = SimulateTrainStep(machine, model, train, plan, options);
    if (options.settle) {
      ASSERT_GE(composed.simulated_layers.at(0), 2 + c.dense_layers);
    } else {
      ASSERT_EQ(composed.simulated_layers.size(), 2u);
      ASSERT_TRUE(composed.simulated_layers[0] == 2 + c.dense_layers ||
                  composed.simulated_layers[0] == 3 + c.dense_layers);
    }
    ExpectComposedNear(composed, full, c);
  }
}

// The figures of `composed` against `full`, the whole step (ComposedStepTest).
void ExpectComposedNear(const TrainStepReport& composed, const TrainStepReport& full,
                        const ComposeCase& c) {
  auto near = [](double a, double b) { return std::abs(a - b) <= 0.01 * std::abs(b); };
  EXPECT_PRED2(near, composed.step_time.seconds(), full.step_time.seconds());
  EXPECT_PRED2(near, composed.compute.seconds(), full.compute.seconds());
  const double peak_tolerance =
      composed.simulated_layers.at(0) <= 3 + c.dense_layers ? c.screening_peak_tolerance : 0.05;
  EXPECT_NEAR(static_cast<double>(composed.memory.peak.count()),
              static_cast<double>(full.memory.peak.count()),
              peak_tolerance * static_cast<double>(full.memory.peak.count()));
  EXPECT_NEAR(composed.exposed_comm.seconds(), full.exposed_comm.seconds(),
              0.01 * full.step_time.seconds());
  EXPECT_NEAR(composed.recompute.seconds(), full.recompute.seconds(),
              0.01 * full.step_time.seconds());
  EXPECT_EQ(composed.memory.params, full.memory.params);
  EXPECT_EQ(composed.memory.optimizer, full.memory.optimizer);
  EXPECT_EQ(full.memory.host > Bytes(0), !c.offload.empty());
  EXPECT_EQ(composed.memory.host, full.memory.host);  // Whole buffers, one set per layer.
  EXPECT_NEAR(composed.host_transfer.seconds(), full.host_transfer.seconds(),
              0.01 * full.step_time.seconds());
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ComposedStepTest,
    ::testing::Values(
        ComposeCase{"data8", {{"data", 8}}, {{"batch", {"data"}}}},
        ComposeCase{"fsdp8", {{"fsdp", 8}}, {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}}},
        ComposeCase{"fsdp4_tensor2", {{"fsdp", 4}, {"tensor", 2}}, FsdpTensorRules()},
        ComposeCase{"data4_tensor2_sequence",
                    {{"data", 4}, {"tensor", 2}},
                    {{"batch", {"data"}},
                     {"length", {"tensor"}},
                     {"heads", {"tensor"}},
                     {"kv_heads", {"tensor"}},
                     {"mlp", {"tensor"}}}},
        ComposeCase{
            "fsdp8_microbatches2", {{"fsdp", 8}}, {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}}, 2},
        // Each layer's backward makes its gradients faster than their reduce-scatters finish
        // (two collectives in flight, and the next layer's weight gathers among them), so
        // the unreduced gradients waiting for theirs pile up over the first layers: the peak
        // (at layer 1's backward) is 6.04, 7.57, 8.77, 9.75, 10.72 MB at 2 to 6 layers, rising
        // by 0.98 MB a layer from 4 on. Screening extrapolates 2 and 3's slope: 15.19 MB at 8
        // layers against 12.68 (20% high); the settled composition gives 12.68.
        ComposeCase{"fsdp8_full_remat",
                    {{"fsdp", 8}},
                    {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}},
                    1,
                    RematPolicy::kFull,
                    0,
                    0,
                    {},
                    0.21},
        ComposeCase{"fsdp4_tensor2_selective_remat",
                    {{"fsdp", 4}, {"tensor", 2}},
                    FsdpTensorRules(),
                    1,
                    RematPolicy::kSelective},
        ComposeCase{"fsdp4_expert2_moe",
                    {{"fsdp", 4}, {"expert", 2}},
                    {{"batch", {"fsdp", "expert"}}, {"embed", {"fsdp"}}, {"expert", {"expert"}}},
                    1,
                    RematPolicy::kNone,
                    4},
        ComposeCase{"data2_expert4_moe_after_two_dense_layers_full_remat",
                    {{"data", 2}, {"expert", 4}},
                    {{"batch", {"data", "expert"}}, {"expert", {"expert"}}},
                    1,
                    RematPolicy::kFull,
                    4,
                    2},
        ComposeCase{"fsdp8_full_remat_offload_input_and_qkv",
                    {{"fsdp", 8}},
                    {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}},
                    1,
                    RematPolicy::kFull,
                    0,
                    0,
                    {"decoder_layer_input", "query_proj", "key_proj", "value_proj"}}),
    [](const auto& info) { return info.param.name; });

// Vocabulary tiling keeps one tile's logits live at a time: each tile's are recomputed in the
// backward. A model whose head dominates its memory (vocabulary 4096, d_model 32; per device
// one sequence of 64 positions: logits of 64 x 4096 x 4 B = 1 MiB) peaks lower by about the
// logits the other tiles no longer hold, (1 - 1/n) MiB (within 2%: a tile's labels and loss
// slices stay beside them), and takes longer by the recomputed head.
TEST(ComposedPeakTest, VocabularyTilingHoldsOneTilesLogits) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  TransformerConfig model;
  model.layers = 2;
  model.d_model = 32;
  model.d_ff = 64;
  model.heads = 4;
  model.kv_heads = 2;
  model.head_dim = 8;
  model.vocab = 4096;
  TrainConfig train;
  train.batch = 8;
  train.seq_len = 64;
  train.optimizer = Optimizer::kSgd;
  StepPlan plan;
  plan.mesh = {{"data", 8}};
  plan.rules = {{"batch", {"data"}}};
  const TrainStepReport whole = SimulateTrainStep(machine, model, train, plan);
  const double logits = 64.0 * 4096 * 4;
  for (int64_t n : {2, 4}) {
    train.vocab_tiling = n;
    const TrainStepReport tiled = SimulateTrainStep(machine, model, train, plan);
    const double saved = static_cast<double>((whole.memory.peak - tiled.memory.peak).count());
    EXPECT_NEAR(saved, (1 - 1.0 / static_cast<double>(n)) * logits, 0.02 * logits) << n;
    EXPECT_GT(tiled.step_time, whole.step_time) << n;
    EXPECT_GT(tiled.recompute, whole.recompute) << n;
  }
}

// Llama-3-70B on 256 v6e with full remat and each layer's input offloaded: the 2-layer step
// peaks above the 3-layer one (24.1 against 23.7 GiB, at the head's gradient; the step's peak
// grows from 3 layers on), so a step composed from 2 and 3 layers extrapolated a falling peak
// (6.1 GiB at 80 layers). Composed from 3 and 4 instead, the 12-layer step's peak is the whole
// step's to the byte (every figure affine from 3 layers on), and its time within 1%.
TEST(ComposedPeakTest, FallingShortPeaksComposeFromTheNextPair) {
  Machine machine(BuildPreset("tpu-v6e", {16, 16}));
  TransformerConfig model = FindModelPreset("llama-3-70b")->config;
  model.layers = 12;
  TrainConfig train;
  train.batch = 1280;
  train.seq_len = 8192;
  train.optimizer = Optimizer::kAdam;
  train.dtype = DType::kBF16;
  train.param_dtype = DType::kF32;
  StepPlan plan;
  plan.mesh = {{"fsdp", 256}};
  plan.rules = {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}};
  plan.remat = RematPolicy::kFull;
  plan.offload = {"decoder_layer_input"};
  TrainStepOptions whole;
  whole.compose = false;
  const TrainStepReport full = SimulateTrainStep(machine, model, train, plan, whole);
  TrainStepOptions screening;  // The falling pair's rule alone (settling probes further).
  screening.settle = false;
  const TrainStepReport composed = SimulateTrainStep(machine, model, train, plan, screening);
  EXPECT_EQ(composed.simulated_layers, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(composed.memory.peak, full.memory.peak);
  const TrainStepReport settled = SimulateTrainStep(machine, model, train, plan);
  EXPECT_GE(settled.simulated_layers.at(0), 3);
  EXPECT_EQ(settled.memory.peak, full.memory.peak);
  EXPECT_NEAR(composed.step_time.seconds(), full.step_time.seconds(),
              0.01 * full.step_time.seconds());
}

// A 4-layer step whose peak falls from 2 layers to 3 (the Llama-3-70B plan above: 24.10 GiB
// at 2 layers, 23.70 at 3, 23.74 at 4) is composed from 3 and 4 layers, which is the whole
// step itself, not extrapolated from 2 and 3 (23.30 GiB, below every step's peak).
TEST(ComposedPeakTest, FallingShortPeaksOfAFourLayerStepTakeTheWholeStep) {
  auto run = [](int64_t layers) {
    StepFigures f;
    f.end = Time::FromSeconds(0.4 * static_cast<double>(layers));
    const int64_t peaks[] = {0, 0, 25877596040, 25447942792, 25488051592};
    f.peak = Bytes(peaks[layers]);
    return f;
  };
  std::vector<int64_t> simulated;
  const StepFigures f = ComposeShortSteps(2, 4, run, &simulated);
  EXPECT_EQ(simulated, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(f.peak, Bytes(25488051592));
  EXPECT_EQ(f.end, run(4).end);
}

// Llama-3-70B on 2048 v5p chips (data 8 x FSDP 64 x TP 4, selective remat), its step of 2 to
// 6 layers simulated whole: 420.2, 494.1, 560.8, 630.9, 701.0 ms, then 70.1 ms a layer (8 and
// 12 layers: 841.3 ms, 1.122 s). The screening composition extrapolates 2 and 3 layers' 73.9
// ms a layer to 80 layers, 6.185 s; the settled one probes until two slopes agree (66.7 after
// 73.9, 70.1 after 66.7, 70.1 after 70.1) and composes from 5 and 6: 701.0 + 74 x 70.1 ms =
// 5.8884 s, the whole 80-layer step's 5.891 s within 0.1%.
TEST(ComposedPeakTest, SettledCompositionWaitsForTheSlopeToRepeat) {
  auto run = [](int64_t layers) {
    const double ms[] = {0, 0, 420.2, 494.1, 560.8, 630.9, 701.0};
    StepFigures f;
    f.end = Time::FromSeconds(1e-3 * (layers <= 6 ? ms[layers] : 701.0 + 70.1 * (layers - 6)));
    f.peak = Bytes(1000 * layers);
    return f;
  };
  std::vector<int64_t> simulated;
  const StepFigures screened = ComposeShortSteps(2, 80, run, &simulated, /*settle=*/false);
  EXPECT_EQ(simulated, (std::vector<int64_t>{2, 3}));
  EXPECT_NEAR(screened.end.seconds(), 0.4202 + 78 * 0.0739, 1e-9);
  const StepFigures settled = ComposeShortSteps(2, 80, run, &simulated);
  EXPECT_EQ(simulated, (std::vector<int64_t>{5, 6}));
  EXPECT_NEAR(settled.end.seconds(), 0.701 + 74 * 0.0701, 1e-9);
  EXPECT_EQ(settled.peak, Bytes(80000));
  // A step that never settles stops probing kSettleProbes layers past the first pair.
  auto alternating = [](int64_t layers) {
    StepFigures f;
    f.end = Time::FromSeconds(0.1 * static_cast<double>(layers) + (layers % 2 ? 0.01 : 0));
    return f;
  };
  ComposeShortSteps(2, 80, alternating, &simulated);
  EXPECT_EQ(simulated, (std::vector<int64_t>{2 + kSettleProbes, 3 + kSettleProbes}));
}

// Exposed communication composes per collective class, each at least none: a class whose
// exposure shrinks with the layers (all_gather: 6 us, then 5 us) stops at none, and the
// composed whole is the sum of what the classes keep (the psum_scatter's 4 + 2k us, k layers
// past the first pair's shorter step), not the whole's own extrapolation (10 + k us), which
// the shrinking class pulls below its parts.
TEST(ComposeFiguresTest, ExposedCommunicationIsTheSumOfItsClasses) {
  auto us = [](int64_t n) { return Time::Microseconds(n); };
  StepFigures a, b;
  a.exposed_comm = us(10);
  a.exposed_by_collective = {{"psum_scatter over fsdp", us(4)}, {"all_gather over fsdp", us(6)}};
  b.exposed_comm = us(11);
  b.exposed_by_collective = {{"psum_scatter over fsdp", us(6)}, {"all_gather over fsdp", us(5)}};
  const StepFigures f = ComposeFigures(a, b, 10);
  EXPECT_EQ(f.exposed_by_collective,
            (std::map<std::string, Time>{{"psum_scatter over fsdp", us(24)}}));
  EXPECT_EQ(f.exposed_comm, us(24));
  // Classes that all grow compose to the whole's own extrapolation.
  b.exposed_by_collective["all_gather over fsdp"] = us(7);
  b.exposed_comm = us(13);
  const StepFigures g = ComposeFigures(a, b, 10);
  EXPECT_EQ(g.exposed_comm, us(40));
  EXPECT_EQ(g.exposed_by_collective.at("all_gather over fsdp"), us(16));
}

// Mixtral 8x7B's dropless step with full remat (FSDP 8 x EP 8 on H100): its memory phases peak
// at 10.08, 18.51, 23.29, 23.33, 1.63 GiB with 2 layers and 10.44, 23.41, 23.59, 23.84, 2.13
// with 3. Extrapolated to 32 layers the second phase (the first backward pass, still settling
// at 2 layers) would peak at 166 GiB, above the fourth, which holds both measured peaks: the
// composition moves to the next pair.
TEST(ComposedPeakTest, APeakMovingToAnotherPhaseIsNotExtrapolated) {
  auto gib = [](double g) { return Bytes(static_cast<int64_t>(g * 1073741824.0)); };
  StepFigures a, b;
  for (double g : {10.08, 18.51, 23.29, 23.33, 1.63}) a.phase_peaks.push_back(gib(g));
  for (double g : {10.44, 23.41, 23.59, 23.84, 2.13}) b.phase_peaks.push_back(gib(g));
  a.peak = gib(23.33);
  b.peak = gib(23.84);
  EXPECT_FALSE(PeakFalls(a, b));
  EXPECT_TRUE(PeakChangesPhase(a, b, 29));
  EXPECT_GT(ComposeFigures(a, b, 29).peak, gib(160));
  EXPECT_FALSE(PeakChangesPhase(a, a, 29));  // Every phase flat: the peak stays where it is.
}

}  // namespace
}  // namespace shardsim::planner

namespace shardsim::planner {
namespace {

// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
// Section 4.1) count the bytes one layer keeps for its backward as sbh(34 + 5as/h) in 16-bit
// (s tokens per sequence, b sequences, h width, a heads): attention 11sbh + 5as^2b, MLP 19sbh,
// the two LayerNorms' inputs 4sbh. shardsim's layer has no dropout (its masks: sbh in the
// attention, sbh in the MLP) and a fused attention that keeps no s x s scores (the 5as^2b
// term), so it keeps 32sbh bytes at 2 bytes per element, 16sbh elements: LayerNorm inputs x
// and h (2sbh), their outputs read by the projections (2sbh), q, k, v and the attention's
// output (4sbh), the GELU's input and output (8sbh). With tensor parallelism over t and no
// sequence parallelism the LayerNorms' inputs and outputs stay whole on every device
// (Korthikanti's 10sbh without the masks: 8sbh bytes, 4sbh elements), the rest is split:
// (4 + 12/t) sbh elements; with sequence parallelism every term is split: 16sbh/t.
// With full recompute a layer keeps its input only: sbh elements (Korthikanti's 2sbh bytes),
// split by sequence parallelism. With selective recompute (matmul outputs kept, the rest
// recomputed) it keeps its input (1), q, k, v (3), the attention projection's output o (1:
// the recomputed residual add reads it) and the MLP's up projection (4: GELU's derivative
// reads it): 9sbh; the down projection's output is read by nothing after the forward.
// Measured as the slope of the step's peak in the layer count (2 to 3 layers), less the
// layer's parameters (inputs, live throughout); f32, gradients only, so the peak is the
// start of the backward pass with every layer's activations live. Exact: the count is of
// whole buffers.
struct ActivationCase {
  std::string name;
  std::vector<MeshAxis> mesh;
  std::map<std::string, std::vector<std::string>> rules;
  double elements_per_sbh;  // Per device, per layer, in units of s·b·h / devices holding b.
  RematPolicy remat = RematPolicy::kNone;
  std::vector<std::string> offload = {};  // plan.offload: MaxText checkpoint names.
  double host_elements_per_sbh = 0;       // Likewise, held in host memory.
};

class ActivationMemoryTest : public ::testing::TestWithParam<ActivationCase> {};

TEST_P(ActivationMemoryTest, PerLayerBytesAreKorthikantisWithoutDropoutAndScores) {
  const ActivationCase& c = GetParam();
  // A host link fast enough that no value waits in HBM for its copy to host memory (at 1.6e10
  // B/s this small layer's copies fall behind its compute, and the backlog adds to the slope).
  HardwareSpec hardware;
  hardware.preset = "tpu-v5e";
  hardware.shape = {4, 2};
  hardware.device.host_bandwidth = Bandwidth::BytesPerSecond(1e18);
  Machine machine(BuildHardware(hardware));
  TransformerConfig m;
  m.d_model = 64;
  m.heads = 4;
  m.kv_heads = 4;
  m.head_dim = 16;
  m.d_ff = 256;  // 4h, as Korthikanti's MLP.
  m.vocab = 128;
  m.mlp = MlpKind::kGelu;
  m.norm = NormKind::kLayer;
  TrainConfig t;
  t.batch = 8;
  t.seq_len = 1024;  // A layer's input outweighs its gradients (full remat's peak).
  StepPlan plan;
  plan.mesh = c.mesh;
  plan.rules = c.rules;
  plan.remat = c.remat;
  plan.offload = c.offload;
  TrainStepOptions whole;
  whole.compose = false;
  m.layers = 2;
  const TrainStepReport two = SimulateTrainStep(machine, m, t, plan, whole);
  m.layers = 3;
  const TrainStepReport three = SimulateTrainStep(machine, m, t, plan, whole);
  const int64_t layer = (three.memory.peak - two.memory.peak).count() -
                        (three.memory.params - two.memory.params).count();
  int64_t batch_split = 1;
  for (const MeshAxis& a : c.mesh) batch_split *= a.name == "data" ? a.size : 1;
  const double sbh = static_cast<double>(t.seq_len * t.batch / batch_split * m.d_model);
  EXPECT_EQ(static_cast<double>(layer), c.elements_per_sbh * sbh * 4);
  EXPECT_EQ(static_cast<double>((three.memory.host - two.memory.host).count()),
            c.host_elements_per_sbh * sbh * 4);
}

INSTANTIATE_TEST_SUITE_P(
    Plans, ActivationMemoryTest,
    ::testing::Values(
        ActivationCase{"data8", {{"data", 8}}, {{"batch", {"data"}}}, 16},
        ActivationCase{"data2_tensor4",
                       {{"data", 2}, {"tensor", 4}},
                       {{"batch", {"data"}},
                        {"heads", {"tensor"}},
                        {"kv_heads", {"tensor"}},
                        {"mlp", {"tensor"}}},
                       4 + 12.0 / 4},
        ActivationCase{"data2_tensor4_sequence",
                       {{"data", 2}, {"tensor", 4}},
                       {{"batch", {"data"}},
                        {"length", {"tensor"}},
                        {"heads", {"tensor"}},
                        {"kv_heads", {"tensor"}},
                        {"mlp", {"tensor"}}},
                       16.0 / 4},
        // MaxText's activation_embed over tensor: the residual stream (the layer's input and
        // the attention block's output h) split over tensor, the norms' outputs gathered whole
        // (a norm needs its row), the rest split as without it: 2 + 14/t.
        ActivationCase{"data2_tensor4_activation_embed",
                       {{"data", 2}, {"tensor", 4}},
                       {{"batch", {"data"}},
                        {"heads", {"tensor"}},
                        {"kv_heads", {"tensor"}},
                        {"mlp", {"tensor"}},
                        {"activation_embed", {"tensor"}}},
                       2 + 14.0 / 4},
        ActivationCase{"data8_full", {{"data", 8}}, {{"batch", {"data"}}}, 1, RematPolicy::kFull},
        ActivationCase{
            "data8_selective", {{"data", 8}}, {{"batch", {"data"}}}, 9, RematPolicy::kSelective},
        ActivationCase{"data2_tensor4_sequence_full",
                       {{"data", 2}, {"tensor", 4}},
                       {{"batch", {"data"}},
                        {"length", {"tensor"}},
                        {"heads", {"tensor"}},
                        {"kv_heads", {"tensor"}},
                        {"mlp", {"tensor"}}},
                       1.0 / 4,
                       RematPolicy::kFull},
        // Host offload (MaxText's custom remat policy with "offload"): the offloaded values
        // leave HBM for host memory; what a layer's backward fetches back a layer ahead is live
        // whatever the layer count. (With full remat and the input offloaded a layer keeps
        // nothing in HBM, and the peak moves to the backward's end, where every gradient is
        // live: no activation slope to measure there.)
        ActivationCase{"data8_offload_input",
                       {{"data", 8}},
                       {{"batch", {"data"}}},
                       16 - 1,
                       RematPolicy::kNone,
                       {"decoder_layer_input"},
                       1},
        ActivationCase{"data8_offload_context",  // The attention's output (MaxText's name).
                       {{"data", 8}},
                       {{"batch", {"data"}}},
                       16 - 1,
                       RematPolicy::kNone,
                       {"context"},
                       1},
        ActivationCase{"data8_selective_offload_mlp_input_projection",
                       {{"data", 8}},
                       {{"batch", {"data"}}},
                       9 - 4,
                       RematPolicy::kSelective,
                       {"mlpwi_0"},
                       4},
        ActivationCase{"data8_offload_qkv",
                       {{"data", 8}},
                       {{"batch", {"data"}}},
                       16 - 3,
                       RematPolicy::kNone,
                       {"query_proj", "key_proj", "value_proj"},
                       3}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace shardsim::planner
