// Collectives on machines whose collectives run as NCCL (CommSpec::nccl): closed forms of the
// launch and protocol costs, NVLS, the hierarchical all-reduce and rail-aligned ring channels,
// and the tuner's estimates against the simulation.
//
// Notation: V bytes (the all-reduce buffer, or the gathered array), W the one-way bandwidth of
// a link in bytes per microsecond, L the launch latency, s the protocol's step latency. Hops:
// GPU -> NVSwitch 0.5 us, GPU -> leaf 1 us (so GPU -> GPU is 1 us in a node, 2 us across
// nodes under one leaf). Tolerance: the fluid model is exact to the picosecond on these
// contention-free or symmetric layouts, so closed forms are checked to 1e-6 relative; the
// pipelining bounds state their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/collective.h"
#include "collectives/nccl_tuner.h"
#include "sim/simulator.h"
#include "tests/topology/fat_tree_params.h"
#include "topology/hierarchical.h"
#include "topology/network.h"
#include "topology/routing.h"
#include "topology/switch.h"

namespace shardsim {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kNvW = 450e3;  // Bytes per microsecond.
constexpr double kNicW = 50e3;  // Bytes per microsecond.
constexpr double kLaunch = 10;  // Microseconds.
constexpr double kStep = 2;     // Microseconds, every protocol unless a test sets its own.

// Every protocol with the same figures (so the tuner's protocol does not change the time),
// full efficiency, one segment (a 1 GiB chunk) unless `chunk` is given.
CommSpec Comm(bool nvls, int channels = 8, Bytes chunk = Bytes::GiB(1)) {
  CommSpec c;
  c.nccl = true;
  c.launch_latency = Time::Microseconds(kLaunch);
  for (ProtocolSpec& p : c.protocols) p = {Time::Microseconds(kStep), 1.0};
  c.nvls = nvls;
  c.channels = channels;
  c.chunk_size = chunk;
  return c;
}

Topology Node(int gpus, const CommSpec& comm) {
  Topology t = BuildSwitch(gpus, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink,
                           DeviceSpec{}, "node");
  t.SetCommSpec(comm);
  return t;
}

Topology Nodes(int nodes, int per_node, const CommSpec& comm) {
  Topology t = BuildHierarchical(testing_support::FatTree(nodes, per_node), DeviceSpec{}, "nodes");
  t.SetCommSpec(comm);
  return t;
}

struct Ran {
  double us = 0;
  std::string resolved;
};

// Runs `kind` of V bytes (f32) over every device of `topo`, timing only.
Ran RunCollective(const Topology& topo, CollectiveKind kind, const std::string& algorithm,
                  double v) {
  Simulator sim;
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network net(sim, topo, *router);
  CollectiveJob job;
  job.kind = kind;
  job.dtype = DType::kF32;
  const int g = topo.num_devices();
  for (int d = 0; d < g; ++d) job.members.push_back(topo.device_vertex(d));
  job.numerics = false;
  const int64_t elements = static_cast<int64_t>(v) / 4;
  job.total = elements;
  job.block = kind == CollectiveKind::kAllReduce ? elements : elements / g;
  int done = 0;
  job.on_member_done = [&done](int) { ++done; };
  Ran r;
  std::unique_ptr<CollectiveAlgorithm> algo = MakeAlgorithm(algorithm, net, job, {g}, &r.resolved);
  algo->Start();
  sim.Run();
  EXPECT_EQ(done, g);
  r.us = sim.Now().microseconds();
  return r;
}

struct ClosedForm {
  std::string name;
  Topology (*topology)();
  CollectiveKind kind;
  std::string algorithm;
  double v;
  double expected_us;
};

void PrintTo(const ClosedForm& c, std::ostream* os) { *os << c.name; }

constexpr double kSmall = 64 * 1024;
constexpr double kLarge = 64 * kMiB;

std::vector<ClosedForm> Cases() {
  using K = CollectiveKind;
  auto node8 = [] { return Node(8, Comm(true)); };
  auto two_by_four = [] { return Nodes(2, 4, Comm(false)); };
  auto two_by_four_nvls = [] { return Nodes(2, 4, Comm(true)); };
  auto two_by_four_sharp = [] {
    CommSpec c = Comm(false);
    c.sharp = true;
    return Nodes(2, 4, c);
  };
  auto slow_links = [] {
    CommSpec c = Comm(false);
    c.nvlink_efficiency = 0.5;
    return Node(8, c);
  };
  std::vector<ClosedForm> cases;
  for (double v : {kSmall, kLarge}) {
    const std::string size = v == kSmall ? "64KiB" : "64MiB";
    // Ring on one node: L, then n-1 steps (2(n-1) for all-reduce) of one 1 us crossing plus s,
    // each moving V/n over every GPU's NVLink.
    cases.push_back({"ring_all_gather_node8_" + size, node8, K::kAllGather, "ring", v,
                     kLaunch + 7 * (1 + kStep) + 7.0 / 8 * v / kNvW});
    cases.push_back({"ring_all_reduce_node8_" + size, node8, K::kAllReduce, "ring", v,
                     kLaunch + 14 * (1 + kStep) + 14.0 / 8 * v / kNvW});
    // The achievable fraction of NVLink scales the bandwidth term.
    cases.push_back({"ring_all_gather_half_nvlink_" + size, slow_links, K::kAllGather, "ring", v,
                     kLaunch + 7 * (1 + kStep) + 7.0 / 8 * v / (0.5 * kNvW)});
    // NVLS, one segment: V up to the switch, V/8 down, V/8 up, 7 pieces of V/8 down at once;
    // each transfer one 0.5 us hop plus s.
    cases.push_back({"nvls_node8_" + size, node8, K::kAllReduce, "nvls", v,
                     kLaunch + 4 * (0.5 + kStep) + (1 + 1.0 / 8 + 1.0 / 8 + 7.0 / 8) * v / kNvW});
    // Hierarchical, 2 nodes of 4, direct inside the node: node reduce-scatter (3 pieces of V/4
    // out of and into every GPU), rail reduce-scatter and all-gather (V/8 over the NIC, 2 us
    // each way), node all-gather (3 pieces of V/4).
    cases.push_back(
        {"hierarchical_2x4_" + size, two_by_four, K::kAllReduce, "hierarchical", v,
         kLaunch + 2 * (1 + kStep + 3.0 / 4 * v / kNvW) + 2 * (2 + kStep + v / 8 / kNicW)});
    // CollNet (SHARP in the leaf, direct inside the node): the node stages as above; each
    // rail stage goes up to the leaf and back down (1 us hops): reduce-scatter V/4 up and V/8
    // down, all-gather V/8 up and the other member's V/8 down.
    cases.push_back({"collnet_2x4_" + size, two_by_four_sharp, K::kAllReduce, "collnet", v,
                     kLaunch + 2 * (1 + kStep + 3.0 / 4 * v / kNvW) + 4 * (1 + kStep) +
                         (1.0 / 4 + 1.0 / 8 + 1.0 / 8 + 1.0 / 8) * v / kNicW});
    // With NVLS inside the node: V up and V/4 down, the rail stages as above, V/4 up and 3
    // pieces of V/4 down.
    cases.push_back({"hierarchical_nvls_2x4_" + size, two_by_four_nvls, K::kAllReduce,
                     "hierarchical", v,
                     kLaunch + 4 * (0.5 + kStep) + (1 + 1.0 / 4 + 1.0 / 4 + 3.0 / 4) * v / kNvW +
                         2 * (2 + kStep + v / 8 / kNicW)});
  }
  return cases;
}

class NcclClosedForm : public testing::TestWithParam<ClosedForm> {};

TEST_P(NcclClosedForm, MatchesItsDerivation) {
  const ClosedForm& c = GetParam();
  Topology topo = c.topology();
  Ran r = RunCollective(topo, c.kind, c.algorithm, c.v);
  EXPECT_EQ(r.resolved.substr(0, r.resolved.find('/')), c.algorithm);
  EXPECT_NEAR(r.us, c.expected_us, 1e-6 * c.expected_us);
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclClosedForm, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<ClosedForm>& info) {
                           return info.param.name;
                         });

