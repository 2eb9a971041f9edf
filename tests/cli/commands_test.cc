// End-to-end tests of `shardsim collective`, `shardsim show-sharding`, `shardsim run --dump`
// and the example run files under configs/: the real binary, its exit code, stdout, stderr
// and output files, checked against SPEC.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/array.h"
#include "collectives/npy.h"
#include "tests/cli/subprocess.h"
#include "topology/presets.h"

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

std::string Config(const std::string& name) { return SourceDir() + "/configs/" + name; }

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::stringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

// ---------------------------------------------------------------------------------------------
// The CSV of `shardsim collective --csv`.

struct CsvRow {
  int64_t size_bytes = 0;
  int64_t count = 0;
  std::string algorithm;
  double time_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
};

// Parses the sweep CSV; fails the test on a malformed header or row.
std::vector<CsvRow> ParseSweepCsv(const std::string& text) {
  std::vector<CsvRow> rows;
  std::vector<std::string> lines = Split(text, '\n');
  EXPECT_FALSE(text.empty()) << "empty CSV";
  if (lines.empty()) return rows;
  EXPECT_EQ(lines[0], "size_bytes,count,algorithm,time_us,algbw_gbps,busbw_gbps");
  EXPECT_EQ(text.back(), '\n') << "the CSV's last line is not terminated";
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = Split(lines[i], ',');
    EXPECT_EQ(f.size(), 6u) << "CSV line " << i + 1 << ": " << lines[i];
    if (f.size() != 6) continue;
    CsvRow r;
    size_t used = 0;
    try {
      r.size_bytes = std::stoll(f[0], &used);
      EXPECT_EQ(used, f[0].size()) << lines[i];
      r.count = std::stoll(f[1], &used);
      EXPECT_EQ(used, f[1].size()) << lines[i];
      r.algorithm = f[2];
      r.time_us = std::stod(f[3], &used);
      EXPECT_EQ(used, f[3].size()) << lines[i];
      r.algbw_gbps = std::stod(f[4], &used);
      EXPECT_EQ(used, f[4].size()) << lines[i];
      r.busbw_gbps = std::stod(f[5], &used);
      EXPECT_EQ(used, f[5].size()) << lines[i];
    } catch (const std::exception& e) {
      ADD_FAILURE() << "CSV line " << i + 1 << " does not parse: " << lines[i];
      continue;
    }
    rows.push_back(r);
  }
  return rows;
}

// The columns agree with each other: algbw = size / time, busbw = algbw * factor, to the
// CSV's printed precision (6 decimals).
void ExpectConsistentRow(const CsvRow& r, double factor) {
  SCOPED_TRACE("row of " + std::to_string(r.size_bytes) + " bytes");
  EXPECT_GT(r.time_us, 0.0);
  EXPECT_EQ(r.count, r.size_bytes / 4);  // float32 elements.
  double algbw = static_cast<double>(r.size_bytes) / (r.time_us * 1e-6) / 1e9;
  EXPECT_NEAR(r.algbw_gbps, algbw, 1e-6 * algbw + 1e-6);
  // Each printed value is rounded by at most 0.5e-6.
  EXPECT_NEAR(r.busbw_gbps, r.algbw_gbps * factor, 0.5e-6 * (1 + factor) + 1e-9);
}

// ---------------------------------------------------------------------------------------------
// A minimal .npy reader, independent of shardsim's.

struct Npy {
  int major = 0;
  std::string header;  // The header's dict text.
  std::string descr;   // '<f4'
  bool fortran_order = true;
  std::vector<int64_t> shape;
  size_t data_offset = 0;   // Where the array data starts.
  std::vector<float> data;  // Only for descr '<f4'.
};

