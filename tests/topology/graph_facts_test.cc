#include "topology/graph_facts.h"

#include <gtest/gtest.h>

#include "tests/topology/fat_tree_params.h"
#include "topology/build.h"
#include "topology/explicit_graph.h"
#include "topology/fully_connected.h"
#include "topology/hierarchical.h"
#include "topology/ring.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

constexpr double kB = 45e9;  // One-way link bandwidth used below.

Topology Torus(std::vector<int> shape, std::vector<bool> wrap) {
  return BuildTorus(std::move(shape), std::move(wrap), Bandwidth::BytesPerSecond(kB),
                    Time::Microseconds(1), LinkKind::kIci, DeviceSpec{}, "t");
}

HardwareSpec Preset(std::string name, std::vector<int> shape = {}, int nodes = 0) {
  HardwareSpec s;
  s.preset = std::move(name);
  s.shape = std::move(shape);
  s.nodes = nodes;
  return s;
}

HierarchicalParams Tree(int nodes, int per_node, int nodes_per_leaf = 0, int spines = 0) {
  return testing_support::FatTree(nodes, per_node, nodes_per_leaf, spines);
}

TEST(GraphFactsTest, TpuV5pCube) {
  GraphFacts f = ComputeFacts(BuildHardware(Preset("tpu-v5p")));
  EXPECT_EQ(f.devices, 64);
  EXPECT_EQ(f.switches, 0);
  EXPECT_EQ(f.physical_links, 192);
  EXPECT_EQ(f.diameter, 6);  // 3 dims x floor(4/2).
  // Cut across one dimension: 16 rings, each crossed twice (middle + wraparound) = 32 links
  // of 9.0e10 B/s one way = 2.88e12 B/s.
  EXPECT_DOUBLE_EQ(f.bisection.bytes_per_second(), 32 * 9.0e10);
  EXPECT_EQ(f.bisection_method, "closed form: torus");
  EXPECT_EQ(f.wraparound, (std::vector<bool>{true, true, true}));
}

TEST(GraphFactsTest, TpuV5eSlices) {
  GraphFacts mesh = ComputeFacts(BuildHardware(Preset("tpu-v5e", {4, 4})));
  EXPECT_EQ(mesh.diameter, 6);
  EXPECT_DOUBLE_EQ(mesh.bisection.bytes_per_second(), 4 * 4.5e10);  // 4 lines, no wrap.
  GraphFacts pod = ComputeFacts(BuildHardware(Preset("tpu-v5e", {16, 16})));
  EXPECT_EQ(pod.diameter, 16);
  EXPECT_DOUBLE_EQ(pod.bisection.bytes_per_second(), 2 * 16 * 4.5e10);
  // 16x4 wrapping only the long axis: cutting the long axis costs 2*4 links, the short 1*16.
  GraphFacts mixed = ComputeFacts(BuildHardware(Preset("tpu-v6e", {16, 4})));
  EXPECT_DOUBLE_EQ(mixed.bisection.bytes_per_second(), 8 * 9.0e10);
}

TEST(GraphFactsTest, GpuNodesAndFatTrees) {
  GraphFacts node = ComputeFacts(BuildHardware(Preset("h100-dgx")));
  EXPECT_EQ(node.devices, 8);
  EXPECT_EQ(node.switches, 1);
  EXPECT_EQ(node.physical_links, 8);
  EXPECT_EQ(node.diameter, 2);
  // 4 GPUs x 450 GB/s one way = 1.8 TB/s (hardware.md's "node bisection 3.6 TB/s" counts
  // both directions).
  EXPECT_DOUBLE_EQ(node.bisection.bytes_per_second(), 4 * 450e9);
  EXPECT_EQ(node.bisection_method, "closed form: switch");
  EXPECT_TRUE(node.wraparound.empty());

  GraphFacts four = ComputeFacts(BuildHardware(Preset("h100-dgx", {}, 4)));
  EXPECT_EQ(four.devices, 32);
  EXPECT_EQ(four.diameter, 2);                                     // One leaf.
  EXPECT_DOUBLE_EQ(four.bisection.bytes_per_second(), 16 * 50e9);  // Half the NICs.
  EXPECT_EQ(four.bisection_method, "closed form: fat tree");

  GraphFacts pod = ComputeFacts(BuildHardware(Preset("h100-dgx", {}, 128)));
  EXPECT_EQ(pod.devices, 1024);
  EXPECT_EQ(pod.switches, 128 + 4 + 8);
  EXPECT_EQ(pod.diameter, 4);
  EXPECT_DOUBLE_EQ(pod.bisection.bytes_per_second(), 512 * 50e9);
}