// The tuner weighs protocols by size: LL (quarter bandwidth, short steps) for small messages,
// Simple (full bandwidth, long steps) for large ones, and the simulation pays the chosen one's
// figures: at 1 KiB the ring of 8 costs L + 7 (1 + 0.5) + 7/8 V / (W/4).
TEST(NcclProtocols, TunerPicksByMessageSize) {
  CommSpec c = Comm(false);
  c.protocols[static_cast<int>(Protocol::kLL)] = {Time::Nanoseconds(500), 0.25};
  c.protocols[static_cast<int>(Protocol::kLL128)] = {Time::Microseconds(50), 0.5};
  c.protocols[static_cast<int>(Protocol::kSimple)] = {Time::Microseconds(5), 1.0};
  Topology topo = Node(8, c);
  Ran small = RunCollective(topo, CollectiveKind::kAllGather, "ring", 1024);
  EXPECT_EQ(small.resolved, "ring/LL");
  const double small_us = kLaunch + 7 * (1 + 0.5) + 7.0 / 8 * 1024 / (0.25 * kNvW);
  EXPECT_NEAR(small.us, small_us, 1e-6 * small_us);
  Ran large = RunCollective(topo, CollectiveKind::kAllGather, "ring", kLarge);
  EXPECT_EQ(large.resolved, "ring/Simple");
  const double large_us = kLaunch + 7 * (1 + 5) + 7.0 / 8 * kLarge / kNvW;
  EXPECT_NEAR(large.us, large_us, 1e-6 * large_us);
  // A protocol given with the algorithm is used whatever the size.
  Ran forced = RunCollective(topo, CollectiveKind::kAllGather, "ring/LL128", kLarge);
  EXPECT_EQ(forced.resolved, "ring/LL128");
  const double forced_us = kLaunch + 7 * (1 + 50) + 7.0 / 8 * kLarge / (0.5 * kNvW);
  EXPECT_NEAR(forced.us, forced_us, 1e-6 * forced_us);
}

