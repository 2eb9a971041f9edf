// Pipelined training steps: the schedule's bubble shrinks with microbatches and with
// interleaving, GPipe holds more activations than 1F1B, each stage holds its share of the
// parameters, layers that do not divide among the stages and leading dense layers make
// unequal stages, plans that do not fit together are located errors, and the schedules tried to
// stay within memory equal those asked for.
#include "planner/models/pipeline_step_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "sim/observer.h"
#include "sim/spec_error.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

// 8 layers, d 256, 8 heads of 32, SwiGLU ff 1024, vocabulary 512; batch 32 x 256, bf16 on f32,
// Adam.
TransformerConfig Model() {
  TransformerConfig m;
  m.layers = 8;
  m.d_model = 256;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 32;
  m.d_ff = 1024;
  m.vocab = 512;
  return m;
}

// Model() as a mixture of 4 experts of `expert_d_ff`, top 2, its dense MLP 64 wide.
TransformerConfig Moe(int64_t expert_d_ff) {
  TransformerConfig m = Model();
  m.d_ff = 64;
  m.experts = 4;
  m.top_k = 2;
  m.expert_d_ff = expert_d_ff;
  return m;
}

TrainConfig Train(int64_t microbatches) {
  TrainConfig t;
  t.batch = 32;
  t.seq_len = 256;
  t.dtype = DType::kBF16;
  t.param_dtype = DType::kF32;
  t.optimizer = Optimizer::kAdam;
  t.microbatches = microbatches;
  return t;
}

// data 2 x stage 2 x tensor 2 on a v5e 4x2.
StepPlan Plan(PipelineSchedule schedule, int virtual_stages = 1) {
  StepPlan plan;
  plan.mesh = {{"data", 2}, {"stage", 2}, {"tensor", 2}};
  plan.rules = {{"batch", {"data"}}, {"heads", {"tensor"}}, {"kv_heads", {"tensor"}},
                {"mlp", {"tensor"}}, {"vocab", {"tensor"}}, {"layers", {"stage"}}};
  plan.pipeline = PipelinePlan{"stage", schedule, virtual_stages};
  return plan;
}

double BubbleFraction(const TrainStepReport& r) {
  return r.bubble.seconds() / r.step_time.seconds();
}

TEST(PipelineStepTest, BubbleShrinksWithMicrobatchesAndInterleaving) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const TrainStepReport m2 =
      SimulateTrainStep(machine, Model(), Train(2), Plan(PipelineSchedule::kOneFOneB));
  const TrainStepReport m8 =
      SimulateTrainStep(machine, Model(), Train(8), Plan(PipelineSchedule::kOneFOneB));
  const TrainStepReport inter =
      SimulateTrainStep(machine, Model(), Train(8), Plan(PipelineSchedule::kInterleaved, 2));
  EXPECT_EQ(m8.pipeline_stages, 2);
  EXPECT_GT(m2.bubble, Time());
  EXPECT_LT(BubbleFraction(m8), BubbleFraction(m2));
  EXPECT_LT(inter.bubble, m8.bubble);
  // With 2 stages the 1F1B bubble is one stage's forward and backward of a microbatch: about
  // 1/(m + 1) of the schedule (the last stage also runs the head, so not exactly).
  EXPECT_NEAR(BubbleFraction(m2), 1.0 / 3, 0.15);
}

TEST(PipelineStepTest, GpipeHoldsMoreActivationsThanOneFOneB) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  TrainConfig t = Train(8);
  const TrainStepReport one =
      SimulateTrainStep(machine, Model(), t, Plan(PipelineSchedule::kOneFOneB));
  const TrainStepReport gpipe =
      SimulateTrainStep(machine, Model(), t, Plan(PipelineSchedule::kGpipe));
  // Each stage: GPipe holds all 8 microbatches in flight, 1F1B at most 2.
  ASSERT_EQ(gpipe.pipeline_peaks.size(), 2u);
  for (size_t s = 0; s < 2; ++s) EXPECT_GT(gpipe.pipeline_peaks[s], one.pipeline_peaks[s]);
  EXPECT_GT(gpipe.memory.peak, one.memory.peak);
}

