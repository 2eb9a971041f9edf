#include "sim/cli/run_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
                    "hardware.device.ram",
                    "unknown key 'ram'; expected one of flops, hbm_bandwidth, hbm_capacity, "
                    "matmul_efficiency, attention_efficiency, memory_efficiency, op_overhead, "
                    "comm_compute_slowdown"},
        BadFileCase{"EfficiencyAboveOne", "bad_device_efficiency.yaml", "4:24",
                    "hardware.device.matmul_efficiency",
                    "expected a fraction of the peak in (0, 1] like 0.85, got \"1.5\""},
        BadFileCase{"OverheadWithoutUnit", "bad_device_overhead.yaml", "3:25",
                    "hardware.device.op_overhead",
                    "expected a time unit (ps, ns, us, ms, s) in \"2\""},
        BadFileCase{"DtypeRateTwice", "bad_device_dtype_twice.yaml", "4:32",
                    "hardware.device.flops.bfloat16", "'bfloat16' and 'bf16' name the same dtype"},
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
                    "missing required key 'transfers' (or 'program', or 'model')"},
        BadFileCase{"TransfersAndProgram", "bad_program.yaml", "3:1", "program",
                    "give either transfers: or program:, not both"},
        BadFileCase{"MeshWithTransfers", "bad_transfers_with_mesh.yaml", "3:1", "mesh",
                    "mesh: applies only with program:, not with transfers:"},
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
        BadFileCase{"EmptyFile", "bad_empty.yaml", "1:1", "", "got nothing"},
        BadFileCase{"SecondDocument", "bad_two_documents.yaml", "6:1", "",
                    "a second YAML document (after '---'); a file holds one document"},
        BadFileCase{"LiteralBeyondFloat32", "bad_literal_range.yaml", "5:52",
                    "arrays.a.init.value.2",
                    "value \"1e39\" is outside the float32 range (about 3.4e38)"},
        BadFileCase{"LiteralBeyondInt32", "bad_literal_int32.yaml", "5:61",
                    "arrays.ids.init.value.2",
                    "value \"2147483648\" is not an int32 (a whole number from -2147483648 to "
                    "2147483647)"},
        BadFileCase{"HugeBytes", "bad_huge_bytes.yaml", "6:12", "transfers.0.bytes",
                    "size \"1e30 B\" is too large (at most 8 EiB)"},
        BadFileCase{"HugeStartTime", "bad_huge_at.yaml", "4:40", "transfers.0.at",
                    "time \"1e8 s\" is past the simulator's range (at most about 106 days)"},
        BadFileCase{"HugeLatency", "bad_huge_latency.yaml", "3:39", "hardware.link.latency",
                    "time \"1e9 s\" is past the simulator's range"},
        BadFileCase{"InfiniteBandwidth", "bad_infinite_bandwidth.yaml", "3:21",
                    "hardware.link.bandwidth",
                    "a bandwidth must be a finite non-negative number, got \"inf GB/s\""}),
    [](const testing::TestParamInfo<BadFileCase>& info) { return info.param.name; });