// Pipelined in 1 MiB segments, NVLS beats its unpipelined run (one segment: the four
// transfers in turn, L + 4 (0.5 + s) + 2.125 V / W, the closed form above) by overlapping the
// stages, and never beats the bandwidth bound: the busiest direction of a GPU's NVLink
// carries (1 + 1/8) V. What remains above the bound is every window of 8 segments paying its
// stage latencies: at 64 MiB at least 20% under the unpipelined time.
TEST(NcclPipelining, NvlsOverlapsItsStages) {
  Topology topo = Node(8, Comm(true, 8, Bytes::MiB(1)));
  Ran r = RunCollective(topo, CollectiveKind::kAllReduce, "nvls", kLarge);
  const double bound = kLaunch + 1.125 * kLarge / kNvW;
  const double unpipelined = kLaunch + 4 * (0.5 + kStep) + 2.125 * kLarge / kNvW;
  EXPECT_GE(r.us, bound);
  EXPECT_LE(r.us, 0.8 * unpipelined);
}

// Across 2 nodes of 8 with NVLS inside, each stage's busiest link carries V / 400 GB/s
// worth: NVLink 1.125 V at 450 GB/s, the NIC V/8 at 50 GB/s. Pipelined at 256 MiB the run
// stays above that bound and at least 35% under its stages in turn (the closed form above:
// L + 4 (0.5 + s) + 2.25 V / W_nvlink + 2 (2 + s + V / 16 / W_nic)); a flat ring through one
// NIC per node crossing would take 2 (15/16) V / 50 GB/s, 4.7 times the bound.
TEST(NcclPipelining, HierarchicalOverlapsItsStagesOverEveryRail) {
  Topology topo = Nodes(2, 8, Comm(true, 8, Bytes::MiB(1)));
  const double v = 256 * kMiB;
  Ran r = RunCollective(topo, CollectiveKind::kAllReduce, "hierarchical", v);
  const double bound = kLaunch + v / 400e3;
  const double unpipelined = kLaunch + 4 * (0.5 + kStep) +
                             (1 + 1.0 / 8 + 1.0 / 8 + 7.0 / 8) * v / kNvW +
                             2 * (2 + kStep + v / 16 / kNicW);
  EXPECT_GE(r.us, bound);
  EXPECT_LE(r.us, 0.65 * unpipelined);
}

