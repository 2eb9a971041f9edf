#include "sim/cli/run_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "sim/cli/yaml_reader.h"

namespace shardsim {
namespace {

// The folder of this test's YAML files.
std::string DataDir() {
  if (const char* root = std::getenv("SHARDSIM_SOURCE_DIR")) {
    return std::string(root) + "/tests/cli/data/";
  }
  return (std::filesystem::path(__FILE__).parent_path() / "data").string() + "/";
}

std::string Data(const std::string& name) { return DataDir() + name; }

// Runs `load` and returns the InputError's message; fails the test if nothing is thrown.
template <typename F>
std::string ErrorOf(F load) {
  try {
    load();
  } catch (const InputError& e) {
    std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

std::string LoadError(const std::string& path, const std::vector<std::string>& overrides = {}) {
  return ErrorOf([&] { LoadRunFile(path, overrides); });
}

TEST(RunFileTest, LoadsValidRunFile) {
  RunFile f = LoadRunFile(Data("valid_run.yaml"));
  EXPECT_EQ(f.path, Data("valid_run.yaml"));
  const HardwareSpec& hw = f.hardware;
  EXPECT_EQ(hw.preset, "tpu-v5e");
  EXPECT_FALSE(hw.topology.has_value());
  EXPECT_EQ(hw.shape, (std::vector<int>{4, 2}));
  EXPECT_EQ(hw.wraparound, (std::vector<bool>{false, true}));
  EXPECT_EQ(hw.nodes, 0);
  ASSERT_TRUE(hw.link.bandwidth.has_value());
  EXPECT_DOUBLE_EQ(hw.link.bandwidth->bytes_per_second(), 45e9);
  EXPECT_EQ(hw.link.latency, Time::Microseconds(1));
  EXPECT_DOUBLE_EQ(hw.device.flops.at("bf16").per_second(), 197e12);
  EXPECT_DOUBLE_EQ(hw.device.flops.at("f32").per_second(), 98.5e12);
  EXPECT_DOUBLE_EQ(hw.device.hbm_bandwidth->bytes_per_second(), 820e9);
  EXPECT_EQ(hw.device.hbm_capacity, Bytes::GiB(16));

  ASSERT_EQ(f.transfers.size(), 2u);
  EXPECT_EQ(f.transfers[0].name, "transfer 0");
  EXPECT_EQ(f.transfers[0].src, 0);
  EXPECT_EQ(f.transfers[0].dst, 5);
  EXPECT_EQ(f.transfers[0].bytes, Bytes::MiB(64));
  EXPECT_EQ(f.transfers[0].at, Time());
  EXPECT_EQ(f.transfers[1].name, "second");
  EXPECT_EQ(f.transfers[1].src, 1);
  EXPECT_EQ(f.transfers[1].dst, 2);
  EXPECT_EQ(f.transfers[1].bytes, Bytes(1024));
  EXPECT_EQ(f.transfers[1].at, Time::Nanoseconds(2500));

  EXPECT_EQ(f.options.numerics, "off");
  EXPECT_EQ(f.options.algorithms, (std::map<std::string, std::string>{
                                      {"psum", "ring"}, {"all_gather", "bidirectional_ring"}}));
}

TEST(RunFileTest, RecordsKeyLocations) {
  RunFile f = LoadRunFile(Data("valid_run.yaml"));
  struct Expected {
    std::string key;
    int line;
    int column;
  };
  for (const Expected& e : std::vector<Expected>{{"hardware", 2, 1},
                                                 {"hardware.shape", 4, 3},
                                                 {"hardware.link.bandwidth", 6, 10},
                                                 {"hardware.device.flops.bf16", 8, 13},
                                                 {"transfers.0", 12, 5},
                                                 {"transfers.0.bytes", 12, 22},
                                                 {"transfers.1", 13, 5},
                                                 {"transfers.1.name", 17, 5},
                                                 {"options.numerics", 19, 3}}) {
    ASSERT_TRUE(f.locations.count(e.key)) << e.key;
    const KeyLocation& loc = f.locations.at(e.key);
    EXPECT_EQ(loc.line, e.line) << e.key;
    EXPECT_EQ(loc.column, e.column) << e.key;
    EXPECT_FALSE(loc.from_set) << e.key;
  }
}

TEST(RunFileTest, LoadsCustomTopologies) {
  RunFile graph = LoadRunFile(Data("valid_graph.yaml"));
  ASSERT_TRUE(graph.hardware.topology.has_value());
  const CustomTopologySpec& g = *graph.hardware.topology;
  EXPECT_EQ(g.kind, "graph");
  EXPECT_EQ(g.devices, 3);
  ASSERT_EQ(g.links.size(), 2u);
  EXPECT_EQ(g.links[1].src, 1);
  EXPECT_EQ(g.links[1].dst, 2);
  EXPECT_DOUBLE_EQ(g.links[1].bandwidth.bytes_per_second(), 50e9);
  EXPECT_EQ(g.links[0].latency, Time::Nanoseconds(500));
  EXPECT_TRUE(g.links[0].bidirectional);
  EXPECT_FALSE(g.links[1].bidirectional);
  EXPECT_EQ(graph.locations.at("hardware.topology.links.1.src").line, 7);

  RunFile torus = LoadRunFile(Data("valid_torus.yaml"));
  ASSERT_TRUE(torus.hardware.topology.has_value());
  EXPECT_EQ(torus.hardware.topology->kind, "torus");
  EXPECT_EQ(torus.hardware.topology->shape, (std::vector<int>{4, 4, 2}));
  EXPECT_EQ(torus.hardware.topology->wraparound, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(torus.transfers[0].at, Time::Milliseconds(1));

  RunFile h = LoadRunFile(Data("valid_hierarchical.yaml"));
  const CustomTopologySpec& t = *h.hardware.topology;
  EXPECT_EQ(t.kind, "hierarchical");
  EXPECT_EQ(t.nodes, 4);
  EXPECT_EQ(t.per_node, 8);
  EXPECT_EQ(t.nodes_per_leaf, 2);
  EXPECT_EQ(t.spines, 2);
  EXPECT_DOUBLE_EQ(t.nic_bandwidth->bytes_per_second(), 50e9);
  EXPECT_EQ(t.nic_latency, Time::Microseconds(2));
}

// One malformed file and the error it must give.
struct BadFileCase {
  std::string name;      // Test name.
  std::string file;      // File under tests/cli/data/.
  std::string where;     // "LINE:COL" of the error.
  std::string key;       // The key named in the message ("" for none).
  std::string fragment;  // Text the message must contain.
};

// Prints the case's name, so test listings (and ctest) show it instead of a byte dump.
void PrintTo(const BadFileCase& c, std::ostream* os) { *os << c.name; }

class BadFileTest : public testing::TestWithParam<BadFileCase> {};

TEST_P(BadFileTest, GivesLocatedOneLineError) {
  const BadFileCase& c = GetParam();
  const std::string path = Data(c.file);
  std::string message = LoadError(path);
  EXPECT_TRUE(message.starts_with(path + ":" + c.where + ": ")) << message;
  if (c.key.empty()) {
    EXPECT_EQ(message.find("(key "), std::string::npos) << message;
  } else {
    EXPECT_TRUE(message.ends_with(" (key " + c.key + ")")) << message;
  }
  EXPECT_NE(message.find(c.fragment), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadFileTest,
    testing::Values(
        BadFileCase{"BadUnit", "bad_unit.yaml", "4:16", "hardware.link.bandwidth",
                    "expected a bandwidth unit like GB/s or Gb/s in \"45 GX/s\""},
        BadFileCase{"UnknownKeyDidYouMean", "bad_unknown_key.yaml", "3:10",
                    "hardware.link.bandwith", "unknown key 'bandwith'; did you mean 'bandwidth'?"},
        BadFileCase{"UnknownKeyListsAllowed", "bad_unknown_far_key.yaml", "4:5",
                    "hardware.device.memory",
                    "unknown key 'memory'; expected one of flops, hbm_bandwidth, hbm_capacity"},
        BadFileCase{"UnknownTopLevelKey", "bad_top_level_key.yaml", "5:1", "optoins",
                    "unknown top-level key 'optoins'; did you mean 'options'?"},
        BadFileCase{"MissingDst", "bad_missing_dst.yaml", "5:5", "transfers.1.dst",
                    "missing required key 'dst'"},
        BadFileCase{"ShapeIsMapping", "bad_shape_mapping.yaml", "3:10", "hardware.shape",
                    "expected a list of positive integers like [4, 4] or \"4x4\", got a mapping"},
        BadFileCase{"YamlSyntax", "bad_syntax.yaml", "4:10", "", "invalid YAML: "},
        BadFileCase{"BareBandwidth", "bad_bare_bandwidth.yaml", "3:21", "hardware.link.bandwidth",
                    "in \"45\""},
        BadFileCase{"NegativeBytes", "bad_negative_bytes.yaml", "6:12", "transfers.0.bytes",
                    "non-negative"},
        BadFileCase{"PresetAndTopology", "bad_preset_and_topology.yaml", "3:3", "hardware.topology",
                    "give either preset or topology, not both"},
        BadFileCase{"NoTransfers", "bad_no_transfers.yaml", "1:1", "transfers",
                    "missing required key 'transfers' (or 'program')"},
        BadFileCase{"ProgramNotSupported", "bad_program.yaml", "3:1", "program",
                    "program: is not supported yet; use transfers:"},
        BadFileCase{"BadNumerics", "bad_numerics.yaml", "6:13", "options.numerics",
                    "unknown value \"of\"; did you mean 'off'?"},
        BadFileCase{"WraparoundNotBool", "bad_wraparound.yaml", "4:22", "hardware.wraparound.1",
                    "expected true or false, got \"maybe\""},
        BadFileCase{"PresetIsList", "bad_preset_type.yaml", "2:11", "hardware.preset",
                    "expected a string, got a list"},
        BadFileCase{"TopologyKindTypo", "bad_topology_kind.yaml", "3:11", "hardware.topology.kind",
                    "unknown value \"tori\"; did you mean 'torus'?"},
        BadFileCase{"GraphLinkOutOfRange", "bad_graph_link.yaml", "7:23",
                    "hardware.topology.links.1.dst", "dst 2 is not a device of the graph (0..1)"},
        BadFileCase{"SrcNotInteger", "bad_src_string.yaml", "4:11", "transfers.0.src",
                    "expected an integer, got \"zero\""},
        BadFileCase{"DuplicateKey", "bad_duplicate_key.yaml", "3:3", "hardware.preset",
                    "duplicate key 'preset' (first given at line 2)"},
        BadFileCase{"KeyOfAnotherKind", "bad_kind_key.yaml", "2:27", "hardware.topology.size",
                    "'size' does not apply to kind torus"},
        BadFileCase{"TopLevelList", "bad_top_level_list.yaml", "1:1", "",
                    "expected a mapping with hardware: and transfers:, got a list"},
        BadFileCase{"ZeroNodes", "bad_zero_nodes.yaml", "3:10", "hardware.nodes",
                    "must be positive, got 0"},
        BadFileCase{"TransfersIsMapping", "bad_transfers_mapping.yaml", "4:3", "transfers",
                    "got a mapping"},
        BadFileCase{"EmptyFile", "bad_empty.yaml", "1:1", "", "got nothing"}),
    [](const testing::TestParamInfo<BadFileCase>& info) { return info.param.name; });

TEST(RunFileTest, MissingFile) {
  const std::string path = Data("no_such_file.yaml");
  EXPECT_EQ(LoadError(path), path + ": cannot open: No such file or directory");
}

// One --set case that loads: the overrides and a check of the result.
struct OverrideCase {
  std::string name;                           // Test name.
  std::vector<std::string> overrides;         // --set strings.
  std::function<void(const RunFile&)> check;  // Checks the loaded file.
};

void PrintTo(const OverrideCase& c, std::ostream* os) { *os << c.name; }

class OverrideTest : public testing::TestWithParam<OverrideCase> {};

TEST_P(OverrideTest, Applies) {
  RunFile f = LoadRunFile(Data("valid_run.yaml"), GetParam().overrides);
  GetParam().check(f);
}

INSTANTIATE_TEST_SUITE_P(
    Overrides, OverrideTest,
    testing::Values(
        OverrideCase{"QuotedBandwidth",
                     {"hardware.link.bandwidth=\"90 GB/s\""},
                     [](const RunFile& f) {
                       EXPECT_DOUBLE_EQ(f.hardware.link.bandwidth->bytes_per_second(), 90e9);
                       const KeyLocation& loc = f.locations.at("hardware.link.bandwidth");
                       EXPECT_TRUE(loc.from_set);
                       EXPECT_EQ(loc.set_key, "hardware.link.bandwidth");
                       EXPECT_FALSE(f.locations.at("hardware.link.latency").from_set);
                     }},
        OverrideCase{"UnquotedBandwidth",
                     {"hardware.link.bandwidth=90 GB/s"},
                     [](const RunFile& f) {
                       EXPECT_DOUBLE_EQ(f.hardware.link.bandwidth->bytes_per_second(), 90e9);
                     }},
        OverrideCase{"ShapeList",
                     {"hardware.shape=[8,8]", "hardware.wraparound=[true, true]"},
                     [](const RunFile& f) {
                       EXPECT_EQ(f.hardware.shape, (std::vector<int>{8, 8}));
                       EXPECT_EQ(f.hardware.wraparound, (std::vector<bool>{true, true}));
                     }},
        OverrideCase{"NewKey",
                     {"hardware.nodes=2", "options.algorithms.psum=tree"},
                     [](const RunFile& f) {
                       EXPECT_EQ(f.hardware.nodes, 2);
                       EXPECT_EQ(f.options.algorithms.at("psum"), "tree");
                       EXPECT_TRUE(f.locations.at("hardware.nodes").from_set);
                     }},
        OverrideCase{"NewMapping",
                     {"hardware.device.hbm_capacity=32 GiB", "hardware.device.flops.f16=1 TFLOP/s"},
                     [](const RunFile& f) {
                       EXPECT_EQ(f.hardware.device.hbm_capacity, Bytes::GiB(32));
                       EXPECT_DOUBLE_EQ(f.hardware.device.flops.at("f16").per_second(), 1e12);
                     }},
        OverrideCase{"ListIndex",
                     {"transfers.0.bytes=1 MiB", "transfers.1.at=3 us"},
                     [](const RunFile& f) {
                       EXPECT_EQ(f.transfers[0].bytes, Bytes::MiB(1));
                       EXPECT_EQ(f.transfers[0].dst, 5);
                       EXPECT_EQ(f.transfers[1].at, Time::Microseconds(3));
                     }},
        OverrideCase{"AppendListEntry",
                     {"transfers.2={src: 3, dst: 4, bytes: 8}"},
                     [](const RunFile& f) {
                       ASSERT_EQ(f.transfers.size(), 3u);
                       EXPECT_EQ(f.transfers[2].src, 3);
                       EXPECT_EQ(f.transfers[2].bytes, Bytes(8));
                       EXPECT_EQ(f.transfers[2].name, "transfer 2");
                     }},
        OverrideCase{"ReplaceSection",
                     {"hardware={preset: b200-dgx, nodes: 2}"},
                     [](const RunFile& f) {
                       EXPECT_EQ(f.hardware.preset, "b200-dgx");
                       EXPECT_TRUE(f.hardware.shape.empty());
                       EXPECT_EQ(f.locations.at("hardware.nodes").set_key, "hardware");
                     }}),
    [](const testing::TestParamInfo<OverrideCase>& info) { return info.param.name; });

// One --set case that fails, with the exact message.
struct BadOverrideCase {
  std::string name;      // Test name.
  std::string override;  // The --set string.
  std::string message;   // The exact InputError message.
};

void PrintTo(const BadOverrideCase& c, std::ostream* os) { *os << c.name; }

class BadOverrideTest : public testing::TestWithParam<BadOverrideCase> {};

TEST_P(BadOverrideTest, Fails) {
  EXPECT_EQ(LoadError(Data("valid_run.yaml"), {GetParam().override}), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Overrides, BadOverrideTest,
    testing::Values(
        BadOverrideCase{"UnknownKey", "hardware.link.bandwith=90 GB/s",
                        "--set hardware.link.bandwith: unknown key 'bandwith'; did you mean "
                        "'bandwidth'? (key hardware.link.bandwith)"},
        BadOverrideCase{"UnknownIntermediate", "hardware.lnk.bandwidth=90 GB/s",
                        "--set hardware.lnk.bandwidth: unknown key 'lnk'; did you mean 'link'? "
                        "(key hardware.lnk)"},
        BadOverrideCase{"BareNumber", "hardware.link.bandwidth=90",
                        "--set hardware.link.bandwidth: expected a bandwidth unit like GB/s or "
                        "Gb/s in \"90\" (key hardware.link.bandwidth)"},
        BadOverrideCase{"NoEquals", "hardware.nodes", "--set hardware.nodes: expected KEY=VALUE"},
        BadOverrideCase{"EmptySegment", "hardware..nodes=2",
                        "--set hardware..nodes=2: expected KEY=VALUE"},
        BadOverrideCase{"IndexPastEnd", "transfers.5.bytes=1",
                        "--set transfers.5.bytes: index 5 is past the end of transfers (2 "
                        "entries) (key transfers.5.bytes)"},
        BadOverrideCase{"IntoScalar", "hardware.preset.name=x",
                        "--set hardware.preset.name: hardware.preset is a value, not a mapping "
                        "or list (key hardware.preset.name)"},
        BadOverrideCase{"ProgramNotSupported", "program=[]",
                        "--set program: program: is not supported yet; use transfers: (key "
                        "program)"}),
    [](const testing::TestParamInfo<BadOverrideCase>& info) { return info.param.name; });

TEST(LocateTest, PointsAtKeyOrEnclosingKey) {
  RunFile f = LoadRunFile(Data("valid_run.yaml"));
  const std::string p = f.path;
  EXPECT_EQ(f.Locate(SpecError("hardware.shape", "tpu-v5e takes 2 dimensions")),
            p + ":4:3: tpu-v5e takes 2 dimensions (key hardware.shape)");
  EXPECT_EQ(f.Locate(SpecError("transfers.1.dst", "dst 2 is not a device")),
            p + ":14:5: dst 2 is not a device (key transfers.1.dst)");
  EXPECT_EQ(f.Locate(SpecError("hardware.shape.1", "too small")),
            p + ":4:14: too small (key hardware.shape.1)");
  EXPECT_EQ(f.Locate(SpecError("hardware.shape.7", "no such dimension")),
            p + ":4:3: no such dimension (key hardware.shape.7)");
  EXPECT_EQ(f.Locate(SpecError("hardware.device.flops.f8", "no f8")),
            p + ":8:5: no f8 (key hardware.device.flops.f8)");
  EXPECT_EQ(f.Locate(SpecError("mesh.axes", "bad\nmesh")), p + ": bad mesh (key mesh.axes)");
}

TEST(LocateTest, OverriddenKeyNamesTheSetOption) {
  RunFile f = LoadRunFile(Data("valid_run.yaml"), {"hardware.shape=[3,3]"});
  EXPECT_EQ(f.Locate(SpecError("hardware.shape", "odd shape")),
            "--set hardware.shape: odd shape (key hardware.shape)");
  EXPECT_EQ(f.Locate(SpecError("hardware.preset", "unknown preset")),
            f.path + ":3:3: unknown preset (key hardware.preset)");
}

TEST(HardwareFileTest, ReadsHardwareSectionOfRunFile) {
  RunFile f = LoadHardwareFile(Data("hardware_section.yaml"));
  ASSERT_TRUE(f.hardware.topology.has_value());
  EXPECT_EQ(f.hardware.topology->kind, "ring");
  EXPECT_EQ(f.hardware.topology->size, 8);
  EXPECT_FALSE(f.hardware.topology->bidirectional);
  EXPECT_EQ(f.Locate(SpecError("hardware.topology.size", "too big")),
            f.path + ":2:26: too big (key hardware.topology.size)");
}

TEST(HardwareFileTest, ReadsBareHardwareMapping) {
  RunFile f = LoadHardwareFile(Data("hardware_only.yaml"));
  EXPECT_EQ(f.hardware.preset, "h100-dgx");
  EXPECT_EQ(f.hardware.nodes, 4);
  EXPECT_EQ(f.hardware.link.latency, Time::Nanoseconds(700));
  EXPECT_EQ(f.Locate(SpecError("hardware.preset", "unknown preset")),
            f.path + ":2:1: unknown preset (key hardware.preset)");
}

TEST(HardwareFileTest, Errors) {
  std::string path = Data("no_hardware.yaml");
  EXPECT_EQ(ErrorOf([&] { LoadHardwareFile(path); }),
            path +
                ":1:1: expected a hardware: section, or a mapping with preset: or topology: "
                "(key hardware)");
  path = Data("bad_unit.yaml");
  EXPECT_TRUE(ErrorOf([&] { LoadHardwareFile(path); }).starts_with(path + ":4:16: "));
  path = Data("no_such_file.yaml");
  EXPECT_EQ(ErrorOf([&] { LoadHardwareFile(path); }),
            path + ": cannot open: No such file or directory");
}

}  // namespace
}  // namespace shardsim
