#include "collectives/algorithm.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include "collectives/algorithms/collnet.h"
#include "collectives/algorithms/direct.h"
#include "collectives/algorithms/halving_doubling.h"
#include "collectives/algorithms/hierarchical.h"
#include "collectives/algorithms/nvls.h"
#include "collectives/algorithms/ring.h"
#include "collectives/algorithms/tree.h"
#include "collectives/ir/op_registry.h"
#include "collectives/nccl_tuner.h"
#include "topology/torus_grid.h"

namespace shardsim {
namespace {

// Members of the group along `axis` (others fixed at 0), in order, closing back to the first:
// true when every consecutive pair and the closing pair are one hop apart. `order` gives the
// member at each row-major position over `axis_sizes` (empty: position p is member p).
bool RingClosesInOneHop(Network& network, const CollectiveJob& job,
                        const std::vector<int>& axis_sizes, int axis,
                        const std::vector<int>& order = {}) {
  int stride = 1;
  for (size_t a = axis + 1; a < axis_sizes.size(); ++a) stride *= axis_sizes[a];
  int n = axis_sizes[axis];
  if (n <= 2) return true;  // Two members: forward and back are the same link pair.
  auto member = [&order](int position) { return order.empty() ? position : order[position]; };
  for (int v = 0; v < n; ++v) {
    int a = member(v * stride), b = member(((v + 1) % n) * stride);
    if (network.Hops(job.members[a], job.members[b]) != 1) return false;
  }
  return true;
}

// Whether every ring along the axes of `axis_sizes` (the positions given by `order`) closes
// in one hop.
bool EveryRingClosesInOneHop(Network& network, const CollectiveJob& job,
                             const std::vector<int>& axis_sizes,
                             const std::vector<int>& order = {}) {
  for (size_t a = 0; a < axis_sizes.size(); ++a) {
    if (axis_sizes[a] > 1 &&
        !RingClosesInOneHop(network, job, axis_sizes, static_cast<int>(a), order)) {
      return false;
    }
  }
  return true;
}

bool MeetAtOneSwitch(Network& network, const CollectiveJob& job) {
  const Topology& topo = network.topology();
  if (topo.num_switches() == 0) {
    // A fully connected graph has every pair one hop apart.
    for (int a = 0; a < job.size(); ++a) {
      for (int b = a + 1; b < job.size(); ++b) {
        if (network.Hops(job.members[a], job.members[b]) != 1) return false;
      }
    }
    return job.size() > 2;
  }
  // Every member's first hop reaches the same switch, and every pair is two hops apart.
  VertexId hub = -1;
  for (int a = 0; a < job.size(); ++a) {
    for (int b = 0; b < job.size(); ++b) {
      if (a == b) continue;
      if (network.Hops(job.members[a], job.members[b]) != 2) return false;
    }
    const std::vector<LinkId>& out = topo.out_links(job.members[a]);
    bool found = false;
    for (LinkId l : out) {
      VertexId v = topo.link(l).dst;
      if (topo.node(v).kind == NodeKind::kSwitch && (hub < 0 || v == hub)) {
        hub = v;
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

std::unique_ptr<CollectiveAlgorithm> MakeRingFamily(const char* algo, Network& network,
                                                    CollectiveJob& job,
                                                    const std::vector<int>& axis_sizes) {
  // On a torus, torus_2d runs its rings along the torus dimensions the group spans (TorusGrid)
  // rather than along the mesh axes: a mesh axis placed over several dimensions (fsdp over
  // 16 x 4 chips) has a ring per dimension, each on its own links, as TPUs run it; only a
  // group that is no grid there (a hand-made device list) keeps the mesh's axes.
  if (std::string(algo) == "torus_2d") {
    if (std::optional<TorusGrid> grid = FindTorusGrid(network.topology(), job.members)) {
      RingPlan plan = MakeRingPlan(algo, grid->sizes,
                                   EveryRingClosesInOneHop(network, job, grid->sizes, grid->order));
      plan.order = std::move(grid->order);
      return MakeRingAlgorithm(network, job, std::move(plan));
    }
  }
  RingPlan plan = MakeRingPlan(algo, axis_sizes, EveryRingClosesInOneHop(network, job, axis_sizes));
  // On NCCL machines a ring across two or more nodes (the same count of members in each)
  // runs as rail-aligned channels.
  const CommSpec& comm = network.topology().comm();
  if (comm.nccl && std::string(algo) == "ring") {
    std::vector<std::vector<int>> nodes = MembersByNode(network, job);
    if (EvenNodes(nodes)) {
      // Channels beyond the members of a node would repeat a ring already run: the same links.
      const int k = static_cast<int>(nodes[0].size());
      plan.channels = RailAlignedRings(nodes, std::min(comm.channels, k));
    }
  }
  return MakeRingAlgorithm(network, job, std::move(plan));
}

// A tree's buffer of `bytes` flows in min(64, ceil(bytes / chunk_size)) segments: large
// messages approach the bandwidth bound, small ones stay one latency-bound segment.
int TreeSegments(int64_t bytes, Bytes chunk_size) {
  int64_t chunk = std::max<int64_t>(1, chunk_size.count());
  return static_cast<int>(std::clamp<int64_t>((bytes + chunk - 1) / chunk, 1, 64));
}

std::unique_ptr<CollectiveAlgorithm> MakeTree(Network& network, CollectiveJob& job,
                                              const std::vector<int>&, Bytes chunk_size) {
  return MakeTreeAlgorithm(network, job, TreeSegments(job.BytesOf(job.total).count(), chunk_size));
}

// Each of the two trees carries half the buffer.
std::unique_ptr<CollectiveAlgorithm> MakeDoubleTree(Network& network, CollectiveJob& job,
                                                    const std::vector<int>&, Bytes chunk_size) {
  return MakeDoubleTreeAlgorithm(network, job,
                                 TreeSegments(job.BytesOf(job.total).count() / 2, chunk_size));
}

// Starts another algorithm after a fixed delay: NCCL's kernel launch and the ranks'
// synchronisation before a collective's first step.
class Launched : public CollectiveAlgorithm {
 public:
  Launched(Simulator& sim, Time delay, CollectiveJob& job,
           std::unique_ptr<CollectiveAlgorithm> inner)
      : sim_(sim), delay_(delay), job_(job), inner_(std::move(inner)) {}
  void Start() override {
    if (delay_ == Time()) {
      inner_->Start();
      return;
    }
    // The caller may release the inputs once Start returns: keep them for the real start.
    if (job_.numerics && job_.in) {
      inputs_ = std::move(*job_.in);
      job_.in = &inputs_;
    }
    sim_.Schedule(delay_, [this] {
      inner_->Start();
      inputs_.clear();
      inputs_.shrink_to_fit();
    });
  }

 private:
  Simulator& sim_;
  Time delay_;
  CollectiveJob& job_;
  std::unique_ptr<CollectiveAlgorithm> inner_;
  std::vector<std::vector<float>> inputs_;
};

// "psum, pmean, pmax, pmin": the ops that run an all-reduce, from the op registry.
std::string AllReduceOpList() {
  std::string text;
  for (const std::string& name : CollectiveOpNames(CollectiveKind::kAllReduce)) {
    text += (text.empty() ? "" : ", ") + name;
  }
  return text;
}

constexpr CollectiveKind kGather = CollectiveKind::kAllGather;
constexpr CollectiveKind kScatter = CollectiveKind::kReduceScatter;
constexpr CollectiveKind kReduce = CollectiveKind::kAllReduce;

}  // namespace

const std::vector<AlgorithmDef>& AlgorithmRegistry() {
  static const std::vector<AlgorithmDef> registry = {
      {"ring",
       {kGather, kScatter, kReduce},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>& axes, Bytes) {
         return MakeRingFamily("ring", n, j, axes);
       }},
      {"bidirectional_ring",
       {kGather, kScatter, kReduce},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>& axes, Bytes) {
         return MakeRingFamily("bidirectional_ring", n, j, axes);
       }},
      {"torus_2d",
       {kGather, kScatter, kReduce},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>& axes, Bytes) {
         return MakeRingFamily("torus_2d", n, j, axes);
       }},
      {"direct",
       {kGather, kScatter, kReduce, CollectiveKind::kAllToAll, CollectiveKind::kPermute},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>&, Bytes) {
         return MakeDirectAlgorithm(n, j);
       }},
      {"halving_doubling",
       {kGather, kScatter, kReduce},
       true,
       [](Network& n, CollectiveJob& j, const std::vector<int>&, Bytes) {
         return MakeHalvingDoublingAlgorithm(n, j);
       }},
      {"tree", {kReduce}, false, MakeTree},
      {"double_tree", {kReduce}, false, MakeDoubleTree},
      {"nvls",
       {kReduce},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>&, Bytes) {
         return MakeNvlsAlgorithm(n, j);
       }},
      {"hierarchical",
       {kReduce},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>&, Bytes) {
         return MakeHierarchicalAlgorithm(n, j);
       }},
      {"collnet",
       {kReduce},
       false,
       [](Network& n, CollectiveJob& j, const std::vector<int>&, Bytes) {
         return MakeCollnetAlgorithm(n, j);
       }},
  };
  return registry;
}