TEST(GraphFactsTest, RingsAndFullyConnected) {
  GraphFacts ring = ComputeFacts(
      BuildRing(8, true, Bandwidth::BytesPerSecond(kB), Time(), LinkKind::kIci, DeviceSpec{}));
  EXPECT_EQ(ring.diameter, 4);
  EXPECT_DOUBLE_EQ(ring.bisection.bytes_per_second(), 2 * kB);
  GraphFacts one_way = ComputeFacts(
      BuildRing(8, false, Bandwidth::BytesPerSecond(kB), Time(), LinkKind::kIci, DeviceSpec{}));
  EXPECT_EQ(one_way.diameter, 7);
  EXPECT_DOUBLE_EQ(one_way.bisection.bytes_per_second(), kB);
  EXPECT_EQ(one_way.bisection_method, "closed form: one-way ring");
  GraphFacts full = ComputeFacts(BuildFullyConnected(7, Bandwidth::BytesPerSecond(kB), Time(),
                                                     LinkKind::kGeneric, DeviceSpec{}));
  EXPECT_EQ(full.diameter, 1);
  EXPECT_DOUBLE_EQ(full.bisection.bytes_per_second(), 3 * 4 * kB);
  EXPECT_EQ(full.bisection_method, "closed form: fully connected");
  GraphFacts single = ComputeFacts(Torus({1}, {true}));
  EXPECT_EQ(single.diameter, 0);
  EXPECT_EQ(single.bisection.bytes_per_second(), 0);
}

// The closed forms must agree with exact enumeration wherever enumeration is feasible.
struct TorusCase {
  std::vector<int> shape;
  std::vector<bool> wrap;
};

class TorusClosedFormTest : public testing::TestWithParam<TorusCase> {};