// A stage holds half the layers: fewer parameter bytes per device than the same mesh without
// the pipeline (stage folded into data).
TEST(PipelineStepTest, StagesHoldTheirShareOfTheParameters) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan flat;
  flat.mesh = {{"data", 4}, {"tensor", 2}};
  flat.rules = {{"batch", {"data"}},
                {"heads", {"tensor"}},
                {"kv_heads", {"tensor"}},
                {"mlp", {"tensor"}},
                {"vocab", {"tensor"}}};
  const TrainStepReport staged =
      SimulateTrainStep(machine, Model(), Train(4), Plan(PipelineSchedule::kOneFOneB));
  const TrainStepReport replicated = SimulateTrainStep(machine, Model(), Train(4), flat);
  // The fullest stage, the first, holds half the layers and the embedding; the last the other
  // half and the head: together the whole model's, the final norm's 256 aside.
  EXPECT_EQ(staged.memory.params * 2 + Bytes(256 * 4), replicated.memory.params);
}

TEST(PipelineStepTest, ExposedCommunicationSplitsByCollective) {
  // The classes add up to exposed_comm: the stage's tensor psums, the gradient all-reduce
  // over data after the flush, and the sends between stages (the rest).
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const TrainStepReport r =
      SimulateTrainStep(machine, Model(), Train(4), Plan(PipelineSchedule::kOneFOneB));
  Time sum;
  for (const auto& [name, t] : r.exposed_by_collective) sum += t;
  EXPECT_EQ(sum, r.exposed_comm);
  EXPECT_TRUE(r.exposed_by_collective.count("psum over data"));
  EXPECT_TRUE(r.exposed_by_collective.count("psum over tensor"));
  // The bytes each device puts into them a step (compare's "inputs"; none were given for
  // pipelines): the busiest stage is the last, whose chunk sends only gradients back, one per
  // microbatch: 4 of [4, 256, 256] bf16 (batch 32 over 4 microbatches and data 2); the gradient
  // all-reduce takes the stage's gradients once: the first stage's (the fullest, the report's)
  // with the final norm's 256 and the unembedding (split over tensor as the embedding is)
  // for the embedding.
  EXPECT_EQ(r.bytes_by_collective.at("ppermute over stage"), Bytes(4 * 4 * 256 * 256 * 2));
  EXPECT_EQ(r.bytes_by_collective.at("psum over data"), r.memory.grads + Bytes(256 * 4));
  EXPECT_GT(r.bytes_by_collective.at("psum over tensor"), Bytes(0));
}

// Per-link figures of a pipeline (the busiest stage's, on its devices' links): the stage's
// collectives and sends repeat per microbatch, its gradient all-reduce once, so each link's
// busy time is affine in the microbatches; no link is busier than the step is long.
TEST(PipelineStepTest, LinkFiguresAreAffineInTheMicrobatches) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  std::map<int, std::map<LinkId, int64_t>> busy;  // By microbatches.
  for (int m : {2, 4, 8}) {
    const TrainStepReport r =
        SimulateTrainStep(machine, Model(), Train(m), Plan(PipelineSchedule::kOneFOneB));
    ASSERT_FALSE(r.link_busy.empty());
    for (const auto& [link, t] : r.link_busy) {
      busy[m][link] = t.picoseconds();
      EXPECT_LE(t, r.step_time);
    }
  }
  ASSERT_EQ(busy[2].size(), busy[8].size());
  int growing = 0;  // Links of the stage's tensor psums and sends (the rest: the all-reduce's).
  for (const auto& [link, t2] : busy[2]) {
    // Rounding: each composed part to a picosecond.
    EXPECT_NEAR(busy[8][link] - t2, 3 * (busy[4][link] - t2), 8) << link;
    EXPECT_GE(busy[4][link], t2) << link;
    growing += busy[4][link] > t2 ? 1 : 0;
  }
  EXPECT_GT(growing, 0);
}

