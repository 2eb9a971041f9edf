// A pipelined all-reduce by levels of groups: reduce-scatter down the levels, all-gather back
// up, each step a direct exchange or an in-switch reduction. The building block of the NVLS
// and hierarchical algorithms.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// Segments a member keeps in flight in one step: NCCL's connections have NCCL_STEPS = 8
// buffer slots, so a stage works on up to 8 chunks while the next stage drains earlier ones.
inline constexpr int kStagedInFlight = 8;

// One level: a partition of the members into groups. At this level every group reduce-
// scatters the range its members share (the range of the levels above, or the whole segment)
// into as many pieces as it has members, piece r to its r-th member; on the way back it
// all-gathers them. Members of one group must share their ranks at every level above.
struct ReductionLevel {
  std::vector<std::vector<int>> groups;  // Member ids of each group, in rank order.
  // Through the group's switch: for the reduce-scatter every member sends its whole range to
  // the switch, which sends each member its reduced piece (NVLS's multimem load-reduce); for
  // the all-gather every member sends its piece to the switch, which sends it to the others
  // (multicast store). Otherwise members exchange pieces directly: (g - 1) / g of the range out
  // of every member in each direction.
  bool via_switch = false;
  std::vector<VertexId> switches;  // Per group, when via_switch.
};

// Transfers in flight across all segments the engine aims to stay under: a segment's
// transfers grow as the square of a group's size, so large groups flow in fewer segments.
inline constexpr int64_t kStagedTransferBudget = int64_t{1} << 16;

// Transfers one segment costs through every level (reduce-scatter and all-gather): a direct
// exchange 2 g (g - 1) per group of g, a switch 3 g + g (g - 1).
int64_t StagedTransfersPerSegment(const std::vector<ReductionLevel>& levels);

// Segments a buffer of `bytes` flows in with pipelining unit `chunk`: ceil(bytes / chunk),
// between 1 and 64, and at most kStagedTransferBudget / `transfers_per_segment` (at least 1).
int StagedSegments(int64_t bytes, int64_t chunk, int64_t transfers_per_segment);

// The segments `job`'s all-reduce buffer flows in through `levels` on `network`: StagedSegments
// with the comm spec's chunk size.
int StagedSegmentsOf(const Network& network, const CollectiveJob& job,
                     const std::vector<ReductionLevel>& levels);

// Runs `job` (kAllReduce) with `levels`: the buffer flows in `segments` pieces; each member
// takes the segments through the 2 * levels.size() steps in order, up to 8 segments per step
// at a time (NCCL's buffer slots), so a step's transfers of later segments overlap the next
// step's of earlier ones. A
// segment's all-reduce over G = g_1 ... g_d members moves, per member, (g_i - 1)/g_i of its
// range at level i in each direction (direct) or the range up and the piece down (switch),
// where the range at level i is the segment / (g_1 ... g_{i-1}): with the levels pipelined,
// the time tends to the slowest level's bytes over its links' bandwidth (derivation in
// hierarchical.h and nvls.h).
std::unique_ptr<CollectiveAlgorithm> MakeStagedAllReduce(Network& network, CollectiveJob& job,
                                                         std::vector<ReductionLevel> levels,
                                                         int segments);

// The same in StagedSegmentsOf(network, job, levels) segments.
std::unique_ptr<CollectiveAlgorithm> MakeStagedAllReduce(Network& network, CollectiveJob& job,
                                                         std::vector<ReductionLevel> levels);

}  // namespace shardsim
