// Choosing and building the algorithm that runs a collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// The SPEC's algorithm names: ring, bidirectional_ring, torus_2d, direct, halving_doubling,
// tree, auto.
const std::vector<std::string>& AlgorithmNames();

// Picks the algorithm `auto` means for `job` on the network, given the sizes of the group's
// mesh axes (first major). The rule:
// - all_to_all and ppermute: direct (every member has something different for every peer);
// - a group whose members all meet at one switch (an NVSwitch node, a fully connected graph):
//   direct, one hop-pair per transfer and no ring latency chain;
// - small messages (under 64 KiB per member) on a power-of-two group of more than 2 whose
//   rings do not close in one hop (lines): halving_doubling, fewer latencies than a ring whose
//   closing transfer crosses the line (on a closed ring it pays as many hops, on shared links);
// - several mesh axes of size > 1: torus_2d, both directions when every axis's ring closes
//   in one hop (a wraparound);
// - one axis: bidirectional_ring when the ring closes in one hop, else ring (a line: the
//   closing transfer crosses the whole line on the reverse links, so a second direction would
//   only share those links).
std::string ChooseAlgorithm(Network& network, const CollectiveJob& job,
                            const std::vector<int>& axis_sizes);

// Builds algorithm `name` ("auto" resolves through ChooseAlgorithm) for `job`. Throws
// std::invalid_argument when the algorithm cannot run the job (tree for all_gather, ring for
// all_to_all, halving_doubling on 6 devices, ...). `resolved` receives the concrete name.
// `chunk_size` is the tree's pipelining unit: its buffer flows in
// min(64, ceil(bytes / chunk_size)) segments (large messages approach the bandwidth bound,
// small ones stay one latency-bound segment). Rings need no chunking: each step already moves
// one chunk of V/G per member, which reaches the bandwidth bound in the fluid model.
std::unique_ptr<CollectiveAlgorithm> MakeAlgorithm(const std::string& name, Network& network,
                                                   CollectiveJob& job,
                                                   const std::vector<int>& axis_sizes,
                                                   std::string* resolved,
                                                   Bytes chunk_size = Bytes::MiB(1));

}  // namespace shardsim
