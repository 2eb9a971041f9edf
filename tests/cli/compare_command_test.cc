// `shardsim compare` (SPEC "Comparing plans"): the side-by-side table, the step split into
// parts that add up to each run's step time, reasons ordered by how much each part differs,
// the same figures `shardsim run` reports, and errors for what it cannot compare.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class CompareCommandTest : public CliFixture {
 protected:
  // The tiny transformer on 8 v5e chips under `plan`.
  std::string Tiny(const std::string& name, const std::string& plan) const {
    return WriteInput(name,
                      "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
                      "model: {kind: transformer, layers: 4, d_model: 64, d_ff: 128, heads: 8,\n"
                      "        kv_heads: 2, vocab: 128}\n"
                      "train: {global_batch: 16, seq_len: 16, optimizer: adam, dtype: f32,\n"
                      "        param_dtype: f32}\n"
                      "plan:\n" +
                          plan);
  }
};

TEST_F(CompareCommandTest, TableReasonsAndPartsThatAddUp) {
  const std::string a = Tiny("fsdp.yaml",
                             "  mesh: {fsdp: 8}\n"
                             "  rules: {batch: fsdp, embed: fsdp}\n");
  const std::string b =
      Tiny("tp.yaml",
           "  mesh: {data: 4, tensor: 2}\n"
           "  rules: {batch: data, heads: tensor, kv_heads: tensor, mlp: tensor,\n"
           "          vocab: tensor}\n"
           "  remat: full\n");
  const std::string json = (out() / "c.json").string();
  const Result r = RunOk({"compare", a, b, "--json", json});
  for (const char* text : {"A: fsdp.yaml", "B: tp.yaml", "step time", "MFU", "exposed comm",
                           "peak / HBM", "fits", "why ", " is faster than "}) {
    EXPECT_NE(r.out.find(text), std::string::npos) << text << "\n" << r.out;
  }
  const nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const nlohmann::json& run : j["runs"]) {
    // The parts add up to the step time exactly (waiting is the rest). None is negative:
    // compute and exposed communication lie within the step; composition extrapolates each
    // figure on its own from 2 and 3 layers, so the rest may be off by rounding (1 ns).
    int64_t sum = 0;
    for (const auto& [name, ps] : run["step_parts_ps"].items()) {
      EXPECT_GE(ps.get<int64_t>(), -1000) << name;
      sum += ps.get<int64_t>();
    }
    EXPECT_EQ(sum, run["step_time_ps"].get<int64_t>());
  }
  // Reasons: the largest differences first; the faster run has the shorter step.
  const std::string fastest = j["fastest"];
  const auto& runs = j["runs"];
  const size_t f = runs[0]["label"] == fastest ? 0 : 1;
  EXPECT_LE(runs[f]["step_time_s"].get<double>(), runs[1 - f]["step_time_s"].get<double>());
  ASSERT_FALSE(j["reasons"].empty());
  for (size_t k = 1; k < j["reasons"].size(); ++k) {
    EXPECT_GE(std::abs(j["reasons"][k - 1]["difference_s"].get<double>()),
              std::abs(j["reasons"][k]["difference_s"].get<double>()));
  }
  // The figures are those `shardsim run` reports for the same file.
  for (size_t i = 0; i < 2; ++i) {
    const std::string run_json = (out() / ("run" + std::to_string(i) + ".json")).string();
    RunOk({"run", i == 0 ? a : b, "--json", run_json});
    const nlohmann::json single = nlohmann::json::parse(ReadFile(run_json));
    EXPECT_DOUBLE_EQ(single["step_time_s"].get<double>(), runs[i]["step_time_s"].get<double>());
    EXPECT_DOUBLE_EQ(single["mfu"].get<double>(), runs[i]["mfu"].get<double>());
  }
}

TEST_F(CompareCommandTest, TraceDirHoldsEachRunsTrace) {
  const std::string a = Tiny("a.yaml", "  mesh: {fsdp: 8}\n  rules: {batch: fsdp, embed: fsdp}\n");
  const std::string b = Tiny("b.yaml", "  mesh: {data: 8}\n  rules: {batch: data}\n");
  const fs::path dir = out() / "traces";
  const Result r = RunOk({"compare", a, b, "--trace-dir", dir.string()});
  for (const char* label : {"A", "B"}) {
    const fs::path trace = dir / (std::string(label) + ".json");
    ASSERT_TRUE(fs::exists(trace)) << trace;
    const nlohmann::json j = nlohmann::json::parse(ReadFile(trace));
    EXPECT_FALSE(j["traceEvents"].empty()) << label;
    EXPECT_NE(r.out.find("trace of " + std::string(label) + ": " + trace.string()),
              std::string::npos)
        << r.out;
  }
}

TEST_F(CompareCommandTest, Errors) {
  const std::string a = Tiny("a.yaml", "  mesh: {fsdp: 8}\n  rules: {batch: fsdp}\n");
  Result r = Run({"compare", a});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("compare needs two or more run files"), std::string::npos) << r;
  const std::string program =
      WriteInput("p.yaml",
                 "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
                 "mesh: {axes: {x: 8}}\n"
                 "arrays: {a: {shape: [8], sharding: \"P('x')\", init: ones}}\n"
                 "program: [{op: psum, in: a, axis_name: x, out: b}]\n"
                 "outputs: {b: \"P('x')\"}\n");
  r = Run({"compare", a, program});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("compare takes model run files"), std::string::npos) << r;
  EXPECT_EQ(r.out, "");
}

// The two DeepSeek-V3 examples: the plan search's best (EP 8 inside each node) against the
// report's 16 stages x EP 64 over 8 nodes. The reason named first is the all-to-all over
// expert, and the links say where: EP 64's NICs busy, EP 8's NVLink.
TEST_F(CompareCommandTest, DeepSeekExpertParallelismInsideANodeWins) {
  const std::string dir = SourceDir() + "/configs/models/";
  const Result r =
      RunOk({"compare", dir + "deepseek_v3_h100_ep8.yaml", dir + "deepseek_v3_h100_pp16.yaml"});
  const size_t why = r.out.find("why A is faster than B");
  ASSERT_NE(why, std::string::npos) << r.out;
  const size_t first = r.out.find("\n- ", why);
  const std::string reason = r.out.substr(first + 1, r.out.find('\n', first + 1) - first - 1);
  EXPECT_NE(reason.find("B spends"), std::string::npos) << reason;
  EXPECT_NE(reason.find("more in exposed all_to_all over expert"), std::string::npos) << reason;
  EXPECT_NE(r.out.find("B's NIC at", why), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("A's NVLink at", why), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardsim::cli_test
