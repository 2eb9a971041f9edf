#include "topology/ring.h"

#include <gtest/gtest.h>

namespace shardsim {
namespace {

Topology Ring(int size, bool bidirectional) {
  DeviceSpec d;
  d.platform = "GPU";
  return BuildRing(size, bidirectional, Bandwidth::GBps(100), Time::Nanoseconds(700),
                   LinkKind::kGeneric, d);
}

TEST(RingTest, BidirectionalRingHasDuplexLinksAndWraps) {
  Topology t = Ring(8, true);
  EXPECT_EQ(t.num_devices(), 8);
  EXPECT_EQ(t.num_physical_links(), 8);
  EXPECT_EQ(t.links().size(), 16u);
  ASSERT_TRUE(t.torus());
  EXPECT_EQ(t.torus()->shape, std::vector<int>{8});
  EXPECT_EQ(t.torus()->wraparound, std::vector<bool>{true});
  EXPECT_TRUE(t.FindLink(7, 0).has_value());
  EXPECT_TRUE(t.FindLink(0, 7).has_value());
  EXPECT_FALSE(IsOneWayRing(t));
  EXPECT_EQ(t.node(3).name, "GPU 3");
  EXPECT_EQ(t.name(), "ring 8");
}

TEST(RingTest, OneWayRingHasOnlyForwardLinks) {
  Topology t = Ring(8, false);
  EXPECT_EQ(t.num_physical_links(), 8);
  EXPECT_EQ(t.links().size(), 8u);
  for (const Link& l : t.links()) {
    EXPECT_EQ(l.dst, (l.src + 1) % 8);
    EXPECT_EQ(l.direction, +1);
    EXPECT_EQ(l.dimension, 0);
  }
  EXPECT_FALSE(t.FindLink(1, 0).has_value());
  EXPECT_TRUE(IsOneWayRing(t));
}

TEST(RingTest, TwoDevices) {
  Topology both = Ring(2, true);
  EXPECT_EQ(both.num_physical_links(), 1);  // The closing link would duplicate 0 <-> 1.
  EXPECT_EQ(both.torus()->wraparound, std::vector<bool>{false});
  Topology one_way = Ring(2, false);
  EXPECT_EQ(one_way.num_physical_links(), 2);  // 0 -> 1 and the way back 1 -> 0.
  EXPECT_TRUE(one_way.FindLink(1, 0).has_value());
  EXPECT_TRUE(IsOneWayRing(one_way));
}

TEST(RingTest, SingleDeviceHasNoLinks) {
  Topology t = Ring(1, true);
  EXPECT_EQ(t.num_devices(), 1);
  EXPECT_EQ(t.num_physical_links(), 0);
  EXPECT_FALSE(IsOneWayRing(Ring(1, false)));
}

}  // namespace
}  // namespace shardsim