// Rail-aligned ring channels: an all-gather over 2 nodes of 4 with 4 channels crosses the
// nodes through all 4 NICs of each node, each carrying a quarter of the ring's (7/8) V; one
// channel would put all of it through one NIC.
TEST(NcclChannels, RingsSpreadOverTheRails) {
  const double v = 64 * kMiB;
  Ran four = RunCollective(Nodes(2, 4, Comm(false, 4)), CollectiveKind::kAllGather, "ring", v);
  Ran one = RunCollective(Nodes(2, 4, Comm(false, 1)), CollectiveKind::kAllGather, "ring", v);
  const double nic_one = 7.0 / 8 * v / kNicW;
  EXPECT_GE(one.us, nic_one);
  EXPECT_LE(one.us, 1.02 * nic_one + kLaunch + 7 * (2 + kStep));
  EXPECT_GE(four.us, nic_one / 4);
  EXPECT_LE(four.us, 1.05 * nic_one / 4 + kLaunch + 7 * (2 + kStep));
}

// NCCL's double binary tree across 8 nodes of one GPU: at 64 bytes the time is its latency
// chain, L + 2 floor(log2 8) (2 us across nodes + s), the bandwidth terms under a
// nanosecond (within 1%); the tuner picks it over the ring (2 (8 - 1) steps) at that size and
// the ring at 256 MiB, where the ring's 2 (n-1)/n S beats the trees' 2 S over each NIC.
TEST(NcclDoubleTree, LatencyChainAndTunerChoice) {
  Topology topo = Nodes(8, 1, Comm(false));
  Ran tiny = RunCollective(topo, CollectiveKind::kAllReduce, "double_tree", 64);
  const double chain = kLaunch + 2 * 3 * (2 + kStep);
  EXPECT_NEAR(tiny.us, chain, 0.01 * chain);
  EXPECT_EQ(RunCollective(topo, CollectiveKind::kAllReduce, "auto", 64).resolved.substr(0, 11),
            "double_tree");
  EXPECT_EQ(
      RunCollective(topo, CollectiveKind::kAllReduce, "auto", 256 * kMiB).resolved.substr(0, 4),
      "ring");
}

// Across 8 nodes of 8 at 1 GiB, a fabric that reduces halves the rails' bytes ((1 + 1/8) S/8
// through the leaf against 2 (7/8) S/8 exchanged): the tuner takes CollNet, and it is faster
// than the hierarchical all-reduce the same machine runs without SHARP.
TEST(NcclCollnet, TunerTakesTheReducingFabricAcrossManyNodes) {
  CommSpec with = Comm(true, 8, Bytes::MiB(1));
  with.sharp = true;
  Ran sharp = RunCollective(Nodes(8, 8, with), CollectiveKind::kAllReduce, "auto", 1024 * kMiB);
  Ran plain = RunCollective(Nodes(8, 8, Comm(true, 8, Bytes::MiB(1))), CollectiveKind::kAllReduce,
                            "auto", 1024 * kMiB);
  EXPECT_EQ(sharp.resolved, "collnet/Simple");
  EXPECT_EQ(plain.resolved, "hierarchical/Simple");
  EXPECT_LT(sharp.us, 0.9 * plain.us);
}

