#include "topology/routing.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/topology/fat_tree_params.h"
#include "topology/explicit_graph.h"
#include "topology/hierarchical.h"
#include "topology/ring.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

Topology Torus(std::vector<int> shape, std::vector<bool> wrap) {
  return BuildTorus(std::move(shape), std::move(wrap), Bandwidth::GBps(45), Time::Microseconds(1),
                    LinkKind::kIci, DeviceSpec{}, "t");
}

// Checks that `route` is a connected walk from `src` to `dst`.
void ExpectWalk(const Topology& t, const std::vector<LinkId>& route, VertexId src, VertexId dst) {
  VertexId at = src;
  for (LinkId id : route) {
    ASSERT_EQ(t.link(id).src, at);
    at = t.link(id).dst;
  }
  EXPECT_EQ(at, dst);
}

// Torus distance along one dimension.
int Distance(int a, int b, int k, bool wrap) {
  int d = std::abs(a - b);
  return wrap ? std::min(d, k - d) : d;
}

TEST(TorusRoutingTest, EightRingTakesTheShortWayAroundTheWrap) {
  Topology t = Torus({8}, {true});
  auto router = MakeRouter(t);
  const std::vector<LinkId>& to7 = router->Route(0, 7);
  ASSERT_EQ(to7.size(), 1u);  // 0 -> 7 over the wraparound link, in the - direction.
  EXPECT_EQ(t.link(to7[0]).direction, -1);
  EXPECT_EQ(t.link(to7[0]).dst, 7);
  // 0 -> 4: a tie (4 either way) goes +.
  std::vector<LinkId> to4 = router->Route(0, 4);
  ASSERT_EQ(to4.size(), 4u);
  for (LinkId id : to4) EXPECT_EQ(t.link(id).direction, +1);
  ExpectWalk(t, to4, 0, 4);
  // 6 -> 1 wraps forward: 6, 7, 0, 1.
  std::vector<LinkId> wrap = router->Route(6, 1);
  ASSERT_EQ(wrap.size(), 3u);
  ExpectWalk(t, wrap, 6, 1);
  EXPECT_TRUE(router->Route(3, 3).empty());
}

TEST(TorusRoutingTest, LineGoesStraight) {
  Topology t = Torus({8}, {false});
  auto router = MakeRouter(t);
  std::vector<LinkId> r = router->Route(0, 7);
  EXPECT_EQ(r.size(), 7u);
  ExpectWalk(t, r, 0, 7);
  r = router->Route(7, 0);
  EXPECT_EQ(r.size(), 7u);
  for (LinkId id : r) EXPECT_EQ(t.link(id).direction, -1);
}

TEST(TorusRoutingTest, OneWayRingAlwaysGoesPlus) {
  Topology t =
      BuildRing(8, false, Bandwidth::GBps(45), Time::Microseconds(1), LinkKind::kIci, DeviceSpec{});
  auto router = MakeRouter(t);
  EXPECT_EQ(router->Route(0, 7).size(), 7u);
  EXPECT_EQ(router->Route(7, 0).size(), 1u);
  std::vector<LinkId> r = router->Route(5, 2);
  EXPECT_EQ(r.size(), 5u);
  ExpectWalk(t, r, 5, 2);
  Topology two = BuildRing(2, false, Bandwidth::GBps(45), Time(), LinkKind::kIci, DeviceSpec{});
  auto two_router = MakeRouter(two);
  ExpectWalk(two, two_router->Route(1, 0), 1, 0);
}

struct ShapeCase {
  std::vector<int> shape;
  std::vector<bool> wrap;
};

class TorusHopCountTest : public testing::TestWithParam<ShapeCase> {};

