// Model runs (SPEC "Models, training and serving steps"): a `model:` run file prints the step
// report and its JSON; with --numerics on the whole step runs on real data and matches the
// unsharded step; the composed timing-only run agrees with the whole step; bad or unbuilt
// plans are located errors; every configs/models example runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class ModelRunTest : public CliFixture {
 protected:
  // A tiny model under FSDP 4 x TP 2 with two microbatches; `extra` appended to the file.
  std::string Tiny(const std::string& extra = "") const {
    return WriteInput("tiny.yaml",
                      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
                      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8,\n"
                      "        kv_heads: 2, vocab: 128}\n"
                      "train: {global_batch: 16, seq_len: 16, microbatches: 2, optimizer: adam,\n"
                      "        dtype: f32, param_dtype: f32}\n"
                      "plan:\n"
                      "  mesh: {fsdp: 4, tensor: 2}\n"
                      "  rules: {batch: fsdp, embed: fsdp, heads: tensor, kv_heads: tensor,\n"
                      "          mlp: tensor, vocab: tensor}\n" +
                          extra);
  }

  // An 8-layer model pipelined over stage 4 x tensor 2 with `microbatches`; `plan` appended to
  // the plan (its remat and pipeline lines).
  std::string Pipelined(int microbatches, const std::string& plan) const {
    return WriteInput(
        "pipe.yaml",
        "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
        "model: {kind: transformer, layers: 8, d_model: 256, d_ff: 1024, heads: 8, kv_heads: 8,\n"
        "        head_dim: 32, vocab: 512}\n"
        "train: {global_batch: 32, seq_len: 256, microbatches: " +
            std::to_string(microbatches) +
            ", optimizer: adam, dtype: bf16,\n"
            "        param_dtype: f32}\n"
            "plan:\n"
            "  mesh: {stage: 4, tensor: 2}\n"
            "  rules: {heads: tensor, kv_heads: tensor, mlp: tensor, vocab: tensor, layers: "
            "stage}\n" +
            plan);
  }

  nlohmann::json RunJson(const std::vector<std::string>& args) {
    std::vector<std::string> all = args;
    const std::string json = (out() / "s.json").string();
    all.insert(all.end(), {"--json", json});
    RunOk(all);
    return nlohmann::json::parse(ReadFile(json));
  }
};

