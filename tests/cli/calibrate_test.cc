// `shardsim calibrate` and `hardware.comm`: the GPU presets against the public nccl-tests
// curves, the fit recovering figures it was given, located errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/placement.h"
#include "collectives/runtime/machine.h"
#include "sim/cli/collective_command.h"
#include "tests/cli/subprocess.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace {

namespace fs = std::filesystem;
using shardsim::cli_test::IsOneErrorLine;
using shardsim::cli_test::Result;

// One row of calibrate's table: size, measured, preset and fitted times.
struct CalibrationRow {
  double size = 0;
  double measured_us = 0;
  double preset_us = 0;
  double fitted_us = 0;
};

std::vector<CalibrationRow> Rows(const std::string& out) {
  std::vector<CalibrationRow> rows;
  std::istringstream in(out);
  std::string line;
  static const std::regex kRow(
      R"(^# \S+\s+\S+_perf\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+\S+%\s+([0-9.]+)\s+\S+%\s+\S+$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, kRow)) {
      rows.push_back({std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), std::stod(m[4])});
    }
  }
  return rows;
}

// A fitted figure from the printed hardware block ("    launch_latency: 28.438 us").
double Figure(const std::string& out, const std::string& key) {
  std::smatch m;
  const std::regex re(key + R"(: ([0-9.]+))");
  if (!std::regex_search(out, m, re)) {
    ADD_FAILURE() << "no " << key << " in\n" << out;
    return 0;
  }
  return std::stod(m[1]);
}

class CalibrateTest : public shardsim::cli_test::CliFixture {
 protected:
  std::string DataFile(const std::string& name) const {
    return (fs::path(shardsim::cli_test::SourceDir()) / "tests" / "data" / "nccl" / name).string();
  }
};

// The issue's acceptance bounds for the public curves (measured-steps.md, "Collectives"),
// with every preset at its defaults: 10% at >= 1 GiB, 15% at 64-512 MiB, 25% at <= 16 MiB.
// The presets' NCCL figures were fitted to these very curves (presets.cc), so this checks that
// the shipped defaults still reproduce them, not an independent prediction.
TEST_F(CalibrateTest, PresetsMatchThePublicCurves) {
  for (const auto& [preset, file] : std::vector<std::pair<std::string, std::string>>{
           {"a100-dgx", "a100_8gpu_oci_all_reduce_perf.txt"},
           {"h100-dgx", "h100_2x8gpu_aws_p5_all_reduce_perf.txt"}}) {
    SCOPED_TRACE(preset);
    Result r = RunOk({"calibrate", "--preset", preset, DataFile(file), "--max-simulations", "1"});
    std::vector<CalibrationRow> rows = Rows(r.out);
    ASSERT_GE(rows.size(), 7u) << r;
    for (const CalibrationRow& row : rows) {
      const double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
      const double tolerance = row.size >= gib ? 0.10 : row.size >= 64 * mib ? 0.15 : 0.25;
      EXPECT_NEAR(row.preset_us, row.measured_us, tolerance * row.measured_us)
          << row.size << " bytes";
    }
  }
}