const AlgorithmDef* FindAlgorithm(const std::string& name) {
  for (const AlgorithmDef& def : AlgorithmRegistry()) {
    if (name == def.name) return &def;
  }
  return nullptr;
}

const std::vector<std::string>& AlgorithmNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const AlgorithmDef& def : AlgorithmRegistry()) n.emplace_back(def.name);
    n.emplace_back("auto");
    return n;
  }();
  return names;
}

std::optional<Protocol> ParseProtocol(const std::string& text) {
  for (int p = 0; p < kNumProtocols; ++p) {
    if (text == ProtocolName(static_cast<Protocol>(p))) return static_cast<Protocol>(p);
  }
  return std::nullopt;
}

std::string AlgorithmSupports(const std::string& full_name, CollectiveKind kind, int group_size) {
  if (full_name.empty() || full_name == "auto") return "";
  const size_t slash = full_name.find('/');
  const std::string name = full_name.substr(0, slash);
  if (slash != std::string::npos) {
    const std::string protocol = full_name.substr(slash + 1);
    if (!ParseProtocol(protocol)) {
      return "unknown protocol '" + protocol + "' in '" + full_name + "' (LL, LL128 or Simple)";
    }
    if (name == "auto") return "";
  }
  const AlgorithmDef* def = FindAlgorithm(name);
  if (!def) return "unknown algorithm '" + name + "'";
  if (std::find(def->kinds.begin(), def->kinds.end(), kind) == def->kinds.end()) {
    if (kind == CollectiveKind::kAllToAll || kind == CollectiveKind::kPermute) {
      return name + " does not implement " + CollectiveKindName(kind) + "; use direct";
    }
    if (def->kinds.size() == 1 && def->kinds[0] == kReduce) {
      return name + " implements all-reduce only (" + AllReduceOpList() + "), not " +
             CollectiveKindName(kind);
    }
    return name + " does not implement " + CollectiveKindName(kind);
  }
  if (def->power_of_two_groups && (group_size & (group_size - 1)) != 0) {
    return name + " needs a power-of-two group, got " + std::to_string(group_size) + " devices";
  }
  return "";
}