TEST_F(ModelRunTest, ReportsTheStepAndItsJson) {
  const std::string file = Tiny();
  const Result r = RunOk({"run", file});
  for (const char* line : {"simulated time:", "tokens/s:", "MFU:", "memory/device:", "fits"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const nlohmann::json j = RunJson({"run", file});
  for (const char* key : {"step_time_s", "tokens_per_s", "tokens_per_s_per_device", "mfu",
                          "compute_s", "exposed_comm_s", "bubble_s", "recompute_s", "fits"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  // Composed from two consecutive layer counts where the step has settled (ComposeShortSteps).
  ASSERT_EQ(j["simulated_layers"].size(), 2u);
  EXPECT_EQ(j["simulated_layers"][1].get<int>(), j["simulated_layers"][0].get<int>() + 1);
  EXPECT_GE(j["simulated_layers"][0].get<int>(), 2);
  // --whole-step simulates every layer: the same step here within 1% (composition's test).
  const nlohmann::json whole = RunJson({"run", file, "--whole-step"});
  EXPECT_EQ(whole["simulated_layers"].size(), 1u);
  EXPECT_NEAR(whole["step_time_s"].get<double>(), j["step_time_s"].get<double>(),
              0.01 * whole["step_time_s"].get<double>());
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 16 * 16 / j["step_time_s"].get<double>());
  const nlohmann::json& m = j["step_memory"];
  EXPECT_EQ(m["grads"], m["params"]);
  EXPECT_EQ(m["optimizer"].get<int64_t>(), 2 * m["params"].get<int64_t>());
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_EQ(j["schedule"], "prefetch");
  EXPECT_FALSE(j.contains("prefetching_peak"));
}

// GPT-3 175B with FSDP 256 on 256 v6e (a validation case) peaks over the 29.8 GiB of HBM when
// each layer's weight gathers are prefetched and within it when they are not: the step runs
// without prefetching them, fits, and says so in the text and the JSON.
TEST_F(ModelRunTest, ScheduleKeepsWithinHbm) {
  const std::string file =
      SourceDir() + "/configs/validation/tpu_recipes_v6e_gpt3_175b_256chips.yaml";
  const Result r = RunOk({"run", file});
  EXPECT_NE(r.out.find("schedule:       no_prefetch: each weight's collective issued where its "
                       "layer reads it (prefetching them a layer ahead peaks at 30.72 GiB"),
            std::string::npos)
      << r.out;
  const nlohmann::json j = RunJson({"run", file});
  EXPECT_EQ(j["schedule"], "no_prefetch");
  EXPECT_TRUE(j["fits"].get<bool>());
  const int64_t capacity = j["step_memory"]["capacity"].get<int64_t>();
  EXPECT_LE(j["step_memory"]["peak"].get<int64_t>(), capacity);
  EXPECT_GT(j["prefetching_peak"].get<int64_t>(), capacity);
}

// A mixture-of-experts model (4 experts, top 2, capacity factor 1) runs with expert
// parallelism over the mesh's fsdp axis; with numerics on it passes and reports the share of
// expert assignments its routing dropped, and the exposed communication names the all-to-alls.
TEST_F(ModelRunTest, MixtureOfExpertsRunsAndReportsItsDroppedShare) {
  const std::string file = Tiny();
  const std::vector<std::string> moe = {
      "--set", "model.experts=4",         "--set", "model.expert_d_ff=32",
      "--set", "model.capacity_factor=1", "--set", "plan.rules.expert=fsdp"};
  std::vector<std::string> args = {"run", file, "--numerics", "on"};
  args.insert(args.end(), moe.begin(), moe.end());
  const Result r = RunOk(args);
  EXPECT_NE(r.out.find("numerics:       passed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MoE routing dropped "), std::string::npos) << r.out;
  args = {"run", file};
  args.insert(args.end(), moe.begin(), moe.end());
  EXPECT_NE(RunOk(args).out.find("all_to_all over fsdp"), std::string::npos);
}

// Dropless routing (capacity_factor -1) runs the ragged dispatch with real data and passes;
// the run says nothing was dropped, and the exposed communication names the ragged
// all-to-alls.
TEST_F(ModelRunTest, DroplessMixtureOfExpertsRunsWithRealData) {
  const std::string file = Tiny();
  const std::vector<std::string> moe = {
      "--set", "model.experts=4",          "--set", "model.expert_d_ff=32",
      "--set", "model.capacity_factor=-1", "--set", "plan.rules.expert=fsdp"};
  std::vector<std::string> args = {"run", file, "--numerics", "on"};
  args.insert(args.end(), moe.begin(), moe.end());
  const Result r = RunOk(args);
  EXPECT_NE(r.out.find("numerics:       passed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MoE routing is dropless"), std::string::npos) << r.out;
  args = {"run", file};
  args.insert(args.end(), moe.begin(), moe.end());
  EXPECT_NE(RunOk(args).out.find("ragged_all_to_all over fsdp"), std::string::npos);
  // Bounded receive buffers (ragged_buffer_factor 1.25: 1.25 times the rows a device routes,
  // where the worst case holds all 4 members' rows) pass too, and hold less at the peak.
  args = {"run", file, "--numerics", "on", "--set", "model.ragged_buffer_factor=1.25"};
  args.insert(args.end(), moe.begin(), moe.end());
  const std::string bounded = RunOk(args).out;
  EXPECT_NE(bounded.find("numerics:       passed"), std::string::npos) << bounded;
  EXPECT_NE(bounded.find("MoE routing dropped "), std::string::npos) << bounded;
  std::vector<std::string> timing = {"run", file};
  timing.insert(timing.end(), moe.begin(), moe.end());
  const int64_t worst = RunJson(timing)["step_memory"]["peak"].get<int64_t>();
  timing.insert(timing.end(), {"--set", "model.ragged_buffer_factor=1.25"});
  EXPECT_LT(RunJson(timing)["step_memory"]["peak"].get<int64_t>(), worst);
}

// --numerics on runs the whole step with real data (microbatches, Adam, FSDP x TP) and checks
// it against the unsharded step; its step time is the composed run's within 1%.
TEST_F(ModelRunTest, NumericsOnRunsTheWholeStepAndPasses) {
  const std::string file = Tiny();
  const nlohmann::json whole = RunJson({"run", file, "--numerics", "on"});
  EXPECT_TRUE(whole["numerics"]["checked"].get<bool>());
  EXPECT_TRUE(whole["numerics"]["passed"].get<bool>());
  EXPECT_EQ(whole["simulated_layers"], nlohmann::json::array({4}));
  const nlohmann::json composed = RunJson({"run", file});
  EXPECT_NEAR(composed["step_time_s"].get<double>(), whole["step_time_s"].get<double>(),
              0.01 * whole["step_time_s"].get<double>());
}

// A step whose batch holds more tokens than the vocabulary has classes (16 x 16 against 128)
// takes its synthetic ids and labels modulo the vocabulary: with plain arange half were out of
// range, the embedding's take gave NaN rows and the loss NaN, and the check passed on NaN
// matching NaN. Now no output of the reference is NaN, and the report says how many are.
TEST_F(ModelRunTest, SyntheticTokensStayInsideTheVocabulary) {
  const nlohmann::json whole = RunJson({"run", Tiny(), "--numerics", "on", "--set",
                                        "train.microbatches=1", "--set", "train.optimizer=none"});
  EXPECT_TRUE(whole["numerics"]["passed"].get<bool>()) << whole["numerics"];
  EXPECT_EQ(whole["numerics"]["nonfinite_outputs"].get<int>(), 0) << whole["numerics"];
}

// Remat changes what is kept, not what is computed: with selective and full recompute the
// whole step still matches the unsharded one, its recompute time is reported (more for full),
// and the composed run agrees with it within 1%.
TEST_F(ModelRunTest, RematRecomputesAndStillPasses) {
  const std::string file = Tiny();
  double selective_recompute = 0;
  for (const char* remat : {"selective", "full"}) {
    SCOPED_TRACE(remat);
    const std::string set = std::string("plan.remat=") + remat;
    const nlohmann::json whole = RunJson({"run", file, "--numerics", "on", "--set", set});
    EXPECT_TRUE(whole["numerics"]["passed"].get<bool>());
    EXPECT_EQ(whole["remat"], remat);
    const double recompute = whole["recompute_s"].get<double>();
    EXPECT_GT(recompute, 0);
    EXPECT_LT(recompute, whole["compute_s"].get<double>());
    const nlohmann::json composed = RunJson({"run", file, "--set", set});
    EXPECT_NEAR(composed["step_time_s"].get<double>(), whole["step_time_s"].get<double>(),
                0.01 * whole["step_time_s"].get<double>());
    EXPECT_NEAR(composed["recompute_s"].get<double>(), recompute, 0.01 * recompute);
    if (selective_recompute == 0) {
      selective_recompute = recompute;
    } else {
      EXPECT_GT(recompute, selective_recompute);
    }
  }
}

// A custom remat (torchtitan's op-level selective AC: every other projection and the attention
// output saved) recomputes the rest and the whole step still matches the unsharded one; the
// text and JSON reports name the policy and what it saves.
TEST_F(ModelRunTest, CustomRematSavesWhatItNames) {
  const std::string set = "plan.remat={save: [query_proj, value_proj, context, mlpwi_0, mlpwo]}";
  const nlohmann::json whole = RunJson({"run", Tiny(), "--numerics", "on", "--set", set});
  EXPECT_TRUE(whole["numerics"]["passed"].get<bool>()) << whole["numerics"];
  EXPECT_EQ(whole["remat"], "custom");
  EXPECT_EQ(
      whole["remat_save"],
      nlohmann::json::parse(R"(["query_proj", "value_proj", "context", "mlpwi_0", "mlpwo"])"));
  EXPECT_GT(whole["recompute_s"].get<double>(), 0);
  const Result r = RunOk({"run", Tiny(), "--set", set});
  EXPECT_NE(r.out.find("(remat: custom (save query_proj, value_proj, context, mlpwi_0, mlpwo))"),
            std::string::npos)
      << r;
}

// Host offload (MaxText's remat_policy custom with "offload"): with full remat and the layers'
// inputs and query projections in host memory, the whole step still matches the unsharded one;
// the report gives the host memory held and the time copying, and the composed run agrees
// with the whole step within 1% (its host bytes exactly: whole buffers, per layer).
TEST_F(ModelRunTest, OffloadKeepsValuesInHostMemoryAndStillPasses) {
  const std::string file = Tiny();
  const std::vector<std::string> sets = {"--set", "plan.remat=full",
                                         "--set", "plan.offload=[decoder_layer_input, query_proj]",
                                         "--set", "train.optimizer=sgd"};
  std::vector<std::string> args = {"run", file, "--numerics", "on"};
  args.insert(args.end(), sets.begin(), sets.end());
  const nlohmann::json whole = RunJson(args);
  EXPECT_TRUE(whole["numerics"]["passed"].get<bool>()) << whole["numerics"];
  // The check's bounds are vacuous this deep in a backward pass (README): assert the error
  // itself. Summation order moves these O(1) f32 values by about 2e-6; a stale or wrong fetched
  // activation would move the gradients, and so the updated weights, by orders more.
  EXPECT_LT(whole["numerics"]["max_abs_error"].get<double>(), 1e-4) << whole["numerics"];
  // By hand: a microbatch of 8 sequences over fsdp 4 is 2 x 16 tokens per device; a layer's
  // input [2, 16, 64] f32 is 8192 B, its queries split over tensor 2 (4 of 8 heads of 8)
  // 4096 B; the second microbatch's forward starts after the first's backward fetched all of
  // its values back, so at most one microbatch's 4 layers are in host memory at once.
  EXPECT_EQ(whole["step_memory"]["host"].get<int64_t>(), 4 * (8192 + 4096));
  EXPECT_GT(whole["host_transfer_s"].get<double>(), 0);
  args = {"run", file};
  args.insert(args.end(), sets.begin(), sets.end());
  const nlohmann::json composed = RunJson(args);
  EXPECT_NEAR(composed["step_time_s"].get<double>(), whole["step_time_s"].get<double>(),
              0.01 * whole["step_time_s"].get<double>());
  EXPECT_EQ(composed["step_memory"]["host"], whole["step_memory"]["host"]);
  const Result text = RunOk(args);
  EXPECT_NE(text.out.find("host offload:"), std::string::npos) << text.out;
  // Without offload the report has no host line and the JSON no host figures.
  const nlohmann::json none = RunJson({"run", file, "--set", "plan.remat=full"});
  EXPECT_FALSE(none["step_memory"].contains("host"));
  EXPECT_FALSE(none.contains("host_transfer_s"));
}

// Offload under sequence parallelism with remat: the partitioner lays each copy back out as
// the recomputation wants it in device memory, never slicing the host copy (which made the
// run fail with "dynamic_slice: 'o2_mb0_host' is in host memory").
TEST_F(ModelRunTest, OffloadWithSequenceParallelismAndRematPasses) {
  const std::string file = Tiny();
  for (const char* remat : {"plan.remat=selective", "plan.remat=full"}) {
    SCOPED_TRACE(remat);
    const nlohmann::json j =
        RunJson({"run", file, "--numerics", "on", "--set", "plan.rules.length=tensor", "--set",
                 remat, "--set", "plan.offload=[out_proj, mlpwo, query_proj]"});
    EXPECT_TRUE(j["numerics"]["passed"].get<bool>()) << j["numerics"];
    EXPECT_GT(j["step_memory"]["host"].get<int64_t>(), 0);
  }
}

// A serve: run prints TTFT, TPOT and the KV cache, and gives SPEC's keys in --json: the cache
// by hand (2 x 4 layers x 8 / 4 sequences x (16 + 8) positions x 2 / 2 kv heads x 8 x 4 B).
TEST_F(ModelRunTest, ServeReportsTtftTpotAndTheCache) {
  const std::string file = WriteInput(
      "serve.yaml",
      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8, kv_heads: 2,\n"
      "        vocab: 128}\n"
      "serve: {batch: 8, prompt_len: 16, decode_len: 8, dtype: f32}\n"
      "plan:\n"
      "  mesh: {data: 4, tensor: 2}\n"
      "  rules: {batch: data, heads: tensor, kv_heads: tensor, mlp: tensor, vocab: tensor}\n");
  const Result r = RunOk({"run", file});
  for (const char* line : {"TTFT:", "TPOT:", "KV cache", "tokens/s:"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  const nlohmann::json j = RunJson({"run", file});
  EXPECT_EQ(j["kv_cache_bytes"].get<int64_t>(), 2 * 4 * 2 * 24 * 1 * 8 * 4);
  EXPECT_DOUBLE_EQ(j["generation_s"].get<double>(),
                   j["ttft_s"].get<double>() + 7 * j["tpot_s"].get<double>());
  EXPECT_TRUE(j["fits"].get<bool>());
  // Serving keeps no activations for a backward pass: nothing to offload.
  const Result offload = Run({"run", file, "--set", "plan.offload=[query_proj]"});
  EXPECT_EQ(offload.exit_code, 2) << offload;
  EXPECT_NE(offload.err.find("serving steps have none (key plan.offload)"), std::string::npos)
      << offload;
  // Nor anything to recompute: a remat policy, named or custom, is refused.
  for (const char* remat : {"plan.remat=full", "plan.remat={save: [context]}"}) {
    const Result refused = Run({"run", file, "--set", remat});
    EXPECT_EQ(refused.exit_code, 2) << refused;
    EXPECT_NE(refused.err.find("remat: applies to training steps, not to serve:"),
              std::string::npos)
        << refused;
    EXPECT_NE(refused.err.find("(key plan.remat)"), std::string::npos) << refused;
  }
  // --numerics on checks the prefill and a decode step (each partitioned, run with data and
  // compared with the unsharded step); the timing stays the composed one.
  const nlohmann::json checked = RunJson({"run", file, "--numerics", "on"});
  EXPECT_TRUE(checked["numerics"]["checked"].get<bool>()) << checked["numerics"];
  EXPECT_TRUE(checked["numerics"]["passed"].get<bool>()) << checked["numerics"];
  EXPECT_EQ(checked["tpot_s"], j["tpot_s"]);
  const Result on = RunOk({"run", file, "--numerics", "on"});
  EXPECT_NE(on.out.find("prefill passed"), std::string::npos) << on.out;
  EXPECT_NE(on.out.find("decode passed"), std::string::npos) << on.out;
  const Result traced = Run({"run", file, "--trace", (out() / "serve.json").string()});
  EXPECT_EQ(traced.exit_code, 2) << traced;
  EXPECT_NE(traced.err.find("--trace, --dump and --timing network run training steps"),
            std::string::npos)
      << traced;
}

// A kind: mlp model run: the step's report counts 6 FLOPs per weight per example
// (784-64-10: 50,816 weights, batch 64) and --numerics on passes (f32).
TEST_F(ModelRunTest, MlpModelRunsAndPasses) {
  const std::string file =
      WriteInput("mlp.yaml",
                 "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
                 "model: {kind: mlp, layer_sizes: [784, 64, 10], activation: relu}\n"
                 "train: {global_batch: 64, optimizer: adam, dtype: f32, param_dtype: f32}\n"
                 "plan:\n"
                 "  mesh: {fsdp: 4, tensor: 2}\n"
                 "  rules: {batch: fsdp, embed: fsdp, mlp: tensor}\n");
  const nlohmann::json j = RunJson({"run", file});
  EXPECT_DOUBLE_EQ(j["model_flops"].get<double>(), 6.0 * (784 * 64 + 64 * 10) * 64);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 64 / j["step_time_s"].get<double>());
  const nlohmann::json whole = RunJson({"run", file, "--numerics", "on"});
  EXPECT_TRUE(whole["numerics"]["passed"].get<bool>());
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"plan.remat=full", "plan.remat"},
           {"train.seq_len=16", "train.seq_len"},
           {"model.layer_sizes=[784]", "model.layer_sizes"}}) {
    const Result r = Run({"run", file, "--set", set});
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_NE(r.err.find("(key " + key + ")"), std::string::npos) << r;
  }
}

struct BadModel {
  std::string name;
  std::string set;      // A --set override.
  std::string key;      // The key the error names.
  std::string message;  // A fragment of the message.
};

class BadModelTest : public ModelRunTest, public testing::WithParamInterface<BadModel> {};

TEST_P(BadModelTest, IsALocatedError) {
  const BadModel& c = GetParam();
  const Result r = Run({"run", Tiny(), "--set", c.set});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("(key " + c.key + ")"), std::string::npos) << r;
  EXPECT_NE(r.err.find(c.message), std::string::npos) << r;
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadModelTest,
    testing::Values(
        BadModel{"UnknownPreset", "model=llama-5-8b", "model", "unknown model preset"},
        BadModel{"RuleAxisNotInMesh", "plan.rules.mlp=tp", "plan.rules.mlp",
                 "'tp' is not an axis of plan.mesh"},
        BadModel{"UnknownLogicalName", "plan.rules.hidden=fsdp", "plan.rules.hidden",
                 "unknown key 'hidden'"},
        BadModel{"MicrobatchesNotDividing", "train.microbatches=3", "train.microbatches",
                 "must divide global_batch"},
        BadModel{"UnknownRemat", "plan.remat=partial", "plan.remat",
                 "expected one of none, selective, full"},
        BadModel{"CustomRematUnknownName", "plan.remat={save: [query_proj, scores]}",
                 "plan.remat.save.1", "expected one of decoder_layer_input, query_proj"},
        BadModel{"CustomRematNameTwice", "plan.remat={save: [context, context]}",
                 "plan.remat.save.1", "'context' is named twice"},
        BadModel{"CustomRematOtherKey", "plan.remat={keep: [context]}", "plan.remat.keep",
                 "expected one of save"},
        BadModel{"CustomRematSavesWhatItOffloads",
                 "plan={mesh: {fsdp: 4, tensor: 2}, remat: {save: [context]}, offload: [context]}",
                 "plan.offload", "'context' is both saved by plan.remat and offloaded"},
        BadModel{"TrainAndServe", "serve={batch: 1, prompt_len: 8, decode_len: 2}", "serve",
                 "either train: or serve:"},
        BadModel{"PipelineAxisNotInMesh", "plan.pipeline={axis: stage}", "plan.pipeline.axis",
                 "'stage' is not an axis of plan.mesh"},
        BadModel{"VirtualStagesWithoutInterleaving",
                 "plan.pipeline={axis: tensor, virtual_stages: 2}", "plan.pipeline.virtual_stages",
                 "needs schedule: interleaved"},
        BadModel{"PipelineWithoutTheLayersRule", "plan.pipeline={axis: tensor}",
                 "plan.rules.layers", "layers: tensor"},
        BadModel{"FirstStageLayersZero", "plan.pipeline={axis: tensor, first_stage_layers: 0}",
                 "plan.pipeline.first_stage_layers", "must be positive"},
        BadModel{"TopKAboveExperts", "model={preset: llama-2-7b, experts: 2, top_k: 3}",
                 "model.top_k", "top_k (3) must be in [1, experts (2)]"},
        BadModel{"AuxLossWithoutExperts", "model={preset: llama-2-7b, router_aux_loss: 0.01}",
                 "model.router_aux_loss", "give experts too"},
        BadModel{"BufferFactorWithACapacity",
                 "model={preset: llama-2-7b, experts: 2, ragged_buffer_factor: 1.25}",
                 "model.ragged_buffer_factor", "give capacity_factor: -1 too"},
        BadModel{"BufferFactorNotFinite",
                 "model={preset: llama-2-7b, experts: 2, capacity_factor: -1, "
                 "ragged_buffer_factor: .inf}",
                 "model.ragged_buffer_factor", "ragged_buffer_factor must be a number"},
        BadModel{"NegativeAuxLoss", "model={preset: llama-2-7b, experts: 2, router_aux_loss: -1}",
                 "model.router_aux_loss", "finite number >= 0"},
        BadModel{"MeshLargerThanMachine", "plan.mesh={fsdp: 8, tensor: 2}", "plan.mesh", "devices"},
        BadModel{"UnknownOffloadName", "plan.offload=[attention_out]", "plan.offload.0",
                 "expected one of decoder_layer_input, query_proj"},
        BadModel{"VocabTilingNotDividingTheSequence", "train.vocab_tiling=3", "train.vocab_tiling",
                 "vocab_tiling (3) must divide seq_len (16)"},
        BadModel{"OffloadNamedTwice", "plan.offload=[key_proj, key_proj]", "plan.offload.1",
                 "'key_proj' is named twice"},

        BadModel{"KvHeadsNotDividingTensor", "plan.mesh={fsdp: 2, tensor: 4}", "plan.rules",
                 "parameter wk0 [embed, kv_heads, head_dim]"}),
    [](const auto& info) { return info.param.name; });