// Parses `bytes` as a .npy file; fails the test where it is not one.
Npy ParseNpy(const std::string& bytes) {
  Npy n;
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    ADD_FAILURE() << "no .npy magic";
    return n;
  }
  n.major = static_cast<unsigned char>(bytes[6]);
  EXPECT_TRUE(n.major >= 1 && n.major <= 3) << "version " << n.major;
  size_t header_len = 0, prefix = 0;
  auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(bytes[i])); };
  if (n.major == 1) {
    header_len = byte(8) | byte(9) << 8;
    prefix = 10;
  } else {
    if (bytes.size() < 12) {
      ADD_FAILURE() << "truncated .npy preamble";
      return n;
    }
    header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    prefix = 12;
  }
  n.data_offset = prefix + header_len;
  if (bytes.size() < n.data_offset) {
    ADD_FAILURE() << "header runs past the end of the file";
    return n;
  }
  EXPECT_EQ(n.data_offset % 16, 0u) << "array data must start 16-byte aligned";
  n.header = bytes.substr(prefix, header_len);
  EXPECT_EQ(n.header.back(), '\n') << "the header must end with a newline";
  std::smatch m;
  static const std::regex kDict(R"(^\{.*\}\s*$)");
  EXPECT_TRUE(std::regex_match(n.header, kDict)) << n.header;
  if (std::regex_search(n.header, m, std::regex(R"('descr'\s*:\s*'([^']*)')"))) {
    n.descr = m[1];
  } else {
    ADD_FAILURE() << "no descr in " << n.header;
  }
  if (std::regex_search(n.header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))"))) {
    n.fortran_order = m[1] == "True";
  } else {
    ADD_FAILURE() << "no fortran_order in " << n.header;
  }
  if (std::regex_search(n.header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) {
    for (const std::string& d : Split(m[1], ',')) {
      std::string t = std::regex_replace(d, std::regex(R"(\s+)"), "");
      if (!t.empty()) n.shape.push_back(std::stoll(t));
    }
  } else {
    ADD_FAILURE() << "no shape in " << n.header;
  }
  if (n.descr == "<f4") {
    int64_t elements = 1;
    for (int64_t d : n.shape) elements *= d;
    EXPECT_EQ(bytes.size() - n.data_offset, static_cast<size_t>(elements) * 4)
        << "data size does not match the shape";
    if (bytes.size() - n.data_offset == static_cast<size_t>(elements) * 4) {
      n.data.resize(elements);
      std::memcpy(n.data.data(), bytes.data() + n.data_offset, elements * 4);
    }
  }
  return n;
}

// ---------------------------------------------------------------------------------------------

class CommandsTest : public shardsim::cli_test::CliFixture {
 protected:
  json ReadJson(const fs::path& path) const {
    EXPECT_TRUE(fs::exists(path)) << path;
    return json::parse(ReadFile(path));
  }

  // Runs a collective sweep with --csv and returns its parsed rows.
  std::vector<CsvRow> Sweep(std::vector<std::string> args, Result* result = nullptr) const {
    fs::path csv = out() / "sweep.csv";
    args.insert(args.begin(), "collective");
    args.push_back("--csv");
    args.push_back(csv.string());
    Result r = RunOk(args);
    if (result) *result = r;
    EXPECT_TRUE(fs::exists(csv)) << r;
    std::vector<CsvRow> rows = ParseSweepCsv(ReadFile(csv));
    fs::remove(csv);
    return rows;
  }
};