// Without data axes nothing is all-reduced after the flush, but every stage still updates:
// the step ends with the slowest update (it ended at the flush, Adam's step as long as
// SGD's), and its parts add up to it. Vocabulary tiling reaches the stages' runs but not the
// runs of the layers alone, which have no logits (it was refused).
TEST(PipelineStepTest, WithoutDataAxesTheStepEndsWithTheUpdate) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan = Plan(PipelineSchedule::kOneFOneB);
  plan.mesh = {{"stage", 4}, {"tensor", 2}};
  plan.rules.erase("batch");
  TrainConfig sgd = Train(4);
  sgd.optimizer = Optimizer::kSgd;
  const TrainStepReport a = SimulateTrainStep(machine, Model(), Train(4), plan);
  const TrainStepReport s = SimulateTrainStep(machine, Model(), sgd, plan);
  EXPECT_GT(a.step_time, s.step_time);
  for (const TrainStepReport* r : {&a, &s}) {
    EXPECT_EQ(r->compute + r->exposed_comm + r->bubble, r->step_time);
  }
  TrainConfig tiled = Train(4);
  tiled.vocab_tiling = 4;
  EXPECT_GT(SimulateTrainStep(machine, Model(), tiled, plan).step_time, Time());
  // Uneven stages whose updates outweigh their short microbatches: the busiest stage (one of
  // 2 layers) updates right after its last backward, before the schedule ends. Its idle time
  // is what its tasks, all-reduce and update leave of the step (its update was counted as
  // bubble too, and the parts exceeded the step).
  TransformerConfig wide = Model();
  wide.layers = 5;
  wide.d_model = 1024;
  wide.head_dim = 128;
  wide.d_ff = 4096;
  TrainConfig short_sequences = Train(4);
  short_sequences.batch = 8;
  short_sequences.seq_len = 16;
  const TrainStepReport u = SimulateTrainStep(machine, wide, short_sequences, plan);
  EXPECT_EQ(u.pipeline_layers, (std::vector<int64_t>{1, 2, 1, 1}));
  EXPECT_EQ(u.compute + u.exposed_comm + u.bubble, u.step_time);
}

// Each stage all-reduces its gradients as soon as its own last backward is done, while the
// stages before it still run theirs (1F1B: the first stage finishes last); the step ends with
// the last update. Read from the trace the step reports (TrainStepOptions::observer).
TEST(PipelineStepTest, EachStageReducesItsGradientsWhenItsBackwardsAreDone) {
  struct Slices : Observer {
    std::vector<SliceRecord> all;
    void OnSlice(const SliceRecord& s) override { all.push_back(s); }
  } trace;
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan = Plan(PipelineSchedule::kOneFOneB);
  plan.mesh = {{"data", 2}, {"stage", 4}};
  plan.rules = {{"batch", {"data"}}, {"layers", {"stage"}}};
  TrainStepOptions options;
  options.observer = &trace;
  const TrainStepReport r = SimulateTrainStep(machine, Model(), Train(4), plan, options);
  std::map<int, Time> last_backward, reduce_start;
  Time end;
  for (const SliceRecord& s : trace.all) {
    end = std::max(end, s.end);
    if (s.name.rfind("backward", 0) == 0) {
      last_backward[s.pid] = std::max(last_backward[s.pid], s.end);
    }
    if (s.name == "psum over data (gradients)") reduce_start[s.pid] = s.start;
  }
  ASSERT_EQ(reduce_start.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(reduce_start[s], last_backward[s]) << s;
  EXPECT_LT(reduce_start[3], last_backward[0]);
  EXPECT_EQ(end, r.step_time);
  // The head's update is split by weights held: the first stage updates the embedding, the last
  // the unembedding (as large) and the final norm, the middle ones neither. They used to count
  // both tables' each.
  std::map<int, Time> update;
  for (const SliceRecord& s : trace.all) {
    if (s.name == "optimizer update") update[s.pid] = s.end - s.start;
  }
  EXPECT_EQ(update[1], update[2]);
  const Time first = update[0] - update[1], last = update[3] - update[1];
  EXPECT_GT(first, Time());
  EXPECT_GE(last, first);
  EXPECT_LT((last - first).picoseconds(), first.picoseconds() / 100);  // The norm: 1/512.
}

TEST(PipelineStepTest, PlansThatDoNotFitTogetherAreLocated) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan no_rule = Plan(PipelineSchedule::kOneFOneB);
  no_rule.rules.erase("layers");
  try {
    SimulateTrainStep(machine, Model(), Train(4), no_rule);
    ADD_FAILURE() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "plan.rules.layers");
  }
  TransformerConfig one = Model();
  one.layers = 1;  // Two stages need a layer each.
  try {
    SimulateTrainStep(machine, one, Train(4), Plan(PipelineSchedule::kOneFOneB));
    ADD_FAILURE() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "plan.pipeline");
  }
}

