// The tree algorithm for all-reduce: reduce up a binary tree, broadcast back down.
#pragma once

#include <memory>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// Members form a binary heap by group index (parent of m is (m - 1) / 2). The buffer is cut
// into `pipeline` segments that flow independently: a member combines a segment from both
// children and passes it up; the root sends each finished segment down, and every member
// forwards it to its children. Derivation, one segment of V bytes (no pipelining), each
// tree edge its own path of bandwidth B and latency a: 2 * depth * (a + V / B), depth =
// floor(log2 G); with P segments the bandwidth term approaches 2 V / B plus
// 2 * depth * V / (P B) of pipeline fill. On a switch the two children of a member share its
// link, so sends there take twice as long (tests/collectives/algorithm_timing_test.cc derives
// the exact switch times). Throws std::invalid_argument for anything but all-reduce.
std::unique_ptr<CollectiveAlgorithm> MakeTreeAlgorithm(Network& network, CollectiveJob& job,
                                                       int pipeline);

// NCCL's double binary tree: two such trees at once, each reducing and broadcasting half of
// the buffer, the second with the members' heap order reversed, so that a member that is a
// leaf of one (the upper half of the heap) is an inner member of the other (for an odd G the
// middle member is a leaf of both). Every non-root
// member sends each half up once and an inner member sends its half down twice: about 2 S out
// of the busiest member for S bytes, against one tree's 3 S, in 2 floor(log2 G) steps rather
// than a ring's 2 (G - 1).
std::unique_ptr<CollectiveAlgorithm> MakeDoubleTreeAlgorithm(Network& network, CollectiveJob& job,
                                                             int pipeline);

}  // namespace shardsim
