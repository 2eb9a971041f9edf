// `shardsim run` reports peak device memory against HBM capacity, says when a program does
// not fit (a warning, `fits: false`, exit 0), and runs the cached timing path on request.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class MemoryCliTest : public CliFixture {};

// x: f32[256,256] over dp=2 (local 131072 B), w: f32[256,64] replicated (65536 B); relu makes
// a new buffer (x is the caller's), exp writes over it, the matmul adds 32768 B: the peak is
// 131072 + 65536 + 131072 + 32768 = 360448 B at op y (see tests/collectives/timing_test.cc).
const char* kProgram = R"yaml(hardware: {preset: tpu-v5e, shape: [2, 1]}
mesh: {axes: {dp: 2}}
arrays:
  x: {shape: [256, 256], dtype: f32, init: arange, sharding: "P('dp', None)"}
  w: {shape: [256, 64], dtype: f32, init: arange, sharding: "P()"}
program:
  - {op: relu, in: x, out: a}
  - {op: exp, in: a, out: b}
  - {op: matmul, in: [b, w], out: y}
outputs:
  y: "P('dp', None)"
)yaml";

TEST_F(MemoryCliTest, ReportsPeakAndFits) {
  std::string file = WriteInput("m.yaml", kProgram);
  std::string json = (out() / "s.json").string();
  Result r = RunOk({"run", file, "--numerics", "off", "--json", json});
  EXPECT_NE(r.out.find("memory:         peak 352 KiB per device (device 0, at y)"),
            std::string::npos)
      << r;
  EXPECT_NE(r.out.find("fits"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["memory"]["peak_bytes"], 360448);
  EXPECT_EQ(j["memory"]["peak_op"], "y");
  EXPECT_EQ(j["fits"], true);
  EXPECT_EQ(j["per_device"][1]["peak_bytes"], 360448);
}

TEST_F(MemoryCliTest, OverCapacityWarnsAndReportsNotFitting) {
  std::string file = WriteInput("m.yaml", kProgram);
  std::string json = (out() / "s.json").string();
  Result r = Run({"run", file, "--numerics", "off", "--json", json, "--set",
                  "hardware.device.hbm_capacity=300 KiB"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("warning: device 0 needs 352 KiB at op y, over its 300 KiB of HBM"),
            std::string::npos)
      << r;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r;
  nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["fits"], false);
  EXPECT_EQ(j["memory"]["capacity_bytes"], 300 * 1024);
}

TEST_F(MemoryCliTest, CachedTimingAgreesOnASerialProgram) {
  std::string file = WriteInput("m.yaml", kProgram);
  std::string a = (out() / "a.json").string(), b = (out() / "b.json").string();
  RunOk({"run", file, "--numerics", "off", "--json", a});
  RunOk({"run", file, "--timing", "cached", "--json", b});
  nlohmann::json ja = nlohmann::json::parse(ReadFile(a));
  nlohmann::json jb = nlohmann::json::parse(ReadFile(b));
  EXPECT_EQ(ja["simulated_time_s"], jb["simulated_time_s"]);
  EXPECT_EQ(jb["simulated_devices"], 1);
  EXPECT_EQ(jb["numerics"]["checked"], false);
}

TEST_F(MemoryCliTest, CachedTimingRefusesNumericsOn) {
  std::string file = WriteInput("m.yaml", kProgram);
  Result r = Run({"run", file, "--timing", "cached", "--numerics", "on"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
}

// --numerics auto sizes the whole run: an all_gather of a 128 MiB array over 64 devices makes
// 128 MiB on each of them (8 GiB in all), far over the 2 GiB budget, though its input is small.
TEST_F(MemoryCliTest, NumericsAutoCountsOutputsOnEveryDevice) {
  std::string file = WriteInput("g.yaml", R"yaml(hardware: {preset: tpu-v5e, shape: [8, 8]}
mesh: {axes: {dp: 64}}
arrays:
  x: {shape: [32768, 1024], dtype: f32, init: normal, sharding: "P('dp', None)"}
program:
  - {op: all_gather, in: x, out: y, axis_name: dp, axis: 0, tiled: true}
outputs:
  y: "P()"
)yaml");
  Result r = RunOk({"run", file});
  EXPECT_NE(r.out.find("numerics:       off: the run would need about"), std::string::npos) << r;
}

}  // namespace
}  // namespace shardsim::cli_test