// GPU presets give no host link (hardware.md lists none): offload asks for one, and runs once
// given.
TEST_F(ModelRunTest, OffloadNeedsAHostLink) {
  const std::string file = Tiny("  offload: [query_proj]\n");
  const Result r = Run({"run", file, "--set", "hardware={preset: h100-dgx}"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("set hardware.device.host_bandwidth (key plan.offload)"), std::string::npos)
      << r;
  RunOk({"run", file, "--set", "hardware={preset: h100-dgx, device: {host_bandwidth: 64 GB/s}}"});
}

// A checkpoint name some layer lacks is refused rather than offloading nothing there: a mixture
// of experts' layers have no dense MLP projections.
TEST_F(ModelRunTest, OffloadNamesEveryLayersValue) {
  const Result r = Run({"run", Tiny("  offload: [mlpwi_0]\n"), "--set",
                        "model={kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8, "
                        "kv_heads: 2, vocab: 128, experts: 4, top_k: 2}"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("'mlpwi_0' is not a value of every decoder layer"), std::string::npos) << r;
  EXPECT_NE(r.err.find("(key plan.offload)"), std::string::npos) << r;
}

TEST_F(ModelRunTest, ProgramKeysDoNotGoWithAModel) {
  const Result r = Run({"run", Tiny("mesh: {axes: {dp: 8}}\n")});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("does not go with model:"), std::string::npos) << r;
}

// DeepSeek-V3 with its report's 16 pipeline stages: 61 layers (3 dense, then experts) in
// stages of 3 or 4, the text and the JSON naming each stage's layers; the step's parts (the
// busiest stage's compute, exposed communication and idle time) add up to the step.
TEST_F(ModelRunTest, DeepSeekPipelinesInUnequalStages) {
  const std::string file =
      (fs::path(SourceDir()) / "configs" / "models" / "deepseek_v3_h100_pp16.yaml").string();
  const Result r = RunOk({"run", file});
  EXPECT_NE(r.out.find("(16 stages of 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3 layers)"),
            std::string::npos)
      << r.out;
  const nlohmann::json j = RunJson({"run", file});
  const std::vector<int64_t> layers = j["pipeline_layers"].get<std::vector<int64_t>>();
  EXPECT_EQ(std::accumulate(layers.begin(), layers.end(), int64_t{0}), 61);
  // Each stage's peak; the step's memory is the fullest's, the first stage's here (its 3 dense
  // layers' MLPs and the embedding table); the 4-layer stages after it, holding neither table,
  // peak lower.
  const std::vector<int64_t> peaks = j["pipeline_peak_bytes"].get<std::vector<int64_t>>();
  ASSERT_EQ(peaks.size(), 16u);
  EXPECT_EQ(*std::max_element(peaks.begin(), peaks.end()), j["step_memory"]["peak"].get<int64_t>());
  EXPECT_EQ(peaks[0], j["step_memory"]["peak"].get<int64_t>());
  EXPECT_LT(peaks[1], peaks[0]);
  EXPECT_NE(r.out.find("stage peaks:"), std::string::npos) << r.out;
  EXPECT_NEAR(j["compute_s"].get<double>() + j["exposed_comm_s"].get<double>() +
                  j["bubble_s"].get<double>(),
              j["step_time_s"].get<double>(), 1e-9 * j["step_time_s"].get<double>());
}

// Offload in a pipeline: a chunk waiting in flight holds in HBM what its forward did not
// offload, however slow the host link (its copies finished long before its backward). They
// were read from the bytes live as one microbatch's backward starts, which on a slow link still
// hold the queued copies: GPipe's 8 chunks in flight then made offloading raise the peak
// (32.4 -> 46.4 MiB) and a 10000 GB/s link lowered it (32.9).
TEST_F(ModelRunTest, PipelineOffloadHoldsWhatItDidNotOffloadInFlight) {
  const std::string file =
      Pipelined(8, "  remat: full\n  pipeline: {axis: stage, schedule: gpipe}\n");
  auto peak = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"run", file};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    return static_cast<double>(RunJson(args)["step_memory"]["peak"].get<int64_t>());
  };
  const double kept = peak({});
  const double slow = peak({"plan.offload=[mlpwi_0, mlpwi_1]"});
  const double fast =
      peak({"plan.offload=[mlpwi_0, mlpwi_1]", "hardware.device.host_bandwidth=10000 GB/s"});
  EXPECT_LT(slow, kept);
  EXPECT_LT(fast, kept);
  // The stage's own step may still wait on its last copies: a few percent, not 8 chunks'.
  EXPECT_NEAR(slow, fast, 0.05 * fast);
}