std::string ChooseAlgorithm(Network& network, const CollectiveJob& job,
                            const std::vector<int>& axis_sizes) {
  if (job.kind == CollectiveKind::kAllToAll || job.kind == CollectiveKind::kPermute) {
    return "direct";
  }
  int g = job.size();
  if (g <= 1) return "ring";
  if (MeetAtOneSwitch(network, job)) return "direct";
  int axes = 0;
  for (int n : axis_sizes) axes += n > 1 ? 1 : 0;
  int64_t per_member = job.kind == CollectiveKind::kAllReduce ? job.total : job.block * g;
  Bytes bytes = job.BytesOf(per_member);
  const bool small = bytes < Bytes::KiB(64);
  // A small message is latency-bound: one ring over a group spread across several torus
  // dimensions pays G - 1 steps each way (4,478 hops for 2,240 chips), torus_2d's rings along
  // those dimensions the sum of their lengths (92 on 16 x 5 x 28). Those rings are the ones
  // that close or not below.
  std::optional<TorusGrid> grid;
  if (small) grid = FindTorusGrid(network.topology(), job.members);
  const bool along_torus = grid && grid->sizes.size() > 1;
  const bool closes = along_torus ? EveryRingClosesInOneHop(network, job, grid->sizes, grid->order)
                                  : EveryRingClosesInOneHop(network, job, axis_sizes);
  // On a line the ring's closing transfer crosses the whole line every step; recursive
  // halving's log2(G) exchanges cost fewer latencies. On a closed ring it does not pay: its
  // partners 2^k apart cost as many hops as the ring's steps, on shared links.
  if (!closes && small && g > 2 && (g & (g - 1)) == 0) return "halving_doubling";
  // Otherwise, a small all-reduce over a group that is no grid of several torus dimensions and
  // whose rings do not close in one hop (a mesh axis strided over several torus dimensions, or
  // part of a ring or a line: ring steps cross several hops, latency-bound) pays a step per ring
  // position each way, the sum of 2 (n - 1) over its axes (1,118 for data 560), where a tree pays 2
  // ceil(log2 G): up to the root and back down (26 for 4,480 chips). NCCL likewise takes its tree
  // for small messages.
  if (!closes && small && !along_torus && job.kind == CollectiveKind::kAllReduce) {
    int ring_steps = 0;
    for (int n : axis_sizes) ring_steps += 2 * (n - 1);
    int tree_steps = 0;
    while ((1 << (tree_steps / 2)) < g) tree_steps += 2;
    if (tree_steps < ring_steps) return "tree";
  }
  if (along_torus) return "torus_2d";
  if (axes > 1) return "torus_2d";
  return closes ? "bidirectional_ring" : "ring";
}

