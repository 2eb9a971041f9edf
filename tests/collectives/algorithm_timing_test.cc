// Timing of every collective algorithm against its closed form, on contention-free layouts
// (plus the few layouts whose sharing is simple enough to derive exactly).
//
// Notation in the table: V is the whole array in bytes (all-gather: the gathered result;
// reduce-scatter: one member's whole input; all-reduce: one member's buffer; all-to-all: the
// whole array over all members, G times one member's buffer), a the latency of one hop, W the
// one-way bandwidth of one link in bytes per microsecond, x the time one ring chunk takes on one
// link. Every expected time is written out in microseconds from the derivation beside it.
//
// Tolerance: the Network is a fluid model that is exact (a lone transfer of S bytes over h hops
// takes h*a + S/W to the picosecond; each drain is rounded up to a whole picosecond), so the
// simulator should match the closed forms to about 1e-9 relative. The 1% bound is the issue's
// acceptance bound for "matches its closed form", not slack for a model error. Because 1% of a
// bandwidth-dominated time can hide a latency term, most layouts are also checked at a small
// size (1 or 64 KiB) where the latency terms dominate.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/collective.h"
#include "sim/simulator.h"
#include "topology/network.h"
#include "topology/routing.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

constexpr double KiB = 1024.0;
constexpr double MiB = 1024.0 * 1024.0;

// ICI: TPU v5e-like links, 45 GB/s one way per link (hardware.md), 1 us per hop.
constexpr double kIciW = 45e3;  // Bytes per microsecond.
constexpr double kIciA = 1.0;   // Microseconds per hop.
// NVSwitch node: 450 GB/s per GPU one way (H100, hardware.md), 0.5 us per hop, 2 hops GPU-GPU.
constexpr double kNvW = 450e3;
constexpr double kNvA = 0.5;

Topology Ring8() {
  return BuildTorus({8}, {true}, Bandwidth::GBps(45), Time::Microseconds(1), LinkKind::kIci,
                    DeviceSpec{}, "ring8");
}
Topology Line8() {
  return BuildTorus({8}, {false}, Bandwidth::GBps(45), Time::Microseconds(1), LinkKind::kIci,
                    DeviceSpec{}, "line8");
}
Topology Torus4x4() {
  return BuildTorus({4, 4}, {true, true}, Bandwidth::GBps(45), Time::Microseconds(1),
                    LinkKind::kIci, DeviceSpec{}, "torus4x4");
}
Topology Switch8() {
  return BuildSwitch(8, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink,
                     DeviceSpec{}, "switch8");
}
Topology Switch4() {
  return BuildSwitch(4, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink,
                     DeviceSpec{}, "switch4");
}

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Sizes the job's flat buffers from V (see the notation above); f32, so 4 bytes an element.
void SizeJob(CollectiveJob& job, int64_t v_bytes) {
  int64_t g = job.size();
  int64_t elements = v_bytes / 4;
  switch (job.kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      job.block = elements / g;
      break;
    case CollectiveKind::kAllReduce:
      job.total = elements;
      job.block = elements;
      break;
    case CollectiveKind::kAllToAll:
      job.block = elements / (g * g);
      break;
    case CollectiveKind::kPermute:
      job.block = elements / g;
      break;
  }
}

struct RunResult {
  double us = 0;          // Simulated end time.
  std::string resolved;   // The algorithm that ran.
  std::vector<int> done;  // on_member_done calls per member.
};

// Runs one timing-only collective over devices `members` of `topo`.
RunResult RunCollective(const Topology& topo, const std::vector<int>& members,
                        const std::vector<int>& axis_sizes, CollectiveKind kind,
                        const std::string& algorithm, int64_t v_bytes) {
  Simulator sim;
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network net(sim, topo, *router);
  CollectiveJob job;
  job.kind = kind;
  job.dtype = DType::kF32;
  for (int d : members) job.members.push_back(topo.device_vertex(d));
  job.numerics = false;
  SizeJob(job, v_bytes);
  RunResult r;
  r.done.assign(members.size(), 0);
  job.on_member_done = [&r](int m) { ++r.done[m]; };
  // A chunk larger than any case keeps the tree to one segment: its closed forms below are
  // unpipelined (executor_test.cc checks that chunking pipelines it).
  std::unique_ptr<CollectiveAlgorithm> algo =
      MakeAlgorithm(algorithm, net, job, axis_sizes, &r.resolved, Bytes::GiB(1));
  algo->Start();
  sim.Run();
  r.us = sim.Now().microseconds();
  return r;
}