// plan.torus_order places the mesh with the torus's dimensions handed out in that order: the
// plan line names it, and --numerics on (the whole step on the network) describes the
// placement and passes; an order that is not the torus's dimensions, or one given beside
// devices, is a located error.
TEST_F(ModelRunTest, TorusOrderPlacesTheMesh) {
  const std::string file = Tiny();
  const Result r = RunOk({"run", file, "--set", "plan.torus_order=[0, 1]"});
  EXPECT_NE(r.out.find("mesh fsdp=4 x tensor=2 (torus_order [0, 1]);"), std::string::npos) << r.out;
  const nlohmann::json j =
      RunJson({"run", file, "--numerics", "on", "--set", "plan.torus_order=[0, 1]"});
  EXPECT_TRUE(j["numerics"]["passed"].get<bool>());
  const Result whole = RunOk({"run", file, "--numerics", "on", "--set", "plan.torus_order=[0, 1]"});
  EXPECT_NE(whole.out.find("tensor -> torus dim 0 (factor 2 of 4) (torus_order [0, 1])"),
            std::string::npos)
      << whole.out;
  for (const auto& [set, message] : std::vector<std::pair<std::string, std::string>>{
           {"plan.torus_order=[0, 0]", "must list each of the torus's 2 dimensions (0..1) once"},
           {"plan={mesh: {fsdp: 4, tensor: 2}, devices: [0, 1, 2, 3, 4, 5, 6, 7], "
            "torus_order: [0, 1]}",
            "not both"}}) {
    const Result bad = Run({"run", file, "--set", set});
    EXPECT_EQ(bad.exit_code, 2) << bad;
    EXPECT_NE(bad.err.find("(key plan.torus_order)"), std::string::npos) << bad;
    EXPECT_NE(bad.err.find(message), std::string::npos) << bad;
  }
}