// Malformed programs: each error at the key or value that is wrong.
INSTANTIATE_TEST_SUITE_P(
    Programs, BadFileTest,
    testing::Values(
        BadFileCase{"UnknownOp", "bad_program_unknown_op.yaml", "6:10", "program.0.op",
                    "unknown op 'allgather'; did you mean 'all_gather'?"},
        BadFileCase{"ShardMapOutputNotMade", "bad_program_shard_map.yaml", "7:62", "program.0.out",
                    "'y' is not made by the body (defined: x, z)"},
        BadFileCase{"ShardMapSpecPerInput", "bad_program_shard_map_specs.yaml", "7:38",
                    "program.0.in_specs", "expected one spec per input (1), got 2"},
        BadFileCase{
            "KeyNotForOp", "bad_program_key_not_applicable.yaml", "6:38", "program.0.tiled",
            "key 'tiled' does not apply to op matmul (it takes op, in, out, name, where, mesh, "
            "preferred_element_type)"},
        BadFileCase{"KeyOfAnotherOpDidYouMean", "bad_program_key_typo.yaml", "6:52",
                    "program.0.axes",
                    "key 'axes' does not apply to op all_gather; did you mean 'axis'?"},
        BadFileCase{"MissingAxisName", "bad_program_missing_axis_name.yaml", "6:5",
                    "program.0.axis_name", "missing required key 'axis_name'"},
        BadFileCase{"PermAndShift", "bad_program_perm_and_shift.yaml", "11:5", "program.0.shift",
                    "give either perm or shift, not both"},
        BadFileCase{"PermOutsideGroup", "bad_program_perm_range.yaml", "6:69", "program.0.perm.1.1",
                    "index 4 is outside the group of 4 over dp (0..3)"},
        BadFileCase{"BadShardingString", "bad_program_sharding.yaml", "4:32", "arrays.x.sharding",
                    "bad PartitionSpec \"P(dp, None)\": expected a quoted axis name, None or a "
                    "tuple, got dp (quote axis names: 'dp')"},
        BadFileCase{"ShardingAxisDidYouMean", "bad_program_sharding_axis.yaml", "4:33",
                    "arrays.x.sharding.0", "'dq' is not a mesh axis; did you mean 'dp'?"},
        BadFileCase{"ShardingNotDivisible", "bad_program_not_divisible.yaml", "4:32",
                    "arrays.x.sharding",
                    "dimension 0 of size 6 is not divisible by 4 (the size of mesh axis dp)"},
        BadFileCase{"UnknownDtype", "bad_program_dtype.yaml", "4:29", "arrays.x.dtype",
                    "unknown value \"f23\"; did you mean 'f32'?"},
        BadFileCase{"ValueCount", "bad_program_value_count.yaml", "4:36", "arrays.x.init.value",
                    "has 6 values but the shape [2, 4] needs 8"},
        BadFileCase{"NestedValueShape", "bad_program_nested_value.yaml", "4:48",
                    "arrays.x.init.value.1",
                    "has 2 entries but needs 3 along dimension 1 of shape [2, 3]"},
        BadFileCase{"ArrayNameNotIdentifier", "bad_program_array_name.yaml", "4:3", "arrays.1x",
                    "'1x' is not a valid array name"},
        BadFileCase{"UndefinedInputDidYouMean", "bad_program_undefined_input.yaml", "7:26",
                    "program.1.in.1", "'x_ful' is not defined; did you mean 'x_full'?"},
        BadFileCase{"InputMadeLater", "bad_program_used_before_made.yaml", "6:20", "program.0.in",
                    "'h' is not defined before this op (program.1 makes it)"},
        BadFileCase{"OutputNeverProduced", "bad_program_never_produced.yaml", "7:11", "outputs.y2",
                    "'y2' is never produced; did you mean 'y'?"},
        BadFileCase{"MatmulOneInput", "bad_program_input_count.yaml", "6:22", "program.0.in",
                    "matmul takes 2 inputs (in: [a, b]), got 1"},
        BadFileCase{"BinaryWithoutScalar", "bad_program_binary_no_scalar.yaml", "6:19",
                    "program.0.in",
                    "add takes in: [a, b], or in: a with scalar:, got 1 input and no scalar"},
        BadFileCase{"SplitOutputCount", "bad_program_split_outs.yaml", "6:29", "program.0.out",
                    "split makes 3 outputs (sections: 3), got 2 names"},
        BadFileCase{"MissingOut", "bad_program_no_out.yaml", "6:5", "program.0.out",
                    "missing required key 'out'"},
        BadFileCase{"MeshSizeZero", "bad_program_mesh_zero.yaml", "2:19", "mesh.axes.dp",
                    "must be positive, got 0"},
        BadFileCase{"UnknownAlgorithm", "bad_program_algorithm.yaml", "6:57", "program.0.algorithm",
                    "unknown value \"rnig\"; did you mean 'ring'?"},
        BadFileCase{"AlgorithmsKeyDidYouMean", "bad_program_algorithms_key.yaml", "8:24",
                    "options.algorithms.allreduce",
                    "unknown key 'allreduce'; did you mean 'all_reduce'?"},
        BadFileCase{"MissingOutputs", "bad_program_no_outputs.yaml", "1:1", "outputs",
                    "missing required key 'outputs'"},
        BadFileCase{"MissingMesh", "bad_program_no_mesh.yaml", "1:1", "mesh",
                    "missing required key 'mesh'"}),
    [](const testing::TestParamInfo<BadFileCase>& info) { return info.param.name; });

