#include "topology/switch.h"

#include <gtest/gtest.h>

#include "topology/fully_connected.h"

namespace shardsim {
namespace {

TEST(SwitchTest, EveryDeviceHangsOffOneSwitch) {
  DeviceSpec d;
  d.platform = "GPU";
  Topology t =
      BuildSwitch(8, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink, d, "node");
  EXPECT_EQ(t.num_devices(), 8);
  EXPECT_EQ(t.num_switches(), 1);
  EXPECT_EQ(t.num_physical_links(), 8);
  const VertexId hub = 8;
  EXPECT_EQ(t.node(hub).kind, NodeKind::kSwitch);
  EXPECT_EQ(t.node(hub).name, "nvswitch");
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(t.out_links(i).size(), 1u);
    EXPECT_EQ(t.link(t.out_links(i)[0]).dst, hub);
    ASSERT_TRUE(t.FindLink(hub, i).has_value());
    EXPECT_EQ(t.link(*t.FindLink(hub, i)).bandwidth, Bandwidth::GBps(450));
  }
}

TEST(FullyConnectedTest, EveryPairIsLinked) {
  Topology t = BuildFullyConnected(5, Bandwidth::GBps(10), Time::Microseconds(1),
                                   LinkKind::kGeneric, DeviceSpec{});
  EXPECT_EQ(t.num_devices(), 5);
  EXPECT_EQ(t.num_switches(), 0);
  EXPECT_EQ(t.num_physical_links(), 10);
  for (int a = 0; a < 5; ++a) {
    for (int b = 0; b < 5; ++b) {
      if (a != b) {
        EXPECT_TRUE(t.FindLink(a, b).has_value()) << a << "->" << b;
      }
    }
  }
  EXPECT_EQ(t.node(2).name, "device 2");
}

}  // namespace
}  // namespace shardsim