TEST_P(TorusHopCountTest, HopsEqualTorusDistanceInDimensionOrder) {
  const ShapeCase& c = GetParam();
  Topology t = Torus(c.shape, c.wrap);
  auto router = MakeRouter(t);
  const std::vector<bool>& wrap = t.torus()->wraparound;  // Effective (length 2: none).
  for (int a = 0; a < t.num_devices(); ++a) {
    for (int b = 0; b < t.num_devices(); ++b) {
      const std::vector<LinkId>& r = router->Route(a, b);
      std::vector<int> ca = TorusCoords(c.shape, a), cb = TorusCoords(c.shape, b);
      size_t want = 0;
      for (size_t d = 0; d < c.shape.size(); ++d) {
        want += Distance(ca[d], cb[d], c.shape[d], wrap[d]);
      }
      ASSERT_EQ(r.size(), want) << a << " -> " << b;
      int last_dim = -1;
      for (LinkId id : r) {
        EXPECT_GE(t.link(id).dimension, last_dim);  // Dimension 0 first.
        last_dim = t.link(id).dimension;
      }
      ExpectWalk(t, r, a, b);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, TorusHopCountTest,
                         testing::Values(ShapeCase{{4, 4, 4}, {true, true, true}},
                                         ShapeCase{{4, 4}, {false, false}},
                                         ShapeCase{{3, 5}, {true, false}},
                                         ShapeCase{{2, 3, 4}, {true, true, true}},
                                         ShapeCase{{7}, {true}}));

TEST(ShortestPathRoutingTest, SwitchRoutesAreTwoHops) {
  Topology t =
      BuildSwitch(8, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink, DeviceSpec{});
  auto router = MakeRouter(t);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      const std::vector<LinkId>& r = router->Route(a, b);
      EXPECT_EQ(r.size(), a == b ? 0u : 2u);
      ExpectWalk(t, r, a, b);
    }
  }
}

TEST(ShortestPathRoutingTest, PrefersBandwidthAtEqualLatencyAndIsDeterministic) {
  // 0 -> 3 via 1 (slow) or via 2 (fast), both two hops of 1 us.
  CustomTopologySpec spec;
  spec.kind = "graph";
  spec.devices = 4;
  auto link = [](int s, int d, double gbps) {
    ExplicitLinkSpec l;
    l.src = s;
    l.dst = d;
    l.bandwidth = Bandwidth::GBps(gbps);
    l.latency = Time::Microseconds(1);
    return l;
  };
  spec.links = {link(0, 1, 10), link(1, 3, 10), link(0, 2, 100), link(2, 3, 100)};
  Topology t = BuildExplicitGraph(spec, DeviceSpec{});
  auto router = MakeRouter(t);
  std::vector<LinkId> r = router->Route(0, 3);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(t.link(r[0]).dst, 2);
  auto again = MakeShortestPathRouter(t);
  EXPECT_EQ(again->Route(0, 3), r);
  EXPECT_EQ(router->Route(3, 0).size(), 2u);
}

HierarchicalParams Tree(int nodes, int per_node, int nodes_per_leaf = 0, int spines = 0) {
  return testing_support::FatTree(nodes, per_node, nodes_per_leaf, spines);
}

TEST(FatTreeRoutingTest, InsideANodeUsesNvlinkNeverTheNic) {
  Topology t = BuildHierarchical(Tree(4, 8, 2, 4), DeviceSpec{});
  auto router = MakeRouter(t);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      const std::vector<LinkId>& r = router->Route(a + 8, b + 8);  // Node 1.
      ASSERT_EQ(r.size(), 2u);
      for (LinkId id : r) EXPECT_EQ(t.link(id).kind, LinkKind::kNvlink);
      ExpectWalk(t, r, a + 8, b + 8);
    }
  }
}

TEST(FatTreeRoutingTest, BetweenNodes) {
  const HierarchicalParams p = Tree(4, 8, 2, 4);
  Topology t = BuildHierarchical(p, DeviceSpec{});
  FatTreeLayout layout(ResolveHierarchical(p));
  auto router = MakeRouter(t);
  // Nodes 0 and 1 share leaf 0: NIC up, NIC down.
  std::vector<LinkId> same_leaf = router->Route(3, 8 + 5);
  ASSERT_EQ(same_leaf.size(), 2u);
  EXPECT_EQ(t.link(same_leaf[0]).kind, LinkKind::kNic);
  EXPECT_EQ(t.link(same_leaf[0]).dst, layout.Leaf(0));
  ExpectWalk(t, same_leaf, 3, 13);
  // Node 1 -> node 2 crosses leaves through spine (1 + 2) % 4 = 3.
  std::vector<LinkId> across = router->Route(8, 16);
  ASSERT_EQ(across.size(), 4u);
  EXPECT_EQ(t.link(across[1]).dst, layout.Spine(3));
  EXPECT_EQ(t.link(across[1]).kind, LinkKind::kFabric);
  ExpectWalk(t, across, 8, 16);
}