// The partition spec of per-dimension axis lists.
PartitionSpec Spec(std::vector<std::vector<std::string>> dims) { return PartitionSpec{dims}; }

TEST(ProgramFileTest, LoadsSpecExample) {
  RunFile f = LoadRunFile(Data("valid_program.yaml"));
  EXPECT_TRUE(f.transfers.empty());
  ASSERT_TRUE(f.program.has_value());
  const ProgramSpec& p = *f.program;
  ASSERT_EQ(p.mesh_axes.size(), 2u);
  EXPECT_EQ(p.mesh_axes[0].name, "dp");
  EXPECT_EQ(p.mesh_axes[0].size, 4);
  EXPECT_EQ(p.mesh_axes[1].name, "tp");
  EXPECT_EQ(p.mesh_axes[1].size, 2);
  EXPECT_EQ(p.mesh_devices, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));

  ASSERT_EQ(p.arrays.size(), 2u);
  const ArraySpec& x = p.arrays[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.shape, (Shape{1024, 4096}));
  EXPECT_EQ(x.dtype, DType::kF32);
  EXPECT_EQ(x.init.kind, InitSpec::Kind::kNormal);
  EXPECT_EQ(x.init.seed, 0u);
  EXPECT_EQ(x.sharding, Spec({{"dp"}, {}}));  // "P('dp', None)"
  const ArraySpec& w = p.arrays[1];
  EXPECT_EQ(w.name, "w");
  EXPECT_EQ(w.shape, (Shape{4096, 256}));
  EXPECT_EQ(w.dtype, DType::kBF16);  // "bfloat16"
  EXPECT_EQ(w.init.kind, InitSpec::Kind::kUniform);
  EXPECT_EQ(w.init.seed, 1u);
  EXPECT_EQ(w.sharding, Spec({{"dp"}, {}}));  // [dp, null]

  ASSERT_EQ(p.ops.size(), 2u);
  const OpSpec& gather = p.ops[0];
  EXPECT_EQ(gather.kind, OpKind::kAllGather);
  EXPECT_EQ(gather.name, "w_full");
  EXPECT_EQ(gather.key, "program.0");
  EXPECT_EQ(gather.in, (std::vector<std::string>{"w"}));
  EXPECT_EQ(gather.out, (std::vector<std::string>{"w_full"}));
  EXPECT_EQ(gather.axis_name, (std::vector<std::string>{"dp"}));
  EXPECT_EQ(gather.axis, 0);
  EXPECT_TRUE(gather.tiled);
  EXPECT_EQ(gather.algorithm, "");
  const OpSpec& matmul = p.ops[1];
  EXPECT_EQ(matmul.kind, OpKind::kMatmul);
  EXPECT_EQ(matmul.name, "y");
  EXPECT_EQ(matmul.key, "program.1");
  EXPECT_EQ(matmul.in, (std::vector<std::string>{"x", "w_full"}));
  EXPECT_EQ(matmul.out, (std::vector<std::string>{"y"}));
  EXPECT_TRUE(matmul.axis_name.empty());

  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_EQ(p.outputs[0].name, "y");
  EXPECT_EQ(p.outputs[0].key, "outputs.y");
  EXPECT_EQ(p.outputs[0].spec, Spec({{"dp"}, {}}));

  EXPECT_EQ(f.options.numerics, "auto");
  EXPECT_EQ(f.options.algorithms,
            (std::map<std::string, std::string>{{"all_reduce", "ring"},
                                                {"psum_scatter", "bidirectional_ring"}}));
}