// A node whose NVLS stage runs late must not lose the other node's contribution: member m of
// a fast node, done with its node's reduction, sends its part across while the slow node's
// switch has not yet returned the receiver's piece; the part must be added to that piece, not
// overwritten by it. Node 1's NVLink is loaded by two large transfers between its GPUs that
// start with the all-reduce; every output must still be the exact sum.
TEST(NcclStagedNumerics, ASlowNodeKeepsTheOthersContributions) {
  for (const char* algorithm : {"hierarchical", "collnet"}) {
    SCOPED_TRACE(algorithm);
    CommSpec c = Comm(true, 8, Bytes::GiB(1));  // One segment: node 1 lags by a whole stage.
    c.sharp = true;
    Topology topo = Nodes(2, 2, c);
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(topo);
    Network net(sim, topo, *router);
    const int g = 4;
    const int64_t n = 1 << 20;
    std::vector<std::vector<float>> in(g), out(g);
    for (int m = 0; m < g; ++m) {
      for (int64_t i = 0; i < n; ++i) in[m].push_back(static_cast<float>((m + 1) * (i % 7 + 1)));
    }
    CollectiveJob job;
    job.kind = CollectiveKind::kAllReduce;
    job.dtype = DType::kF32;
    for (int d = 0; d < g; ++d) job.members.push_back(topo.device_vertex(d));
    job.total = n;
    job.block = n;
    job.numerics = true;
    job.in = &in;
    job.out = &out;
    int done = 0;
    job.on_member_done = [&done](int) { ++done; };
    std::string resolved;
    std::unique_ptr<CollectiveAlgorithm> algo = MakeAlgorithm(algorithm, net, job, {g}, &resolved);
    // Load node 1's NVLink both ways (GPUs 2 and 3): its switch stage gets a fifth of the
    // links, and finishes after node 0's parts have crossed to it (4 MiB at 450 GB/s per stage
    // against 1 MiB over a 50 GB/s NIC).
    for (int i = 0; i < 4; ++i) {
      net.Start(topo.device_vertex(2), topo.device_vertex(3), Bytes::MiB(64), "load", [] {});
      net.Start(topo.device_vertex(3), topo.device_vertex(2), Bytes::MiB(64), "load", [] {});
    }
    algo->Start();
    sim.Run();
    ASSERT_EQ(done, g);
    for (int m = 0; m < g; ++m) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[m][i], static_cast<float>(10 * (i % 7 + 1))) << "member " << m << " at " << i;
      }
    }
  }
}

// The tuner's estimate of what it picks is close to what the simulation then takes (within
// 35%: like NCCL's own model, the estimates skip how the staged pipelines' windows and the
// rings' fast and slow links interact), and what it picks is within 25% of the fastest
// candidate simulated, over sizes from 4 KiB to 1 GiB on one H100-like node and on 2 nodes
// (NVLS on).
TEST(NcclTuner, EstimatesAndChoicesFollowTheSimulation) {
  for (int nodes : {1, 2}) {
    Topology topo = nodes == 1 ? Node(8, Comm(true, 8, Bytes::MiB(1)))
                               : Nodes(2, 8, Comm(true, 8, Bytes::MiB(1)));
    for (double v = 4096; v <= 1024 * kMiB; v *= 16) {
      SCOPED_TRACE(std::to_string(nodes) + " nodes, " + std::to_string(v) + " bytes");
      Simulator sim;
      std::unique_ptr<Router> router = MakeRouter(topo);
      Network net(sim, topo, *router);
      CollectiveJob job;
      job.kind = CollectiveKind::kAllReduce;
      for (int d = 0; d < topo.num_devices(); ++d) job.members.push_back(topo.device_vertex(d));
      job.total = static_cast<int64_t>(v) / 4;
      std::vector<NcclChoice> candidates = NcclCandidates(net, job, {topo.num_devices()}, "auto");
      ASSERT_FALSE(candidates.empty());
      NcclChoice chosen = ChooseNccl(net, job, {topo.num_devices()}, "auto");
      double fastest = 1e300, chosen_us = 0;
      for (const NcclChoice& c : candidates) {
        const std::string name = c.algorithm + "/" + ProtocolName(c.protocol);
        const double us = RunCollective(topo, CollectiveKind::kAllReduce, name, v).us;
        fastest = std::min(fastest, us);
        if (c.algorithm == chosen.algorithm && c.protocol == chosen.protocol) chosen_us = us;
      }
      EXPECT_NEAR(chosen.estimate.microseconds(), chosen_us, 0.35 * chosen_us);
      EXPECT_LE(chosen_us, 1.25 * fastest);
    }
  }
}

}  // namespace
}  // namespace shardsim
