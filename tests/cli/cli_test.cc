// End-to-end tests of the shardsim command: the real binary run as a subprocess, its exit
// code, stdout, stderr and output files checked against the contract in SPEC.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using shardsim::cli_test::IsOneErrorLine;
using shardsim::cli_test::Listing;
using shardsim::cli_test::ReadFile;
using shardsim::cli_test::Result;
using shardsim::cli_test::SourceDir;
using shardsim::cli_test::WriteFile;

constexpr double kMiB = 1024.0 * 1024.0;

std::string Quickstart() { return SourceDir() + "/configs/quickstart.yaml"; }

// Relative difference check: |actual - expected| <= 1% of expected.
void ExpectWithinOnePercent(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, 0.01 * std::abs(expected)) << what;
}

class CliTest : public shardsim::cli_test::CliFixture {
 protected:
  json ReadJson(const fs::path& path) const {
    EXPECT_TRUE(fs::exists(path)) << path;
    return json::parse(ReadFile(path));
  }
};

// ---------------------------------------------------------------------------------------------
// shardsim topo

TEST_F(CliTest, TopoTpuV5pCubeIsAWrappedTorus) {
  fs::path j = out() / "v5p.json";
  Result r = RunOk({"topo", "tpu-v5p", "--shape", "4x4x4", "--json", j.string()});
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(devices:\s+64\b)"))) << r;
  json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 64);
  EXPECT_EQ(t["switches"], 0);
  EXPECT_EQ(t["links"], 192);   // 64 chips x 3 dimensions, each link counted once.
  EXPECT_EQ(t["diameter"], 6);  // 2 hops per wrapped dimension of 4.
  EXPECT_EQ(t["wraparound"], json::parse("[true, true, true]"));
  EXPECT_EQ(t["shape"], json::parse("[4, 4, 4]"));
  EXPECT_GT(t["bisection_bandwidth"].get<double>(), 0.0);
  EXPECT_EQ(Listing(out()), std::set<std::string>{"v5p.json"});
}

// --slices: four v5e 16x16 slices are 1024 chips, one DCN switch and a DCN link per chip at
// hardware.md's 3.125e9 B/s; v4 has no DCN figure: a flagged error.
TEST_F(CliTest, TopoSlicesJoinToriThroughDcn) {
  fs::path j = out() / "slices.json";
  const Result r =
      RunOk({"topo", "tpu-v5e", "--shape", "16x16", "--slices", "4", "--json", j.string()});
  EXPECT_NE(r.out.find("1024 x DCN: 3.125 GB/s per direction, 10 us latency"), std::string::npos)
      << r;
  EXPECT_NE(r.out.find("4x16x16 (dim 0: the slices, joined by DCN)"), std::string::npos) << r;
  const json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 1024);
  EXPECT_EQ(t["switches"], 1);
  const Result bad = Run({"topo", "tpu-v4", "--slices", "2"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err.rfind("error: --slices: ", 0), 0u) << bad;
}

TEST_F(CliTest, TopoTpuV5eSmallSliceDoesNotWrap) {
  fs::path j = out() / "v5e.json";
  RunOk({"topo", "tpu-v5e", "--shape", "4x4", "--json", j.string()});
  json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 16);
  EXPECT_EQ(t["wraparound"], json::parse("[false, false]"));
  EXPECT_EQ(t["diameter"], 6);  // 3 + 3 hops across an unwrapped 4x4 mesh.
}

TEST_F(CliTest, TopoTpuV5eFullPodWrapsBothAxes) {
  Result r = RunOk({"topo", "tpu-v5e", "--shape", "16x16"});
  EXPECT_NE(r.out.find("dim 0 yes, dim 1 yes"), std::string::npos) << r;
  fs::path j = out() / "pod.json";
  RunOk({"topo", "tpu-v5e", "--shape", "16x16", "--json", j.string()});
  json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 256);
  EXPECT_EQ(t["wraparound"], json::parse("[true, true]"));
}

TEST_F(CliTest, TopoH100DgxIsEightGpusOnOneNvSwitch) {
  fs::path j = out() / "dgx.json";
  RunOk({"topo", "h100-dgx", "--json", j.string()});
  json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 8);
  EXPECT_EQ(t["switches"], 1);
  EXPECT_EQ(t["links"], 8);
  ASSERT_EQ(t["link_groups"].size(), 1u) << t.dump();
  const json& g = t["link_groups"][0];
  EXPECT_EQ(g["kind"], "NVLink");
  EXPECT_EQ(g["count"], 8);
  EXPECT_DOUBLE_EQ(g["bandwidth"].get<double>(), 450e9);  // Per direction.
}