const std::vector<std::string> kV5e4x4 = {"--hardware", "tpu-v5e", "--shape",
                                          "4x4",        "--mesh",  "x=4,y=4"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---------------------------------------------------------------------------------------------
// shardsim collective

TEST_F(CommandsTest, CollectivePsumSweepCsv) {
  fs::path csv = out() / "psum.csv";
  Result r = RunOk({"collective", "--hardware", "tpu-v5e", "--shape", "4x4", "--mesh", "x=4,y=4",
                    "--op", "psum", "--axis", "x", "--sizes", "1MiB:4MiB", "--csv", csv.string()});
  EXPECT_EQ(Listing(out()), std::set<std::string>{"psum.csv"});
  std::vector<CsvRow> rows = ParseSweepCsv(ReadFile(csv));
  ASSERT_EQ(rows.size(), 3u) << ReadFile(csv);
  const int64_t sizes[] = {1 << 20, 2 << 20, 4 << 20};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].size_bytes, sizes[i]);
    ExpectConsistentRow(rows[i], 2.0 * 3 / 4);  // psum: 2 (n-1)/n, n = 4.
    if (i > 0) {
      EXPECT_GT(rows[i].time_us, rows[i - 1].time_us) << "time must grow with size";
    }
  }
  // The table on stdout names the columns and has one line per size.
  for (const char* column : {"size", "time", "algbw", "busbw"}) {
    EXPECT_NE(r.out.find(column), std::string::npos) << column << "\n" << r;
  }
  for (int64_t s : sizes) {
    EXPECT_TRUE(std::regex_search(r.out, std::regex("(^|\\n)\\s*" + std::to_string(s) + "\\s")))
        << s << "\n"
        << r;
  }
}

// The nccl-tests bus bandwidth factor of each op over a group of n = 4.
struct FactorCase {
  std::string op;
  double factor;
};

void PrintTo(const FactorCase& c, std::ostream* os) { *os << c.op; }

class CollectiveFactorTest : public CommandsTest, public testing::WithParamInterface<FactorCase> {};

TEST_P(CollectiveFactorTest, BusBandwidthIsAlgBandwidthTimesFactor) {
  std::vector<CsvRow> rows =
      Sweep(kV5e4x4 + std::vector<std::string>{"--op", GetParam().op, "--axis", "y", "--sizes",
                                               "64KiB:256KiB"});
  ASSERT_EQ(rows.size(), 3u);
  for (const CsvRow& r : rows) ExpectConsistentRow(r, GetParam().factor);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, CollectiveFactorTest,
    testing::Values(FactorCase{"psum", 1.5}, FactorCase{"pmean", 1.5}, FactorCase{"pmax", 1.5},
                    FactorCase{"pmin", 1.5}, FactorCase{"all_gather", 0.75},
                    FactorCase{"psum_scatter", 0.75}, FactorCase{"all_to_all", 0.75},
                    FactorCase{"ppermute", 1.0}),
    [](const testing::TestParamInfo<FactorCase>& info) { return info.param.op; });

TEST_F(CommandsTest, CollectiveAllGatherRingReportsAlgorithm) {
  std::vector<CsvRow> rows =
      Sweep(kV5e4x4 + std::vector<std::string>{"--op", "all_gather", "--axis", "x", "--sizes",
                                               "1MiB:4MiB", "--algorithm", "ring"});
  ASSERT_EQ(rows.size(), 3u);
  for (const CsvRow& r : rows) {
    EXPECT_EQ(r.algorithm, "ring");
    ExpectConsistentRow(r, 3.0 / 4);  // all_gather: (n-1)/n.
  }
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_GT(rows[i].time_us, rows[i - 1].time_us);
}

// The algorithm column reports the algorithm asked for, not only what auto would pick.
TEST_F(CommandsTest, CollectiveAlgorithmColumnFollowsTheFlag) {
  for (const char* algorithm : {"ring", "direct", "bidirectional_ring"}) {
    SCOPED_TRACE(algorithm);
    Result r;
    std::vector<CsvRow> rows =
        Sweep(kV5e4x4 + std::vector<std::string>{"--op", "psum", "--axis", "x", "--sizes", "256KiB",
                                                 "--algorithm", algorithm},
              &r);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].algorithm, algorithm);
    EXPECT_NE(r.out.find(algorithm), std::string::npos) << r;
  }
}

