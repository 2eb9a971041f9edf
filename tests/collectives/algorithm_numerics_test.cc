// Data every collective algorithm produces, against expectations computed here by plain loops
// from the flat-buffer definitions in collectives/collective.h. Inputs are small integers held
// in floats, so every sum is exact and outputs are compared for equality.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/collective.h"
#include "sim/simulator.h"
#include "tests/topology/fat_tree_params.h"
#include "topology/hierarchical.h"
#include "topology/network.h"
#include "topology/routing.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// Where the group lives. Numerics do not depend on timing, but the topology decides routes,
// sharing and so arrival orders, which the algorithms must not depend on.
// kNcclSwitch and kNcclFatTree run as NCCL does (CommSpec::nccl, NVLS on the switch; the fat
// tree's shape is {nodes, per node}, kNcclFatTreeNvls with NVLS inside its nodes), with a
// 64-byte pipelining chunk so that large counts flow in many segments.
enum class Place {
  kRing,
  kLine,
  kTorus,
  kSwitch,
  kNcclSwitch,
  kNcclFatTree,
  kNcclFatTreeNvls,
  kNcclFatTreeSharp,  // NVLS inside the nodes, SHARP in the leaf switch.
};

struct NumericsCase {
  std::string algorithm;
  CollectiveKind kind = CollectiveKind::kAllReduce;
  ReduceOp reduce = ReduceOp::kSum;
  Place place = Place::kSwitch;
  std::vector<int> shape;       // Torus shape (kRing/kLine: {G}; kSwitch: {G}).
  std::vector<int> axis_sizes;  // The group's mesh axes (product = G).
  int64_t count = 0;            // Elements: all-reduce total, else block.
  int pattern = 0;              // kPermute: which destination pattern (see Destinations).
  // The group's devices, member by member (empty: every device, in index order): a snake or a
  // strided subset of a torus, whose rings torus_2d runs along the torus dimensions.
  std::vector<int> devices = {};

  int size() const {
    if (!devices.empty()) return static_cast<int>(devices.size());
    return std::accumulate(shape.begin(), shape.end(), 1, std::multiplies<int>());
  }
};

const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

std::string Join(const std::vector<int>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

std::string CaseName(const NumericsCase& c) {
  std::string place = c.place == Place::kRing              ? "ring"
                      : c.place == Place::kLine            ? "line"
                      : c.place == Place::kTorus           ? "torus"
                      : c.place == Place::kSwitch          ? "switch"
                      : c.place == Place::kNcclSwitch      ? "ncclswitch"
                      : c.place == Place::kNcclFatTree     ? "nccltree"
                      : c.place == Place::kNcclFatTreeNvls ? "nccltreenvls"
                                                           : "nccltreesharp";
  std::string name = c.algorithm + "_" + CollectiveKindName(c.kind);
  bool reduces = c.kind == CollectiveKind::kReduceScatter || c.kind == CollectiveKind::kAllReduce;
  if (reduces) name += std::string("_") + OpName(c.reduce);
  name += "_" + place + Join(c.shape, "x") + "_axes" + Join(c.axis_sizes, "x") + "_n" +
          std::to_string(c.count);
  if (c.kind == CollectiveKind::kPermute) name += "_p" + std::to_string(c.pattern);
  if (!c.devices.empty()) name += "_devices" + Join(c.devices, "_");
  return name;
}

void PrintTo(const NumericsCase& c, std::ostream* os) { *os << CaseName(c); }

Topology Build(Place place, const std::vector<int>& shape) {
  Bandwidth bw = Bandwidth::GBps(45);
  Time lat = Time::Microseconds(1);
  switch (place) {
    case Place::kRing:
      return BuildTorus(shape, std::vector<bool>(shape.size(), true), bw, lat, LinkKind::kIci,
                        DeviceSpec{}, "ring");
    case Place::kLine:
      return BuildTorus(shape, std::vector<bool>(shape.size(), false), bw, lat, LinkKind::kIci,
                        DeviceSpec{}, "line");
    case Place::kTorus:
      return BuildTorus(shape, std::vector<bool>(shape.size(), true), bw, lat, LinkKind::kIci,
                        DeviceSpec{}, "torus");
    case Place::kSwitch:
      return BuildSwitch(shape[0], Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink,
                         DeviceSpec{}, "switch");
    case Place::kNcclSwitch:
    case Place::kNcclFatTree:
    case Place::kNcclFatTreeNvls:
    case Place::kNcclFatTreeSharp: {
      CommSpec comm;
      comm.nccl = true;
      comm.launch_latency = Time::Microseconds(5);
      comm.protocols = {ProtocolSpec{Time::Nanoseconds(600), 0.25},
                        ProtocolSpec{Time::Nanoseconds(1900), 0.92},
                        ProtocolSpec{Time::Nanoseconds(3400), 1.0}};
      comm.nvls = place != Place::kNcclFatTree;
      comm.sharp = place == Place::kNcclFatTreeSharp;
      comm.channels = 4;
      comm.chunk_size = Bytes(64);
      Topology topo;
      if (place == Place::kNcclSwitch) {
        topo = BuildSwitch(shape[0], Bandwidth::GBps(450), Time::Nanoseconds(500),
                           LinkKind::kNvlink, DeviceSpec{}, "switch");
      } else {
        topo = BuildHierarchical(testing_support::FatTree(shape[0], shape[1]), DeviceSpec{},
                                 "fat tree");
      }
      topo.SetCommSpec(comm);
      return topo;
    }
  }
  return Topology();
}

// Permutation destinations: 0 shift by one, 1 reversal, 2 even members send to the next one
// and odd members send nothing (even members receive zeros), 3 identity.
std::vector<int> Destinations(int pattern, int g) {
  std::vector<int> d(g);
  for (int m = 0; m < g; ++m) {
    switch (pattern) {
      case 0:
        d[m] = (m + 1) % g;
        break;
      case 1:
        d[m] = g - 1 - m;
        break;
      case 2:
        d[m] = m % 2 == 0 && m + 1 < g ? m + 1 : -1;
        break;
      default:
        d[m] = m;
        break;
    }
  }
  return d;
}

// Input element i of member m: a small integer, different per member and position so that
// max and min pick different members at different positions.
float Value(int m, int64_t i) { return static_cast<float>((m * 37 + i * 11) % 23 - 11); }

float Reduce(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    case ReduceOp::kMin:
      return a < b ? a : b;
  }
  return 0;
}