// Layers split as evenly as they can; the remainder goes to the middle chunks first, then to
// the first (its embedding is cheap), never to the last (it runs the head).
TEST(PipelineStepTest, ChunkLayersSpreadTheRemainderOverTheMiddleThenTheFirst) {
  EXPECT_EQ(ChunkLayers(8, 2), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(ChunkLayers(7, 2), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(ChunkLayers(7, 4), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(ChunkLayers(6, 4), (std::vector<int64_t>{1, 2, 2, 1}));
  EXPECT_EQ(ChunkLayers(4, 4), (std::vector<int64_t>{1, 1, 1, 1}));
  // DeepSeek-V3's 61 layers over 16 stages: 13 middle ones take 4.
  const std::vector<int64_t> deepseek = ChunkLayers(61, 16);
  EXPECT_EQ(std::accumulate(deepseek.begin(), deepseek.end(), int64_t{0}), 61);
  EXPECT_EQ(deepseek.front(), 3);
  EXPECT_EQ(deepseek.back(), 3);
  EXPECT_EQ(std::count(deepseek.begin(), deepseek.end(), 4), 13);
  EXPECT_THROW(ChunkLayers(3, 4), SpecError);
}

// With first_stage_layers or last_stage_layers (Megatron-LM's --decoder-first- and
// --decoder-last-pipeline-num-layers) those stages take what they say and the stages between
// split the rest evenly; each stage's layers split evenly among its virtual stages (chunk
// c * stages + s of stage s). Without either, ChunkLayers' split.
TEST(PipelineStepTest, FirstAndLastStageLayersFixThoseStages) {
  PipelinePlan pp;
  EXPECT_EQ(PipelineChunkLayers(61, 16, pp), ChunkLayers(61, 16));
  pp.first_stage_layers = 5;
  pp.last_stage_layers = 2;
  // DeepSeek-V3-like: 61 - 5 - 2 = 54 over the 14 stages between does not divide; 60 does not
  // either (53); 63 does (56: 4 each).
  const std::vector<int64_t> even = PipelineChunkLayers(63, 16, pp);
  EXPECT_EQ(even.front(), 5);
  EXPECT_EQ(even.back(), 2);
  EXPECT_EQ(std::count(even.begin(), even.end(), 4), 14);
  EXPECT_EQ(PipelineChunkLayers(9, 3, pp), (std::vector<int64_t>{5, 2, 2}));
  pp.last_stage_layers = 0;
  EXPECT_EQ(PipelineChunkLayers(9, 3, pp), (std::vector<int64_t>{5, 2, 2}));
  pp.first_stage_layers = 0;
  pp.last_stage_layers = 1;
  EXPECT_EQ(PipelineChunkLayers(7, 4, pp), (std::vector<int64_t>{2, 2, 2, 1}));
  pp.first_stage_layers = 2;
  pp.last_stage_layers = 4;
  pp.virtual_stages = 2;  // Stage s's chunks are s and s + 3: 1 + 1, 2 + 2, 2 + 2.
  EXPECT_EQ(PipelineChunkLayers(10, 3, pp), (std::vector<int64_t>{1, 2, 2, 1, 2, 2}));
  for (const auto& [layers, stages] : std::vector<std::pair<int64_t, int>>{
           {9, 3},     // Stage 1's 3 layers do not split into 2 virtual stages.
           {11, 3},    // Likewise 5.
           {7, 2},     // Nothing between to take the 7th.
           {5, 1}}) {  // One stage is both.
    try {
      PipelineChunkLayers(layers, stages, pp);
      ADD_FAILURE() << layers << " layers on " << stages << " stages were accepted";
    } catch (const SpecError& e) {
      EXPECT_EQ(e.key(), "plan.pipeline");
    }
  }
  EXPECT_EQ(PipelineChunkLayers(6, 2, pp), (std::vector<int64_t>{1, 2, 1, 2}));
}

// 7 layers on 2 stages (4 and 3): the step takes longer than 6 layers' (3 and 3) and less
// than 8 layers' (4 and 4, the second also running the head). The peak is the fuller stage's:
// no stage of the 7-layer step holds more layers than the 8-layer step's, nor fewer than the
// 6-layer step's.
TEST(PipelineStepTest, LayersThatDoNotDivideMakeUnequalStages) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  auto step = [&](int64_t layers) {
    TransformerConfig m = Model();
    m.layers = layers;
    return SimulateTrainStep(machine, m, Train(4), Plan(PipelineSchedule::kOneFOneB));
  };
  const TrainStepReport six = step(6), seven = step(7), eight = step(8);
  EXPECT_EQ(seven.pipeline_layers, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(eight.pipeline_layers, (std::vector<int64_t>{4, 4}));
  EXPECT_LT(six.step_time, seven.step_time);
  EXPECT_LT(seven.step_time, eight.step_time);
  EXPECT_LE(seven.memory.peak, eight.memory.peak);
  EXPECT_GE(seven.memory.peak, six.memory.peak);
  EXPECT_LT(six.memory.peak, eight.memory.peak);
}

// A mixture of experts whose first layers are dense (DeepSeek-V3's 3 of 61; refused before):
// 4 layers on 2 stages, the first 2 dense with a narrow MLP. Stage 0 then runs only cheap dense
// layers, so the step is faster than with every layer an expert layer; the busiest stage (the
// experts' and the head's, whose figures the report gives) computes as much as in the uniform
// model, and waits less for a light first stage: a smaller bubble.
TEST(PipelineStepTest, LeadingDenseLayersMakeALighterFirstStage) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  TransformerConfig moe = Moe(1024);
  moe.layers = 4;
  TransformerConfig leading = moe;
  leading.dense_layers = 2;
  StepPlan plan = Plan(PipelineSchedule::kOneFOneB);
  const TrainStepReport uniform = SimulateTrainStep(machine, moe, Train(4), plan);
  const TrainStepReport mixed = SimulateTrainStep(machine, leading, Train(4), plan);
  EXPECT_EQ(mixed.pipeline_layers, (std::vector<int64_t>{2, 2}));
  EXPECT_LT(mixed.step_time, uniform.step_time);
  EXPECT_LT(mixed.bubble, uniform.bubble);
  EXPECT_EQ(mixed.compute, uniform.compute);
  EXPECT_EQ(mixed.simulated_dense_first, std::vector<int64_t>{3});
  EXPECT_TRUE(uniform.simulated_dense_first.empty());
}

// Each stage holds its own: the first its layers and the embedding table, the last its layers
// and the head, the others their layers alone (every stage used to count the whole step's
// embedding and head). 8 layers of 1049088 parameters (attention 4 x 256 x 256, two norms,
// SwiGLU 3 x 256 x 1024) on 4 stages, replicated over data, in f32; the tables 512 x 256.
TEST(PipelineStepTest, OnlyTheFirstAndLastStagesHoldTheTables) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan;
  plan.mesh = {{"data", 2}, {"stage", 4}};
  plan.rules = {{"batch", {"data"}}, {"layers", {"stage"}}};
  plan.pipeline = PipelinePlan{"stage", PipelineSchedule::kGpipe, 1};
  const TrainStepReport r = SimulateTrainStep(machine, Model(), Train(4), plan);
  ASSERT_EQ(r.pipeline_peaks.size(), 4u);
  // GPipe holds every microbatch in flight on every stage: the middle stages are alike.
  EXPECT_EQ(r.pipeline_peaks[1], r.pipeline_peaks[2]);
  // The embedding's parameters, gradient, Adam's two moments and its update's temporary.
  const Bytes table(512 * 256 * 4);
  EXPECT_EQ(r.pipeline_peaks[0] - r.pipeline_peaks[1], table * 5);
  // The last holds the head and its logits; the first, with the table's gradient and moments
  // on top of its layers', is the fullest here, and its state is the report's.
  EXPECT_GT(r.pipeline_peaks[3], r.pipeline_peaks[1]);
  EXPECT_EQ(r.memory.peak, r.pipeline_peaks[0]);
  EXPECT_EQ(r.memory.params, Bytes(2 * 1049088 * 4) + table);
}

// Gradients accumulate over the microbatches and are summed once a step: with the batch split
// over the expert axis too, the gradients of the weights it replicates (attention, norms, the
// router, the head) are partial sums over expert, psummed in the step that updates, not after
// every microbatch's backward (they were: 508.6 GiB a step on the DeepSeek-V3 example, 4.2 GiB
// now). Only the loss's psum (one f32) repeats per microbatch. (At 8 microbatches, one
// sequence per device, the partitioner builds the embedding table's gradient from its
// cotangent and the token ids gathered over expert instead of summing the table's 512 KiB
// gradient, small gathers over an axis on both torus dimensions being torus_2d's: it prices
// one microbatch's program alone; see the README's known limits.)
TEST(PipelineStepTest, GradientsReplicatedOverAStageAxisAreSummedOnceAStep) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const TransformerConfig moe = Moe(512);
  StepPlan plan;
  plan.mesh = {{"stage", 2}, {"expert", 4}};
  plan.rules = {{"batch", {"expert"}}, {"expert", {"expert"}}, {"layers", {"stage"}}};
  plan.pipeline = PipelinePlan{"stage", PipelineSchedule::kOneFOneB, 1};
  const TrainStepReport m2 = SimulateTrainStep(machine, moe, Train(2), plan);
  const TrainStepReport m4 = SimulateTrainStep(machine, moe, Train(4), plan);
  const Bytes once = m2.bytes_by_collective.at("psum over expert");
  EXPECT_EQ(m4.bytes_by_collective.at("psum over expert") - once, Bytes(2 * 4));
  // Gradients only (optimizer none): the step still sums them once (it did not at all).
  TrainConfig none = Train(2);
  none.optimizer = Optimizer::kNone;
  EXPECT_EQ(SimulateTrainStep(machine, moe, none, plan).bytes_by_collective.at("psum over expert"),
            once);
  // What is summed once is the stage's gradients but the experts' (split over expert): more
  // than a layer's attention weights in f32, less than all the stage's gradients.
  EXPECT_GT(once, Bytes(4 * 256 * 256 * 4));
  EXPECT_LT(once, m2.memory.grads);
}