TEST_F(CommandsTest, CollectiveNumericsOnPasses) {
  for (const char* op : {"psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"}) {
    for (const char* axis : {"x", "x,y"}) {
      SCOPED_TRACE(std::string(op) + " over " + axis);
      Result r = RunOk(std::vector<std::string>{"collective"} + kV5e4x4 +
                       std::vector<std::string>{"--op", op, "--axis", axis, "--sizes",
                                                "64KiB:128KiB", "--numerics", "on"});
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 4) << r;  // 2 headers, 2 rows.
    }
  }
}

// NVSwitch, as NCCL runs it: a ring all_gather of S bytes is NCCL's launch latency, then 7
// steps of one GPU -> switch -> GPU crossing (two 0.5 us hops) plus the protocol's step
// latency, and (n-1)/n * S over one 450 GB/s NVLink direction at the preset's achievable
// fraction (CommSpec, read from the preset) and the protocol's efficiency.
TEST_F(CommandsTest, CollectiveH100AllGatherClosedForm) {
  std::vector<CsvRow> rows = Sweep({"--hardware", "h100-dgx", "--mesh", "g=8", "--op", "all_gather",
                                    "--axis", "g", "--sizes", "64MiB"});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].size_bytes, 64 * 1024 * 1024);
  // The tuner's protocol, whichever it is, with its figures.
  ASSERT_EQ(rows[0].algorithm.substr(0, 5), "ring/");
  const std::optional<shardsim::Protocol> protocol =
      shardsim::ParseProtocol(rows[0].algorithm.substr(5));
  ASSERT_TRUE(protocol.has_value()) << rows[0].algorithm;
  const shardsim::CommSpec comm = shardsim::BuildPreset("h100-dgx").comm();
  const shardsim::ProtocolSpec& spec = comm.protocol(*protocol);
  double expected_us =
      comm.launch_latency.microseconds() + 7 * (1.0 + spec.step_latency.microseconds()) +
      (7.0 / 8) * 64 * kMiB / (450e9 * comm.nvlink_efficiency * spec.efficiency) * 1e6;
  EXPECT_NEAR(rows[0].time_us, expected_us, 0.01 * expected_us);
  ExpectConsistentRow(rows[0], 7.0 / 8);
}

// Bad input: exit 2, one line on stderr, nothing on stdout, no CSV.
struct BadCollectiveCase {
  std::string name;
  std::vector<std::string> args;
  std::vector<std::string> fragments;  // Text stderr must contain.
};

void PrintTo(const BadCollectiveCase& c, std::ostream* os) { *os << c.name; }

class BadCollectiveTest : public CommandsTest,
                          public testing::WithParamInterface<BadCollectiveCase> {};

TEST_P(BadCollectiveTest, ExitsTwoWithOneLineAndNoCsv) {
  std::vector<std::string> args = {"collective", "--hardware", "tpu-v5e", "--shape", "4x4"};
  args = args + GetParam().args + std::vector<std::string>{"--csv", (out() / "sweep.csv").string()};
  Result r = Run(args);
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  for (const std::string& f : GetParam().fragments) {
    EXPECT_NE(r.err.find(f), std::string::npos) << "missing \"" << f << "\"\n" << r;
  }
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty());
}