TEST(ProgramFileTest, RecordsProgramKeyLocations) {
  RunFile f = LoadRunFile(Data("valid_program.yaml"));
  struct Expected {
    std::string key;
    int line;
    int column;
  };
  for (const Expected& e : std::vector<Expected>{{"mesh.axes.dp", 7, 10},
                                                 {"mesh.axes.tp", 7, 17},
                                                 {"mesh.devices", 8, 3},
                                                 {"arrays.x", 10, 3},
                                                 {"arrays.x.shape", 10, 7},
                                                 {"arrays.x.sharding", 10, 63},
                                                 {"arrays.w.sharding.0", 11, 79},
                                                 {"program.0", 13, 5},
                                                 {"program.0.axis_name", 13, 42},
                                                 {"program.1.in", 14, 18},
                                                 {"program.1.in.1", 14, 26},
                                                 {"outputs.y", 16, 3}}) {
    ASSERT_TRUE(f.locations.count(e.key)) << e.key;
    EXPECT_EQ(f.locations.at(e.key).line, e.line) << e.key;
    EXPECT_EQ(f.locations.at(e.key).column, e.column) << e.key;
  }
  const std::string p = f.path;
  EXPECT_EQ(f.Locate(SpecError("program.1.in", "shapes [256,4096] and [1024,256] differ")),
            p + ":14:18: shapes [256,4096] and [1024,256] differ (key program.1.in)");
  EXPECT_EQ(f.Locate(SpecError("mesh.devices", "device 9 is not on the machine")),
            p + ":8:3: device 9 is not on the machine (key mesh.devices)");
}

TEST(ProgramFileTest, KeepsMeshAxesInFileOrder) {
  RunFile f = LoadRunFile(Data("valid_program_ops.yaml"));
  const ProgramSpec& p = *f.program;
  ASSERT_EQ(p.mesh_axes.size(), 2u);
  EXPECT_EQ(p.mesh_axes[0].name, "tp");
  EXPECT_EQ(p.mesh_axes[0].size, 2);
  EXPECT_EQ(p.mesh_axes[1].name, "dp");
  EXPECT_EQ(p.mesh_axes[1].size, 4);
  EXPECT_TRUE(p.mesh_devices.empty());
}

TEST(ProgramFileTest, ReadsShardingsInBothSpellings) {
  const ProgramSpec p = *LoadRunFile(Data("valid_program_ops.yaml")).program;
  EXPECT_EQ(p.arrays[0].sharding, Spec({}));                  // "P()"
  EXPECT_EQ(p.arrays[1].sharding, Spec({{}, {}}));            // [null, null]
  EXPECT_EQ(p.arrays[2].sharding, Spec({{"dp", "tp"}, {}}));  // [[dp, tp], null]
  EXPECT_EQ(p.arrays[3].sharding, Spec({}));                  // none given: replicated
  EXPECT_EQ(p.arrays[4].sharding, Spec({{"tp", "dp"}}));      // "P(('tp', 'dp'),)"
  ASSERT_EQ(p.outputs.size(), 3u);
  EXPECT_EQ(p.outputs[0].name, "r");
  EXPECT_EQ(p.outputs[0].spec, Spec({{"dp", "tp"}}));  // [[dp, tp]]
  EXPECT_EQ(p.outputs[1].name, "ab");
  EXPECT_EQ(p.outputs[1].spec, Spec({}));  // "P()"
  EXPECT_EQ(p.outputs[2].name, "idx");
  EXPECT_EQ(p.outputs[2].spec, Spec({}));  // []
}

