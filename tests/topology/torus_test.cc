#include "topology/torus.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace shardsim {
namespace {

DeviceSpec TestChip() {
  DeviceSpec d;
  d.chip = "test";
  d.platform = "TPU";
  return d;
}

Topology Torus(std::vector<int> shape, std::vector<bool> wrap) {
  return BuildTorus(std::move(shape), std::move(wrap), Bandwidth::GBps(45), Time::Microseconds(1),
                    LinkKind::kIci, TestChip(), "test torus");
}

TEST(TorusIndexTest, FirstDimensionIsMajor) {
  const std::vector<int> shape = {2, 3, 4};
  EXPECT_EQ(TorusIndex(shape, {0, 0, 1}), 1);
  EXPECT_EQ(TorusIndex(shape, {0, 1, 0}), 4);
  EXPECT_EQ(TorusIndex(shape, {1, 0, 0}), 12);
  EXPECT_EQ(TorusIndex(shape, {1, 2, 3}), 23);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(TorusIndex(shape, TorusCoords(shape, i)), i);
  EXPECT_EQ(TorusCoords(shape, 23), (std::vector<int>{1, 2, 3}));
}

TEST(TorusTest, WraparoundLinkNeedsThreeOrMore) {
  EXPECT_FALSE(HasWraparoundLink(1, true));
  EXPECT_FALSE(HasWraparoundLink(2, true));
  EXPECT_TRUE(HasWraparoundLink(3, true));
  EXPECT_FALSE(HasWraparoundLink(4, false));
}

struct LinkCountCase {
  std::vector<int> shape;
  std::vector<bool> wrap;
  int devices;
  int physical_links;
  std::vector<bool> reported_wrap;
};

class TorusLinkCountTest : public testing::TestWithParam<LinkCountCase> {};

TEST_P(TorusLinkCountTest, CountsDevicesAndLinks) {
  const LinkCountCase& c = GetParam();
  Topology t = Torus(c.shape, c.wrap);
  EXPECT_EQ(t.num_devices(), c.devices);
  EXPECT_EQ(t.num_switches(), 0);
  EXPECT_EQ(t.num_physical_links(), c.physical_links);
  EXPECT_EQ(static_cast<int>(t.links().size()), 2 * c.physical_links);
  ASSERT_TRUE(t.torus().has_value());
  EXPECT_EQ(t.torus()->shape, c.shape);
  EXPECT_EQ(t.torus()->wraparound, c.reported_wrap);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TorusLinkCountTest,
    testing::Values(
        // 4x4x4 with wraparound: 64 chips x 3 dimensions, every chip one + link per dim.
        LinkCountCase{{4, 4, 4}, {true, true, true}, 64, 192, {true, true, true}},
        // 4x4 mesh: 2 dims x 4 lines x 3 links.
        LinkCountCase{{4, 4}, {false, false}, 16, 24, {false, false}},
        // Length 2 never gets a separate wraparound link: 4 + 2x4 links.
        LinkCountCase{{2, 4}, {true, true}, 8, 12, {false, true}},
        LinkCountCase{{8}, {true}, 8, 8, {true}}, LinkCountCase{{8}, {false}, 8, 7, {false}},
        LinkCountCase{{1, 1, 5}, {true, true, true}, 5, 5, {false, false, true}},
        LinkCountCase{{1}, {true}, 1, 0, {false}},
        LinkCountCase{{16, 20, 28}, {true, true, true}, 8960, 3 * 8960, {true, true, true}}));

TEST(TorusTest, LinksGoPlusAlongTheirDimension) {
  const std::vector<int> shape = {3, 4, 2};
  Topology t = Torus(shape, {true, true, false});
  for (const Link& l : t.links()) {
    ASSERT_GE(l.dimension, 0);
    const std::vector<int>& a = t.node(l.src).coords;
    const std::vector<int>& b = t.node(l.dst).coords;
    const int k = shape[l.dimension];
    for (int d = 0; d < 3; ++d) {
      if (d == l.dimension) {
        EXPECT_EQ((a[d] + l.direction + k) % k, b[d]);
      } else {
        EXPECT_EQ(a[d], b[d]);
      }
    }
    EXPECT_EQ(l.bandwidth, Bandwidth::GBps(45));
    EXPECT_EQ(l.latency, Time::Microseconds(1));
    EXPECT_EQ(l.kind, LinkKind::kIci);
  }
}

TEST(TorusTest, EveryChipOfAFullTorusHasSixNeighbours) {
  Topology t = Torus({4, 4, 4}, {true, true, true});
  for (int d = 0; d < t.num_devices(); ++d) {
    const std::vector<LinkId>& out = t.out_links(t.device_vertex(d));
    ASSERT_EQ(out.size(), 6u);
    std::set<VertexId> neighbours;
    for (LinkId id : out) neighbours.insert(t.link(id).dst);
    EXPECT_EQ(neighbours.size(), 6u);
  }
}

TEST(TorusTest, NamesDevicesWithCoordinates) {
  Topology t = Torus({2, 2, 2}, {false, false, false});
  // Device 6 = 1*4 + 1*2 + 0.
  EXPECT_EQ(t.node(t.device_vertex(6)).name, "TPU 6 (1,1,0)");
  EXPECT_EQ(t.node(t.device_vertex(6)).coords, (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(t.node(t.device_vertex(6)).device, 6);
  EXPECT_EQ(t.name(), "test torus");
  EXPECT_EQ(t.device_spec().platform, "TPU");
}

}  // namespace
}  // namespace shardsim
