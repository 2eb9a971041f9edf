#include "collectives/mesh.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace shardsim {
namespace {

using Groups = std::vector<std::vector<int>>;

Mesh Iota(std::vector<MeshAxis> axes) {
  int n = 1;
  for (const MeshAxis& axis : axes) n *= axis.size;
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  return Mesh(std::move(axes), std::move(devices));
}

// The message of the std::invalid_argument `f` throws ("" if none).
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MeshTest, CoordsAndPositionsAreRowMajor) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 3}});
  EXPECT_EQ(mesh.size(), 6);
  EXPECT_EQ(mesh.AxisIndex("tp"), 1);
  EXPECT_EQ(mesh.AxisIndex("pp"), -1);
  EXPECT_EQ(mesh.Coords(4), (std::vector<int>{1, 1}));
  for (int p = 0; p < mesh.size(); ++p) EXPECT_EQ(mesh.Position(mesh.Coords(p)), p);
  EXPECT_EQ(mesh.GroupSize({0, 1}), 6);
  EXPECT_EQ(mesh.GroupSize({}), 1);
}

TEST(MeshTest, SingleAxisGroups) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 2}});
  EXPECT_EQ(mesh.Groups({1}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.Groups({0}), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.IndexInGroup(3, {0}), 1);
  EXPECT_EQ(mesh.IndexInGroup(2, {1}), 0);
  EXPECT_EQ(mesh.Groups({}), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(mesh.IndexInGroup(3, {}), 0);
}

TEST(MeshTest, TupleGroupsFollowTheNamedOrder) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 2}});
  EXPECT_EQ(mesh.Groups({0, 1}), (Groups{{0, 1, 2, 3}}));
  // ('tp', 'dp'): tp major, so the group walks dp fastest.
  EXPECT_EQ(mesh.Groups({1, 0}), (Groups{{0, 2, 1, 3}}));
  EXPECT_EQ(mesh.IndexInGroup(1, {1, 0}), 2);  // tp=1, dp=0 -> 1*2+0.
  EXPECT_EQ(mesh.IndexInGroup(2, {1, 0}), 1);  // tp=0, dp=1 -> 0*2+1.
  EXPECT_EQ(mesh.IndexInGroup(1, {0, 1}), 1);
  EXPECT_EQ(mesh.IndexInGroup(2, {0, 1}), 2);
}

TEST(MeshTest, GroupsOverNonAdjacentAxes) {
  const Mesh mesh = Iota({{"a", 2}, {"b", 3}, {"c", 2}});
  EXPECT_EQ(mesh.Groups({0, 2}), (Groups{{0, 1, 6, 7}, {2, 3, 8, 9}, {4, 5, 10, 11}}));
  EXPECT_EQ(mesh.Groups({2, 0}), (Groups{{0, 6, 1, 7}, {2, 8, 3, 9}, {4, 10, 5, 11}}));
  EXPECT_EQ(mesh.Groups({1}), (Groups{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  for (int p = 0; p < mesh.size(); ++p) {
    for (const std::vector<int>& axes : {std::vector<int>{0, 2}, std::vector<int>{2, 0}}) {
      const int index = mesh.IndexInGroup(p, axes);
      bool found = false;
      for (const std::vector<int>& group : mesh.Groups(axes)) {
        if (index < static_cast<int>(group.size()) && group[index] == p) found = true;
      }
      EXPECT_TRUE(found) << "position " << p;
    }
  }
}

TEST(MeshTest, KeepsTheGivenDevices) {
  const Mesh mesh({{"x", 2}, {"y", 2}}, {3, 1, 2, 0});
  EXPECT_EQ(mesh.device(0), 3);
  EXPECT_EQ(mesh.devices(), (std::vector<int>{3, 1, 2, 0}));
}

TEST(MeshTest, RejectsBadMeshes) {
  EXPECT_NE(ErrorOf([] { Mesh({{"dp", 0}}, {}); }).find("'dp' has size 0"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Mesh({{"dp", 2}, {"tp", 2}}, {0, 1, 2});
            }).find("4 positions but 3 devices"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Mesh({{"dp", 2}}, {1, 1});
            }).find("device 1 appears twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Mesh({{"dp", 2}}, {0, -1}); }).find("negative"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Mesh({{"dp", 1}, {"dp", 1}}, {0});
            }).find("named twice"),
            std::string::npos);
  const Mesh mesh = Iota({{"dp", 2}});
  EXPECT_THROW(mesh.Groups({0, 0}), std::invalid_argument);
  EXPECT_THROW(mesh.Groups({1}), std::invalid_argument);
  EXPECT_THROW(mesh.Coords(2), std::invalid_argument);
}

}  // namespace
}  // namespace shardsim
