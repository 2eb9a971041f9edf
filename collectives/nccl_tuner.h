// NCCL's tuner on machines whose collectives run as NCCL (CommSpec::nccl): which algorithm and
// protocol a collective uses, chosen by a closed-form estimate of each candidate's time from
// the message size, the group's nodes and the links, as NCCL's ncclTopoGetAlgoTime does.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "topology/comm_spec.h"
#include "topology/network.h"

namespace shardsim {

// One candidate: an algorithm with a protocol, and its estimated time.
struct NcclChoice {
  std::string algorithm;  // Registry name.
  Protocol protocol = Protocol::kSimple;
  Time estimate;  // The tuner's closed form (not the simulated time).
};

// Every candidate the tuner weighs for `job`, restricted to `algorithm` unless it is "auto".
// Nodes are the NVSwitches the members hang off; members without one (a custom machine with
// `hardware.comm.nccl` and no NVSwitch) count as one node, their links as NVLink's.
// all-reduce: ring, nvls (one NVSwitch node that reduces; Simple only), double_tree (two or
// more nodes, one member each), hierarchical (two or more nodes with two or more members each;
// Simple only when the nodes reduce by NVLS), collnet (the same where the fabric reduces;
// Simple only); all-gather and reduce-scatter: ring;
// all-to-all and permute: direct. Algorithms the tuner does not model (tree,
// halving_doubling, bidirectional_ring, torus_2d) run with Simple. Each estimate, for a
// message of S bytes (the all-reduce buffer, or the gathered array), is
//   launch + steps * (route latency + protocol step latency)
//          + bytes per member on the busiest link / (its bandwidth * efficiencies)
// with the algorithm's steps and bytes as derived in its header (ring.h, nvls.h,
// hierarchical.h, direct.h).
std::vector<NcclChoice> NcclCandidates(Network& network, const CollectiveJob& job,
                                       const std::vector<int>& axis_sizes,
                                       const std::string& algorithm);

// The candidate with the smallest estimate (ties: the earlier one, in the order above and
// LL, LL128, Simple). `algorithm` as for NcclCandidates; a `protocol` given keeps only its
// candidates (an algorithm that cannot run it, like nvls with LL, runs it anyway: the user
// asked).
NcclChoice ChooseNccl(Network& network, const CollectiveJob& job,
                      const std::vector<int>& axis_sizes, const std::string& algorithm,
                      std::optional<Protocol> protocol = std::nullopt);

}  // namespace shardsim
