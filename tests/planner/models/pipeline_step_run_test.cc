// Pipelined training steps: the schedule's bubble shrinks with microbatches and with
// interleaving, GPipe holds more activations than 1F1B, each stage holds its share of the
// parameters, and plans that do not fit together are located errors.
#include "planner/models/pipeline_step_run.h"

#include <gtest/gtest.h>

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
  EXPECT_GT(gpipe.memory.peak, one.memory.peak);
  EXPECT_EQ(gpipe.memory.params, one.memory.params);
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
  EXPECT_LT(staged.memory.params, replicated.memory.params);
  EXPECT_GT(staged.memory.params * 2, replicated.memory.params);  // The head stays whole.
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
  TransformerConfig odd = Model();
  odd.layers = 7;
  try {
    SimulateTrainStep(machine, odd, Train(4), Plan(PipelineSchedule::kOneFOneB));
    ADD_FAILURE() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "plan.pipeline");
  }
}

}  // namespace
}  // namespace shardsim::planner
