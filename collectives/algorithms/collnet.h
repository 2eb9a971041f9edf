// CollNet: a hierarchical all-reduce whose step across nodes the scale-out switch reduces in
// the network (InfiniBand SHARP), on machines whose comm spec says the fabric can
// (CommSpec::sharp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "collectives/staged_all_reduce.h"
#include "topology/network.h"

namespace shardsim {

// "" when CollNet can run `job`, else why not: an all-reduce, a fabric that reduces, the
// hierarchical algorithm's layout (two or more nodes, as many members in each), every member's
// NIC on one leaf switch.
std::string CollnetSupports(const Network& network, const CollectiveJob& job);

// The hierarchical algorithm's levels with the rails reduced by the leaf switch: member l of
// every node sends its piece to the leaf, which returns each its reduced part, and the parts
// come back up and are multicast. Per member, of S bytes over N nodes of k members: the NIC
// carries S/k up and S/(N k) down in the reduce-scatter, S/(N k) up and (N-1)/N S/k down in
// the all-gather, about S/k each way against the direct exchange's 2 (N-1)/N S/k.
std::vector<ReductionLevel> CollnetLevels(const Network& network, const CollectiveJob& job);

// Runs it pipelined as the hierarchical algorithm is. Throws std::invalid_argument when
// CollnetSupports refuses.
std::unique_ptr<CollectiveAlgorithm> MakeCollnetAlgorithm(Network& network, CollectiveJob& job);

}  // namespace shardsim