TEST(ProgramFileTest, ReadsInits) {
  const ProgramSpec p = *LoadRunFile(Data("valid_program_ops.yaml")).program;
  ASSERT_EQ(p.arrays.size(), 5u);
  const ArraySpec& nested = p.arrays[0];
  EXPECT_EQ(nested.init.kind, InitSpec::Kind::kValue);
  EXPECT_EQ(nested.init.values, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(nested.dtype, DType::kF32);  // the default
  const ArraySpec& flat = p.arrays[1];
  EXPECT_EQ(flat.shape, (Shape{3, 2}));
  EXPECT_EQ(flat.init.kind, InitSpec::Kind::kValue);
  EXPECT_EQ(flat.init.values, (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.arrays[2].dtype, DType::kI32);
  EXPECT_EQ(p.arrays[2].init.kind, InitSpec::Kind::kArange);
  const ArraySpec& scalar = p.arrays[3];
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.init.values, (std::vector<double>{2.5}));
  const ArraySpec& file = p.arrays[4];
  EXPECT_EQ(file.shape, (Shape{8, 8}));  // "8x8"
  EXPECT_EQ(file.init.kind, InitSpec::Kind::kFile);
  EXPECT_EQ(file.init.file, "inputs/f.npy");  // as written; the executor resolves it
  EXPECT_EQ(file.init.seed, 7u);
}

TEST(ProgramFileTest, ReadsEveryOpsParameters) {
  const ProgramSpec p = *LoadRunFile(Data("valid_program_ops.yaml")).program;
  ASSERT_EQ(p.ops.size(), 17u);
  for (size_t i = 0; i < p.ops.size(); ++i) EXPECT_EQ(p.ops[i].key, "program." + std::to_string(i));
  const std::vector<OpSpec>& ops = p.ops;

  EXPECT_EQ(ops[0].kind, OpKind::kAxisIndex);
  EXPECT_TRUE(ops[0].in.empty());
  EXPECT_EQ(ops[0].axis_name, (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(ops[0].name, "idx");

  EXPECT_EQ(ops[1].kind, OpKind::kPsum);
  EXPECT_EQ(ops[1].axis_name, (std::vector<std::string>{"tp", "dp"}));  // the op's order
  EXPECT_EQ(ops[1].algorithm, "tree");

  EXPECT_EQ(ops[2].kind, OpKind::kPsumScatter);
  EXPECT_EQ(ops[2].scatter_dimension, 1);
  EXPECT_TRUE(ops[2].tiled);

  EXPECT_EQ(ops[3].kind, OpKind::kAllToAll);
  EXPECT_EQ(ops[3].split_axis, -1);
  EXPECT_EQ(ops[3].concat_axis, 0);
  EXPECT_FALSE(ops[3].tiled);

  EXPECT_EQ(ops[4].kind, OpKind::kPpermute);
  EXPECT_EQ(ops[4].perm, (std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 0}}));
  EXPECT_FALSE(ops[4].shift.has_value());
  EXPECT_EQ(ops[5].name, "back");
  EXPECT_TRUE(ops[5].perm.empty());
  EXPECT_EQ(ops[5].shift, -1);

  EXPECT_EQ(ops[6].kind, OpKind::kEinsum);
  EXPECT_EQ(ops[6].spec, "ij,jk->ik");
  EXPECT_EQ(ops[6].name, "ab");

  // Rebinding `ab`: the default name falls back to "op<i>" as "ab" is taken.
  EXPECT_EQ(ops[7].kind, OpKind::kAdd);
  EXPECT_EQ(ops[7].in, (std::vector<std::string>{"ab"}));
  EXPECT_EQ(ops[7].out, (std::vector<std::string>{"ab"}));
  EXPECT_EQ(ops[7].scalar, 1.5);
  EXPECT_EQ(ops[7].name, "op7");
  EXPECT_EQ(ops[8].kind, OpKind::kMul);
  EXPECT_FALSE(ops[8].scalar.has_value());

  EXPECT_EQ(ops[9].kind, OpKind::kReshape);
  EXPECT_EQ(ops[9].shape, (Shape{-1}));
  EXPECT_EQ(ops[10].kind, OpKind::kTranspose);
  EXPECT_EQ(ops[10].axes, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(ops[11].kind, OpKind::kConcatenate);
  EXPECT_EQ(ops[11].in.size(), 3u);
  EXPECT_EQ(ops[11].axis, 1);
  EXPECT_EQ(ops[12].kind, OpKind::kSplit);
  EXPECT_EQ(ops[12].sections, 3);
  EXPECT_EQ(ops[12].out, (std::vector<std::string>{"p0", "p1", "p2"}));
  EXPECT_EQ(ops[12].name, "p0");
  EXPECT_EQ(ops[13].kind, OpKind::kSlice);
  EXPECT_EQ(ops[13].start, 1);
  EXPECT_EQ(ops[13].size, 2);
  EXPECT_EQ(ops[13].axis, 0);
  EXPECT_EQ(ops[14].kind, OpKind::kRelu);

  EXPECT_EQ(ops[15].kind, OpKind::kAllgatherMatmul);
  EXPECT_EQ(ops[15].gather, "lhs");
  EXPECT_EQ(ops[15].variant, "bidirectional");
  EXPECT_EQ(ops[16].kind, OpKind::kMatmulReduceScatter);
  EXPECT_EQ(ops[16].scatter_dimension, 1);
  EXPECT_EQ(ops[16].variant, "unidirectional");
  EXPECT_EQ(ops[16].gather, "rhs");  // the default
}

TEST(ProgramFileTest, SetReachesIntoPrograms) {
  RunFile f =
      LoadRunFile(Data("valid_program.yaml"),
                  {"mesh.axes.dp=2", "mesh.devices=[3, 2, 1, 0]", "program.0.algorithm=ring",
                   "arrays.w.dtype=f16", "program.2={op: psum, in: y, out: z, axis_name: [tp]}",
                   "outputs.z=[dp]"});
  const ProgramSpec& p = *f.program;
  ASSERT_EQ(p.mesh_axes.size(), 2u);
  EXPECT_EQ(p.mesh_axes[0].name, "dp");  // Order kept when a size is overridden.
  EXPECT_EQ(p.mesh_axes[0].size, 2);
  EXPECT_EQ(p.mesh_devices, (std::vector<int>{3, 2, 1, 0}));
  EXPECT_EQ(p.ops[0].algorithm, "ring");
  EXPECT_EQ(p.arrays[1].dtype, DType::kF16);
  ASSERT_EQ(p.ops.size(), 3u);
  EXPECT_EQ(p.ops[2].axis_name, (std::vector<std::string>{"tp"}));
  ASSERT_EQ(p.outputs.size(), 2u);
  EXPECT_EQ(p.outputs[1].spec, Spec({{"dp"}}));
  EXPECT_TRUE(f.locations.at("program.0.algorithm").from_set);
  EXPECT_EQ(f.Locate(SpecError("program.2.in", "bad")), "--set program.2: bad (key program.2.in)");
}

TEST(ProgramFileTest, SetErrorsNameTheOption) {
  const std::string file = Data("valid_program.yaml");
  EXPECT_EQ(LoadError(file, {"program.1.tiled=true"}),
            "--set program.1.tiled: key 'tiled' does not apply to op matmul (it takes op, in, "
            "out, name, where, mesh, preferred_element_type) (key program.1.tiled)");
  EXPECT_EQ(LoadError(file, {"outputs.z=P()"}),
            "--set outputs.z: 'z' is never produced (defined: x, w, w_full, y) (key outputs.z)");
  // The file's device list no longer fits the overridden mesh: the error points at it.
  EXPECT_EQ(LoadError(file, {"mesh.axes.dp=2"}),
            file +
                ":8:12: has 8 devices but the mesh has 4 positions (dp=2 x tp=2) (key "
                "mesh.devices)");
  EXPECT_EQ(LoadError(file, {"program.0.axis_name=[dp, dp]"}),
            "--set program.0.axis_name: names mesh axis 'dp' twice (key program.0.axis_name.1)");
}

TEST(RunFileTest, LoadsAProgramOfTwentyThousandOps) {
  // Loading once took time quadratic in the ops (each name looked up in a list).
  constexpr int kOps = 20000;
  std::string text =
      "hardware: {preset: tpu-v5e, shape: [2, 2]}\nmesh:\n  axes: {x: 4}\narrays:\n"
      "  a: {shape: [64], dtype: f32, init: zeros, sharding: \"P('x')\"}\nprogram:\n"
      "  - {op: neg, in: a, out: b0}\n";
  for (int i = 1; i < kOps; ++i) {
    text += "  - {op: neg, in: b" + std::to_string(i - 1) + ", out: b" + std::to_string(i) + "}\n";
  }
  text += "  - {op: neg, in: b0, out: b1}\n";  // Rebinds b1; its default name is taken.
  text += "outputs:\n  b" + std::to_string(kOps - 1) + ": \"P('x')\"\n";
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("shardsim_many_ops_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(path);
    out << text;
  }
  RunFile f = LoadRunFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(f.program);
  ASSERT_EQ(f.program->ops.size(), static_cast<size_t>(kOps + 1));
  EXPECT_EQ(f.program->ops[kOps - 1].name, "b" + std::to_string(kOps - 1));
  EXPECT_EQ(f.program->ops[kOps].name, "op" + std::to_string(kOps));
}

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
        BadOverrideCase{"HugeBandwidth", "hardware.link.bandwidth=1e300 TB/s",
                        "--set hardware.link.bandwidth: bandwidth \"1e300 TB/s\" is too large (at "
                        "most 1 EB/s) (key hardware.link.bandwidth)"},
        BadOverrideCase{"NanBandwidth", "hardware.link.bandwidth=nan GB/s",
                        "--set hardware.link.bandwidth: a bandwidth must be a finite non-negative "
                        "number, got \"nan GB/s\" (key hardware.link.bandwidth)"},
        BadOverrideCase{"HugeFlops", "hardware.device.flops={f32: 1e30 FLOP/s}",
                        "--set hardware.device.flops: compute rate \"1e30 FLOP/s\" is too large "
                        "(at most 1e21 FLOP/s) (key hardware.device.flops.f32)"},
        BadOverrideCase{"NoEquals", "hardware.nodes", "--set hardware.nodes: expected KEY=VALUE"},
        BadOverrideCase{"EmptySegment", "hardware..nodes=2",
                        "--set hardware..nodes=2: expected KEY=VALUE"},
        BadOverrideCase{"IndexPastEnd", "transfers.5.bytes=1",
                        "--set transfers.5.bytes: index 5 is past the end of transfers (2 "
                        "entries) (key transfers.5.bytes)"},
        BadOverrideCase{"IntoScalar", "hardware.preset.name=x",
                        "--set hardware.preset.name: hardware.preset is a value, not a mapping "
                        "or list (key hardware.preset.name)"},
        BadOverrideCase{"ProgramWithTransfers", "program=[]",
                        "--set program: give either transfers: or program:, not both (key "
                        "program)"},
        BadOverrideCase{"ArraysWithTransfers", "arrays.x.shape=[4]",
                        "--set arrays.x.shape: arrays: applies only with program:, not with "
                        "transfers: (key arrays)"}),
    [](const testing::TestParamInfo<BadOverrideCase>& info) { return info.param.name; });

