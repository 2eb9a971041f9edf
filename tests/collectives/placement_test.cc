#include "collectives/placement.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/runtime/machine.h"
#include "topology/presets.h"
#include "topology/ring.h"
#include "topology/topology_spec.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

Topology Tpu(const std::string& preset, std::vector<int> shape) {
  return BuildPreset(preset, std::move(shape));
}

Topology Gpu(const std::string& preset, int nodes) { return BuildPreset(preset, {}, nodes); }

Mesh DefaultMesh(std::vector<MeshAxis> axes, const Topology& topo) {
  std::vector<int> devices = DefaultPlacement(axes, topo);
  return Mesh(std::move(axes), std::move(devices));
}

// Whether devices a and b share a direct link.
bool Linked(const Topology& topo, int a, int b) {
  return topo.FindLink(topo.device_vertex(a), topo.device_vertex(b)).has_value();
}

// Checks that consecutive members along mesh axis `axis` are physical neighbours.
void ExpectNeighboursAlong(const Mesh& mesh, const Topology& topo, int axis) {
  for (const std::vector<int>& group : mesh.Groups({axis})) {
    for (size_t i = 1; i < group.size(); ++i) {
      EXPECT_TRUE(Linked(topo, mesh.device(group[i - 1]), mesh.device(group[i])))
          << "axis " << mesh.axes()[axis].name << ": devices " << mesh.device(group[i - 1])
          << " and " << mesh.device(group[i]);
    }
  }
}

TEST(PlacementTest, SquareMeshOnSquareTorusKeepsNeighbours) {
  const Topology topo = Tpu("tpu-v5e", {4, 4});
  const Mesh mesh = DefaultMesh({{"x", 4}, {"y", 4}}, topo);
  std::vector<int> iota(16);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(mesh.devices(), iota);
  ExpectNeighboursAlong(mesh, topo, 0);
  ExpectNeighboursAlong(mesh, topo, 1);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "x -> torus dim 0 (4, line), y -> torus dim 1 (4, line)");
}

TEST(PlacementTest, AxisSpanningTwoDimensionsSnakes) {
  const Topology topo = Tpu("tpu-v5e", {4, 4});
  const Mesh mesh = DefaultMesh({{"dp", 2}, {"tp", 8}}, topo);
  EXPECT_EQ(mesh.devices(),
            (std::vector<int>{0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11, 15, 14, 13, 12}));
  ExpectNeighboursAlong(mesh, topo, 1);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "dp -> torus dim 0 (factor 2 of 4, stride 2), tp -> torus dims 0 (factor 2 of 4) x "
            "1 (4, line) in snake order");
}

TEST(PlacementTest, ThreeDimensionalSnakes) {
  const Topology topo = Tpu("tpu-v4", {4, 4, 4});
  const Mesh mesh = DefaultMesh({{"dp", 4}, {"tp", 16}}, topo);
  ExpectNeighboursAlong(mesh, topo, 0);
  ExpectNeighboursAlong(mesh, topo, 1);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "dp -> torus dim 0 (4, wraps), tp -> torus dims 1 (4, wraps) x 2 (4, wraps) in "
            "snake order");
  // One axis over three pieces: dim 0's low factor 2, then dims 1 and 2.
  const Mesh wide = DefaultMesh({{"a", 2}, {"b", 32}}, topo);
  ExpectNeighboursAlong(wide, topo, 1);
  ExpectNeighboursAlong(DefaultMesh({{"a", 64}}, topo), topo, 0);
}

TEST(PlacementTest, StridedFactorsGoOutermost) {
  const Topology topo = Tpu("tpu-v5p", {4, 4, 4});
  const Mesh mesh = DefaultMesh({{"dp", 8}, {"tp", 8}}, topo);
  ExpectNeighboursAlong(mesh, topo, 1);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "dp -> torus dims 1 (factor 2 of 4, stride 2) x 0 (4, wraps) in snake order, tp -> "
            "torus dims 1 (factor 2 of 4) x 2 (4, wraps) in snake order");
  // dp walks dim 0 (1 hop per step) and steps once along dim 1 by 2.
  const std::vector<std::vector<int>> groups = mesh.Groups({0});
  EXPECT_EQ(TorusCoords({4, 4, 4}, mesh.device(groups[0][3])), (std::vector<int>{3, 0, 0}));
  EXPECT_EQ(TorusCoords({4, 4, 4}, mesh.device(groups[0][4])), (std::vector<int>{3, 2, 0}));
}