int64_t InputLength(const NumericsCase& c) {
  int64_t g = c.size();
  switch (c.kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kPermute:
      return c.count;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      return g * c.count;
    case CollectiveKind::kAllReduce:
      return c.count;
  }
  return 0;
}

// The expected output of every member, by plain loops over `in`.
std::vector<std::vector<float>> Expected(const NumericsCase& c,
                                         const std::vector<std::vector<float>>& in) {
  int g = c.size();
  int64_t b = c.count;
  std::vector<std::vector<float>> out(g);
  for (int r = 0; r < g; ++r) {
    switch (c.kind) {
      case CollectiveKind::kAllGather:
        for (int j = 0; j < g; ++j) {
          for (int64_t k = 0; k < b; ++k) out[r].push_back(in[j][k]);
        }
        break;
      case CollectiveKind::kReduceScatter:
        for (int64_t k = 0; k < b; ++k) {
          float acc = in[0][r * b + k];
          for (int j = 1; j < g; ++j) acc = Reduce(c.reduce, acc, in[j][r * b + k]);
          out[r].push_back(acc);
        }
        break;
      case CollectiveKind::kAllReduce:
        for (int64_t k = 0; k < b; ++k) {
          float acc = in[0][k];
          for (int j = 1; j < g; ++j) acc = Reduce(c.reduce, acc, in[j][k]);
          out[r].push_back(acc);
        }
        break;
      case CollectiveKind::kAllToAll:
        for (int j = 0; j < g; ++j) {
          for (int64_t k = 0; k < b; ++k) out[r].push_back(in[j][r * b + k]);
        }
        break;
      case CollectiveKind::kPermute: {
        out[r].assign(b, 0.0f);
        std::vector<int> d = Destinations(c.pattern, g);
        for (int m = 0; m < g; ++m) {
          if (d[m] == r) out[r] = in[m];
        }
        break;
      }
    }
  }
  return out;
}

struct Ran {
  std::vector<std::vector<float>> out;      // After the run.
  std::vector<std::vector<float>> at_done;  // Each member's output when it reported done.
  std::vector<int> done;                    // on_member_done calls per member.
  std::string resolved;
};

