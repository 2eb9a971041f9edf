#include "topology/torus_grid.h"

#include <gtest/gtest.h>

#include <vector>

#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

Topology Torus(std::vector<int> shape, std::vector<bool> wrap) {
  return BuildTorus(std::move(shape), std::move(wrap), Bandwidth::GBps(45), Time::Microseconds(1),
                    LinkKind::kIci, DeviceSpec{}, "test torus");
}

std::vector<VertexId> Vertices(const Topology& topo, const std::vector<std::vector<int>>& at) {
  std::vector<VertexId> v;
  for (const std::vector<int>& coords : at) {
    v.push_back(topo.device_vertex(TorusIndex(topo.torus()->shape, coords)));
  }
  return v;
}

// A snake over a 4x4 torus (one mesh axis of 16): both dimensions, step 1, and each row-major
// position holds the member at those coordinates.
TEST(TorusGridTest, SnakeOverTwoDimensions) {
  const Topology topo = Torus({4, 4}, {true, true});
  std::vector<std::vector<int>> at;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) at.push_back({i, i % 2 == 0 ? j : 3 - j});
  }
  const std::optional<TorusGrid> grid = FindTorusGrid(topo, Vertices(topo, at));
  ASSERT_TRUE(grid);
  EXPECT_EQ(grid->dims, (std::vector<int>{0, 1}));
  EXPECT_EQ(grid->sizes, (std::vector<int>{4, 4}));
  EXPECT_EQ(grid->strides, (std::vector<int>{1, 1}));
  for (int p = 0; p < 16; ++p) EXPECT_EQ(at[grid->order[p]], (std::vector<int>{p / 4, p % 4}));
}

// The pod's data axis at a quarter of its size: the high 5 of a dimension of 20 (stride 4)
// and the high 7 of one of 28, offset (1, 3) on a wrapping torus, listed from a member that is
// not the least one on either: offsets count from the first member, round the wraparound.
TEST(TorusGridTest, StridedFactorsCountFromTheFirstMemberOnWrappingDimensions) {
  const Topology topo = Torus({4, 20, 28}, {true, true, true});
  std::vector<std::vector<int>> at;
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 7; ++j) at.push_back({2, (1 + 4 * (i + 2)) % 20, (3 + 4 * (j + 5)) % 28});
  }
  const std::optional<TorusGrid> grid = FindTorusGrid(topo, Vertices(topo, at));
  ASSERT_TRUE(grid);
  EXPECT_EQ(grid->dims, (std::vector<int>{1, 2}));
  EXPECT_EQ(grid->sizes, (std::vector<int>{5, 7}));
  EXPECT_EQ(grid->strides, (std::vector<int>{4, 4}));
  // Listed row-major from the origin (i along dimension 1, j along 2): position i * 7 + j.
  for (int p = 0; p < 35; ++p) EXPECT_EQ(grid->order[p], p);
}

// On a line (no wraparound) offsets count from the least coordinate, whoever is first.
TEST(TorusGridTest, LinesCountFromTheLeastCoordinate) {
  const Topology topo = Torus({8}, {false});
  const std::optional<TorusGrid> grid = FindTorusGrid(topo, Vertices(topo, {{6}, {2}, {4}}));
  ASSERT_TRUE(grid);
  EXPECT_EQ(grid->sizes, std::vector<int>{3});
  EXPECT_EQ(grid->strides, std::vector<int>{2});
  EXPECT_EQ(grid->order, (std::vector<int>{1, 2, 0}));
}

// Part of a ring listed from its middle: the progression starts after the widest gap, whoever
// is listed first.
TEST(TorusGridTest, PartOfARingStartsAfterItsWidestGap) {
  const Topology topo = Torus({4, 8}, {true, true});
  for (const std::vector<std::vector<int>>& at :
       {std::vector<std::vector<int>>{{0, 2}, {0, 1}, {0, 3}},
        std::vector<std::vector<int>>{{0, 7}, {0, 1}, {0, 3}}}) {
    const std::optional<TorusGrid> grid = FindTorusGrid(topo, Vertices(topo, at));
    ASSERT_TRUE(grid);
    EXPECT_EQ(grid->dims, std::vector<int>{1});
    EXPECT_EQ(grid->sizes, std::vector<int>{3});
  }
  // {1, 2, 3}: from 1; {7, 1, 3} (stride 2 across the wraparound): from 7.
  EXPECT_EQ(FindTorusGrid(topo, Vertices(topo, {{0, 2}, {0, 1}, {0, 3}}))->order,
            (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(FindTorusGrid(topo, Vertices(topo, {{0, 3}, {0, 1}, {0, 7}}))->order,
            (std::vector<int>{2, 1, 0}));
}

// What is no grid: uneven spacing, a subset of the product, a member twice, a switch machine.
TEST(TorusGridTest, RefusesWhatIsNoGrid) {
  const Topology topo = Torus({4, 8}, {true, true});
  EXPECT_FALSE(FindTorusGrid(topo, Vertices(topo, {{0, 0}, {0, 1}, {0, 3}})));
  EXPECT_FALSE(FindTorusGrid(topo, Vertices(topo, {{0, 0}, {0, 1}, {1, 0}})));
  EXPECT_FALSE(FindTorusGrid(topo, Vertices(topo, {{0, 0}, {1, 1}, {0, 1}, {1, 1}})));
  const Topology sw = BuildSwitch(4, Bandwidth::GBps(450), Time::Nanoseconds(500),
                                  LinkKind::kNvlink, DeviceSpec{}, "switch");
  EXPECT_FALSE(FindTorusGrid(sw, {sw.device_vertex(0), sw.device_vertex(1)}));
  // One member spans nothing.
  const std::optional<TorusGrid> one = FindTorusGrid(topo, Vertices(topo, {{2, 5}}));
  ASSERT_TRUE(one);
  EXPECT_TRUE(one->dims.empty());
  EXPECT_EQ(one->order, std::vector<int>{0});
}

}  // namespace
}  // namespace shardsim