// first_stage_layers and last_stage_layers fix those stages' layers (the report names each
// stage's), where ChunkLayers spreads 8 layers over 4 stages as 2 each; layers that the
// stages between cannot split evenly are a located error.
TEST_F(ModelRunTest, PipelineStagesTakeTheLayersTheirPlanGives) {
  const std::string file =
      Pipelined(4, "  pipeline: {axis: stage, first_stage_layers: 1, last_stage_layers: 3}\n");
  const Result r = RunOk({"run", file});
  EXPECT_NE(r.out.find("(4 stages of 1, 2, 2, 3 layers)"), std::string::npos) << r.out;
  const Result even = RunOk({"run", file, "--set", "plan.pipeline={axis: stage}"});
  EXPECT_NE(even.out.find("(4 stages)"), std::string::npos) << even.out;
  const Result bad =
      Run({"run", file, "--set",
           "plan.pipeline={axis: stage, first_stage_layers: 2, last_stage_layers: 3}"});
  EXPECT_EQ(bad.exit_code, 2) << bad;
  EXPECT_NE(bad.err.find("(key plan.pipeline)"), std::string::npos) << bad;
  EXPECT_NE(bad.err.find("do not split evenly among 2 stages between"), std::string::npos) << bad;
}

// A pipeline's --trace is its composed schedule: a process per stage, 2 x microbatches x
// chunks tasks on each (interleaved x2 here), every send between stages a flow (a bind id
// leaving one task and entering one other), and after the flush the update, which ends the
// step. --numerics on is still refused, naming what the trace is.
TEST_F(ModelRunTest, PipelineTraceIsItsSchedule) {
  const std::string file =
      Pipelined(4, "  pipeline: {axis: stage, schedule: interleaved, virtual_stages: 2}\n");
  const std::string trace = (out() / "pipe_trace.json").string();
  const nlohmann::json j = RunJson({"run", file, "--trace", trace});
  const nlohmann::json t = nlohmann::json::parse(ReadFile(trace));
  const nlohmann::json& events = t.is_object() ? t["traceEvents"] : t;
  std::map<int, int> tasks;  // By stage.
  std::map<std::string, int> flow_out, flow_in;
  double end_us = 0;
  int processes = 0;
  for (const nlohmann::json& e : events) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      ++processes;
      EXPECT_EQ(e["args"]["name"].get<std::string>().rfind("stage ", 0), 0u) << e;
    }
    if (e["ph"] != "X") continue;
    end_us = std::max(end_us, e["ts"].get<double>() + e["dur"].get<double>());
    const std::string name = e["name"];
    if (name.rfind("forward", 0) == 0 || name.rfind("backward", 0) == 0) {
      ++tasks[e["pid"].get<int>()];
    }
    if (e.contains("bind_id")) {
      (e.contains("flow_out") ? flow_out : flow_in)[e["bind_id"].get<std::string>()]++;
    }
  }
  EXPECT_EQ(processes, 4);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(tasks[s], 2 * 4 * 2) << s;
  // Sends: 4 microbatches x (8 chunks - 1) boundaries x 2 directions, each out once, in once.
  EXPECT_EQ(flow_out.size(), 4u * 7 * 2);
  EXPECT_EQ(flow_in.size(), flow_out.size());
  for (const auto& [id, n] : flow_out) {
    EXPECT_EQ(n, 1) << id;
    EXPECT_EQ(flow_in[id], 1) << id;
  }
  EXPECT_NEAR(end_us * 1e-6, j["step_time_s"].get<double>(), 1e-9);
  const Result refused = Run({"run", file, "--numerics", "on"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("--trace writes that schedule"), std::string::npos) << refused.err;
  // Its processes are stages: --trace-devices is refused, not checked against the devices.
  const Result devices = Run({"run", file, "--trace", trace, "--trace-devices", "1"});
  EXPECT_EQ(devices.exit_code, 2);
  EXPECT_NE(devices.err.find("a process per stage"), std::string::npos) << devices.err;
}

// Every example in configs/models runs and fits.
TEST_F(ModelRunTest, EveryExampleRuns) {
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(SourceDir()) / "configs" / "models")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const nlohmann::json j = RunJson({"run", entry.path().string()});
    if (j.contains("tpot_s")) {
      EXPECT_GT(j["tpot_s"].get<double>(), 0);
      EXPECT_GT(j["ttft_s"].get<double>(), j["tpot_s"].get<double>());
    } else {
      EXPECT_GT(j["step_time_s"].get<double>(), 0);
      EXPECT_GT(j["mfu"].get<double>(), 0);
      EXPECT_LT(j["mfu"].get<double>(), 1);
    }
    ++seen;
  }
  EXPECT_GE(seen, 1);
}

}  // namespace
}  // namespace shardsim::cli_test