// A curve that shardsim itself produced with known figures (launch 40 us, Simple step 8 us,
// NVLink at 60% of line rate) is fitted back from the preset's defaults: the fitted curve
// within 0.5% rms of ln(time), launch latency and NVLink efficiency within 3%; the Simple step
// latency, which moves a 1 GiB ring's time by 1% (14 steps of 8 us in 10 ms), within 25%.
TEST_F(CalibrateTest, RecoversTheFiguresOfAKnownCurve) {
  shardsim::HardwareSpec hw;
  hw.preset = "a100-dgx";
  hw.comm.launch_latency = shardsim::Time::Microseconds(40);
  hw.comm.protocols[2].step_latency = shardsim::Time::Microseconds(8);
  hw.comm.nvlink_efficiency = 0.6;
  shardsim::Machine machine(shardsim::BuildHardware(hw));
  std::vector<shardsim::MeshAxis> axes = {{"x", 8}};
  shardsim::Mesh mesh(axes, shardsim::DefaultPlacement(axes, machine.topology()));
  std::ostringstream text;
  text << "# Collective test starting: all_reduce_perf\n# Using devices\n";
  for (int r = 0; r < 8; ++r)
    text << "#  Rank  " << r << " Group  0 Pid 1 on host device  " << r << "\n";
  for (int64_t size = 64 << 10; size <= (int64_t{1} << 30); size *= 4) {
    const shardsim::Time t = shardsim::SimulateCollectiveSize(
        machine, mesh, {"x"}, shardsim::OpKind::kPsum, size / 4, "auto", nullptr);
    char line[200];
    std::snprintf(line, sizeof line, "%12lld %12lld float sum -1 %10.3f 0 0 0 %10.3f 0 0 0\n",
                  static_cast<long long>(size), static_cast<long long>(size / 4), t.microseconds(),
                  t.microseconds());
    text << line;
  }
  const std::string file = WriteInput("known.txt", text.str());
  Result r = RunOk({"calibrate", "--preset", "a100-dgx", file, "--fit",
                    "launch_latency,protocols.Simple.step_latency,nvlink_efficiency"});
  EXPECT_NEAR(Figure(r.out, "launch_latency"), 40, 0.03 * 40) << r;
  EXPECT_NEAR(Figure(r.out, "Simple: \\{step_latency"), 8, 0.25 * 8) << r;
  EXPECT_NEAR(Figure(r.out, "nvlink_efficiency"), 0.6, 0.03 * 0.6) << r;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(fitted \(|, ([0-9.]+) fitted)")));
  EXPECT_LT(std::stod(m[1]), 0.005) << r;
  // The block it prints is a valid hardware section.
  const std::string block = r.out.substr(r.out.find("hardware:"));
  const std::string run_file =
      block.substr(0, block.find("\n#")) +
      "\nmesh: {axes: {x: 8}}\narrays: {g: {shape: [1024], dtype: f32, init: ones}}\n"
      "program:\n  - {op: psum, in: g, out: s, axis_name: x}\noutputs: {s: \"P()\"}\n";
  RunOk({"run", WriteInput("fitted.yaml", run_file)});
}

TEST_F(CalibrateTest, RefusesWhatItCannotRead) {
  // No test name anywhere: which collective?
  std::string nameless =
      WriteInput("out.txt", "#  Rank  0 Group 0\n1024 256 float sum -1 5.0 0 0 0\n");
  Result r = Run({"calibrate", "--preset", "a100-dgx", nameless});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find(nameless + ":1: cannot tell which test wrote this file"), std::string::npos)
      << r;
  // A row whose time is not a number: the line is named.
  std::string bad =
      WriteInput("all_reduce_perf.txt",
                 "#  Rank  0 Group 0\n#  Rank  1 Group 0\n"
                 "1024 256 float sum -1 5.0 0 0 0\n2048 512 float sum -1 fast 0 0 0\n");
  r = Run({"calibrate", "--preset", "a100-dgx", bad});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find(bad + ":4: the out-of-place time column reads 'fast'"), std::string::npos)
      << r;
  // An old output without the redop and root columns: refused, not misread.
  std::string old = WriteInput("all_gather_perf.txt",
                               "#  Rank  0 Group 0\n#  Rank  1 Group 0\n"
                               "1024 256 float 5.0 0.2 0.1 0 5.0 0.2 0.1 0\n");
  r = Run({"calibrate", "--preset", "a100-dgx", old});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find(old + ":3: expected a reduction"), std::string::npos) << r;
  // TPUs have no NCCL.
  r = Run({"calibrate", "--preset", "tpu-v5e", DataFile("a100_8gpu_oci_all_reduce_perf.txt")});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("only GPU presets"), std::string::npos) << r;
  // An unknown figure.
  r = Run({"calibrate", "--preset", "a100-dgx", DataFile("a100_8gpu_oci_all_reduce_perf.txt"),
           "--fit", "launch_latncy"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("unknown figure 'launch_latncy'"), std::string::npos) << r;
  // The channels and the network figures need a curve across nodes.
  r = Run({"calibrate", "--preset", "a100-dgx", DataFile("a100_8gpu_oci_all_reduce_perf.txt"),
           "--fit", "channels"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("channels needs a run spanning two or more nodes"), std::string::npos) << r;
}

// hardware.comm overrides the preset's NCCL figures: raising the launch latency of an 8-GPU
// psum by D raises the simulated time by exactly D.
TEST_F(CalibrateTest, HardwareCommOverridesThePreset) {
  auto run_file = [](const std::string& comm) {
    return "hardware: {preset: h100-dgx" + comm +
           "}\nmesh: {axes: {x: 8}}\n"
           "arrays: {g: {shape: [1048576], dtype: f32, init: ones}}\n"
           "program:\n  - {op: psum, in: g, out: s, axis_name: x}\noutputs: {s: \"P()\"}\n"
           "options: {numerics: off}\n";
  };
  auto time_us = [](const std::string& out) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(simulated time: ([0-9.]+) us)"))) << out;
    return m.size() > 1 ? std::stod(m[1]) : 0.0;
  };
  const double base = time_us(RunOk({"run", WriteInput("a.yaml", run_file(""))}).out);
  const double later = time_us(
      RunOk({"run", WriteInput("b.yaml", run_file(", comm: {launch_latency: 100 us}"))}).out);
  const double preset_launch =
      shardsim::BuildPreset("h100-dgx").comm().launch_latency.microseconds();
  EXPECT_NEAR(later - base, 100 - preset_launch, 0.1);  // The summary prints 0.1 us.
  // Bad figures are located.
  Result r = Run({"run", WriteInput("c.yaml", run_file(", comm: {nvlink_efficiency: 1.5}"))});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("c.yaml:1:"), std::string::npos) << r;
  r = Run(
      {"run", WriteInput("d.yaml", run_file(", comm: {protocols: {LL129: {efficiency: 0.5}}}"))});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("LL129"), std::string::npos) << r;
}

