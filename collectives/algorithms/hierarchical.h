// Hierarchical all-reduce across nodes, as NCCL's NVLS-tree and the Scaling Book describe it:
// reduce-scatter inside each node, all-reduce across nodes over every rail at once, all-gather
// inside each node.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "collectives/staged_all_reduce.h"
#include "topology/network.h"

namespace shardsim {

// The members of `job` by node (the NVSwitch their NVLink links reach), nodes in order of
// their first member, members in group order; empty when a member has no NVSwitch.
std::vector<std::vector<int>> MembersByNode(const Network& network, const CollectiveJob& job);

// Whether `nodes` (MembersByNode) are two or more with as many members each: the layout the
// hierarchical algorithm and rail-aligned rings need.
bool EvenNodes(const std::vector<std::vector<int>>& nodes);

// "" when the hierarchical algorithm can run `job`, else why not.
std::string HierarchicalSupports(const Network& network, const CollectiveJob& job);

// The two levels: the nodes (through their switch when it reduces and a node has two or more
// members), then the rails (member l of every node). Checked first.
std::vector<ReductionLevel> HierarchicalLevels(const Network& network, const CollectiveJob& job);

// With N nodes of k members: inside each node the k members reduce-scatter the segment (by
// NVLS through the switch when it reduces, else directly), then member l of every node
// all-reduces its piece with member l of the others (the rail of NIC l: every NIC of a node
// busy at once), then each node all-gathers. Pipelined in segments of the comm spec's chunk
// size. Per member, of S bytes: inside the node 2 (k-1)/k S by direct exchange (or S + S/k
// up, S down by NVLS), across nodes 2 (N-1)/N S/k over its NIC; the stages overlap, so the
// time tends to the larger of the two over its link's bandwidth (for 2 nodes of 8 H100:
// NVLS 1.125 S / 450 GB/s against S/8 / 50 GB/s: both S / 400 GB/s).
std::unique_ptr<CollectiveAlgorithm> MakeHierarchicalAlgorithm(Network& network,
                                                               CollectiveJob& job);

}  // namespace shardsim