Ran RunCase(const NumericsCase& c, const std::vector<std::vector<float>>& input) {
  Topology topo = Build(c.place, c.shape);
  Simulator sim;
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network net(sim, topo, *router);
  int g = c.size();
  std::vector<std::vector<float>> in = input;
  Ran ran;
  ran.out.resize(g);
  ran.at_done.resize(g);
  ran.done.assign(g, 0);
  CollectiveJob job;
  job.kind = c.kind;
  job.reduce = c.reduce;
  job.dtype = DType::kF32;
  for (int m = 0; m < g; ++m) {
    job.members.push_back(topo.device_vertex(c.devices.empty() ? m : c.devices[m]));
  }
  job.block = c.count;
  job.total = c.kind == CollectiveKind::kAllReduce ? c.count : 0;
  if (c.kind == CollectiveKind::kPermute) job.destination = Destinations(c.pattern, g);
  job.numerics = true;
  job.in = &in;
  job.out = &ran.out;
  job.label = "test";
  job.on_member_done = [&ran](int m) {
    ++ran.done[m];
    ran.at_done[m] = ran.out[m];
  };
  std::unique_ptr<CollectiveAlgorithm> algo =
      MakeAlgorithm(c.algorithm, net, job, c.axis_sizes, &ran.resolved);
  algo->Start();
  sim.Run();
  return ran;
}

class AlgorithmNumerics : public testing::TestWithParam<NumericsCase> {};

TEST_P(AlgorithmNumerics, ExactOutput) {
  const NumericsCase& c = GetParam();
  int g = c.size();
  std::vector<std::vector<float>> in(g);
  for (int m = 0; m < g; ++m) {
    for (int64_t i = 0; i < InputLength(c); ++i) in[m].push_back(Value(m, i));
  }
  std::vector<std::vector<float>> want = Expected(c, in);
  Ran ran = RunCase(c, in);
  // NCCL machines name the protocol too: "nvls/Simple".
  EXPECT_EQ(ran.resolved.substr(0, ran.resolved.find('/')), c.algorithm);
  for (int m = 0; m < g; ++m) {
    EXPECT_EQ(ran.done[m], 1) << "on_member_done calls for member " << m;
    EXPECT_EQ(ran.out[m], want[m]) << "output of member " << m;
    EXPECT_EQ(ran.at_done[m], want[m]) << "output of member " << m << " when it reported done";
  }
}