// topo reports how collectives drive the links: NCCL's figures on GPU presets (A100: no
// NVLS, NVLink at NCCL's 235 of 300 GB/s; --set-style overrides from a run file apply), and
// on TPU presets the split of permutes over minimal routes.
TEST_F(CliTest, TopoReportsTheCollectiveLibrary) {
  fs::path j = out() / "a100.json";
  Result r = RunOk({"topo", "a100-dgx", "--nodes", "2", "--json", j.string()});
  EXPECT_NE(r.out.find("nccl:       launch"), std::string::npos) << r;
  json t = ReadJson(j);
  EXPECT_EQ(t["comm"]["nccl"], true);
  EXPECT_EQ(t["comm"]["nvls"], false);
  EXPECT_NEAR(t["comm"]["nvlink_efficiency"].get<double>(), 235.0 / 300.0, 1e-12);
  EXPECT_EQ(t["comm"]["protocols"].size(), 3u);
  const std::string file = WriteInput("sharp.yaml",
                                      "hardware: {preset: h100-dgx, nodes: 2, "
                                      "comm: {sharp: true, channels: 4}}\n");
  fs::path k = out() / "sharp.json";
  RunOk({"topo", file, "--json", k.string()});
  json u = ReadJson(k);
  EXPECT_EQ(u["comm"]["sharp"], true);
  EXPECT_EQ(u["comm"]["channels"], 4);
  EXPECT_EQ(u["comm"]["nvls"], true);
  fs::path v = out() / "v5e.json";
  Result tpu = RunOk({"topo", "tpu-v5e", "--json", v.string()});
  EXPECT_NE(tpu.out.find("multipath:"), std::string::npos) << tpu;
  json w = ReadJson(v);
  EXPECT_EQ(w["comm"]["nccl"], false);
  EXPECT_EQ(w["comm"]["multipath"], true);
}

TEST_F(CliTest, TopoH100DgxFourNodes) {
  fs::path j = out() / "dgx4.json";
  RunOk({"topo", "h100-dgx", "--nodes", "4", "--json", j.string()});
  json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 32);
  EXPECT_GT(t["switches"].get<int>(), 1);  // NVSwitches plus the scale-out network.
}

TEST_F(CliTest, TopoWritesGraphvizDot) {
  fs::path dot = out() / "g.dot";
  RunOk({"topo", "h100-dgx", "--dot", dot.string()});
  std::string text = ReadFile(dot);
  EXPECT_TRUE(text.starts_with("digraph")) << text.substr(0, 80);
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(label="[^"]*GB/s)"))) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(Listing(out()), std::set<std::string>{"g.dot"});
}

TEST_F(CliTest, TopoReadsHardwareFile) {
  std::string file = WriteInput("ring.yaml",
                                "hardware:\n"
                                "  topology: {kind: ring, size: 6, bidirectional: true}\n"
                                "  link: {bandwidth: 100 GB/s, latency: 2 us}\n");
  fs::path j = out() / "ring.json";
  RunOk({"topo", file, "--json", j.string()});
  json t = ReadJson(j);
  EXPECT_EQ(t["devices"], 6);
  EXPECT_EQ(t["links"], 6);
  EXPECT_EQ(t["diameter"], 3);
  ASSERT_EQ(t["link_groups"].size(), 1u) << t.dump();
  EXPECT_DOUBLE_EQ(t["link_groups"][0]["bandwidth"].get<double>(), 100e9);
  EXPECT_DOUBLE_EQ(t["link_groups"][0]["latency_s"].get<double>(), 2e-6);
}

TEST_F(CliTest, TopoReadsBareHardwareMappingFile) {
  fs::path j = out() / "t.json";
  RunOk({"topo", SourceDir() + "/tests/cli/data/hardware_only.yaml", "--json", j.string()});
  EXPECT_EQ(ReadJson(j)["devices"], 32);  // h100-dgx, nodes: 4.
}

TEST_F(CliTest, TopoUnknownPresetIsOneLineAndWritesNothing) {
  fs::path j = out() / "t.json";
  Result r = Run({"topo", "tpu-v9", "--json", j.string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("tpu-v5p"), std::string::npos) << r;  // Lists the known presets.
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty());
}