INSTANTIATE_TEST_SUITE_P(
    Cli, BadCollectiveTest,
    testing::Values(
        BadCollectiveCase{"UnknownOp",
                          {"--mesh", "x=4,y=4", "--op", "psumm", "--axis", "x"},
                          {"--op psumm", "psum"}},
        BadCollectiveCase{
            "UnknownAxis", {"--mesh", "x=4,y=4", "--op", "psum", "--axis", "z"}, {"--axis", "'z'"}},
        BadCollectiveCase{"SizesWithoutMax",
                          {"--mesh", "x=4,y=4", "--op", "psum", "--axis", "x", "--sizes", "1KiB:"},
                          {"--sizes 1KiB:"}},
        BadCollectiveCase{
            "SizesMinOverMax",
            {"--mesh", "x=4,y=4", "--op", "psum", "--axis", "x", "--sizes", "2KiB:1KiB"},
            {"--sizes 2KiB:1KiB"}},
        BadCollectiveCase{
            "SizesBareNumberStep",
            {"--mesh", "x=4,y=4", "--op", "psum", "--axis", "x", "--sizes", "1KiB:4KiB:1"},
            {"--sizes"}},
        BadCollectiveCase{"MeshDoesNotMatchDevices",
                          {"--mesh", "x=4,y=2", "--op", "psum", "--axis", "x"},
                          {"--mesh x=4,y=2", "16"}},
        BadCollectiveCase{"UnknownAlgorithm",
                          {"--mesh", "x=4,y=4", "--op", "psum", "--axis", "x", "--sizes", "1KiB",
                           "--algorithm", "bogus"},
                          {"bogus"}},
        BadCollectiveCase{
            "BadMeshSyntax", {"--mesh", "x4", "--op", "psum", "--axis", "x"}, {"--mesh"}}),
    [](const testing::TestParamInfo<BadCollectiveCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// shardsim show-sharding

// The text of each non-blank grid cell, row by row, from a `visualize_array_sharding`-style
// drawing: cells are delimited by '|'; a row of cells spans several lines, of which the one
// with text counts.
std::vector<std::vector<std::string>> GridCells(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  static const std::regex kCellLine(R"(^\|.*\|\s*$)");
  for (const std::string& line : Split(text, '\n')) {
    if (!std::regex_match(line, kCellLine)) continue;
    std::vector<std::string> cells;
    bool any = false;
    std::string inner = line.substr(1, line.rfind('|') - 1);
    for (const std::string& cell : Split(inner, '|')) {
      std::string t = std::regex_replace(cell, std::regex(R"(^\s+|\s+$)"), "");
      any = any || !t.empty();
      cells.push_back(t);
    }
    if (any) rows.push_back(cells);
  }
  return rows;
}

TEST_F(CommandsTest, ShowShardingRowsOverDp) {
  Result r = RunOk(
      {"show-sharding", "--mesh", "dp=4,tp=2", "--shape", "1024x4096", "--spec", "P('dp', None)"});
  EXPECT_NE(r.out.find("f32[1024@dp,4096]"), std::string::npos) << r;
  EXPECT_NE(r.out.find("f32[256,4096]"), std::string::npos) << r;
  std::vector<std::vector<std::string>> grid = GridCells(r.out);
  ASSERT_EQ(grid.size(), 4u) << r;
  std::set<std::string> devices;
  for (const auto& row : grid) {
    ASSERT_EQ(row.size(), 1u) << r;
    EXPECT_TRUE(std::regex_match(row[0], std::regex(R"(\d+,\d+)"))) << row[0];
    for (const std::string& d : Split(row[0], ',')) devices.insert(d);
  }
  EXPECT_EQ(devices.size(), 8u) << r;  // Every device holds exactly one block.
  // Row-major mesh: dp block i is held by devices 2i and 2i+1 (replicated over tp).
  EXPECT_EQ(grid[0][0], "0,1");
  EXPECT_EQ(grid[3][0], "6,7");
}

TEST_F(CommandsTest, ShowShardingTupleOfAxes) {
  Result r = RunOk({"show-sharding", "--mesh", "dp=4,tp=2", "--shape", "1024x4096", "--spec",
                    "P(('dp','tp'), None)"});
  EXPECT_NE(r.out.find("1024@(dp,tp)"), std::string::npos) << r;
  EXPECT_NE(r.out.find("f32[128,4096]"), std::string::npos) << r;
  std::vector<std::vector<std::string>> grid = GridCells(r.out);
  ASSERT_EQ(grid.size(), 8u) << r;
  for (size_t i = 0; i < grid.size(); ++i) {
    ASSERT_EQ(grid[i].size(), 1u) << r;
    EXPECT_EQ(grid[i][0], std::to_string(i)) << r;  // First axis major: dp*2 + tp.
  }
}

TEST_F(CommandsTest, ShowShardingTwoDimensionalGrid) {
  Result r = RunOk(
      {"show-sharding", "--mesh", "dp=4,tp=2", "--shape", "1024x4096", "--spec", "P('dp', 'tp')"});
  EXPECT_NE(r.out.find("f32[1024@dp,4096@tp]"), std::string::npos) << r;
  EXPECT_NE(r.out.find("f32[256,2048]"), std::string::npos) << r;
  std::vector<std::vector<std::string>> grid = GridCells(r.out);
  ASSERT_EQ(grid.size(), 4u) << r;
  for (size_t i = 0; i < grid.size(); ++i) {
    EXPECT_EQ(grid[i], (std::vector<std::string>{std::to_string(2 * i), std::to_string(2 * i + 1)}))
        << r;
  }
}

struct BadShowCase {
  std::string name;
  std::string shape;
  std::string spec;
  std::vector<std::string> fragments;
};

void PrintTo(const BadShowCase& c, std::ostream* os) { *os << c.name; }

class BadShowShardingTest : public CommandsTest, public testing::WithParamInterface<BadShowCase> {};

TEST_P(BadShowShardingTest, ExitsTwoWithOneLine) {
  Result r = Run({"show-sharding", "--mesh", "dp=4,tp=2", "--shape", GetParam().shape, "--spec",
                  GetParam().spec});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  for (const std::string& f : GetParam().fragments) {
    EXPECT_NE(r.err.find(f), std::string::npos) << "missing \"" << f << "\"\n" << r;
  }
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Cli, BadShowShardingTest,
    testing::Values(BadShowCase{"UnknownAxis", "1024x4096", "P('xx', None)", {"--spec", "'xx'"}},
                    BadShowCase{"NotDividing", "1022x4096", "P('dp', None)", {"--spec", "1022"}},
                    BadShowCase{"BadSyntax", "1024x4096", "P('dp', None", {"--spec"}},
                    BadShowCase{"AxisTwice", "1024x4096", "P('dp', 'dp')", {"--spec", "dp"}},
                    BadShowCase{"RankMismatch", "1024x4096", "P('dp', None, None)", {"--spec"}},
                    BadShowCase{"BadShape", "1024x", "P('dp', None)", {"--shape"}}),
    [](const testing::TestParamInfo<BadShowCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// shardsim run --dump

TEST_F(CommandsTest, RunInitialisesF16ArrayFromF32Npy) {
  // NumPy users save float32; an f16 array rounds each value: 1.0001 -> 1, 2049 -> 2048.
  using shardsim::Array;
  using shardsim::DType;
  shardsim::WriteNpy(Array::FromValues(DType::kF32, {4}, {1.0001f, 2049.0f, 0.5f, -3.0f}),
                     (in() / "x.npy").string());
  std::string file = WriteInput("f16.yaml",
                                "hardware: {preset: tpu-v5e, shape: [2, 2]}\n"
                                "mesh:\n  axes: {x: 4}\n"
                                "arrays:\n"
                                "  x: {shape: [4], dtype: f16, init: {file: x.npy}, "
                                "sharding: \"P()\"}\n"
                                "program:\n  - {op: neg, in: x, out: y}\n"
                                "outputs:\n  y: \"P()\"\n");
  fs::path dump = out() / "D";
  RunOk({"run", file, "--dump", dump.string(), "--numerics", "on"});
  std::string bytes = ReadFile(dump / "y.npy");
  Npy y = ParseNpy(bytes);
  EXPECT_EQ(y.descr, "<f2") << y.header;
  ASSERT_EQ(bytes.size(), y.data_offset + 8);
  uint16_t half[4];
  std::memcpy(half, bytes.data() + y.data_offset, sizeof(half));
  EXPECT_EQ(half[0], 0xBC00);  // -1
  EXPECT_EQ(half[1], 0xE800);  // -2048
  EXPECT_EQ(half[2], 0xB800);  // -0.5
  EXPECT_EQ(half[3], 0x4200);  // 3
}

TEST_F(CommandsTest, RunDumpWritesNpy) {
  fs::path dump = out() / "D";
  fs::path summary = out() / "S.json";
  RunOk(
      {"run", Config("fsdp_allgather.yaml"), "--dump", dump.string(), "--json", summary.string()});
  EXPECT_EQ(Listing(out()), (std::set<std::string>{"D", "S.json"}));
  ASSERT_TRUE(fs::is_directory(dump));
  EXPECT_EQ(Listing(dump), std::set<std::string>{"y.npy"});  // One file per output.
  Npy y = ParseNpy(ReadFile(dump / "y.npy"));
  EXPECT_EQ(y.descr, "<f4") << y.header;
  EXPECT_FALSE(y.fortran_order) << y.header;
  EXPECT_EQ(y.shape, (std::vector<int64_t>{1024, 256})) << y.header;
  ASSERT_EQ(y.data.size(), 1024u * 256u);
  EXPECT_TRUE(std::all_of(y.data.begin(), y.data.end(), [](float v) { return std::isfinite(v); }));
  EXPECT_TRUE(std::any_of(y.data.begin(), y.data.end(), [](float v) { return v != 0; }));

  json s = ReadJson(summary);
  EXPECT_EQ(s["numerics"]["checked"], true) << s.dump();
  EXPECT_EQ(s["numerics"]["passed"], true) << s.dump();
}

// The dumped values follow JAX's semantics. With a = arange(64*32) sharded P('x', 'y') on a
// 4x4 mesh, each device holds a[16i + r, 8j + c] = (16i + r) * 32 + 8j + c:
// pmax over (x, y) is (48 + r) * 32 + 24 + c, replicated: f32[16, 8];
// psum over x, out P(None, 'y'): element [r, k] = 4 (32 r + k) + 32 * 16 * (0 + 1 + 2 + 3).
TEST_F(CommandsTest, RunDumpValuesMatchClosedForms) {
  fs::path dump = out() / "D";
  RunOk({"run", Config("collectives_tour.yaml"), "--dump", dump.string()});
  Npy max = ParseNpy(ReadFile(dump / "a_max_xy.npy"));
  ASSERT_EQ(max.shape, (std::vector<int64_t>{16, 8})) << max.header;
  ASSERT_EQ(max.data.size(), 128u);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 8; ++c) {
      EXPECT_EQ(max.data[r * 8 + c], (48 + r) * 32 + 24 + c) << r << "," << c;
    }
  }
  Npy sum = ParseNpy(ReadFile(dump / "a_sum_x.npy"));
  ASSERT_EQ(sum.shape, (std::vector<int64_t>{16, 32})) << sum.header;
  ASSERT_EQ(sum.data.size(), 512u);
  for (int r = 0; r < 16; ++r) {
    for (int k = 0; k < 32; ++k) {
      EXPECT_EQ(sum.data[r * 32 + k], 4 * (32 * r + k) + 32 * 16 * 6) << r << "," << k;
    }
  }
  // Every output of the file is dumped, and nothing else.
  EXPECT_EQ(Listing(dump),
            (std::set<std::string>{"a_sum_x.npy", "a_max_xy.npy", "a_ag.npy", "a_stack.npy",
                                   "b_t.npy", "a_next.npy", "a_swap.npy", "b_mean.npy"}));
}

// bf16 outputs are written as float32.
TEST_F(CommandsTest, RunDumpBf16AsFloat32) {
  fs::path dump = out() / "D";
  RunOk({"run", Config("torus_psum.yaml"), "--dump", dump.string()});
  Npy g = ParseNpy(ReadFile(dump / "g_sum.npy"));
  EXPECT_EQ(g.descr, "<f4") << g.header;
  EXPECT_EQ(g.shape, (std::vector<int64_t>{64, 4096})) << g.header;
}

TEST_F(CommandsTest, RunDumpWithNumericsOffWritesNothing) {
  Result r = Run({"run", Config("fsdp_allgather.yaml"), "--dump", (out() / "D").string(), "--json",
                  (out() / "S.json").string(), "--numerics", "off"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("--dump"), std::string::npos) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(Listing(out()).empty()) << "files left in the output folder";
}

// SPEC: an error leaves no partial output files. A --dump folder that cannot be written
// (here a plain file is in its place) must not leave the --json summary behind.
TEST_F(CommandsTest, RunDumpFailureLeavesNoSummary) {
  WriteFile(out() / "D", "not a folder");
  Result r = Run({"run", Config("fsdp_allgather.yaml"), "--dump", (out() / "D").string(), "--json",
                  (out() / "S.json").string()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(Listing(out()), std::set<std::string>{"D"}) << "files left in the output folder";
}

// ---------------------------------------------------------------------------------------------
// The example run files

// Every example under configs/ and its subfolders (not configs/scale/, which are benchmarks)
// runs, and passes its numerics check where it has one. New examples are picked up by listing
// the folder.
TEST_F(CommandsTest, EveryExampleConfigRuns) {
  const fs::path configs = SourceDir() + "/configs";
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(configs);
       it != fs::recursive_directory_iterator(); ++it) {
    // scale/ holds benchmarks' inputs; plans/ plan search files (PlanCommandTest runs them).
    if (it->is_directory() &&
        (it->path() == configs / "scale" || it->path() == configs / "plans")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".yaml") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 5u) << "examples missing from " << SourceDir() << "/configs";
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.string());
    fs::path summary = out() / "summary.json";
    Result r = RunOk({"run", file.string(), "--json", summary.string()});
    EXPECT_NE(r.out.find("simulated time"), std::string::npos) << r;
    json s = ReadJson(summary);
    EXPECT_GT(s["simulated_time_s"].get<double>(), 0.0);
    if (s["numerics"]["checked"] == true) {
      EXPECT_EQ(s["numerics"]["passed"], true) << s["numerics"].dump();
    }
  }
}

// A program run prints where the mesh went and one table row per op with its algorithm.
TEST_F(CommandsTest, ProgramRunPrintsPlacementAndAlgorithms) {
  fs::path summary = out() / "s.json";
  Result r = RunOk({"run", Config("collectives_tour.yaml"), "--json", summary.string()});
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"((^|\n)placement:\s+\S)"))) << r;
  EXPECT_NE(r.out.find("algorithm"), std::string::npos) << r;
  json s = ReadJson(summary);
  ASSERT_EQ(s["ops"].size(), 10u) << s.dump();
  const std::set<std::string> known = {"ring",   "bidirectional_ring", "torus_2d",
                                       "direct", "halving_doubling",   "tree"};
  std::vector<std::string> lines = Split(r.out, '\n');
  for (const json& op : s["ops"]) {
    std::string name = op["name"], kind = op["op"], algorithm = op["algorithm"];
    SCOPED_TRACE(name);
    if (kind != "axis_index") {
      EXPECT_TRUE(known.count(algorithm)) << "algorithm '" << algorithm << "'";
    }
    bool found = false;
    for (const std::string& line : lines) {
      std::vector<std::string> words;
      std::istringstream in(line);
      for (std::string w; in >> w;) words.push_back(w);
      if (words.size() >= 2 && words[0] == name && words[1] == kind &&
          (algorithm.empty() || words.back() == algorithm)) {
        found = true;
      }
    }
    EXPECT_TRUE(found) << "no table row '" << name << " " << kind << " ... " << algorithm << "'\n"
                       << r;
  }
}

}  // namespace