std::vector<NumericsCase> Cases() {
  using K = CollectiveKind;
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};
  std::vector<NumericsCase> cases;
  // Adds all-gather (block 3), reduce-scatter (block 3, every op) and all-reduce (totals 13 and
  // 1, every op: 13 is uneven over most groups, 1 leaves most chunks empty).
  auto add_reductions = [&](const std::string& algo, Place place, std::vector<int> shape,
                            std::vector<int> axes) {
    cases.push_back({algo, K::kAllGather, ReduceOp::kSum, place, shape, axes, 3});
    for (ReduceOp op : ops) {
      cases.push_back({algo, K::kReduceScatter, op, place, shape, axes, 3});
      cases.push_back({algo, K::kAllReduce, op, place, shape, axes, 13});
    }
    cases.push_back({algo, K::kAllGather, ReduceOp::kSum, place, shape, axes, 1});
    cases.push_back({algo, K::kReduceScatter, ReduceOp::kSum, place, shape, axes, 1});
    cases.push_back({algo, K::kAllReduce, ReduceOp::kSum, place, shape, axes, 1});
  };
  for (int g : {1, 2, 3, 4, 8}) {
    for (const char* algo : {"ring", "bidirectional_ring"}) {
      add_reductions(algo, Place::kRing, {g}, {g});
    }
  }
  // A line: the closing transfer crosses the whole line; bidirectional lanes share links.
  for (const char* algo : {"ring", "bidirectional_ring"}) {
    add_reductions(algo, Place::kLine, {8}, {8});
    add_reductions(algo, Place::kLine, {3}, {3});
  }
  // torus_2d: two axes as a 2x4 / 4x2 torus and on an 8-ring; also 2x2, 2x3, 2x2x2, and an
  // axis of size 1.
  add_reductions("torus_2d", Place::kTorus, {2, 4}, {2, 4});
  add_reductions("torus_2d", Place::kTorus, {4, 2}, {4, 2});
  add_reductions("torus_2d", Place::kRing, {8}, {2, 4});
  add_reductions("torus_2d", Place::kRing, {8}, {4, 2});
  add_reductions("torus_2d", Place::kTorus, {2, 2}, {2, 2});
  add_reductions("torus_2d", Place::kTorus, {2, 3}, {2, 3});
  add_reductions("torus_2d", Place::kTorus, {3, 3}, {3, 3});
  add_reductions("torus_2d", Place::kLine, {2, 4}, {2, 4});
  add_reductions("torus_2d", Place::kTorus, {2, 2, 2}, {2, 2, 2});
  add_reductions("torus_2d", Place::kRing, {4}, {1, 4});
  add_reductions("torus_2d", Place::kRing, {1}, {1});
  // Members out of row-major order: rings along the torus dimensions still leave block m on
  // member m. A snake over 4x4 (one mesh axis of 16), a column-major 2x4, and strided 2x2 and
  // 2x3 subsets of 4x4 and 4x6 tori listed out of order.
  {
    std::vector<int> snake;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) snake.push_back(i * 4 + (i % 2 == 0 ? j : 3 - j));
    }
    auto add_placed = [&](std::vector<int> shape, std::vector<int> axes, std::vector<int> devices) {
      const size_t first = cases.size();
      add_reductions("torus_2d", Place::kTorus, shape, axes);
      for (size_t i = first; i < cases.size(); ++i) cases[i].devices = devices;
    };
    add_placed({4, 4}, {16}, snake);
    add_placed({2, 4}, {4, 2}, {0, 4, 1, 5, 2, 6, 3, 7});
    add_placed({4, 4}, {4}, {10, 0, 8, 2});
    add_placed({4, 6}, {2, 3}, {14, 2, 0, 12, 16, 4});
  }
  // direct: every kind.
  for (int g : {1, 2, 3, 4, 8}) {
    add_reductions("direct", Place::kSwitch, {g}, {g});
    cases.push_back({"direct", K::kAllToAll, ReduceOp::kSum, Place::kSwitch, {g}, {g}, 3});
    cases.push_back({"direct", K::kAllToAll, ReduceOp::kSum, Place::kSwitch, {g}, {g}, 1});
    for (int pattern : {0, 1, 2, 3}) {
      cases.push_back(
          {"direct", K::kPermute, ReduceOp::kSum, Place::kSwitch, {g}, {g}, 3, pattern});
    }
  }
  add_reductions("direct", Place::kRing, {8}, {8});
  cases.push_back({"direct", K::kAllToAll, ReduceOp::kSum, Place::kRing, {8}, {8}, 2});
  cases.push_back({"direct", K::kPermute, ReduceOp::kSum, Place::kRing, {8}, {8}, 2, 0});
  // halving_doubling: powers of two.
  for (int g : {1, 2, 4, 8}) add_reductions("halving_doubling", Place::kSwitch, {g}, {g});
  add_reductions("halving_doubling", Place::kRing, {8}, {8});
  add_reductions("halving_doubling", Place::kLine, {8}, {8});
  // tree: all-reduce only; heaps of every shape up to 8.
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8}) {
    for (ReduceOp op : ops) {
      cases.push_back({"tree", K::kAllReduce, op, Place::kSwitch, {g}, {g}, 13});
    }
    cases.push_back({"tree", K::kAllReduce, ReduceOp::kSum, Place::kSwitch, {g}, {g}, 1});
  }
  cases.push_back({"tree", K::kAllReduce, ReduceOp::kSum, Place::kRing, {8}, {8}, 13});
  // NCCL's algorithms (all-reduce only for nvls and hierarchical): group sizes 1..16, odd ones
  // too; 1000 elements flow in 63 segments of the 64-byte chunk.
  auto add_all_reduce = [&](const std::string& algo, Place place, std::vector<int> shape) {
    const int g = std::accumulate(shape.begin(), shape.end(), 1, std::multiplies<int>());
    for (ReduceOp op : ops) {
      cases.push_back({algo, K::kAllReduce, op, place, shape, {g}, 13});
      cases.push_back({algo, K::kAllReduce, op, place, shape, {g}, 1000});
    }
    cases.push_back({algo, K::kAllReduce, ReduceOp::kSum, place, shape, {g}, 1});
  };
  for (int g : {1, 2, 3, 5, 8, 16}) add_all_reduce("nvls", Place::kNcclSwitch, {g});
  for (std::vector<int> shape :
       std::vector<std::vector<int>>{{2, 1}, {2, 3}, {3, 3}, {5, 3}, {2, 8}, {4, 4}}) {
    add_all_reduce("hierarchical", Place::kNcclFatTree, shape);
    add_all_reduce("hierarchical", Place::kNcclFatTreeNvls, shape);
    add_all_reduce("collnet", Place::kNcclFatTreeSharp, shape);
    // Rail-aligned ring channels (4 of them, fewer or more than the members per node).
    const int g = shape[0] * shape[1];
    add_reductions("ring", Place::kNcclFatTree, shape, {g});
    cases.push_back({"ring", K::kAllReduce, ReduceOp::kSum, Place::kNcclFatTree, shape, {g}, 1000});
  }
  // NCCL's double binary tree: on a switch (1..8, 16) and across nodes of one GPU each.
  for (int g : {1, 2, 3, 5, 8, 16}) add_all_reduce("double_tree", Place::kNcclSwitch, {g});
  for (int nodes : {2, 3, 7}) add_all_reduce("double_tree", Place::kNcclFatTree, {nodes, 1});
  for (int g : {2, 6}) add_all_reduce("double_tree", Place::kSwitch, {g});
  // Every kind on an NCCL switch node and fat tree through the tuner's protocols.
  for (int g : {3, 8}) add_reductions("ring", Place::kNcclSwitch, {g}, {g});
  cases.push_back({"direct", K::kAllToAll, ReduceOp::kSum, Place::kNcclFatTree, {3, 3}, {9}, 3});
  cases.push_back({"direct", K::kPermute, ReduceOp::kSum, Place::kNcclFatTree, {3, 3}, {9}, 3, 0});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, AlgorithmNumerics, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<NumericsCase>& info) {
                           return CaseName(info.param);
                         });