TEST_F(CliTest, TopoBadShapeFlagNamesTheFlag) {
  Result r = Run({"topo", "tpu-v5e", "--shape", "4x4x4"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_TRUE(r.err.starts_with("error: --shape: ")) << r;
  EXPECT_EQ(r.out, "");
}

TEST_F(CliTest, TopoBadHardwareFileIsLocated) {
  std::string file = WriteInput("bad.yaml",
                                "hardware:\n"
                                "  preset: tpu-v5e\n"
                                "  shape: [4, 4, 4]\n");
  Result r = Run({"topo", file, "--json", (out() / "t.json").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_TRUE(r.err.starts_with("error: " + file + ":3:")) << r;
  EXPECT_TRUE(Listing(out()).empty());
}

// A shape error found when the program is lowered names the op once ("matmul: inner
// dimensions differ", not "matmul: matmul: ...": the kernel's message names it already).
TEST_F(CliTest, RunShapeErrorNamesTheOpOnce) {
  std::string file = WriteInput("bad.yaml",
                                "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
                                "mesh: {axes: {dp: 4, tp: 2}}\n"
                                "arrays:\n"
                                "  x: {shape: [8, 4], sharding: \"P('dp', None)\"}\n"
                                "  w: {shape: [3, 3], sharding: \"P()\"}\n"
                                "program:\n"
                                "  - {op: matmul, in: [x, w], out: y}\n"
                                "outputs: {y: \"P('dp', None)\"}\n");
  Result r = Run({"run", file});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_EQ(r.err, "error: " + file +
                       ":7:5: matmul: inner dimensions differ: f32[2,4] @ f32[3,3] (key "
                       "program.0)\n")
      << r;
}

// Two outputs, the second unwritable: neither may be left behind.
TEST_F(CliTest, TopoFailedSecondOutputLeavesNoFirstOutput) {
  Result r = Run({"topo", "h100-dgx", "--json", (out() / "t.json").string(), "--dot",
                  (out() / "missing_dir" / "g.dot").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("g.dot"), std::string::npos) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty());
}

// ---------------------------------------------------------------------------------------------
// shardsim run

TEST_F(CliTest, RunQuickstartSummaryMatchesClosedForms) {
  fs::path s = out() / "summary.json";
  fs::path t = out() / "trace.json";
  Result r = RunOk({"run", Quickstart(), "--json", s.string(), "--trace", t.string()});
  EXPECT_NE(r.out.find("simulated time"), std::string::npos) << r;
  EXPECT_NE(r.out.find("lone"), std::string::npos) << r;
  EXPECT_EQ(Listing(out()), (std::set<std::string>{"summary.json", "trace.json"}));

  json j = ReadJson(s);
  EXPECT_EQ(j["devices"], 16);
  EXPECT_GT(j["events"].get<long>(), 0);
  EXPECT_GE(j["wall_time_s"].get<double>(), 0.0);
  ASSERT_TRUE(j["numerics"].is_object()) << j.dump();
  for (const char* k : {"checked", "max_abs_error", "passed"}) {
    EXPECT_TRUE(j["numerics"].contains(k)) << k;
  }

  const double bandwidth = 45e9, latency = 1e-6, size = 64 * kMiB;
  ASSERT_EQ(j["ops"].size(), 4u) << j.dump();
  std::map<std::string, json> ops;
  double last_end = 0;
  for (const json& op : j["ops"]) {
    ASSERT_TRUE(op.contains("start_s") && op.contains("end_s")) << op.dump();
    EXPECT_LT(op["start_s"].get<double>(), op["end_s"].get<double>()) << op.dump();
    for (const char* k : {"name", "op", "bytes", "algorithm"}) EXPECT_TRUE(op.contains(k)) << k;
    last_end = std::max(last_end, op["end_s"].get<double>());
    ops[op["name"].get<std::string>()] = op;
  }
  // Alone on its link: latency + S / B.
  ExpectWithinOnePercent(ops["lone"]["end_s"], latency + size / bandwidth, "lone");
  // Two flows share link 5->6 for their whole life: each gets half of it.
  ExpectWithinOnePercent(ops["shared-b"]["end_s"], latency + 2 * size / bandwidth, "shared-b");
  ExpectWithinOnePercent(ops["shared-a"]["end_s"], 2 * latency + 2 * size / bandwidth, "shared-a");
  // Corner to corner, 6 hops, started at 3 ms: half the bytes over each of the two minimal
  // routes (x then y, y then x), which share no link.
  ExpectWithinOnePercent(ops["corner"]["end_s"], 3e-3 + 6 * latency + 8 * kMiB / bandwidth,
                         "corner");
  EXPECT_DOUBLE_EQ(ops["corner"]["start_s"].get<double>(), 3e-3);
  EXPECT_DOUBLE_EQ(j["simulated_time_s"].get<double>(), last_end);

  ASSERT_EQ(j["per_device"].size(), 16u);
  for (int d = 0; d < 16; ++d) {
    const json& pd = j["per_device"][d];
    EXPECT_EQ(pd["device"], d);
    for (const char* k : {"compute_s", "comm_s", "exposed_comm_s", "idle_s"}) {
      EXPECT_GE(pd[k].get<double>(), 0.0) << "device " << d << " " << k;
    }
    EXPECT_NEAR(
        pd["comm_s"].get<double>() + pd["compute_s"].get<double>() + pd["idle_s"].get<double>(),
        last_end, 1e-9)
        << "device " << d;
  }
  EXPECT_DOUBLE_EQ(j["per_device"][2]["comm_s"].get<double>(), 0.0);  // Device 2 takes no part.

  json trace = ReadJson(t);
  ASSERT_TRUE(trace["traceEvents"].is_array());
  std::set<std::string> processes;
  int slices = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"]);
    if (e["ph"] == "X") ++slices;
  }
  EXPECT_EQ(processes.size(), 16u);
  EXPECT_TRUE(processes.count("/device:TPU:0"));
  EXPECT_GE(slices, 4);
}

TEST_F(CliTest, RunTraceIsByteIdenticalAcrossRuns) {
  fs::path a = out() / "a.json";
  fs::path b = out() / "b.json";
  RunOk({"run", Quickstart(), "--trace", a.string()});
  RunOk({"run", Quickstart(), "--trace", b.string()});
  std::string ta = ReadFile(a);
  EXPECT_FALSE(ta.empty());
  EXPECT_TRUE(ta == ReadFile(b)) << "traces of two identical runs differ";
}

TEST_F(CliTest, RunSetOverridesLinkBandwidth) {
  fs::path s = out() / "s.json";
  RunOk(
      {"run", Quickstart(), "--set", "hardware.link.bandwidth=\"90 GB/s\"", "--json", s.string()});
  json j = ReadJson(s);
  double lone = -1;
  for (const json& op : j["ops"]) {
    if (op["name"] == "lone") lone = op["end_s"];
  }
  ExpectWithinOnePercent(lone, 1e-6 + 64 * kMiB / 90e9, "lone at 90 GB/s");
}

// Two v5p slices joined by DCN (hardware.slices): the data axis takes the slices; a 4 MiB
// ppermute between a chip and its counterpart in the other slice goes chip -> DCN switch ->
// chip, so it takes the two DCN hops' latency (2 x 10 us) plus 4 MiB over one chip's DCN
// bandwidth (6.25e9 B/s, hardware.md): 691.089 us, to the picosecond the fluid model gives.
// Slices on a GPU preset are a located error.
TEST_F(CliTest, RunAcrossSlicesCrossesTheDcn) {
  const std::string file = WriteInput("slices.yaml",
                                      "hardware: {preset: tpu-v5p, shape: [4, 4, 4], slices: 2}\n"
                                      "mesh:\n"
                                      "  axes: {data: 2, fsdp: 64}\n"
                                      "arrays:\n"
                                      "  x: {shape: [128, 1048576], dtype: f32,\n"
                                      "      sharding: \"P(('data', 'fsdp'), None)\"}\n"
                                      "program:\n"
                                      "  - {op: ppermute, in: x, out: y, axis_name: data,\n"
                                      "     perm: [[0, 1], [1, 0]]}\n"
                                      "outputs:\n"
                                      "  y: \"P(('data', 'fsdp'), None)\"\n");
  fs::path s = out() / "s.json";
  const Result r = RunOk({"run", file, "--json", s.string()});
  EXPECT_NE(r.out.find("data -> slices (2, DCN)"), std::string::npos) << r.out;
  const json j = ReadJson(s);
  EXPECT_NEAR(j["simulated_time_s"].get<double>(), 20e-6 + 4 * kMiB / 6.25e9, 1e-12);
  const Result bad = Run({"run", file, "--set", "hardware={preset: h100-dgx, slices: 2}"});
  EXPECT_EQ(bad.exit_code, 2) << bad;
  EXPECT_NE(bad.err.find("(key hardware.slices)"), std::string::npos) << bad;
}

TEST_F(CliTest, RunSetCanBeRepeated) {
  fs::path s = out() / "s.json";
  RunOk({"run", Quickstart(), "--set", "hardware.link.bandwidth=90 GB/s", "--set",
         "hardware.link.latency=3 us", "--json", s.string()});
  json j = ReadJson(s);
  ExpectWithinOnePercent(j["ops"][0]["end_s"], 3e-6 + 64 * kMiB / 90e9, "lone");
}

TEST_F(CliTest, RunFailedSecondOutputLeavesNoFirstOutput) {
  Result r = Run({"run", Quickstart(), "--trace", (out() / "trace.json").string(), "--json",
                  (out() / "missing_dir" / "s.json").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty());
}

TEST_F(CliTest, RunOutputPathIsADirectoryLeavesNoOtherOutput) {
  fs::create_directory(out() / "taken");
  Result r = Run({"run", Quickstart(), "--trace", (out() / "trace.json").string(), "--json",
                  (out() / "taken").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Listing(out()), std::set<std::string>{"taken"});
  EXPECT_TRUE(fs::is_empty(out() / "taken"));
}

TEST_F(CliTest, RunTraceStreamsIntoPlaceAndLeavesNoTemporaryFile) {
  fs::path t = out() / "trace.json";
  RunOk({"run", Quickstart(), "--trace", t.string()});
  EXPECT_EQ(Listing(out()), std::set<std::string>{"trace.json"});
  json trace = ReadJson(t);
  int slices = 0;
  for (const json& e : trace["traceEvents"]) slices += e["ph"] == "X";
  // A slice per hop and a receive slice per transfer part: 2 + 3 + 2, and the corner
  // transfer's two routes of 6 hops, 2 x 7.
  EXPECT_EQ(slices, 21);
}

TEST_F(CliTest, RunTraceDevicesKeepsOnlyThoseDevices) {
  fs::path t = out() / "trace.json";
  RunOk({"run", Quickstart(), "--trace", t.string(), "--trace-devices", "0-1,5"});
  json trace = ReadJson(t);
  std::set<int> pids;
  for (const json& e : trace["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1, 5}));
}

// One refused output request: exit 2, one error line with `fragment`, no output files.
struct BadOutputCase {
  std::string name;               // Test name.
  std::vector<std::string> args;  // Arguments; "OUT/" is replaced by the output folder.
  std::string fragment;           // Text the error line must contain.
};

void PrintTo(const BadOutputCase& c, std::ostream* os) { *os << c.name; }

class BadOutputTest : public CliTest, public testing::WithParamInterface<BadOutputCase> {};

TEST_P(BadOutputTest, ExitsTwoWithOneLineAndNoOutput) {
  std::vector<std::string> args;
  for (std::string a : GetParam().args) {
    if (a.starts_with("OUT/")) a = (out() / a.substr(4)).string();
    if (a == "QUICKSTART") a = Quickstart();
    args.push_back(a);
  }
  Result r = Run(args);
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find(GetParam().fragment), std::string::npos) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Outputs, BadOutputTest,
    testing::Values(
        BadOutputCase{"JsonAndTraceOnOnePath",
                      {"run", "QUICKSTART", "--json", "OUT/x.json", "--trace", "OUT/x.json"},
                      "--trace and --json name the same file"},
        BadOutputCase{"JsonAndTraceOnOnePathSpelledTwoWays",
                      {"run", "QUICKSTART", "--json", "OUT/x.json", "--trace", "OUT/./x.json"},
                      "name the same file"},
        BadOutputCase{"TraceDevicesOutOfRange",
                      {"run", "QUICKSTART", "--trace", "OUT/t.json", "--trace-devices", "0-16"},
                      "--trace-devices 0-16: 16 is out of range (0..15)"},
        BadOutputCase{"TraceDevicesMalformed",
                      {"run", "QUICKSTART", "--trace", "OUT/t.json", "--trace-devices", "3-1"},
                      "range 3-1 runs backwards"},
        BadOutputCase{"TraceDevicesWithoutTrace",
                      {"run", "QUICKSTART", "--trace-devices", "0"},
                      "--trace-devices needs --trace"},
        BadOutputCase{"TopoJsonAndDotOnOnePath",
                      {"topo", "h100-dgx", "--json", "OUT/t", "--dot", "OUT/t"},
                      "--json and --dot name the same file"},
        BadOutputCase{"TopoZeroNodes",
                      {"topo", "h100-dgx", "--nodes", "0", "--json", "OUT/t.json"},
                      "--nodes 0: expected a positive number of nodes"},
        BadOutputCase{"TopoNegativeNodes",
                      {"topo", "h100-dgx", "--nodes", "-3", "--json", "OUT/t.json"},
                      "--nodes -3: expected a positive number of nodes"},
        BadOutputCase{"CollectiveZeroNodes",
                      {"collective", "--hardware", "h100-dgx", "--nodes", "0", "--mesh", "x=8",
                       "--op", "psum", "--axis", "x", "--csv", "OUT/c.csv"},
                      "--nodes 0: expected a positive number of nodes"},
        BadOutputCase{"CollectiveHugeSizesWithNumerics",
                      {"collective", "--hardware", "tpu-v5e", "--shape", "4x4", "--mesh", "x=16",
                       "--op", "psum", "--axis", "x", "--sizes", "1TiB:1PiB", "--numerics", "on",
                       "--csv", "OUT/c.csv"},
                      "of host memory, over the 4 GiB budget of --numerics on"},
        BadOutputCase{"CollectiveSizesPastTheTimeRange",
                      {"collective", "--hardware", "tpu-v5e", "--shape", "4x4", "--mesh", "x=16",
                       "--op", "psum", "--axis", "x", "--sizes", "8000PiB", "--csv", "OUT/c.csv"},
                      "--sizes 8000PiB: a transfer of"},
        BadOutputCase{"ShowShardingHugeMesh",
                      {"show-sharding", "--mesh", "dp=100000,tp=100000", "--shape", "1024x4096",
                       "--spec", "P('dp', None)"},
                      "more than 65536 devices"}),
    [](const testing::TestParamInfo<BadOutputCase>& info) { return info.param.name; });

TEST_F(CliTest, CollectiveHugeSizesRunTimingOnly) {
  Result r = RunOk({"collective", "--hardware", "tpu-v5e", "--shape", "4x4", "--mesh", "x=16",
                    "--op", "psum", "--axis", "x", "--sizes", "1TiB:1PiB"});
  EXPECT_NE(r.out.find("1125899906842624"), std::string::npos) << r;  // 1 PiB, the last row.
}

TEST_F(CliTest, RunOpTableColumnsFitLongOpNames) {
  const std::string name(40, 'n');
  std::string file = WriteInput("long.yaml",
                                "hardware: {preset: tpu-v5e, shape: [2, 2]}\n"
                                "transfers:\n  - {name: " +
                                    name + ", src: 0, dst: 1, bytes: 1 MiB}\n");
  Result r = RunOk({"run", file});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(name + "( +)transfer( +)1 MiB"))) << r;
  EXPECT_GE(m[1].length(), 2) << r;
  // The header's columns line up with the rows'.
  size_t header = r.out.find("op ");
  size_t kind = r.out.find("kind", header);
  size_t row = r.out.rfind('\n', r.out.find(name)) + 1;
  EXPECT_EQ(kind - header, r.out.find("transfer", row) - row) << r;
}

// ---------------------------------------------------------------------------------------------
// Bad input through the CLI: exit 2, one line on stderr, nothing on stdout, no output files.

// One bad invocation of `shardsim run`.
struct BadRunCase {
  std::string name;                    // Test name.
  std::optional<std::string> yaml;     // Run file text written to in/run.yaml; nullopt: none.
  std::vector<std::string> extra;      // Extra arguments after the file.
  int line;                            // Line of the file the error must point at; 0: none.
  std::vector<std::string> fragments;  // Text stderr must contain.
};

void PrintTo(const BadRunCase& c, std::ostream* os) { *os << c.name; }

class BadRunTest : public CliTest, public testing::WithParamInterface<BadRunCase> {};

TEST_P(BadRunTest, ExitsTwoWithOneLocatedLineAndNoOutput) {
  const BadRunCase& c = GetParam();
  const std::string file = (in() / "run.yaml").string();
  if (c.yaml) WriteFile(file, *c.yaml);
  std::vector<std::string> args = {"run",     file,
                                   "--json",  (out() / "summary.json").string(),
                                   "--trace", (out() / "trace.json").string()};
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  Result r = Run(args);

  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  if (c.line > 0) {
    EXPECT_TRUE(r.err.starts_with("error: " + file + ":" + std::to_string(c.line) + ":")) << r;
    EXPECT_TRUE(std::regex_search(r.err, std::regex(":[0-9]+:[0-9]+: "))) << r;  // FILE:LINE:COL
  }
  for (const std::string& f : c.fragments) {
    EXPECT_NE(r.err.find(f), std::string::npos) << "missing \"" << f << "\"\n" << r;
  }
  EXPECT_EQ(r.out, "") << r;
  // No output file, no temporary left behind.
  EXPECT_EQ(Listing(out()), std::set<std::string>{}) << "files left in the output folder";
  EXPECT_EQ(Listing(in()).size(), c.yaml ? 1u : 0u);
}

const char kTransfer[] = "transfers:\n  - {src: 0, dst: 1, bytes: 1 MiB}\n";

INSTANTIATE_TEST_SUITE_P(
    Cli, BadRunTest,
    testing::Values(
        BadRunCase{"BadUnit",
                   std::string("hardware:\n  preset: tpu-v5e\n  link:\n    bandwidth: 45 GX/s\n") +
                       kTransfer,
                   {},
                   4,
                   {"\"45 GX/s\"", "GB/s", "(key hardware.link.bandwidth)"}},
        BadRunCase{
            "UnknownKeyDidYouMean",
            std::string("hardware:\n  preset: tpu-v5e\n  link: {bandwith: 45 GB/s}\n") + kTransfer,
            {},
            3,
            {"unknown key 'bandwith'", "did you mean 'bandwidth'?"}},
        BadRunCase{"UnknownTopLevelKey",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer +
                       "optoins:\n  numerics: on\n",
                   {},
                   5,
                   {"did you mean 'options'?"}},
        BadRunCase{"MissingField",
                   "hardware:\n  preset: tpu-v5e\ntransfers:\n  - {src: 0, dst: 1, bytes: 1 MiB}\n"
                   "  - {src: 2, bytes: 4 KiB}\n",
                   {},
                   5,
                   {"missing required key 'dst'", "(key transfers.1.dst)"}},
        BadRunCase{
            "WrongType",
            "hardware:\n  preset: tpu-v5e\ntransfers:\n  - {src: zero, dst: 1, bytes: 1 MiB}\n",
            {},
            4,
            {"expected an integer, got \"zero\""}},
        BadRunCase{
            "YamlSyntax",
            std::string("hardware:\n  preset: tpu-v5e\n  link: {bandwidth: 45 GB/s, latency: 1 "
                        "us\n") +
                kTransfer,
            {},
            4,
            {"invalid YAML"}},
        BadRunCase{"UnknownPresetListsKnownOnes",
                   std::string("hardware:\n  preset: tpu-v9\n  shape: [4, 4]\n") + kTransfer,
                   {},
                   2,
                   {"unknown preset 'tpu-v9'", "Known presets:", "tpu-v5e", "h100-dgx",
                    "(key hardware.preset)"}},
        BadRunCase{"ShapeRankWrongForPreset",
                   std::string("hardware:\n  preset: tpu-v5e\n  shape: [4, 4, 4]\n") + kTransfer,
                   {},
                   3,
                   {"2 dimensions", "(key hardware.shape)"}},
        BadRunCase{
            "TransferDstOutOfRange",
            "hardware:\n  preset: tpu-v5e\n  shape: [4, 4]\ntransfers:\n"
            "  - {src: 0, dst: 1, bytes: 1 MiB}\n  - src: 0\n    dst: 99\n    bytes: 1 MiB\n",
            {},
            7,
            {"dst 99 is not a device", "0..15", "(key transfers.1.dst)"}},
        BadRunCase{"BareNumberBandwidth",
                   std::string("hardware:\n  preset: tpu-v5e\n  link: {bandwidth: 45, latency: 1 "
                               "us}\n") +
                       kTransfer,
                   {},
                   3,
                   {"in \"45\""}},
        BadRunCase{"NegativeBytes",
                   "hardware:\n  preset: tpu-v5e\ntransfers:\n  - src: 0\n    dst: 1\n"
                   "    bytes: -4096\n",
                   {},
                   6,
                   {"non-negative"}},
        BadRunCase{"DuplicateKey",
                   std::string("hardware:\n  preset: tpu-v5e\n  preset: tpu-v4\n") + kTransfer,
                   {},
                   3,
                   {"duplicate key 'preset'"}},
        BadRunCase{"NumericsTypoInFile",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer +
                       "options:\n  numerics: of\n",
                   {},
                   6,
                   {"did you mean 'off'?"}},
        BadRunCase{"EmptyFile", "", {}, 1, {"got nothing"}},
        BadRunCase{"MissingFile", std::nullopt, {}, 0, {"run.yaml", "cannot open"}},
        BadRunCase{"NumericsFlagBogus",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer,
                   {"--numerics", "bogus"},
                   0,
                   {"--numerics", "bogus"}},
        BadRunCase{"SetWithoutEquals",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer,
                   {"--set", "hardware.nodes"},
                   0,
                   {"--set hardware.nodes", "KEY=VALUE"}},
        BadRunCase{"SetUnknownKey",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer,
                   {"--set", "hardware.link.bandwith=90 GB/s"},
                   0,
                   {"--set hardware.link.bandwith", "did you mean 'bandwidth'?"}},
        BadRunCase{"SetBareNumberBandwidth",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer,
                   {"--set", "hardware.link.bandwidth=90"},
                   0,
                   {"--set hardware.link.bandwidth", "in \"90\""}},
        BadRunCase{"SetShapeWrongRank",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer,
                   {"--set", "hardware.shape=[2,2,2]"},
                   0,
                   {"--set hardware.shape", "2 dimensions"}},
        BadRunCase{"UnknownFlag",
                   std::string("hardware:\n  preset: tpu-v5e\n") + kTransfer,
                   {"--frobnicate"},
                   0,
                   {"--frobnicate"}}),
    [](const testing::TestParamInfo<BadRunCase>& info) { return info.param.name; });

// The bad files kept under tests/cli/data/ fail through the CLI just as through the loader.
struct DataFileCase {
  std::string name;  // Test name.
  std::string file;  // File under tests/cli/data/.
  int line;          // Line the error points at.
};

void PrintTo(const DataFileCase& c, std::ostream* os) { *os << c.name; }

class BadDataFileTest : public CliTest, public testing::WithParamInterface<DataFileCase> {};

TEST_P(BadDataFileTest, ExitsTwoWithOneLocatedLineAndNoOutput) {
  const std::string file = SourceDir() + "/tests/cli/data/" + GetParam().file;
  Result r = Run(
      {"run", file, "--json", (out() / "s.json").string(), "--trace", (out() / "t.json").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_TRUE(r.err.starts_with("error: " + file + ":" + std::to_string(GetParam().line) + ":"))
      << r;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Data, BadDataFileTest,
    testing::Values(DataFileCase{"GraphLinkOutOfRange", "bad_graph_link.yaml", 7},
                    DataFileCase{"KeyOfAnotherKind", "bad_kind_key.yaml", 2},
                    DataFileCase{"PresetAndTopology", "bad_preset_and_topology.yaml", 3},
                    DataFileCase{"ProgramNotSupported", "bad_program.yaml", 3},
                    DataFileCase{"ShapeIsMapping", "bad_shape_mapping.yaml", 3},
                    DataFileCase{"TopLevelList", "bad_top_level_list.yaml", 1},
                    DataFileCase{"TopologyKindTypo", "bad_topology_kind.yaml", 3},
                    DataFileCase{"TransfersIsMapping", "bad_transfers_mapping.yaml", 4},
                    DataFileCase{"WraparoundNotBool", "bad_wraparound.yaml", 4},
                    DataFileCase{"ZeroNodes", "bad_zero_nodes.yaml", 3},
                    DataFileCase{"HugeBytes", "bad_huge_bytes.yaml", 6},
                    DataFileCase{"HugeStartTime", "bad_huge_at.yaml", 4},
                    DataFileCase{"HugeLatency", "bad_huge_latency.yaml", 3},
                    DataFileCase{"InfiniteBandwidth", "bad_infinite_bandwidth.yaml", 3},
                    DataFileCase{"FlopRateTooSlowForTheProgram", "bad_slow_flops.yaml", 6},
                    DataFileCase{"SecondDocument", "bad_two_documents.yaml", 6}),
    [](const testing::TestParamInfo<DataFileCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Usage

TEST_F(CliTest, HelpListsSubcommands) {
  Result r = RunOk({"--help"});
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\btopo\b)"))) << r;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\brun\b)"))) << r;
}

TEST_F(CliTest, SubcommandHelpListsOptions) {
  Result run = RunOk({"run", "--help"});
  for (const char* flag : {"--trace", "--json", "--numerics", "--set"}) {
    EXPECT_NE(run.out.find(flag), std::string::npos) << flag << "\n" << run;
  }
  Result topo = RunOk({"topo", "--help"});
  for (const char* flag : {"--shape", "--nodes", "--dot", "--json"}) {
    EXPECT_NE(topo.out.find(flag), std::string::npos) << flag << "\n" << topo;
  }
}

TEST_F(CliTest, UnknownSubcommandIsOneLineExitTwo) {
  Result r = Run({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_EQ(r.out, "");
}

TEST_F(CliTest, NoSubcommandIsOneLineExitTwo) {
  Result r = Run({});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
}

TEST_F(CliTest, RunWithoutFileIsOneLineExitTwo) {
  Result r = Run({"run"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_EQ(r.out, "");
}

}  // namespace
