#include "topology/hierarchical.h"

#include <gtest/gtest.h>

#include "tests/topology/fat_tree_params.h"
#include "topology/switch.h"

namespace shardsim {
namespace {

HierarchicalParams Params(int nodes, int per_node, int nodes_per_leaf = 0, int spines = 0) {
  return testing_support::FatTree(nodes, per_node, nodes_per_leaf, spines);
}

TEST(HierarchicalTest, ResolvesDefaults) {
  HierarchicalParams small = ResolveHierarchical(Params(4, 8));
  EXPECT_EQ(small.nodes_per_leaf, 4);  // Capped at the node count: one leaf.
  EXPECT_EQ(small.spines, 0);          // No spines above a single leaf.
  HierarchicalParams pod = ResolveHierarchical(Params(128, 8));
  EXPECT_EQ(pod.nodes_per_leaf, 32);  // A SuperPod scalable unit.
  EXPECT_EQ(pod.spines, 8);           // One per NIC rail.
}

TEST(HierarchicalTest, OneLeafHasNoSpines) {
  DeviceSpec d;
  d.platform = "GPU";
  Topology t = BuildHierarchical(Params(4, 8), d);
  EXPECT_EQ(t.num_devices(), 32);
  EXPECT_EQ(t.num_switches(), 4 + 1);  // 4 NVSwitches, 1 leaf.
  EXPECT_EQ(t.num_physical_links(), 32 * 2);
  FatTreeLayout layout(ResolveHierarchical(Params(4, 8)));
  EXPECT_EQ(t.node(layout.NodeSwitch(2)).name, "nvswitch2");
  EXPECT_EQ(t.node(layout.Leaf(0)).name, "leaf0");
  EXPECT_EQ(t.node(9).name, "GPU 9 (node 1)");
  // GPU 9 sits in node 1: NVLink to nvswitch1, NIC to leaf0.
  ASSERT_EQ(t.out_links(9).size(), 2u);
  const Link& nvlink = t.link(t.out_links(9)[0]);
  const Link& nic = t.link(t.out_links(9)[1]);
  EXPECT_EQ(nvlink.dst, layout.NodeSwitch(1));
  EXPECT_EQ(nvlink.kind, LinkKind::kNvlink);
  EXPECT_EQ(nvlink.bandwidth, Bandwidth::GBps(450));
  EXPECT_EQ(nic.dst, layout.Leaf(0));
  EXPECT_EQ(nic.kind, LinkKind::kNic);
  EXPECT_EQ(nic.bandwidth, Bandwidth::GBps(50));
}

TEST(HierarchicalTest, SpineUplinksMatchLeafDownlinks) {
  // 64 nodes of 8 GPUs: 2 leaves of 32 nodes, 8 spines.
  Topology t = BuildHierarchical(Params(64, 8), DeviceSpec{});
  FatTreeLayout layout(ResolveHierarchical(Params(64, 8)));
  EXPECT_EQ(layout.num_leaves(), 2);
  EXPECT_EQ(t.num_switches(), 64 + 2 + 8);
  EXPECT_EQ(t.num_physical_links(), 512 * 2 + 2 * 8);
  for (int leaf = 0; leaf < 2; ++leaf) {
    double up = 0, down = 0;
    for (const Link& l : t.links()) {
      if (l.src == layout.Leaf(leaf) && l.kind == LinkKind::kFabric) {
        up += l.bandwidth.bytes_per_second();
      }
      if (l.src == layout.Leaf(leaf) && l.kind == LinkKind::kNic) {
        down += l.bandwidth.bytes_per_second();
      }
    }
    EXPECT_DOUBLE_EQ(up, down);
    EXPECT_DOUBLE_EQ(up, 256 * 50e9);  // 256 GPUs x 50 GB/s.
  }
  EXPECT_EQ(layout.UplinkBandwidth(0), Bandwidth::BytesPerSecond(256 * 50e9 / 8));
}

TEST(HierarchicalTest, LastLeafMayBePartial) {
  // 3 nodes, 2 per leaf: leaf 1 holds one node; its uplinks carry one node's worth.
  FatTreeLayout layout(ResolveHierarchical(Params(3, 4, 2, 2)));
  EXPECT_EQ(layout.num_leaves(), 2);
  EXPECT_EQ(layout.NodesUnderLeaf(0), 2);
  EXPECT_EQ(layout.NodesUnderLeaf(1), 1);
  EXPECT_DOUBLE_EQ(layout.UplinkBandwidth(1).bytes_per_second(), 4 * 50e9 / 2);
  Topology t = BuildHierarchical(Params(3, 4, 2, 2), DeviceSpec{});
  EXPECT_EQ(t.num_devices(), 12);
  EXPECT_EQ(t.num_switches(), 3 + 2 + 2);
}

TEST(HierarchicalTest, RecognizesWhatItBuilds) {
  for (HierarchicalParams p :
       {Params(1, 8), Params(4, 8), Params(64, 8), Params(3, 4, 2, 2), Params(5, 1, 2, 3)}) {
    Topology t = BuildHierarchical(p, DeviceSpec{});
    std::optional<HierarchicalParams> seen = RecognizeHierarchical(t);
    ASSERT_TRUE(seen.has_value()) << p.nodes << "x" << p.per_node;
    HierarchicalParams want = ResolveHierarchical(p);
    EXPECT_EQ(seen->nodes, want.nodes);
    EXPECT_EQ(seen->per_node, want.per_node);
    EXPECT_EQ(seen->nodes_per_leaf, want.nodes_per_leaf);
    EXPECT_EQ(seen->spines, want.spines);
    EXPECT_EQ(seen->nic_bandwidth, want.nic_bandwidth);
    EXPECT_EQ(seen->fabric_latency, want.spines > 0 ? want.fabric_latency : Time());
  }
}

TEST(HierarchicalTest, DoesNotRecognizeOtherTopologies) {
  EXPECT_FALSE(RecognizeHierarchical(
      BuildSwitch(8, Bandwidth::GBps(450), Time(), LinkKind::kNvlink, DeviceSpec{})));
  // A fat tree with one extra link is no longer the built structure.
  TopologyBuilder b("almost");
  for (int i = 0; i < 2; ++i) b.AddDevice("GPU " + std::to_string(i));
  VertexId sw = b.AddSwitch("nvswitch0");
  VertexId leaf = b.AddSwitch("leaf0");
  for (int i = 0; i < 2; ++i) {
    b.AddDuplexLink(i, sw, Bandwidth::GBps(450), Time(), LinkKind::kNvlink);
    b.AddDuplexLink(i, leaf, Bandwidth::GBps(50), Time(), LinkKind::kNic);
  }
  b.AddDuplexLink(0, 1, Bandwidth::GBps(1), Time(), LinkKind::kGeneric);
  EXPECT_FALSE(RecognizeHierarchical(b.Build()));
}

}  // namespace
}  // namespace shardsim