// The algorithms refuse what they cannot run.
void ExpectRejected(const std::string& algorithm, CollectiveKind kind, int g) {
  Topology topo = Build(Place::kSwitch, {g});
  Simulator sim;
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network net(sim, topo, *router);
  CollectiveJob job;
  job.kind = kind;
  for (int m = 0; m < g; ++m) job.members.push_back(topo.device_vertex(m));
  job.block = 4;
  job.total = 4;
  job.destination = Destinations(0, g);
  job.numerics = false;
  job.on_member_done = [](int) {};
  std::string resolved;
  EXPECT_THROW(MakeAlgorithm(algorithm, net, job, {g}, &resolved), std::invalid_argument)
      << algorithm << " " << CollectiveKindName(kind) << " on " << g;
}

TEST(AlgorithmNumericsRejects, UnsupportedJobs) {
  using K = CollectiveKind;
  ExpectRejected("halving_doubling", K::kAllReduce, 6);
  ExpectRejected("halving_doubling", K::kAllGather, 6);
  ExpectRejected("halving_doubling", K::kReduceScatter, 3);
  ExpectRejected("halving_doubling", K::kAllToAll, 4);
  ExpectRejected("tree", K::kAllGather, 4);
  ExpectRejected("tree", K::kReduceScatter, 4);
  ExpectRejected("tree", K::kAllToAll, 4);
  ExpectRejected("tree", K::kPermute, 4);
  ExpectRejected("ring", K::kAllToAll, 4);
  ExpectRejected("ring", K::kPermute, 4);
  ExpectRejected("bidirectional_ring", K::kAllToAll, 4);
  ExpectRejected("torus_2d", K::kAllToAll, 4);
  ExpectRejected("no_such_algorithm", K::kAllReduce, 4);
  ExpectRejected("nvls", K::kAllGather, 4);
  ExpectRejected("hierarchical", K::kReduceScatter, 4);
}

// NVLS needs a switch that reduces; hierarchical needs two nodes with as many members each.
TEST(AlgorithmNumericsRejects, NcclAlgorithmsNeedTheirTopology) {
  CollectiveJob job;
  job.kind = CollectiveKind::kAllReduce;
  job.total = 4;
  job.numerics = false;
  job.on_member_done = [](int) {};
  std::string resolved;
  {
    Topology topo = Build(Place::kSwitch, {4});  // Not NCCL, no NVLS.
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(topo);
    Network net(sim, topo, *router);
    for (int m = 0; m < 4; ++m) job.members.push_back(topo.device_vertex(m));
    try {
      MakeAlgorithm("nvls", net, job, {4}, &resolved);
      ADD_FAILURE() << "nvls ran without an NVLS switch";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("NVSwitch that reduces"), std::string::npos) << e.what();
    }
    EXPECT_THROW(MakeAlgorithm("hierarchical", net, job, {4}, &resolved), std::invalid_argument);
  }
  {
    Topology topo = Build(Place::kNcclFatTree, {2, 4});
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(topo);
    Network net(sim, topo, *router);
    job.members = {topo.device_vertex(0), topo.device_vertex(1), topo.device_vertex(2),
                   topo.device_vertex(4)};  // 3 members on node 0, 1 on node 1.
    try {
      MakeAlgorithm("hierarchical", net, job, {4}, &resolved);
      ADD_FAILURE() << "hierarchical ran on uneven nodes";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("same number of group members in every node"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(MakeAlgorithm("nvls", net, job, {4}, &resolved), std::invalid_argument);
  }
}

}  // namespace
}  // namespace shardsim