// An op may name its protocol as NCCL_PROTO does ("ring/LL"); a protocol that does not
// exist is a located error, and so is one on a machine without NCCL.
TEST_F(CalibrateTest, AlgorithmsMayNameTheirProtocol) {
  auto run_file = [](const std::string& preset, const std::string& algorithm) {
    return "hardware: {preset: " + preset +
           "}\nmesh: {axes: {x: 8}}\n"
           "arrays: {g: {shape: [4096], dtype: f32, init: ones}}\n"
           "program:\n  - {op: psum, in: g, out: s, axis_name: x, algorithm: " +
           algorithm + "}\noutputs: {s: \"P()\"}\n";
  };
  Result ok = RunOk({"run", WriteInput("ll.yaml", run_file("h100-dgx", "ring/LL"))});
  EXPECT_NE(ok.out.find("ring/LL"), std::string::npos) << ok;
  Result bad = Run({"run", WriteInput("lx.yaml", run_file("h100-dgx", "ring/LX"))});
  EXPECT_EQ(bad.exit_code, 2) << bad;
  EXPECT_NE(bad.err.find("lx.yaml:5:"), std::string::npos) << bad;
  EXPECT_NE(bad.err.find("(key program.0.algorithm)"), std::string::npos) << bad;
  Result tpu = Run({"run", WriteInput("tpu.yaml", run_file("tpu-v5e, shape: [2, 4]", "ring/LL"))});
  EXPECT_EQ(tpu.exit_code, 2) << tpu;
  EXPECT_NE(tpu.err.find("protocols exist on machines whose collectives run as NCCL"),
            std::string::npos)
      << tpu;
}

}  // namespace