TEST(RunFileTest, ReadsDeviceRooflineFigures) {
  RunFile f = LoadRunFile(Data("valid_device_model.yaml"));
  const DeviceOverride& d = f.hardware.device;
  // Long dtype spellings are stored under the short names the presets and cost model use.
  EXPECT_EQ(d.flops.size(), 2u);
  EXPECT_DOUBLE_EQ(d.flops.at("bf16").per_second(), 900e12);
  EXPECT_DOUBLE_EQ(d.flops.at("f32").per_second(), 400e12);
  EXPECT_DOUBLE_EQ(d.hbm_bandwidth->bytes_per_second(), 3e12);
  EXPECT_EQ(d.matmul_efficiency, 0.75);
  EXPECT_EQ(d.memory_efficiency, 1.0);
  EXPECT_EQ(d.op_overhead, Time::Nanoseconds(3500));
  EXPECT_EQ(d.comm_compute_slowdown, 0.2);
  EXPECT_EQ(d.attention_efficiency, 0.6);
  const KeyLocation& loc = f.locations.at("hardware.device.op_overhead");
  EXPECT_EQ(loc.line, 9);
  EXPECT_EQ(loc.column, 5);

  // A file that leaves them out overrides nothing.
  const DeviceOverride& none = LoadRunFile(Data("valid_run.yaml")).hardware.device;
  EXPECT_FALSE(none.matmul_efficiency || none.memory_efficiency || none.op_overhead ||
               none.comm_compute_slowdown || none.attention_efficiency);
}

