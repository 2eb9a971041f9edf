#include "collectives/nccl_tuner.h"

#include <algorithm>
#include <limits>
#include <string>

#include "collectives/algorithms/collnet.h"
#include "collectives/algorithms/hierarchical.h"
#include "collectives/algorithms/nvls.h"
#include "collectives/staged_all_reduce.h"

namespace shardsim {
namespace {

// What the estimates read of the machine and the group.
struct Facts {
  int n = 1;                   // Members.
  int nodes = 1;               // NVSwitch nodes the members span (1 when they have none).
  int k = 1;                   // Members per node.
  double nvlink = 0, nic = 0;  // Achievable bytes per second of a member's scale-up / NIC link.
  Time nvlink_hop, nic_hop;    // Latency of one such link.
};

Facts Gather(const Network& network, const CollectiveJob& job) {
  const Topology& topo = network.topology();
  const CommSpec& comm = topo.comm();
  Facts f;
  f.n = job.size();
  const std::vector<std::vector<int>> nodes = MembersByNode(network, job);
  f.nodes = nodes.empty() ? 1 : static_cast<int>(nodes.size());
  f.k = std::max(1, f.n / f.nodes);
  const VertexId v = job.members.empty() ? 0 : job.members[0];
  const Link* scale_up = topo.FirstOutLink(v, LinkKind::kNvlink);
  if (scale_up) {
    f.nvlink = scale_up->bandwidth.bytes_per_second() * comm.nvlink_efficiency;
    f.nvlink_hop = scale_up->latency;
  } else if (!topo.out_links(v).empty()) {
    const Link& any = topo.link(topo.out_links(v)[0]);
    f.nvlink = any.bandwidth.bytes_per_second();
    f.nvlink_hop = any.latency;
  }
  const Link* nic = topo.FirstOutLink(v, LinkKind::kNic);
  f.nic = nic ? nic->bandwidth.bytes_per_second() * comm.nic_efficiency : f.nvlink;
  f.nic_hop = nic ? nic->latency : f.nvlink_hop;
  return f;
}

double Seconds(Time t) { return t.seconds(); }

// One candidate's estimate in seconds: launch + steps * (route + step latency) + bytes / rate.
double Estimate(const CommSpec& comm, Protocol p, int steps, Time route, double bytes,
                double rate) {
  const ProtocolSpec& spec = comm.protocol(p);
  return Seconds(comm.launch_latency) + steps * Seconds(route + spec.step_latency) +
         bytes / (rate * spec.efficiency);
}

}  // namespace

std::vector<NcclChoice> NcclCandidates(Network& network, const CollectiveJob& job,
                                       const std::vector<int>&, const std::string& algorithm) {
  const CommSpec& comm = network.topology().comm();
  const Facts f = Gather(network, job);
  const bool all_reduce = job.kind == CollectiveKind::kAllReduce;
  // S: the all-reduce buffer, or the gathered / scattered array, or a member's all-to-all
  // buffer, or a permute's block.
  double s = 0;
  switch (job.kind) {
    case CollectiveKind::kAllReduce:
      s = static_cast<double>(job.BytesOf(job.total).count());
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      s = static_cast<double>(job.BytesOf(job.block).count()) * f.n;
      break;
    case CollectiveKind::kPermute:
      s = static_cast<double>(job.BytesOf(job.block).count());
      break;
  }
  const double n = f.n;
  const bool one_node = f.nodes <= 1;
  const Time intra_route = f.nvlink_hop + f.nvlink_hop;
  const Time inter_route = f.nic_hop + f.nic_hop;
  const Protocol all[] = {Protocol::kLL, Protocol::kLL128, Protocol::kSimple};
  std::vector<NcclChoice> out;
  auto add = [&](const char* name, Protocol p, double seconds) {
    if (algorithm != "auto" && algorithm != name) return;
    out.push_back({name, p, Time::FromSeconds(seconds)});
  };
  const bool pairwise =
      job.kind == CollectiveKind::kAllToAll || job.kind == CollectiveKind::kPermute;
  if (pairwise) {
    // Every member sends (n - 1)/n of its buffer at once (a permute: its block); across nodes
    // the share for other nodes, (N - 1)/N of it, crosses the member's NIC.
    const double share = job.kind == CollectiveKind::kPermute ? 1.0 : (n - 1) / n;
    const double cross = one_node ? 0 : (f.nodes - 1.0) / f.nodes;
    const double time_rate = std::max(share / f.nvlink, share * cross / f.nic);
    for (Protocol p : all) {
      add("direct", p,
          Estimate(comm, p, 1, one_node ? intra_route : inter_route, s, 1.0 / time_rate));
    }
  } else {
    // Ring: 2(n-1) steps (n-1 for a single pass), each moving S/n over every ring link. Across
    // nodes the channels' rings are rail-aligned: every member's NVLink carries all of it, and
    // min(channels, k) NICs of a node share the node crossings.
    const int steps = all_reduce ? 2 * (f.n - 1) : f.n - 1;
    const double factor = (all_reduce ? 2.0 : 1.0) * (n - 1) / n;
    const double rails = std::min(comm.channels, f.k);
    const double ring_rate = one_node ? f.nvlink : std::min(f.nvlink, rails * f.nic);
    for (Protocol p : all) {
      add("ring", p,
          Estimate(comm, p, steps, one_node ? intra_route : inter_route, factor * s, ring_rate));
    }
    // The staged algorithms (nvls, hierarchical) flow in segments, kStagedInFlight at a time
    // per stage: one segment pays every stage's latency chain, and each further window of
    // segments pays the slowest stage's again; the bytes go at the busiest link's rate.
    auto windows_of = [&](const std::vector<ReductionLevel>& levels, double* segment) {
      const int segments = StagedSegmentsOf(network, job, levels);
      *segment = s / segments;
      return (segments + kStagedInFlight - 1) / kStagedInFlight;
    };
    double segment = s;
    if (all_reduce && one_node && comm.nvls && NvlsSupports(network, job).empty()) {
      const int windows = windows_of(NvlsLevels(network, job), &segment);
      // Two stages, each up to the switch and down: (1 + 1/n) S on the busiest direction.
      const ProtocolSpec& simple = comm.protocol(Protocol::kSimple);
      const double hop = Seconds(f.nvlink_hop + simple.step_latency);
      const double seconds = Seconds(comm.launch_latency) + 4 * hop + (windows - 1) * 2 * hop +
                             ((1 + 1 / n) * s + segment) / (f.nvlink * simple.efficiency);
      add("nvls", Protocol::kSimple, seconds);
    }
    // NCCL's double binary tree between nodes (one member per node here: its trees join
    // nodes): 2 floor(log2 n) steps across nodes; every member sends about 2 S out (each half
    // up once, an inner member's half down twice) over its NIC, pipelined in segments.
    if (all_reduce && !one_node && f.k == 1) {
      int depth = 0;
      while ((2 << depth) <= f.n) ++depth;
      const double tree_segment = std::min(s / 2, static_cast<double>(comm.chunk_size.count()));
      for (Protocol p : all) {
        add("double_tree", p,
            Estimate(comm, p, 2 * depth, inter_route, 2 * s + 2 * depth * tree_segment,
                     std::min(f.nvlink, f.nic)));
      }
    }
    // One member per node leaves no node stage: an all-pairs exchange between nodes is not
    // what NCCL runs (it rings them), so the tuner leaves it out. CollNet is the same with the
    // leaf switch reducing the rails.
    if (all_reduce && !one_node && f.k > 1 && HierarchicalSupports(network, job).empty()) {
      const bool collnet = CollnetSupports(network, job).empty();
      for (const char* name : {"hierarchical", "collnet"}) {
        const bool in_switch = std::string(name) == "collnet";
        if (in_switch && !collnet) continue;
        const int windows = windows_of(
            in_switch ? CollnetLevels(network, job) : HierarchicalLevels(network, job), &segment);
        // Inside the node: NVLS (S + S/k up) or a direct exchange (2 (k-1)/k S); across nodes
        // 2 (N-1)/N S/k over each NIC, or (1 + 1/N) S/k through a reducing leaf. The stages
        // overlap: the slower one bounds the time.
        const double k = f.k, nodes = f.nodes;
        const bool nvls = comm.nvls && f.k > 1;
        const double intra_bytes = nvls ? (1 + 1 / k) * s : 2 * (k - 1) / k * s;
        const double inter_bytes =
            in_switch ? (1 + 1 / nodes) * s / k : 2 * (nodes - 1) / nodes * s / k;
        const double seconds_per_byte = std::max(intra_bytes / f.nvlink, inter_bytes / f.nic) / s;
        for (Protocol p : all) {
          if ((nvls || in_switch) && p != Protocol::kSimple) continue;
          const ProtocolSpec& spec = comm.protocol(p);
          // Latency chain of a node stage (NVLS: up and down; direct: one crossing) and of a
          // rail stage (one crossing between nodes, or up to the leaf and down).
          const double node_stage = nvls ? 2 * Seconds(f.nvlink_hop + spec.step_latency)
                                         : Seconds(intra_route + spec.step_latency);
          const double rail_stage = in_switch ? 2 * Seconds(f.nic_hop + spec.step_latency)
                                              : Seconds(inter_route + spec.step_latency);
          const double seconds = Seconds(comm.launch_latency) + 2 * node_stage + 2 * rail_stage +
                                 (windows - 1) * std::max(node_stage, rail_stage) +
                                 (s + 2 * segment) * seconds_per_byte / spec.efficiency;
          add(name, p, seconds);
        }
      }
    }
  }
  if (out.empty() && algorithm != "auto") {
    // An algorithm the tuner has no model of: NCCL's bulk protocol.
    out.push_back({algorithm, Protocol::kSimple, Time()});
  }
  return out;
}

NcclChoice ChooseNccl(Network& network, const CollectiveJob& job,
                      const std::vector<int>& axis_sizes, const std::string& algorithm,
                      std::optional<Protocol> protocol) {
  std::vector<NcclChoice> candidates = NcclCandidates(network, job, axis_sizes, algorithm);
  std::optional<NcclChoice> best;
  for (const NcclChoice& c : candidates) {
    if (protocol && c.protocol != *protocol) continue;
    if (!best || c.estimate < best->estimate) best = c;
  }
  if (!best) {
    best = candidates.front();
    best->protocol = *protocol;
  }
  return *best;
}

}  // namespace shardsim