// A mixture of experts whose layers are all dense is a dense model: the same step as with no
// experts (it used to be simulated as expert layers, and refused offloading a dense MLP's
// values or an expert count the axes do not divide).
TEST(PipelineStepTest, AllDenseLayersPipelineAsADenseModel) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  TransformerConfig dense = Model();
  dense.layers = 4;
  TransformerConfig all = dense;
  all.experts = 3;
  all.top_k = 2;
  all.expert_d_ff = 512;
  all.dense_layers = 4;
  StepPlan plan = Plan(PipelineSchedule::kOneFOneB);
  plan.offload = {"mlpwi_0"};
  const TrainStepReport a = SimulateTrainStep(machine, dense, Train(4), plan);
  const TrainStepReport b = SimulateTrainStep(machine, all, Train(4), plan);
  EXPECT_EQ(a.step_time, b.step_time);
  EXPECT_EQ(a.memory.peak, b.memory.peak);
  EXPECT_TRUE(b.simulated_dense_first.empty());
}

// The plan's algorithms reach the pipeline's own collectives (the sends between stages and the
// gradients' all-reduce over the data axes), as lowering gives them to a program's: one that
// cannot run a ppermute is the plan's error, not ignored.
TEST(PipelineStepTest, PlanAlgorithmsRunTheStagesSends) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan = Plan(PipelineSchedule::kOneFOneB);
  plan.algorithms = {{"ppermute", "nvls"}};
  try {
    SimulateTrainStep(machine, Model(), Train(4), plan);
    ADD_FAILURE() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "plan.algorithms");
    EXPECT_NE(std::string(e.what()).find("ppermute between pipeline stages"), std::string::npos)
        << e.what();
  }
  plan.algorithms = {{"ppermute", "direct"}};
  EXPECT_EQ(SimulateTrainStep(machine, Model(), Train(4), plan).step_time,
            SimulateTrainStep(machine, Model(), Train(4), Plan(PipelineSchedule::kOneFOneB))
                .step_time);  // auto runs a permute directly.
}