// One bad hardware.device value given by --set, with the exact message.
struct BadDeviceValueCase {
  std::string name;      // Test name.
  std::string override;  // The --set string.
  std::string message;   // The exact InputError message.
};

void PrintTo(const BadDeviceValueCase& c, std::ostream* os) { *os << c.name; }

class BadDeviceValueTest : public testing::TestWithParam<BadDeviceValueCase> {};

TEST_P(BadDeviceValueTest, Fails) {
  EXPECT_EQ(LoadError(Data("valid_device_model.yaml"), {GetParam().override}), GetParam().message);
}

// "--set hardware.device.KEY: WHAT (key hardware.device.KEY)".
std::string DeviceError(const std::string& key, const std::string& what) {
  return "--set hardware.device." + key + ": " + what + " (key hardware.device." + key + ")";
}

INSTANTIATE_TEST_SUITE_P(
    DeviceValues, BadDeviceValueTest,
    testing::Values(
        BadDeviceValueCase{
            "MatmulEfficiencyZero", "hardware.device.matmul_efficiency=0",
            DeviceError("matmul_efficiency",
                        "expected a fraction of the peak in (0, 1] like 0.85, got \"0\"")},
        BadDeviceValueCase{"MatmulEfficiencyPercent", "hardware.device.matmul_efficiency=85%",
                           DeviceError("matmul_efficiency", "expected a number, got \"85%\"")},
        BadDeviceValueCase{
            "AttentionEfficiencyAboveOne", "hardware.device.attention_efficiency=1.2",
            DeviceError("attention_efficiency",
                        "expected a fraction of the peak in (0, 1] like 0.85, got \"1.2\"")},
        BadDeviceValueCase{
            "MemoryEfficiencyAboveOne", "hardware.device.memory_efficiency=1.01",
            DeviceError("memory_efficiency",
                        "expected a fraction of the peak in (0, 1] like 0.85, got \"1.01\"")},
        BadDeviceValueCase{
            "MemoryEfficiencyNan", "hardware.device.memory_efficiency=.nan",
            DeviceError("memory_efficiency",
                        "expected a fraction of the peak in (0, 1] like 0.85, got \".nan\"")},
        BadDeviceValueCase{
            "OverheadWrongUnit", "hardware.device.op_overhead=2 GB",
            DeviceError("op_overhead", "expected a time unit (ps, ns, us, ms, s) in \"2 GB\"")},
        BadDeviceValueCase{
            "OverheadBareNumber", "hardware.device.op_overhead=2",
            DeviceError("op_overhead", "expected a time unit (ps, ns, us, ms, s) in \"2\"")},
        BadDeviceValueCase{
            "OverheadNegative", "hardware.device.op_overhead=-1 us",
            DeviceError("op_overhead",
                        "a time must be a finite non-negative number, got \"-1 us\"")},
        BadDeviceValueCase{
            "SlowdownNegative", "hardware.device.comm_compute_slowdown=-0.1",
            DeviceError("comm_compute_slowdown",
                        "expected a finite number >= 0 like 0.1 (compute 10% slower while "
                        "communicating), got \"-0.1\"")},
        BadDeviceValueCase{
            "SlowdownInfinite", "hardware.device.comm_compute_slowdown=.inf",
            DeviceError("comm_compute_slowdown",
                        "expected a finite number >= 0 like 0.1 (compute 10% slower while "
                        "communicating), got \".inf\"")},
        BadDeviceValueCase{
            "SlowdownNotNumber", "hardware.device.comm_compute_slowdown=some",
            DeviceError("comm_compute_slowdown", "expected a number, got \"some\"")}),
    [](const testing::TestParamInfo<BadDeviceValueCase>& info) { return info.param.name; });

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
