#include "topology/presets.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "sim/spec_error.h"
#include "topology/build.h"
#include "topology/graph_facts.h"
#include "topology/hierarchical.h"

namespace shardsim {
namespace {

HardwareSpec Preset(std::string name, std::vector<int> shape = {}, int nodes = 0) {
  HardwareSpec s;
  s.preset = std::move(name);
  s.shape = std::move(shape);
  s.nodes = nodes;
  return s;
}

HardwareSpec Custom(CustomTopologySpec topo) {
  HardwareSpec s;
  s.topology = std::move(topo);
  return s;
}

// The key of the SpecError BuildHardware raises; the message goes to `message`.
std::string ErrorKey(const HardwareSpec& spec, std::string* message = nullptr) {
  try {
    BuildHardware(spec);
  } catch (const SpecError& e) {
    if (message) *message = e.what();
    return e.key();
  }
  return "(no error)";
}

TEST(PresetsTest, NamesFollowTheSpec) {
  EXPECT_EQ(PresetNames(),
            (std::vector<std::string>{"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "a100-dgx",
                                      "h100-dgx", "h200-dgx", "b200-dgx", "gb200-nvl72"}));
  EXPECT_TRUE(IsPreset("tpu-v5p"));
  EXPECT_FALSE(IsPreset("tpu-v5"));
  EXPECT_TRUE(IsTpuPreset("tpu-v6e"));
  EXPECT_FALSE(IsTpuPreset("h100-dgx"));
}

TEST(PresetsTest, EveryPresetBuilds) {
  for (const std::string& name : PresetNames()) {
    Topology t = BuildHardware(Preset(name));
    EXPECT_GT(t.num_devices(), 1) << name;
    EXPECT_GT(t.device_spec().flops.count("bf16"), 0u) << name;
    EXPECT_GT(t.device_spec().flops.count("f32"), 0u) << name;
    EXPECT_GT(t.device_spec().hbm_bandwidth.bytes_per_second(), 0) << name;
    EXPECT_GT(t.device_spec().hbm_capacity.count(), 0) << name;
    for (const Link& l : t.links()) EXPECT_GT(l.bandwidth.bytes_per_second(), 0) << name;
    // The packed bandwidths are the links' own, link by link.
    ASSERT_EQ(t.link_bytes_per_second().size(), t.links().size()) << name;
    for (size_t id = 0; id < t.links().size(); ++id) {
      EXPECT_EQ(t.link_bytes_per_second()[id], t.links()[id].bandwidth.bytes_per_second()) << name;
    }
  }
}

TEST(PresetsTest, TpuV5pDefaultIsAFull4x4x4Torus) {
  Topology t = BuildHardware(Preset("tpu-v5p"));
  GraphFacts f = ComputeFacts(t);
  EXPECT_EQ(f.devices, 64);
  EXPECT_EQ(f.switches, 0);
  EXPECT_EQ(f.physical_links, 192);
  EXPECT_EQ(f.diameter, 6);
  EXPECT_EQ(f.wraparound, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(t.name(), "tpu-v5p 4x4x4");
  for (const Link& l : t.links()) {
    EXPECT_EQ(l.bandwidth.bytes_per_second(), 9.0e10);
    EXPECT_EQ(l.latency, Time::Microseconds(1));
    EXPECT_EQ(l.kind, LinkKind::kIci);
  }
  const DeviceSpec& d = t.device_spec();
  EXPECT_EQ(d.chip, "TPU v5p");
  EXPECT_EQ(d.platform, "TPU");
  EXPECT_EQ(d.flops.at("bf16").per_second(), 4.59e14);
  EXPECT_EQ(d.flops.at("int8").per_second(), 9.18e14);
  EXPECT_DOUBLE_EQ(d.flops.at("f32").per_second(), 4.59e14 / 3);
  EXPECT_EQ(d.hbm_bandwidth.bytes_per_second(), 2.8e12);
  EXPECT_EQ(d.hbm_capacity.count(), 96'000'000'000);
}

struct WrapCase {
  std::string preset;
  std::vector<int> shape;
  std::vector<bool> wrap;
  int diameter;
};

class PresetWrapTest : public testing::TestWithParam<WrapCase> {};

TEST_P(PresetWrapTest, FollowsThePresetRule) {
  const WrapCase& c = GetParam();
  GraphFacts f = ComputeFacts(BuildHardware(Preset(c.preset, c.shape)));
  EXPECT_EQ(f.wraparound, c.wrap);
  EXPECT_EQ(f.diameter, c.diameter);
  EXPECT_EQ(PresetWraparound(c.preset, c.shape), c.wrap);
}

INSTANTIATE_TEST_SUITE_P(Slices, PresetWrapTest,
                         testing::Values(
                             // v5e/v6e: only an axis of length 16 wraps.
                             WrapCase{"tpu-v5e", {4, 4}, {false, false}, 6},
                             WrapCase{"tpu-v5e", {16, 16}, {true, true}, 16},
                             WrapCase{"tpu-v6e", {16, 4}, {true, false}, 8 + 3},
                             WrapCase{"tpu-v5e", {8, 8}, {false, false}, 14},
                             // v4/v5p: multiples of 4 in slices of full cubes; hardware.md:
                             // "smaller slices (2x2x1, 2x2x2, 2x2x4) have none".
                             WrapCase{"tpu-v5p", {2, 2, 4}, {false, false, false}, 1 + 1 + 3},
                             WrapCase{"tpu-v5p", {2, 2, 1}, {false, false, false}, 2},
                             WrapCase{"tpu-v4", {4, 4, 8}, {true, true, true}, 2 + 2 + 4},
                             WrapCase{"tpu-v5p", {16, 20, 28}, {true, true, true}, 8 + 10 + 14},
                             WrapCase{"tpu-v5p", {4, 4, 6}, {true, true, false}, 2 + 2 + 5}));

TEST(PresetsTest, WraparoundOverride) {
  HardwareSpec s = Preset("tpu-v5e", {4, 2});
  s.wraparound = {true, false};
  GraphFacts f = ComputeFacts(BuildHardware(s));
  EXPECT_EQ(f.wraparound, (std::vector<bool>{true, false}));
  EXPECT_EQ(f.physical_links, 2 * 4 + 4 * 1);
}

TEST(PresetsTest, H100NodeIsEightGpusOnOneSwitch) {
  Topology t = BuildHardware(Preset("h100-dgx"));
  EXPECT_EQ(t.num_devices(), 8);
  EXPECT_EQ(t.num_switches(), 1);
  EXPECT_EQ(t.num_physical_links(), 8);
  EXPECT_EQ(t.links().size(), 16u);
  for (const Link& l : t.links()) {
    EXPECT_EQ(l.bandwidth.bytes_per_second(), 450e9);  // Per direction.
    EXPECT_EQ(l.kind, LinkKind::kNvlink);
    EXPECT_EQ(l.latency, kNvlinkLatency);
  }
  EXPECT_EQ(t.device_spec().chip, "H100 SXM");
  EXPECT_EQ(t.device_spec().platform, "GPU");
  EXPECT_EQ(t.device_spec().flops.at("bf16").per_second(), 9.9e14);
  EXPECT_EQ(t.device_spec().flops.at("fp8").per_second(), 2.0e15);
  EXPECT_EQ(t.device_spec().hbm_capacity.count(), 80'000'000'000);
}

struct GpuCase {
  std::string preset;
  int gpus;
  double nvlink;
  double hbm_bandwidth;
};

class GpuPresetTest : public testing::TestWithParam<GpuCase> {};

TEST_P(GpuPresetTest, MatchesHardwareTable) {
  const GpuCase& c = GetParam();
  Topology t = BuildHardware(Preset(c.preset));
  EXPECT_EQ(t.num_devices(), c.gpus);
  EXPECT_EQ(t.num_switches(), 1);
  EXPECT_EQ(t.links().front().bandwidth.bytes_per_second(), c.nvlink);
  EXPECT_EQ(t.device_spec().hbm_bandwidth.bytes_per_second(), c.hbm_bandwidth);
}

INSTANTIATE_TEST_SUITE_P(Gpus, GpuPresetTest,
                         testing::Values(GpuCase{"a100-dgx", 8, 300e9, 2.0e12},
                                         GpuCase{"h100-dgx", 8, 450e9, 3.35e12},
                                         GpuCase{"h200-dgx", 8, 450e9, 4.8e12},
                                         GpuCase{"b200-dgx", 8, 900e9, 8.0e12},
                                         GpuCase{"gb200-nvl72", 72, 900e9, 8.0e12}));

TEST(PresetsTest, MultiNodeGpuPresetIsAFatTree) {
  HardwareSpec s = Preset("h100-dgx", {}, 4);
  s.link.bandwidth = Bandwidth::GBps(400);  // Applies to NVLink only.
  Topology t = BuildHardware(s);
  EXPECT_EQ(t.num_devices(), 32);
  std::optional<HierarchicalParams> p = RecognizeHierarchical(t);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->nodes, 4);
  EXPECT_EQ(p->per_node, 8);
  EXPECT_EQ(p->nvlink_bandwidth, Bandwidth::GBps(400));
  EXPECT_EQ(p->nic_bandwidth, Bandwidth::GBps(50));  // 400 Gb/s NICs, untouched.
  EXPECT_EQ(t.name(), "h100-dgx, 4 nodes");
  EXPECT_EQ(BuildHardware(Preset("h100-dgx", {}, 1)).num_switches(), 1);
}

TEST(PresetsTest, LinkAndDeviceOverrides) {
  HardwareSpec s = Preset("tpu-v5e", {4, 2});
  s.link.bandwidth = Bandwidth::GBps(90);
  s.link.latency = Time::Nanoseconds(250);
  s.device.flops["bf16"] = FlopRate::PerSecond(1e14);
  s.device.hbm_capacity = Bytes::GiB(32);
  Topology t = BuildHardware(s);
  for (const Link& l : t.links()) {
    EXPECT_EQ(l.bandwidth, Bandwidth::GBps(90));
    EXPECT_EQ(l.latency, Time::Nanoseconds(250));
  }
  EXPECT_EQ(t.device_spec().flops.at("bf16").per_second(), 1e14);
  EXPECT_EQ(t.device_spec().flops.at("int8").per_second(), 3.94e14);  // Kept.
  EXPECT_EQ(t.device_spec().hbm_capacity, Bytes::GiB(32));
  EXPECT_EQ(t.device_spec().hbm_bandwidth.bytes_per_second(), 8.2e11);  // Kept.
}

struct BadSpecCase {
  std::string what;
  HardwareSpec spec;
  std::string key;
  std::string message_part;
};

class BadHardwareTest : public testing::TestWithParam<BadSpecCase> {};

TEST_P(BadHardwareTest, ThrowsSpecErrorWithKey) {
  std::string message;
  EXPECT_EQ(ErrorKey(GetParam().spec, &message), GetParam().key);
  EXPECT_NE(message.find(GetParam().message_part), std::string::npos) << message;
}

HardwareSpec WithWrap(HardwareSpec s, std::vector<bool> wrap) {
  s.wraparound = std::move(wrap);
  return s;
}
HardwareSpec WithLink(HardwareSpec s, Bandwidth bw) {
  s.link.bandwidth = bw;
  return s;
}
HardwareSpec WithLatency(HardwareSpec s, Time t) {
  s.link.latency = t;
  return s;
}
HardwareSpec WithHbm(HardwareSpec s, Bandwidth bw) {
  s.device.hbm_bandwidth = bw;
  return s;
}
HardwareSpec WithFlops(HardwareSpec s, std::string dtype, double rate) {
  s.device.flops[dtype] = FlopRate::PerSecond(rate);
  return s;
}
CustomTopologySpec Kind(std::string kind) {
  CustomTopologySpec t;
  t.kind = std::move(kind);
  return t;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadHardwareTest,
    testing::Values(
        BadSpecCase{"unknown preset", Preset("tpu-v5"), "hardware.preset",
                    "did you mean 'tpu-v5e'?"},
        BadSpecCase{"unknown preset lists names", Preset("h100"), "hardware.preset",
                    "Known presets: tpu-v4, tpu-v5e"},
        BadSpecCase{"no suggestion for nonsense", Preset("zzzzzzzzzzzzzzzz"), "hardware.preset",
                    "unknown preset 'zzzzzzzzzzzzzzzz'. Known"},
        BadSpecCase{"neither preset nor topology", HardwareSpec{}, "hardware.preset",
                    "needs a `preset`"},
        BadSpecCase{"shape rank", Preset("tpu-v5p", {4, 4}), "hardware.shape", "3D torus"},
        BadSpecCase{"shape rank 2d", Preset("tpu-v5e", {4, 4, 4}), "hardware.shape",
                    "2 dimensions"},
        BadSpecCase{"zero dimension", Preset("tpu-v5e", {4, 0}), "hardware.shape", ">= 1"},
        BadSpecCase{"negative dimension", Preset("tpu-v4", {4, -4, 4}), "hardware.shape", ">= 1"},
        BadSpecCase{"too many chips", Preset("tpu-v5p", {1024, 1024, 1024}), "hardware.shape",
                    "more than"},
        BadSpecCase{"wraparound length", WithWrap(Preset("tpu-v5p"), {true, true}),
                    "hardware.wraparound", "2 entries"},
        BadSpecCase{"shape on gpu", Preset("h100-dgx", {8}), "hardware.shape", "GPU preset"},
        BadSpecCase{"wraparound on gpu", WithWrap(Preset("a100-dgx"), {true}),
                    "hardware.wraparound", "GPU preset"},
        BadSpecCase{"nodes on tpu", Preset("tpu-v5p", {}, 2), "hardware.nodes", "TPU preset"},
        BadSpecCase{"negative nodes", Preset("h100-dgx", {}, -1), "hardware.nodes", ">= 1"},
        BadSpecCase{"zero link bandwidth", WithLink(Preset("tpu-v5e"), Bandwidth()),
                    "hardware.link.bandwidth", "positive"},
        BadSpecCase{"negative latency", WithLatency(Preset("tpu-v5e"), Time::Nanoseconds(-1)),
                    "hardware.link.latency", "negative"},
        BadSpecCase{"zero hbm bandwidth", WithHbm(Preset("h100-dgx"), Bandwidth()),
                    "hardware.device.hbm_bandwidth", "positive"},
        BadSpecCase{"zero flops", WithFlops(Preset("h100-dgx"), "bf16", 0),
                    "hardware.device.flops.bf16", "positive"},
        BadSpecCase{"unknown kind", Custom(Kind("tours")), "hardware.topology.kind",
                    "did you mean 'torus'?"},
        BadSpecCase{"missing kind", Custom(Kind("")), "hardware.topology.kind", "needs a kind"},
        BadSpecCase{"torus without shape", Custom(Kind("torus")), "hardware.topology.shape",
                    "shape"},
        BadSpecCase{"ring without size", Custom(Kind("ring")), "hardware.topology.size",
                    "size >= 1 (missing?)"},
        BadSpecCase{"switch without size", Custom(Kind("switch")), "hardware.topology.size",
                    "size"},
        BadSpecCase{"fully connected without size", Custom(Kind("fully_connected")),
                    "hardware.topology.size", "size"},
        BadSpecCase{"hierarchical without nodes", Custom(Kind("hierarchical")),
                    "hardware.topology.nodes", "nodes"},
        BadSpecCase{"graph without devices", Custom(Kind("graph")), "hardware.topology.devices",
                    "devices"}),
    [](const testing::TestParamInfo<BadSpecCase>& info) {
      std::string name;
      for (char c : info.param.what) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(BuildHardwareTest, BothPresetAndTopologyIsAnError) {
  HardwareSpec s = Custom(Kind("ring"));
  s.preset = "tpu-v5e";
  EXPECT_EQ(ErrorKey(s), "hardware.preset");
}

TEST(BuildHardwareTest, PresetKeysOnCustomTopologyAreErrors) {
  CustomTopologySpec ring = Kind("ring");
  ring.size = 4;
  HardwareSpec s = Custom(ring);
  s.shape = {4};
  EXPECT_EQ(ErrorKey(s), "hardware.shape");
  s.shape.clear();
  s.nodes = 2;
  EXPECT_EQ(ErrorKey(s), "hardware.nodes");
}

TEST(BuildHardwareTest, CustomKinds) {
  CustomTopologySpec torus = Kind("torus");
  torus.shape = {4, 2};
  Topology t = BuildHardware(Custom(torus));
  EXPECT_EQ(t.num_devices(), 8);
  EXPECT_EQ(t.torus()->wraparound, (std::vector<bool>{true, false}));  // Default all true.
  EXPECT_EQ(t.links().front().bandwidth.bytes_per_second(), 4.5e10);

  torus.wraparound = {true};
  EXPECT_EQ(ErrorKey(Custom(torus)), "hardware.topology.wraparound");

  CustomTopologySpec ring = Kind("ring");
  ring.size = 6;
  ring.bidirectional = false;
  HardwareSpec ring_spec = Custom(ring);
  ring_spec.link.bandwidth = Bandwidth::GBps(7);
  Topology r = BuildHardware(ring_spec);
  EXPECT_EQ(r.links().size(), 6u);
  EXPECT_EQ(r.links().front().bandwidth, Bandwidth::GBps(7));

  CustomTopologySpec sw = Kind("switch");
  sw.size = 4;
  EXPECT_EQ(BuildHardware(Custom(sw)).num_switches(), 1);

  CustomTopologySpec fc = Kind("fully_connected");
  fc.size = 4;
  EXPECT_EQ(BuildHardware(Custom(fc)).num_physical_links(), 6);

  CustomTopologySpec tree = Kind("hierarchical");
  tree.nodes = 2;
  tree.per_node = 4;
  EXPECT_EQ(ErrorKey(Custom(Kind("hierarchical"))), "hardware.topology.nodes");
  CustomTopologySpec no_per_node = tree;
  no_per_node.per_node = 0;
  EXPECT_EQ(ErrorKey(Custom(no_per_node)), "hardware.topology.per_node");
  tree.nic_bandwidth = Bandwidth::Gbps(800);
  Topology h = BuildHardware(Custom(tree));
  ASSERT_TRUE(RecognizeHierarchical(h).has_value());
  EXPECT_EQ(RecognizeHierarchical(h)->nic_bandwidth, Bandwidth::GBps(100));

  CustomTopologySpec graph = Kind("graph");
  graph.devices = 2;
  ExplicitLinkSpec link;
  link.src = 0;
  link.dst = 1;
  link.bandwidth = Bandwidth::GBps(3);
  graph.links = {link};
  EXPECT_EQ(BuildHardware(Custom(graph)).links().front().bandwidth, Bandwidth::GBps(3));
  graph.links[0].dst = 5;
  EXPECT_EQ(ErrorKey(Custom(graph)), "hardware.topology.links");
}

TEST(PresetsTest, DeviceSpecAndDefaultShape) {
  EXPECT_EQ(PresetDeviceSpec("tpu-v4").flops.at("bf16").per_second(), 2.75e14);
  EXPECT_EQ(PresetDeviceSpec("b200-dgx").hbm_capacity.count(), 192'000'000'000);
  EXPECT_EQ(PresetDefaultShape("tpu-v6e"), (std::vector<int>{4, 4}));
  EXPECT_TRUE(PresetDefaultShape("h200-dgx").empty());
  EXPECT_THROW(PresetDeviceSpec("nope"), SpecError);
}

}  // namespace
}  // namespace shardsim
