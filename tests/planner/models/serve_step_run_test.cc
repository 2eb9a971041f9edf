// Simulated serving: the KV cache's bytes by hand, the report's definitions, the decode step
// against the HBM roofline, composition against the whole steps, and the steps' numerics.
#include "planner/models/serve_step_run.h"

#include <gtest/gtest.h>

#include <utility>

#include "planner/models/model_presets.h"
#include "tests/planner/models/small_model.h"
#include "tests/planner/partition_test_support.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

TransformerConfig Small() { return test::SmallTransformer(6); }

StepPlan TensorParallel() {
  StepPlan plan;
  plan.mesh = {{"data", 4}, {"tensor", 2}};
  plan.rules = {{"batch", {"data"}},
                {"heads", {"tensor"}},
                {"kv_heads", {"tensor"}},
                {"mlp", {"tensor"}},
                {"vocab", {"tensor"}}};
  return plan;
}

ServeConfig Workload() {
  ServeConfig s;
  s.batch = 16;
  s.prompt_len = 512;
  s.decode_len = 128;
  return s;
}

// Per device: keys and values of 6 layers for 16 / 4 sequences of 512 + 128 positions, 2 / 2
// kv heads of 32, bf16: 2 * 6 * 4 * 640 * 1 * 32 * 2 B = 1,966,080 B. The report's figures
// follow their definitions: the mean context prompt + decode / 2, the generation TTFT +
// (decode - 1) TPOT, output tokens batch x decode over it.
TEST(ServeRunTest, CacheBytesAndDefinitions) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const ServeReport r = SimulateServe(machine, Small(), Workload(), TensorParallel());
  EXPECT_EQ(r.memory.kv_cache.count(), 2 * 6 * 4 * 640 * 1 * 32 * 2);
  EXPECT_EQ(r.mean_context, 512 + 64);
  EXPECT_EQ(r.total, r.ttft + r.tpot * 127);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 16 * 128 / r.total.seconds());
  EXPECT_GT(r.ttft, r.tpot);
  EXPECT_GE(r.memory.peak, r.memory.params + r.memory.kv_cache);
  EXPECT_TRUE(r.memory.fits);
}

// A decode step reads every weight and the whole cache from HBM once at least: its compute
// is no shorter than those bytes over the HBM bandwidth (v5e: 8.2e11 B/s, hardware.md).
TEST(ServeRunTest, DecodeIsBoundByHbm) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  ServeConfig s = Workload();
  const ServeReport r = SimulateServe(machine, Small(), s, TensorParallel());
  // The cache read at the mean context: 576 of 640 positions.
  const double bytes = static_cast<double>(r.memory.params.count()) +
                       static_cast<double>(r.memory.kv_cache.count()) * 576 / 640;
  EXPECT_GE(r.decode_compute.seconds(), bytes / 8.2e11);
}

// Composed from 2 and 3 layers (screening, TrainStepOptions::settle off) and from where the
// steps settle, TTFT and TPOT are the whole steps' within 1%.
TEST(ServeRunTest, ComposedMatchesTheWholeSteps) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  TrainStepOptions whole;
  whole.compose = false;
  const ServeReport full = SimulateServe(machine, Small(), Workload(), TensorParallel(), whole);
  ASSERT_EQ(full.simulated_layers, std::vector<int64_t>{6});
  TrainStepOptions screening;
  screening.settle = false;
  for (const TrainStepOptions& options : {screening, TrainStepOptions{}}) {
    const ServeReport composed =
        SimulateServe(machine, Small(), Workload(), TensorParallel(), options);
    if (!options.settle) {
      ASSERT_EQ(composed.simulated_layers, (std::vector<int64_t>{2, 3}));
    }
    EXPECT_NEAR(composed.ttft.seconds(), full.ttft.seconds(), 0.01 * full.ttft.seconds());
    EXPECT_NEAR(composed.tpot.seconds(), full.tpot.seconds(), 0.01 * full.tpot.seconds());
    EXPECT_EQ(composed.memory.kv_cache, full.memory.kv_cache);
  }
}

// FP8 serving (matmul_dtype and kv_dtype f8e4m3): the cache takes 1 B an element, half the
// bf16 cache exactly; of the weights, the linear layers' take 1 B: per layer wq 256x8x32, wk
// and wv 256x2x32, wo 8x32x256, gate and up 256x512, down 512x256, 557,056 elements, 6 layers,
// half per device over tensor 2: 1,671,168 bytes fewer than in bf16, the rest (embedding,
// unembedding, norms) unchanged. The decode step, bound by those bytes, is shorter.
TEST(ServeRunTest, Fp8StoresLinearWeightsAndTheCacheInOneByte) {
  Machine machine(BuildPreset("h100-dgx"));
  StepPlan plan = TensorParallel();
  plan.mesh = {{"data", 4}, {"tensor", 2}};
  ServeConfig fp8 = Workload();
  fp8.kv_dtype = fp8.matmul_dtype = DType::kF8E4M3;
  const ServeReport wide = SimulateServe(machine, Small(), Workload(), plan);
  const ServeReport narrow = SimulateServe(machine, Small(), fp8, plan);
  EXPECT_EQ(narrow.memory.kv_cache.count() * 2, wide.memory.kv_cache.count());
  EXPECT_EQ(wide.memory.params.count() - narrow.memory.params.count(), 1671168);
  EXPECT_LT(narrow.tpot, wide.tpot);
  // The prefill returns every layer's keys and values converted to the cache's type, in the
  // kernels that make them (fused: no time of their own).
  const LogicalRules rules(plan.rules, plan.mesh);
  int converted = 0;
  for (const OpSpec& op : BuildServeStep(Small(), fp8, ServeStep::kPrefill, plan.mesh, rules).ops) {
    converted += op.kind == OpKind::kConvert && op.dtype == "f8e4m3" && op.fused &&
                 op.out[0].find("_cache") != std::string::npos;
  }
  EXPECT_EQ(converted, 2 * 6);
}

