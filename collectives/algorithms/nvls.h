// NVLS: all-reduce by NVSwitch in-network reduction (NVLink SHARP), for a group inside one
// NVSwitch domain whose switch reduces (CommSpec::nvls).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "collectives/staged_all_reduce.h"
#include "topology/network.h"

namespace shardsim {

// The NVSwitch every member of `job` hangs off by an NVLink link, or -1 when they do not all
// share one.
VertexId SharedNvSwitch(const Network& network, const CollectiveJob& job);

// "" when NVLS can run `job` on the network, else why not.
std::string NvlsSupports(const Network& network, const CollectiveJob& job);

// NVLS's one level: every member in one group through the shared switch (checked first).
std::vector<ReductionLevel> NvlsLevels(const Network& network, const CollectiveJob& job);

// Each member sends its whole buffer to the switch, which sends member j the reduced j-th
// of G pieces (multimem load-reduce); member j sends that piece back and the switch
// multicasts it to the others (multimem store), in pipelined segments of the comm spec's
// chunk size. Per member, of S bytes: S + S/G up and S/G + S (G-1)/G = S down, against the
// ring's 2 (G-1)/G S each way: for G = 8, 1.125 S against 1.75 S, so on NVLink of bandwidth
// B the time tends to (1 + 1/G) S / B plus one segment's fill.
std::unique_ptr<CollectiveAlgorithm> MakeNvlsAlgorithm(Network& network, CollectiveJob& job);

}  // namespace shardsim