TEST(FatTreeRoutingTest, SpreadsNodePairsOverAllSpines) {
  const HierarchicalParams p = Tree(8, 2, 2, 4);  // 4 leaves, 4 spines.
  Topology t = BuildHierarchical(p, DeviceSpec{});
  FatTreeLayout layout(ResolveHierarchical(p));
  auto router = MakeRouter(t);
  std::set<VertexId> spines;
  for (int a = 0; a < t.num_devices(); ++a) {
    for (int b = 0; b < t.num_devices(); ++b) {
      const std::vector<LinkId>& r = router->Route(a, b);
      ExpectWalk(t, r, a, b);
      if (r.size() == 4) spines.insert(t.link(r[1]).dst);
    }
  }
  EXPECT_EQ(spines.size(), 4u);
}

}  // namespace
}  // namespace shardsim

namespace shardsim {
namespace {

// The minimal routes that leave by different ports: on a 4x4 mesh corner to corner, x then y
// and y then x (no link in common); on a ring of 4, the opposite device both ways round; in a
// 4x4x4 torus, the three rotations of the dimension order.
TEST(TorusMinimalRoutesTest, DimensionOrdersAndTiedWays) {
  {
    Topology t = Torus({4, 4}, {false, false});
    auto router = MakeRouter(t);
    std::vector<std::vector<LinkId>> routes = router->MinimalRoutes(0, 15);
    ASSERT_EQ(routes.size(), 2u);
    EXPECT_EQ(routes[0], router->Route(0, 15));
    std::set<LinkId> links;
    for (const auto& r : routes) {
      EXPECT_EQ(r.size(), 6u);
      ExpectWalk(t, r, 0, 15);
      links.insert(r.begin(), r.end());
    }
    EXPECT_EQ(links.size(), 12u);  // Disjoint.
    EXPECT_NE(t.link(routes[0][0]).dimension, t.link(routes[1][0]).dimension);
    // One dimension apart: a single route.
    EXPECT_EQ(router->MinimalRoutes(0, 3).size(), 1u);
  }
  {
    Topology t = Torus({4}, {true});
    auto router = MakeRouter(t);
    std::vector<std::vector<LinkId>> routes = router->MinimalRoutes(0, 2);
    ASSERT_EQ(routes.size(), 2u);
    EXPECT_EQ(t.link(routes[0][0]).direction, +1);
    EXPECT_EQ(t.link(routes[1][0]).direction, -1);
    for (const auto& r : routes) ExpectWalk(t, r, 0, 2);
    EXPECT_EQ(router->MinimalRoutes(0, 1).size(), 1u);  // No tie: the short way only.
  }
  {
    Topology t = Torus({4, 4, 4}, {true, true, true});
    auto router = MakeRouter(t);
    const VertexId dst = 1 * 16 + 1 * 4 + 1;
    std::vector<std::vector<LinkId>> routes = router->MinimalRoutes(0, dst);
    ASSERT_EQ(routes.size(), 3u);
    std::set<int> first_dimensions;
    for (const auto& r : routes) {
      ExpectWalk(t, r, 0, dst);
      first_dimensions.insert(t.link(r[0]).dimension);
    }
    EXPECT_EQ(first_dimensions.size(), 3u);
  }
  {
    // Dimensions of 2 that wrap tie both ways onto one link: no route twice.
    Topology t = Torus({2, 2}, {true, true});
    auto router = MakeRouter(t);
    EXPECT_EQ(router->MinimalRoutes(0, 1).size(), 1u);
    std::vector<std::vector<LinkId>> routes = router->MinimalRoutes(0, 3);
    ASSERT_EQ(routes.size(), 2u);
    EXPECT_NE(routes[0], routes[1]);
  }
}

}  // namespace
}  // namespace shardsim