// A 2-layer d 64 model (8 heads of 8, MLP `d_ff`, vocabulary 128) serving `batch` sequences
// of 16 prompt tokens, 4 decoded: f32 compute, the cache and the linear layers' GEMMs in
// `narrow`.
std::pair<TransformerConfig, ServeConfig> TinyServing(int64_t d_ff, int64_t batch, DType narrow) {
  TransformerConfig m = Small();
  m.layers = 2;
  m.d_model = 64;
  m.head_dim = 8;
  m.d_ff = d_ff;
  m.vocab = 128;
  ServeConfig s;
  s.batch = batch;
  s.prompt_len = 16;
  s.decode_len = 4;
  s.context = 16;
  s.dtype = DType::kF32;
  s.kv_dtype = s.matmul_dtype = narrow;
  return {m, s};
}

// Prefill and decode of TinyServing's model on 8 sequences, partitioned with data x tensor
// parallelism (grouped kv heads over tensor), compute what the unsharded steps compute.
void ExpectServeStepsMatch(DType narrow) {
  const auto [m, s] = TinyServing(128, 8, narrow);
  const StepPlan plan = TensorParallel();
  const LogicalRules rules(plan.rules, plan.mesh);
  ExpectNumericsPass(BuildServeStep(m, s, ServeStep::kPrefill, plan.mesh, rules));
  ExpectNumericsPass(BuildServeStep(m, s, ServeStep::kDecode, plan.mesh, rules));
}

// An FP8 step computes what the unsharded FP8 step computes (activations quantized to f8e4m3
// before each linear layer, products accumulated into f32).
TEST(ServeRunTest, Fp8StepsMatchTheUnshardedOnes) { ExpectServeStepsMatch(DType::kF8E4M3); }

TEST(ServeRunTest, StepsMatchTheUnshardedOnes) { ExpectServeStepsMatch(DType::kF32); }

// A dropless mixture of experts (TinyServing's model, 8 experts) decoding 2 sequences on expert
// parallelism 4: the 2 tokens of a decode step cannot split over the 4 members (its region
// refused them before), so each member holds both and runs its experts over the copies routed
// to them, the partial outputs psummed over expert (DroplessMoeLayout::tokens_replicated); the
// prefill's 2 x 16 tokens split over it by sequence position and dispatch. Both steps partition to
// what the unsharded ones compute, to 2e-3 on the O(1) f32 outputs (as the MoE training steps: the
// products summed in another order; the unsharded steps run the region on the mesh too, whose
// replicated path DroplessMoeTest.ReplicatedTokensComputeWhatDispatchComputes checks against the
// dispatch), and the whole serving run simulates.
// Returns the decode step's lowered program.
ProgramSpec ExpectDroplessServeStepsMatch(const StepPlan& plan) {
  auto [m, s] = TinyServing(64, 2, DType::kF32);
  m.experts = 8;
  m.expert_d_ff = 32;
  m.capacity_factor = -1;
  const LogicalRules rules(plan.rules, plan.mesh);
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const Mesh mesh = PlaceMesh(machine, plan.mesh);
  ProgramSpec decode;
  for (ServeStep step : {ServeStep::kPrefill, ServeStep::kDecode}) {
    const ProgramSpec global = BuildServeStep(m, s, step, plan.mesh, rules);
    const PartitionResult lowered = PartitionOnMachine(global, machine, mesh);
    RunConfig config;
    config.numerics = true;
    RunResult r = RunProgram(machine, mesh, lowered.program, config);
    const NumericsReport report =
        CheckPartitionedNumerics(r.outputs, mesh, global, lowered.program, "", &r.inputs);
    EXPECT_TRUE(report.passed) << report.worst_output;
    EXPECT_LT(report.max_abs_error, 2e-3) << report.worst_output;
    if (step == ServeStep::kDecode) decode = lowered.program;
  }
  const ServeReport r = SimulateServe(machine, m, s, plan);
  EXPECT_GT(r.tpot, Time());
  return decode;
}

TEST(ServeRunTest, DroplessExpertsDecodeABatchTooSmallToSplit) {
  StepPlan plan;
  plan.mesh = {{"expert", 4}, {"tensor", 2}};
  plan.rules = {{"expert", {"expert"}}, {"heads", {"tensor"}}, {"kv_heads", {"tensor"}}};
  ExpectDroplessServeStepsMatch(plan);
}

// The experts over data x expert with the batch over data: a decode step's 2 tokens split over
// data (one a device) but not over expert, refused before; each device dispatches over data the
// copies bound for the experts of its expert coordinate, and the outputs are psummed over
// expert (DroplessMoeLayout). The steps compute what the unsharded ones do, as above.
TEST(ServeRunTest, DroplessExpertsDecodeABatchThatSplitsOverSomeExpertAxes) {
  StepPlan plan;
  plan.mesh = {{"data", 2}, {"expert", 2}, {"tensor", 2}};
  plan.rules = {{"batch", {"data"}},
                {"expert", {"data", "expert"}},
                {"heads", {"tensor"}},
                {"kv_heads", {"tensor"}}};
  const ProgramSpec decode = ExpectDroplessServeStepsMatch(plan);
  int ragged = 0;
  for (const OpSpec& op : decode.ops) {
    if (op.kind != OpKind::kRaggedAllToAll) continue;
    ++ragged;
    EXPECT_EQ(op.axis_name, std::vector<std::string>{"data"});
  }
  EXPECT_EQ(ragged, 2 * 2);  // There and back, in each of the 2 layers.
}

}  // namespace
}  // namespace shardsim::planner
