// Recursive halving (reduce-scatter) and recursive doubling (all-gather) for power-of-two groups.
#pragma once

#include <memory>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// log2(G) rounds of pairwise exchanges. Reduce-scatter round k swaps half of the data still
// held with the partner m XOR 2^k (distance doubling, so the largest exchanges are between
// the nearest members); all-gather mirrors it (m XOR 2^(L-1-k), data doubling as the distance
// halves); all-reduce is one then the other. Derivation for all-reduce of V bytes over G
// members when every exchange has its own path of bandwidth B: 2 log2(G) latencies and
// 2 (G - 1)/G * V / B, the ring's bandwidth term with log2(G) instead of G - 1 latencies,
// which is why `auto` prefers it for small messages. Throws std::invalid_argument for a group
// size that is not a power of two.
std::unique_ptr<CollectiveAlgorithm> MakeHalvingDoublingAlgorithm(Network& network,
                                                                  CollectiveJob& job);

}  // namespace shardsim