// Host offload in a pipeline (refused before): each stage's step copies the named values of
// every layer to host memory after its forward and back before its backward, so the HBM peak
// falls and host memory holds them; a schedule holding more microbatches in flight holds more
// there (GPipe: all 8 forwards before any backward; 1F1B: at most 2 on 2 stages), and the
// copies take host-link time every microbatch.
TEST(PipelineStepTest, OffloadMovesActivationsOfEveryChunkInFlightToTheHost) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan plan = Plan(PipelineSchedule::kOneFOneB);
  const TrainStepReport kept = SimulateTrainStep(machine, Model(), Train(8), plan);
  plan.offload = {"decoder_layer_input", "query_proj", "key_proj", "value_proj"};
  const TrainStepReport one = SimulateTrainStep(machine, Model(), Train(8), plan);
  StepPlan gpipe_plan = Plan(PipelineSchedule::kGpipe);
  gpipe_plan.offload = plan.offload;
  const TrainStepReport gpipe = SimulateTrainStep(machine, Model(), Train(8), gpipe_plan);
  EXPECT_EQ(kept.memory.host, Bytes(0));
  EXPECT_LT(one.memory.peak, kept.memory.peak);
  EXPECT_GT(one.memory.host, Bytes(0));
  EXPECT_GT(gpipe.memory.host, one.memory.host);
  EXPECT_GT(one.host_transfer, Time());
}

}  // namespace
}  // namespace shardsim::planner
namespace shardsim::planner {
namespace {

// A stage step composes, as an unpipelined one does, from the first pair of layer counts where
// it has settled (TrainStepOptions::settle): with FSDP inside the stages (stage 2 x fsdp 4, 16
// layers, each layer's weights gathered a layer ahead and its gradients reduce-scattered while
// the next layer computes) the peaks of the runs of 2, 3 and 4 layers have not (by 3 KB of 138
// MB), and the step composes from a later pair; its time has (no collective exposed), so the
// step time is screening's to the picosecond (before gradient reduce-scatters overlapped, the
// settled time was 0.7% shorter); with tensor parallelism inside them (no prefetch to settle)
// from 2 and 3, to the picosecond what the screening composition gives. Without settle (a
// search's screening) every pipeline composes from 2 and 3.
TEST(PipelineStepTest, StageStepsComposeFromWhereTheyHaveSettled) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  TransformerConfig m = Model();
  m.layers = 16;
  StepPlan fsdp;
  fsdp.mesh = {{"stage", 2}, {"fsdp", 4}};
  fsdp.rules = {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}, {"layers", {"stage"}}};
  fsdp.pipeline = PipelinePlan{"stage", PipelineSchedule::kOneFOneB, 1};
  TrainStepOptions screening;
  screening.settle = false;
  const TrainStepReport fast = SimulateTrainStep(machine, m, Train(4), fsdp, screening);
  const TrainStepReport settled = SimulateTrainStep(machine, m, Train(4), fsdp);
  EXPECT_EQ(fast.simulated_layers, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(settled.simulated_layers.size(), 2u);
  EXPECT_GT(settled.simulated_layers[0], 2);
  EXPECT_EQ(settled.simulated_layers[1], settled.simulated_layers[0] + 1);
  EXPECT_NE(settled.memory.peak, fast.memory.peak);
  EXPECT_NEAR(static_cast<double>(settled.memory.peak.count()),
              static_cast<double>(fast.memory.peak.count()),
              0.01 * static_cast<double>(settled.memory.peak.count()));
  EXPECT_EQ(settled.step_time, fast.step_time);
  EXPECT_EQ(settled.exposed_comm, Time());
  const StepPlan tensor = Plan(PipelineSchedule::kOneFOneB);
  const TrainStepReport a = SimulateTrainStep(machine, m, Train(4), tensor, screening);
  const TrainStepReport b = SimulateTrainStep(machine, m, Train(4), tensor);
  EXPECT_EQ(b.simulated_layers, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.step_time, a.step_time);
  EXPECT_EQ(b.memory.peak, a.memory.peak);
}

// The schedules a pipelined step tries to stay within its memory limit (prefetching weight
// gathers inside the stages, then not, then program order) share each stage step's built and
// partitioned program: the schedule a limit leaves is, to the picosecond and the byte, the step
// asked for with that schedule alone (fresh builds).
TEST(PipelineStepTest, SchedulesTriedWithinMemoryEqualThoseAskedFor) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepPlan fsdp;
  fsdp.mesh = {{"stage", 2}, {"fsdp", 4}};
  fsdp.rules = {{"batch", {"fsdp"}}, {"embed", {"fsdp"}}, {"layers", {"stage"}}};
  fsdp.pipeline = PipelinePlan{"stage", PipelineSchedule::kOneFOneB, 1};
  auto with = [&](StepOverlap overlap, bool within, double limit) {
    TrainStepOptions o;
    o.overlap = overlap;
    o.within_memory = within;
    o.memory_limit = limit;
    return SimulateTrainStep(machine, Model(), Train(4), fsdp, o);
  };
  const TrainStepReport full = with(StepOverlap::kFull, false, 1);
  const TrainStepReport unprefetched = with(StepOverlap::kNoPrefetch, false, 1);
  const TrainStepReport ordered = with(StepOverlap::kNone, false, 1);
  const Bytes least = std::min(unprefetched.memory.peak, ordered.memory.peak);
  ASSERT_GT(full.memory.peak, least);
  const double limit =
      (static_cast<double>(full.memory.peak.count()) + static_cast<double>(least.count())) / 2 /
      static_cast<double>(full.memory.capacity.count());
  const TrainStepReport kept = with(StepOverlap::kFull, true, limit);
  const TrainStepReport& want =
      unprefetched.memory.peak < full.memory.peak &&
              static_cast<double>(unprefetched.memory.peak.count()) <=
                  limit * static_cast<double>(full.memory.capacity.count())
          ? unprefetched
          : ordered;
  EXPECT_EQ(kept.overlap, &want == &unprefetched ? StepOverlap::kNoPrefetch : StepOverlap::kNone);
  EXPECT_EQ(kept.step_time, want.step_time);
  EXPECT_EQ(kept.memory.peak, want.memory.peak);
  EXPECT_EQ(kept.exposed_comm, want.exposed_comm);
  EXPECT_EQ(kept.bubble, want.bubble);
  EXPECT_EQ(kept.overlapped_peak, full.memory.peak);
}

}  // namespace
}  // namespace shardsim::planner