TEST(PlacementTest, SmallAxesShareARing) {
  const Topology topo =
      BuildRing(8, true, Bandwidth::GBps(45), Time::Microseconds(1), LinkKind::kIci, {});
  const Mesh mesh = DefaultMesh({{"a", 2}, {"b", 4}}, topo);
  EXPECT_EQ(mesh.devices(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  ExpectNeighboursAlong(mesh, topo, 1);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "a -> torus dim 0 (factor 2 of 8, stride 4), b -> torus dim 0 (factor 4 of 8)");
}

TEST(PlacementTest, SizeOneAxes) {
  const Topology topo = Tpu("tpu-v5e", {4, 2});
  const Mesh mesh = DefaultMesh({{"pp", 1}, {"dp", 4}, {"tp", 2}}, topo);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "pp -> (size 1), dp -> torus dim 0 (4, line), tp -> torus dim 1 (2, line)");
}

// Axes whose sizes are not the torus's in order still factor: each takes, innermost
// dimension first, what it shares with each dimension. {a: 3, b: 4} on 4x3: b, sharing no
// factor with dim 1 (3), takes dim 0 (4); a takes dim 1. Position (a, b) is device 3 b + a.
TEST(PlacementTest, AxesTakeTheDimensionsTheyShareAFactorWith) {
  const Topology topo = Tpu("tpu-v5e", {4, 3});
  const Mesh mesh = DefaultMesh({{"a", 3}, {"b", 4}}, topo);
  EXPECT_EQ(mesh.devices(), (std::vector<int>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "a -> torus dim 1 (3, line), b -> torus dim 0 (4, line)");
}

// A TPU v5p pod (16x20x28) as data 35 x fsdp 64 x tensor 4: tensor the low 4 of dim 2 (28 =
// 4 x 7), fsdp the low 4 of dim 1 (20 = 4 x 5) and all of dim 0, data the high 7 of dim 2
// and the high 5 of dim 1. Consecutive tensor and fsdp members are one hop apart.
TEST(PlacementTest, PodMeshFactorsAcrossDimensions) {
  const Topology topo = Tpu("tpu-v5p", {16, 20, 28});
  const Mesh mesh = DefaultMesh({{"data", 35}, {"fsdp", 64}, {"tensor", 4}}, topo);
  const std::vector<int> shape = {16, 20, 28};
  auto hops = [&](int p, int q) {
    const std::vector<int> a = TorusCoords(shape, mesh.device(p));
    const std::vector<int> b = TorusCoords(shape, mesh.device(q));
    int h = 0;
    for (int d = 0; d < 3; ++d) h += std::abs(a[d] - b[d]);
    return h;
  };
  for (int p = 0; p + 1 < 4; ++p) EXPECT_EQ(hops(p, p + 1), 1);           // Along tensor.
  for (int f = 0; f + 1 < 64; ++f) EXPECT_EQ(hops(4 * f, 4 * f + 4), 1);  // Along fsdp.
  const std::vector<int> first = TorusCoords(shape, mesh.device(0));
  const std::vector<int> next_data = TorusCoords(shape, mesh.device(64 * 4));
  EXPECT_EQ(first, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(next_data, (std::vector<int>{0, 0, 4}));  // The high factor of dim 2: stride 4.
}

TEST(PlacementTest, ExplicitDevicesAreDescribedByHops) {
  const Topology topo = Tpu("tpu-v5e", {2, 2});
  const Mesh mesh({{"x", 2}, {"y", 2}}, {0, 3, 1, 2});
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "devices as given by mesh.devices (x: consecutive members 1 hop apart, y: "
            "consecutive members up to 2 hops apart)");
  const Mesh missing({{"x", 2}}, {0, 4});
  EXPECT_THROW(DescribePlacement(missing, topo), std::invalid_argument);
  EXPECT_THROW(ValidateMeshDevices(missing, topo), std::invalid_argument);
  EXPECT_NO_THROW(ValidateMeshDevices(mesh, topo));
}

// Handing the torus dimensions out in another order: on a 2x2x2 torus the innermost axis z
// takes dimension 0 and x dimension 2 with order [0, 1, 2], so position (x, y, z) sits at
// physical (z, y, x): device 4z + 2y + x. The default order [2, 1, 0] is DefaultPlacement.
// Each placement is described as the plan it is; orders that are not a permutation of the
// dimensions are refused, as are tori the topology does not have.
TEST(PlacementTest, TorusOrderHandsTheDimensionsOutInThatOrder) {
  const Topology topo = Tpu("tpu-v5p", {2, 2, 2});
  const std::vector<MeshAxis> axes = {{"x", 2}, {"y", 2}, {"z", 2}};
  EXPECT_EQ(DefaultTorusOrder(3), (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(TorusPlacement(axes, topo, {2, 1, 0}), DefaultPlacement(axes, topo));
  const std::vector<int> turned = TorusPlacement(axes, topo, {0, 1, 2});
  for (int x = 0; x < 2; ++x) {
    for (int y = 0; y < 2; ++y) {
      for (int z = 0; z < 2; ++z) EXPECT_EQ(turned[4 * x + 2 * y + z], 4 * z + 2 * y + x);
    }
  }
  EXPECT_EQ(DescribePlacement(Mesh(axes, turned), topo),
            "x -> torus dim 2 (2, line), y -> torus dim 1 (2, line), z -> torus dim 0 (2, line) "
            "(torus_order [0, 1, 2])");
  for (const std::vector<int>& bad :
       {std::vector<int>{0, 1}, std::vector<int>{0, 1, 1}, std::vector<int>{0, 1, 3}}) {
    try {
      TorusPlacement(axes, topo, bad);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "torus_order must list each of the torus's 3 dimensions (0..2) once");
    }
  }
  EXPECT_THROW(TorusPlacement({{"dp", 16}}, Gpu("h100-dgx", 2), {0}), std::invalid_argument);
}

// Machine::Placement keeps each placement it finds: every answer, found or kept, is
// DefaultPlacement's or TorusPlacement's; axis names do not matter to it; a mesh that does not
// cover the machine is refused each time, never kept.
TEST(PlacementTest, MachineKeepsThePlacementsItFinds) {
  const Machine machine(Tpu("tpu-v5p", {4, 4, 8}));
  const std::vector<std::vector<MeshAxis>> meshes = {{{"data", 2}, {"fsdp", 16}, {"tensor", 4}},
                                                     {{"fsdp", 16}, {"data", 2}, {"tensor", 4}},
                                                     {{"a", 2}, {"b", 16}, {"c", 4}},
                                                     {{"fsdp", 128}}};
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::vector<MeshAxis>& axes : meshes) {
      EXPECT_EQ(machine.Placement(axes), DefaultPlacement(axes, machine.topology()));
      for (const std::vector<int>& order :
           {std::vector<int>{0, 1, 2}, std::vector<int>{1, 2, 0}, std::vector<int>{2, 1, 0}}) {
        EXPECT_EQ(machine.Placement(axes, order), TorusPlacement(axes, machine.topology(), order));
      }
    }
  }
  EXPECT_EQ(&machine.Placement(meshes[0]), &machine.Placement(meshes[2]));
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_THROW(machine.Placement({{"dp", 8}}), std::invalid_argument);
  }
}

