// The direct algorithm: every member sends each peer its share in one transfer.
#pragma once

#include <memory>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// All-pairs transfers, all started at once; the natural algorithm on a switch, and the only
// one for all_to_all and ppermute. All-gather: each member sends its block to every peer;
// reduce-scatter: chunk j to member j, which combines the G - 1 it receives; all-reduce:
// direct reduce-scatter, then each member sends its reduced chunk to every peer.
// Derivation on a non-blocking switch with per-device bandwidth B: a member's G - 1 sends
// share its uplink, so all-gather of V bytes takes a + (G - 1)/G * V / B (two hops' latency
// through the switch), and all-to-all of V bytes per member a + (G - 1)/G * V / B, which is
// (G - 1)/G^2 * V_all / B for the whole array V_all = G V (hardware.md's form).
std::unique_ptr<CollectiveAlgorithm> MakeDirectAlgorithm(Network& network, CollectiveJob& job);

}  // namespace shardsim