struct TimingCase {
  std::string name;
  std::function<Topology()> topology;
  std::vector<int> members;     // Device indices, in group order.
  std::vector<int> axis_sizes;  // Mesh axes of the group (first major).
  CollectiveKind kind;
  std::string algorithm;
  double bytes;        // V, see the notation above.
  double expected_us;  // The closed form.
};

std::string CaseName(const testing::TestParamInfo<TimingCase>& info) { return info.param.name; }
void PrintTo(const TimingCase& c, std::ostream* os) { *os << c.name; }

// One 8 MiB ring chunk on an ICI link, in us: x = V/8/W.
constexpr double X8M = 8 * MiB / 8 / kIciW;
constexpr double X64K = 64 * KiB / 8 / kIciW;
constexpr double X1K = 1 * KiB / 8 / kIciW;

std::vector<TimingCase> Cases() {
  const std::vector<int> ring8 = Iota(8);
  const std::vector<int> all16 = Iota(16);
  const std::vector<int> sw4 = Iota(4);
  using K = CollectiveKind;
  return {
      // --- ring, one direction, 8-ring with wraparound: each of the X-1 = 7 steps moves a chunk
      // of V/8 over every link at once, (X-1)(a + V/(X W)) per pass; all-reduce is two passes.
      {"ring_all_gather_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kAllGather,
       "ring",
       8 * MiB,
       7 * (kIciA + 8 * MiB / 8 / kIciW)},
      {"ring_all_gather_ring8_64KiB",
       Ring8,
       ring8,
       {8},
       K::kAllGather,
       "ring",
       64 * KiB,
       7 * (kIciA + 64 * KiB / 8 / kIciW)},
      {"ring_reduce_scatter_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kReduceScatter,
       "ring",
       8 * MiB,
       7 * (kIciA + 8 * MiB / 8 / kIciW)},
      {"ring_reduce_scatter_ring8_64KiB",
       Ring8,
       ring8,
       {8},
       K::kReduceScatter,
       "ring",
       64 * KiB,
       7 * (kIciA + 64 * KiB / 8 / kIciW)},
      {"ring_all_reduce_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       8 * MiB,
       2 * 7 * (kIciA + 8 * MiB / 8 / kIciW)},
      {"ring_all_reduce_ring8_64KiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       64 * KiB,
       2 * 7 * (kIciA + 64 * KiB / 8 / kIciW)},

      // --- bidirectional_ring on the same: two half-size rings in opposite directions, each on
      // its own direction of every link: half the bandwidth term, the same 7 latencies a pass.
      {"bidi_all_gather_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kAllGather,
       "bidirectional_ring",
       8 * MiB,
       7 * (kIciA + 8 * MiB / 16 / kIciW)},
      {"bidi_all_gather_ring8_64KiB",
       Ring8,
       ring8,
       {8},
       K::kAllGather,
       "bidirectional_ring",
       64 * KiB,
       7 * (kIciA + 64 * KiB / 16 / kIciW)},
      {"bidi_reduce_scatter_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kReduceScatter,
       "bidirectional_ring",
       8 * MiB,
       7 * (kIciA + 8 * MiB / 16 / kIciW)},
      {"bidi_all_reduce_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "bidirectional_ring",
       8 * MiB,
       2 * 7 * (kIciA + 8 * MiB / 16 / kIciW)},
      {"bidi_all_reduce_ring8_64KiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "bidirectional_ring",
       64 * KiB,
       2 * 7 * (kIciA + 64 * KiB / 16 / kIciW)},

      // --- ring on a line (no wraparound). Transfers i -> i+1 are one hop on the forward
      // links and take d = a + x (x = V/8/W); the closing 7 -> 0 crosses all 7 reverse links,
      // which nothing else uses: d7 = 7a + x. A member sends step s+1 when step s arrives (no
      // barrier), so member m's last arrival ends a chain of 7 transfers, one from every other
      // member: it finishes at sum(d) - d_m. The last finishers (members 0..6) wait on a chain
      // holding the closing transfer once: 6(a + x) + (7a + x) = 13a + 7x. (A barrier per step
      // would give 7(7a + x); the dataflow ring does better.) All-reduce: member 7 finishes the
      // reduce-scatter 6a early, which only shortens chains that do not end last: 2(13a + 7x).
      {"ring_all_gather_line8_8MiB",
       Line8,
       ring8,
       {8},
       K::kAllGather,
       "ring",
       8 * MiB,
       6 * (kIciA + X8M) + (7 * kIciA + X8M)},
      {"ring_all_gather_line8_64KiB",
       Line8,
       ring8,
       {8},
       K::kAllGather,
       "ring",
       64 * KiB,
       6 * (kIciA + X64K) + (7 * kIciA + X64K)},
      {"ring_reduce_scatter_line8_8MiB",
       Line8,
       ring8,
       {8},
       K::kReduceScatter,
       "ring",
       8 * MiB,
       6 * (kIciA + X8M) + (7 * kIciA + X8M)},
      {"ring_all_reduce_line8_8MiB",
       Line8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       8 * MiB,
       2 * (6 * (kIciA + X8M) + (7 * kIciA + X8M))},
      {"ring_all_reduce_line8_64KiB",
       Line8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       64 * KiB,
       2 * (6 * (kIciA + X64K) + (7 * kIciA + X64K))},

      // --- bidirectional_ring on a line: each lane moves chunks of x/2 worth. Every forward
      // link carries the forward lane's one-hop chunk and the backward lane's closing chunk
      // (0 -> 7 over all forward links), every reverse link the mirror image; both flows get
      // W/2, so each transfer drains in (V/16)/(W/2) = x, exactly as in the one-way ring: the
      // pass takes the one-way line time 13a + 7x, twice the bidirectional ring's bandwidth
      // term (Scaling Book: "about twice the bidirectional time"). All-reduce: see
      // BidirectionalRingOnLineAllReduce below (the early start of the end members lets some
      // flows run alone at W; no simple closed form).
      {"bidi_all_gather_line8_8MiB",
       Line8,
       ring8,
       {8},
       K::kAllGather,
       "bidirectional_ring",
       8 * MiB,
       6 * (kIciA + X8M) + (7 * kIciA + X8M)},
      {"bidi_all_gather_line8_64KiB",
       Line8,
       ring8,
       {8},
       K::kAllGather,
       "bidirectional_ring",
       64 * KiB,
       6 * (kIciA + X64K) + (7 * kIciA + X64K)},
      {"bidi_reduce_scatter_line8_8MiB",
       Line8,
       ring8,
       {8},
       K::kReduceScatter,
       "bidirectional_ring",
       8 * MiB,
       6 * (kIciA + X8M) + (7 * kIciA + X8M)},

      // --- torus_2d over two axes of a 4x4 torus with wraparound (members row-major, axis
      // sizes {4, 4}); both axes close in one hop, so 2 parts x 2 directions = 4 lanes, each a
      // quarter of every block. All-gather, lane of part p: a ring pass along one axis moving
      // its own block share (V/16/4 = V/64 bytes) 3 times, then along the other axis moving row
      // shares of 4 blocks (V/16) 3 times. In every phase each lane has its own (axis,
      // direction), so every directed link carries one flow at W:
      // 3(a + V/(64W)) + 3(a + V/(16W)) = 6a + 15/64 V/W = 6a + (N-1)/N * V/(k W) / 2 with
      // N = 16, k = 2 axes, 2 directions. Reduce-scatter mirrors it; all-reduce is both.
      {"torus2d_all_gather_4x4_8MiB",
       Torus4x4,
       all16,
       {4, 4},
       K::kAllGather,
       "torus_2d",
       8 * MiB,
       3 * (kIciA + 8 * MiB / 64 / kIciW) + 3 * (kIciA + 8 * MiB / 16 / kIciW)},
      {"torus2d_all_gather_4x4_64KiB",
       Torus4x4,
       all16,
       {4, 4},
       K::kAllGather,
       "torus_2d",
       64 * KiB,
       3 * (kIciA + 64 * KiB / 64 / kIciW) + 3 * (kIciA + 64 * KiB / 16 / kIciW)},
      {"torus2d_all_gather_4x4_8MiB_scaling_book",
       Torus4x4,
       all16,
       {4, 4},
       K::kAllGather,
       "torus_2d",
       8 * MiB,
       2 * 3 * kIciA + 15.0 / 16 * 8 * MiB / (2 * kIciW) / 2},
      {"torus2d_reduce_scatter_4x4_8MiB",
       Torus4x4,
       all16,
       {4, 4},
       K::kReduceScatter,
       "torus_2d",
       8 * MiB,
       3 * (kIciA + 8 * MiB / 16 / kIciW) + 3 * (kIciA + 8 * MiB / 64 / kIciW)},
      {"torus2d_all_reduce_4x4_8MiB",
       Torus4x4,
       all16,
       {4, 4},
       K::kAllReduce,
       "torus_2d",
       8 * MiB,
       2 * (3 * (kIciA + 8 * MiB / 16 / kIciW) + 3 * (kIciA + 8 * MiB / 64 / kIciW))},
      {"torus2d_all_reduce_4x4_64KiB",
       Torus4x4,
       all16,
       {4, 4},
       K::kAllReduce,
       "torus_2d",
       64 * KiB,
       2 * (3 * (kIciA + 64 * KiB / 16 / kIciW) + 3 * (kIciA + 64 * KiB / 64 / kIciW))},

      // --- direct inside an NVSwitch node (8 GPUs, 450 GB/s each way per GPU, 0.5 us a hop,
      // 2 hops GPU-switch-GPU). All-gather: each GPU's 7 sends of V/8 share its uplink and
      // every downlink receives 7: (N-1)/N V/W + 2a. Reduce-scatter: the same volumes.
      {"direct_all_gather_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kAllGather,
       "direct",
       8 * MiB,
       7.0 / 8 * 8 * MiB / kNvW + 2 * kNvA},
      {"direct_all_gather_switch8_64KiB",
       Switch8,
       ring8,
       {8},
       K::kAllGather,
       "direct",
       64 * KiB,
       7.0 / 8 * 64 * KiB / kNvW + 2 * kNvA},
      {"direct_reduce_scatter_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kReduceScatter,
       "direct",
       8 * MiB,
       7.0 / 8 * 8 * MiB / kNvW + 2 * kNvA},
      // All-reduce: direct reduce-scatter, then each GPU sends its reduced chunk to all peers.
      {"direct_all_reduce_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kAllReduce,
       "direct",
       8 * MiB,
       2 * (7.0 / 8 * 8 * MiB / kNvW + 2 * kNvA)},
      // All-to-all, V the whole array (8 MiB per GPU): (N-1)/N^2 * V/W + 2a.
      {"direct_all_to_all_switch8_64MiB",
       Switch8,
       ring8,
       {8},
       K::kAllToAll,
       "direct",
       64 * MiB,
       7.0 / 64 * 64 * MiB / kNvW + 2 * kNvA},
      {"direct_all_to_all_switch8_512KiB",
       Switch8,
       ring8,
       {8},
       K::kAllToAll,
       "direct",
       512 * KiB,
       7.0 / 64 * 512 * KiB / kNvW + 2 * kNvA},

      // --- halving_doubling on the switch: every exchange is a lone pair on its own uplink and
      // downlink, 2 hops. Reduce-scatter rounds move V/2, V/4, V/8; all-gather V/8, V/4, V/2:
      // log2(8) = 3 rounds a pass, 3 * 2a + 7/8 V/W; all-reduce 2 * log2(8) = 6 rounds.
      {"hd_all_reduce_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kAllReduce,
       "halving_doubling",
       8 * MiB,
       2 * 3 * 2 * kNvA + 2 * 7.0 / 8 * 8 * MiB / kNvW},
      {"hd_all_reduce_switch8_1KiB",
       Switch8,
       ring8,
       {8},
       K::kAllReduce,
       "halving_doubling",
       1 * KiB,
       2 * 3 * 2 * kNvA + 2 * 7.0 / 8 * 1 * KiB / kNvW},
      {"hd_all_gather_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kAllGather,
       "halving_doubling",
       8 * MiB,
       3 * 2 * kNvA + 7.0 / 8 * 8 * MiB / kNvW},
      {"hd_reduce_scatter_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kReduceScatter,
       "halving_doubling",
       8 * MiB,
       3 * 2 * kNvA + 7.0 / 8 * 8 * MiB / kNvW},

      // --- tree all-reduce on the switch (heap 0:{1,2} 1:{3,4} 2:{5,6} 3:{7}, one segment of
      // x = V/W; every edge is 2 hops = 2a). Siblings share their parent's downlink and a
      // parent's two sends share its uplink, so the edges are not independent paths:
      // up: 4->1, 7->3 at x+2a; 5->2 and 6->2 share 2's downlink: 2x+2a; 3->1 at 2x+4a; 2->0
      // starts at 2x+2a alone, 1->0 joins at 2x+4a (2a < x), the pair shares 0's downlink and
      // 1->0 arrives at 4x+4a; down: 0->{1,2} share 0's uplink, 6x+6a; 1->{3,4} and 2->{5,6},
      // 8x+8a; 3->7, 9x+10a.
      {"tree_all_reduce_switch8_8MiB",
       Switch8,
       ring8,
       {8},
       K::kAllReduce,
       "tree",
       8 * MiB,
       9 * (8 * MiB / kNvW) + 10 * kNvA},
      // Latency-bound (x < 2a): 2->0 has drained (3x+2a) before 1->0 starts (2x+4a): 1->0 arrives
      // at 3x+6a, then 5x+8a, 7x+10a, 8x+12a.
      {"tree_all_reduce_switch8_1KiB",
       Switch8,
       ring8,
       {8},
       K::kAllReduce,
       "tree",
       1 * KiB,
       8 * (1 * KiB / kNvW) + 12 * kNvA},
      // Four GPUs (0:{1,2} 1:{3}): 3->1 and 2->0 at x+2a; 1->0 at 2x+4a; 0->{1,2} share 0's
      // uplink: 4x+6a; 1->3: 5x+8a.
      {"tree_all_reduce_switch4_8MiB",
       Switch4,
       sw4,
       {4},
       K::kAllReduce,
       "tree",
       8 * MiB,
       5 * (8 * MiB / kNvW) + 8 * kNvA},

      // --- small messages (1 KiB all-reduce), latency-bound.
      // Ring on the 8-ring: 14 one-hop latencies.
      {"ring_all_reduce_ring8_1KiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       1 * KiB,
       2 * 7 * (kIciA + X1K)},
      {"bidi_all_reduce_ring8_1KiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "bidirectional_ring",
       1 * KiB,
       2 * 7 * (kIciA + X1K / 2)},
      // halving_doubling on the 8-ring: partners are 1, 2 and 4 hops away (shorter way round,
      // ties +). Distance 1: lone flows, a + (S/2)/W. Distance 2: pairs 0->2, 1->3 share link
      // 1->2 (and their mirrors), W/2 each: 2a + (S/4)/(W/2). Distance 4: all eight flows go
      // the + way, 4 per link, W/4 each: 4a + (S/8)/(W/4). All-gather mirrors it:
      // 2 * (7a + 3/2 S/W) = 14a + 3 S/W. The latency is the ring's 14a (1+2+4 = 7 hops a
      // pass), not 2 log2(8) = 6 hops.
      {"hd_all_reduce_ring8_1KiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "halving_doubling",
       1 * KiB,
       2 * ((kIciA + KiB / 2 / kIciW) + (2 * kIciA + KiB / 4 / (kIciW / 2)) +
            (4 * kIciA + KiB / 8 / (kIciW / 4)))},
      {"hd_all_reduce_ring8_8MiB",
       Ring8,
       ring8,
       {8},
       K::kAllReduce,
       "halving_doubling",
       8 * MiB,
       14 * kIciA + 3 * 8 * MiB / kIciW},
      // On the line the same sharing happens (0->2 and 1->3 share 1->2; 0->4 .. 3->7 share
      // 3->4), so the same time, while the ring pays 26a there.
      {"hd_all_reduce_line8_1KiB",
       Line8,
       ring8,
       {8},
       K::kAllReduce,
       "halving_doubling",
       1 * KiB,
       14 * kIciA + 3 * KiB / kIciW},
      {"ring_all_reduce_line8_1KiB",
       Line8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       1 * KiB,
       2 * (6 * (kIciA + X1K) + (7 * kIciA + X1K))},
      // Ring on the switch: every step is one 2-hop flow per uplink and downlink.
      {"ring_all_reduce_switch8_1KiB",
       Switch8,
       ring8,
       {8},
       K::kAllReduce,
       "ring",
       1 * KiB,
       2 * 7 * (2 * kNvA + KiB / 8 / kNvW)},
  };
}