TEST(PlacementTest, MeshMustCoverTheMachine) {
  const Topology topo = Tpu("tpu-v5e", {4, 4});
  try {
    DefaultPlacement({{"dp", 4}, {"tp", 2}}, topo);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "mesh dp=4, tp=2 has fewer positions than the hardware's 16 devices; the default "
              "placement uses every device (give mesh.devices to use a subset)");
  }
  EXPECT_THROW(DefaultPlacement({{"dp", 32}}, topo), std::invalid_argument);
}

TEST(PlacementTest, GpuNodesKeepInnerAxesInside) {
  const Topology topo = Gpu("h100-dgx", 2);
  const Mesh mesh = DefaultMesh({{"dp", 2}, {"tp", 8}}, topo);
  std::vector<int> iota(16);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(mesh.devices(), iota);
  EXPECT_EQ(DescribePlacement(mesh, topo),
            "dp across nodes, tp inside nodes (NVLink) (row-major device order)");
  const Mesh spread = DefaultMesh({{"dp", 4}, {"tp", 4}}, topo);
  EXPECT_EQ(DescribePlacement(spread, topo),
            "dp spans nodes (up to 2 members per node), tp inside nodes (NVLink) (row-major "
            "device order)");
}

TEST(PlacementTest, SingleGpuNode) {
  const Topology topo = Gpu("h100-dgx", 1);
  const Mesh mesh = DefaultMesh({{"dp", 2}, {"tp", 4}}, topo);
  EXPECT_EQ(DescribePlacement(mesh, topo), "row-major device order, all devices behind one switch");
}

}  // namespace
}  // namespace shardsim