std::unique_ptr<CollectiveAlgorithm> MakeAlgorithm(const std::string& name, Network& network,
                                                   CollectiveJob& job,
                                                   const std::vector<int>& axis_sizes,
                                                   std::string* resolved, Bytes chunk_size) {
  const CommSpec& comm = network.topology().comm();
  // "ring/LL128": an algorithm with a protocol (NCCL_ALGO and NCCL_PROTO).
  const size_t slash = name.find('/');
  if (slash != std::string::npos) {
    std::string refused = AlgorithmSupports(name, job.kind, job.size());
    if (!refused.empty()) throw std::invalid_argument(refused);
    if (!comm.nccl) {
      throw std::invalid_argument("'" + name +
                                  "' names a protocol: protocols exist on machines whose "
                                  "collectives run as NCCL (GPU presets, hardware.comm.nccl)");
    }
  }
  const std::string algorithm = name.substr(0, slash);
  const std::optional<Protocol> forced =
      slash == std::string::npos ? std::nullopt : ParseProtocol(name.substr(slash + 1));
  const bool automatic = algorithm.empty() || algorithm == "auto";
  if (!comm.nccl) {
    std::string algo = automatic ? ChooseAlgorithm(network, job, axis_sizes) : name;
    if (resolved) *resolved = algo;
    std::string refused = AlgorithmSupports(algo, job.kind, job.size());
    if (!refused.empty()) throw std::invalid_argument(refused);
    return FindAlgorithm(algo)->make(network, job, axis_sizes, chunk_size);
  }
  // As NCCL runs it: the tuner's algorithm (when auto) and protocol, after the launch.
  if (!automatic) {
    std::string refused = AlgorithmSupports(algorithm, job.kind, job.size());
    if (!refused.empty()) throw std::invalid_argument(refused);
  }
  NcclChoice choice = ChooseNccl(network, job, axis_sizes, automatic ? "auto" : algorithm, forced);
  const ProtocolSpec& protocol = comm.protocol(choice.protocol);
  job.step_latency = protocol.step_latency;
  job.wire_factor = 1.0 / protocol.efficiency;
  if (resolved) *resolved = choice.algorithm + "/" + ProtocolName(choice.protocol);
  return std::make_unique<Launched>(
      network.simulator(), comm.launch_latency, job,
      FindAlgorithm(choice.algorithm)->make(network, job, axis_sizes, chunk_size));
}

}  // namespace shardsim