class AlgorithmTiming : public testing::TestWithParam<TimingCase> {};

TEST_P(AlgorithmTiming, MatchesClosedForm) {
  const TimingCase& c = GetParam();
  Topology topo = c.topology();
  RunResult r = RunCollective(topo, c.members, c.axis_sizes, c.kind, c.algorithm,
                              static_cast<int64_t>(c.bytes));
  EXPECT_EQ(r.resolved, c.algorithm);
  EXPECT_NEAR(r.us, c.expected_us, 0.01 * c.expected_us)
      << c.name << ": simulated " << r.us << " us, closed form " << c.expected_us << " us";
  for (size_t m = 0; m < r.done.size(); ++m) {
    EXPECT_EQ(r.done[m], 1) << "member " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(ClosedForms, AlgorithmTiming, testing::ValuesIn(Cases()), CaseName);

// --- bidirectional_ring all-reduce on a line. Per-lane the phases chain per member, and the
// end members (7 forward, 0 backward) finish the reduce-scatter 6a before the others and start
// the all-gather's closing transfer early, so some flows briefly run alone at W instead of W/2.
// The bandwidth term is exactly the one-way ring's (every link carries 14 x's worth of bytes,
// as the one-way ring plus the other lane's closing transfers). The latency term has no simple
// closed form: for large messages the simulator gives 26a - (337/64)a ~ 20.73a; the test bounds
// it between 20a and the one-way ring's 26a (the end members' head start is 6a).
TEST(AlgorithmTimingShared, BidirectionalRingOnLineAllReduce) {
  Topology topo = Line8();
  auto run = [&](double v) {
    return RunCollective(topo, Iota(8), {8}, CollectiveKind::kAllReduce, "bidirectional_ring",
                         static_cast<int64_t>(v))
        .us;
  };
  double small = 8 * MiB, large = 64 * MiB;
  double t_small = run(small), t_large = run(large);
  double x_small = small / 8 / kIciW, x_large = large / 8 / kIciW;
  // Bandwidth term: 14x, from the difference of two sizes in the bandwidth-dominated regime.
  EXPECT_NEAR(t_large - t_small, 14 * (x_large - x_small), 0.01 * 14 * (x_large - x_small));
  for (auto [t, x] : {std::pair{t_small, x_small}, std::pair{t_large, x_large}}) {
    double latency = t - 14 * x;
    EXPECT_GE(latency, 20 * kIciA - 1e-6) << t;
    EXPECT_LE(latency, 26 * kIciA + 1e-6) << t;
    // Never slower than the one-way ring on the line.
    EXPECT_LE(t, 2 * (13 * kIciA + 7 * x) + 1e-6);
  }
}

// --- latency-bound ordering (1 KiB all-reduce of 8 members).
TEST(AlgorithmTimingOrdering, SmallMessages) {
  const int64_t kib = 1024;
  auto t = [&](Topology topo, const std::string& algo) {
    return RunCollective(topo, Iota(8), {8}, CollectiveKind::kAllReduce, algo, kib).us;
  };
  // On a switch halving_doubling takes 6 two-hop rounds against the ring's 14, and direct 2.
  double sw_ring = t(Switch8(), "ring"), sw_hd = t(Switch8(), "halving_doubling"),
         sw_direct = t(Switch8(), "direct");
  EXPECT_LT(sw_hd, sw_ring);
  EXPECT_LT(sw_direct, sw_hd);
  // On a line halving_doubling pays 14 hops, the ring 26.
  EXPECT_LT(t(Line8(), "halving_doubling"), t(Line8(), "ring"));
  // On the 8-ring with wraparound halving_doubling's partners 1, 2, 4 hops away cost the same
  // 14 hop latencies as the ring, and its shared links a larger bandwidth term (3 S/W against
  // 1.75 S/W), so it is the slowest of the three; the bidirectional ring is the fastest.
  double r_ring = t(Ring8(), "ring"), r_bidi = t(Ring8(), "bidirectional_ring"),
         r_hd = t(Ring8(), "halving_doubling");
  EXPECT_LT(r_bidi, r_ring);
  EXPECT_LT(r_ring, r_hd);
  // All three pay 14 hops of latency: within 0.1 us of 14 us for 1 KiB.
  for (double v : {r_ring, r_bidi, r_hd}) EXPECT_NEAR(v, 14 * kIciA, 0.1);
}

// --- what `auto` picks.
std::string Choose(const Topology& topo, const std::vector<int>& members,
                   const std::vector<int>& axis_sizes, CollectiveKind kind, int64_t v_bytes) {
  Simulator sim;
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network net(sim, topo, *router);
  CollectiveJob job;
  job.kind = kind;
  job.dtype = DType::kF32;
  for (int d : members) job.members.push_back(topo.device_vertex(d));
  job.numerics = false;
  SizeJob(job, v_bytes);
  std::string via_choose = ChooseAlgorithm(net, job, axis_sizes);
  std::string resolved;
  MakeAlgorithm("auto", net, job, axis_sizes, &resolved);
  EXPECT_EQ(resolved, via_choose);
  return via_choose;
}

TEST(AlgorithmChoice, AutoPicksTheDocumentedAlgorithm) {
  using K = CollectiveKind;
  const int64_t kib = 1024, mib = 1024 * 1024;
  // On a closed ring halving_doubling pays as many hops as the ring (see the ordering test).
  EXPECT_EQ(Choose(Ring8(), Iota(8), {8}, K::kAllReduce, kib), "bidirectional_ring");
  EXPECT_EQ(Choose(Line8(), Iota(8), {8}, K::kAllReduce, kib), "halving_doubling");
  EXPECT_EQ(Choose(Ring8(), Iota(8), {8}, K::kAllReduce, 64 * mib), "bidirectional_ring");
  EXPECT_EQ(Choose(Ring8(), Iota(8), {8}, K::kAllGather, 64 * mib), "bidirectional_ring");
  EXPECT_EQ(Choose(Line8(), Iota(8), {8}, K::kAllReduce, 64 * mib), "ring");
  EXPECT_EQ(Choose(Line8(), Iota(8), {8}, K::kReduceScatter, 64 * mib), "ring");
  EXPECT_EQ(Choose(Torus4x4(), Iota(16), {4, 4}, K::kAllGather, 64 * mib), "torus_2d");
  EXPECT_EQ(Choose(Torus4x4(), Iota(16), {4, 4}, K::kAllReduce, 64 * mib), "torus_2d");
  EXPECT_EQ(Choose(Switch8(), Iota(8), {8}, K::kAllReduce, 64 * mib), "direct");
  EXPECT_EQ(Choose(Switch8(), Iota(8), {8}, K::kAllReduce, kib), "direct");
  EXPECT_EQ(Choose(Switch8(), Iota(8), {8}, K::kAllGather, 64 * mib), "direct");
  EXPECT_EQ(Choose(Ring8(), Iota(8), {8}, K::kAllToAll, 64 * mib), "direct");
  EXPECT_EQ(Choose(Line8(), Iota(8), {8}, K::kAllToAll, kib), "direct");
  // A non-power-of-two group never gets halving_doubling. Six chips of the 8-ring: the ring's
  // closing transfer crosses 3 hops every step, so a small all-reduce takes the tree (6 steps
  // against the ring's 10), which is faster there; a large one, and a gather, the ring.
  EXPECT_EQ(Choose(Ring8(), {0, 1, 2, 3, 4, 5}, {6}, K::kAllReduce, kib), "tree");
  EXPECT_LT(RunCollective(Ring8(), {0, 1, 2, 3, 4, 5}, {6}, K::kAllReduce, "tree", kib).us,
            RunCollective(Ring8(), {0, 1, 2, 3, 4, 5}, {6}, K::kAllReduce, "ring", kib).us);
  EXPECT_EQ(Choose(Ring8(), {0, 1, 2, 3, 4, 5}, {6}, K::kAllReduce, 64 * mib), "ring");
  EXPECT_EQ(Choose(Ring8(), {0, 1, 2, 3, 4, 5}, {6}, K::kAllGather, kib), "ring");
  // Chips 0, 1 and 2 of the 8-ring: the tree's 4 steps do not beat the ring's 4.
  EXPECT_EQ(Choose(Ring8(), {0, 1, 2}, {3}, K::kAllReduce, kib), "ring");
}

}  // namespace
}  // namespace shardsim