TEST_P(TorusClosedFormTest, MatchesExactEnumeration) {
  Topology t = Torus(GetParam().shape, GetParam().wrap);
  GraphFacts f = ComputeFacts(t);
  EXPECT_EQ(f.bisection_method, "closed form: torus");
  EXPECT_NEAR(f.bisection.bytes_per_second(), ExactBisection(t).bytes_per_second(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TorusClosedFormTest,
    testing::Values(TorusCase{{3}, {true}}, TorusCase{{5}, {false}}, TorusCase{{6}, {true}},
                    TorusCase{{2, 4}, {true, true}}, TorusCase{{3, 3}, {true, true}},
                    TorusCase{{3, 3}, {false, false}}, TorusCase{{3, 4}, {true, false}},
                    TorusCase{{3, 4}, {false, true}}, TorusCase{{4, 4}, {true, true}},
                    TorusCase{{4, 4}, {false, false}}, TorusCase{{4, 4}, {true, false}},
                    TorusCase{{2, 2, 2}, {false, false, false}},
                    TorusCase{{2, 2, 3}, {true, true, true}}, TorusCase{{3, 5}, {true, true}},
                    TorusCase{{3, 5}, {false, true}}, TorusCase{{2, 7}, {false, true}},
                    TorusCase{{1, 4, 3}, {true, true, false}},
                    TorusCase{{2, 2, 4}, {false, false, true}}));

TEST(ClosedFormTest, SwitchFullyConnectedAndFatTreeMatchExactEnumeration) {
  std::vector<Topology> topologies;
  topologies.push_back(
      BuildSwitch(5, Bandwidth::GBps(450), Time(), LinkKind::kNvlink, DeviceSpec{}));
  topologies.push_back(
      BuildSwitch(8, Bandwidth::GBps(450), Time(), LinkKind::kNvlink, DeviceSpec{}));
  topologies.push_back(BuildFullyConnected(6, Bandwidth::BytesPerSecond(kB), Time(),
                                           LinkKind::kGeneric, DeviceSpec{}));
  topologies.push_back(
      BuildRing(7, false, Bandwidth::BytesPerSecond(kB), Time(), LinkKind::kIci, DeviceSpec{}));
  for (HierarchicalParams p : {Tree(1, 4), Tree(2, 3), Tree(3, 2, 1, 2), Tree(3, 3, 2, 3),
                               Tree(4, 3, 2, 2), Tree(5, 2, 2, 1)}) {
    topologies.push_back(BuildHierarchical(p, DeviceSpec{}));
  }
  for (const Topology& t : topologies) {
    GraphFacts f = ComputeFacts(t);
    EXPECT_NE(f.bisection_method, "exact enumeration") << t.name();
    EXPECT_NEAR(f.bisection.bytes_per_second(), ExactBisection(t).bytes_per_second(), 2.0)
        << t.name() << " (" << f.bisection_method << ")";
  }
}

ExplicitLinkSpec L(int src, int dst) {
  ExplicitLinkSpec l;
  l.src = src;
  l.dst = dst;
  l.bandwidth = Bandwidth::BytesPerSecond(kB);
  l.latency = Time::Microseconds(1);
  return l;
}

TEST(GraphFactsTest, ExplicitGraphsUseBfsAndEnumeration) {
  // A 6-cycle given as an explicit graph.
  CustomTopologySpec spec;
  spec.kind = "graph";
  spec.devices = 6;
  for (int i = 0; i < 6; ++i) spec.links.push_back(L(i, (i + 1) % 6));
  GraphFacts f = ComputeFacts(BuildExplicitGraph(spec, DeviceSpec{}));
  EXPECT_EQ(f.diameter, 3);
  EXPECT_DOUBLE_EQ(f.bisection.bytes_per_second(), 2 * kB);
  EXPECT_EQ(f.bisection_method, "exact enumeration");
  EXPECT_TRUE(f.wraparound.empty());

  // A path 0 - 1 - 2 - 3 plus a chord 0 - 3: a 4-cycle, bisection 2 links.
  spec.devices = 4;
  spec.links = {L(0, 1), L(1, 2), L(2, 3), L(0, 3)};
  f = ComputeFacts(BuildExplicitGraph(spec, DeviceSpec{}));
  EXPECT_EQ(f.diameter, 2);
  EXPECT_DOUBLE_EQ(f.bisection.bytes_per_second(), 2 * kB);
}

TEST(GraphFactsTest, LargeExplicitGraphGivesAnUpperBound) {
  // A 40-cycle: the true bisection is 2 links; a structured candidate finds it.
  CustomTopologySpec spec;
  spec.kind = "graph";
  spec.devices = 40;
  for (int i = 0; i < 40; ++i) spec.links.push_back(L(i, (i + 1) % 40));
  GraphFacts f = ComputeFacts(BuildExplicitGraph(spec, DeviceSpec{}));
  EXPECT_EQ(f.diameter, 20);
  EXPECT_DOUBLE_EQ(f.bisection.bytes_per_second(), 2 * kB);
  EXPECT_EQ(f.bisection_method, "upper bound: best of 4 candidate cuts");
}

TEST(GraphFactsTest, UnrecognizedSwitchedGraphUsesMaxFlow) {
  // Two switches joined by a thin link, two devices on each: the cut is the thin link.
  TopologyBuilder b("dumbbell");
  for (int i = 0; i < 4; ++i) b.AddDevice("d" + std::to_string(i));
  VertexId left = b.AddSwitch("left");
  VertexId right = b.AddSwitch("right");
  for (int i = 0; i < 2; ++i) {
    b.AddDuplexLink(i, left, Bandwidth::GBps(100), Time(), LinkKind::kGeneric);
    b.AddDuplexLink(i + 2, right, Bandwidth::GBps(100), Time(), LinkKind::kGeneric);
  }
  b.AddDuplexLink(left, right, Bandwidth::GBps(10), Time(), LinkKind::kGeneric);
  GraphFacts f = ComputeFacts(b.Build());
  EXPECT_EQ(f.bisection_method, "exact enumeration");
  EXPECT_DOUBLE_EQ(f.bisection.bytes_per_second(), 10e9);
  EXPECT_EQ(f.diameter, 3);
}

}  // namespace
}  // namespace shardsim
