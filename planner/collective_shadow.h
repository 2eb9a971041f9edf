// Filling collectives' shadows: the part of XLA's latency-hiding scheduler (and of
// Megatron-LM's bulk overlap) that runs, while a collective the next ops wait for is in
// flight, compute that comes before its input in program order but that neither it nor its
// readers need: a layer's weight-gradient products beside the all-gathers and reduce-scatters
// of its activations' gradients.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/program.h"
#include "planner/name_bindings.h"
#include "planner/partitioner.h"

namespace shardsim::planner {

// The order of a partitioned program's ops (mode manual) with independent compute moved into
// collectives' shadows: the new program's op k is manual.ops[order[k]].
// Taking in program order each collective C that is neither a weight collective (WeightOpsOf:
// prefetched) nor a tail collective (TailCollectivesOf: its readers deferred), with P the op
// making its input and R its first reader: the window is the ops from the previous such
// collective's first reader (or the program's start) to R. The ops of the window that P does
// not need (directly or through the window): local ops before P, and ops reading ops that move
// (a product's reduce-scatter moves with it, wherever it sits before R), that are not weight
// ops, whose names are bound once, and whose readers before R all move too, move to just
// before R, in their order. The
// executor issues C once P is done (collectives issue in their program order, as their input
// is ready), so its transfers run beside them; before, those before P ran first and C's reader
// waited for all of C. Every other op keeps its place, each op still follows
// what it reads, and the values computed are the same.
// The program splits into segments at `segment_starts` (ascending op indices: each layer's
// forward and backward, each pass): a collective whose P and R lie in different segments is
// left alone, and a window never reaches back past R's segment, so nothing moves between
// layers (nor from the forward into the backward).
std::vector<size_t> ShadowOrder(const ProgramSpec& manual,
                                const std::vector<size_t>& segment_starts);

// Applies ShadowOrder to `partitioned` (its per-op reasons and types follow their ops). With
// `ids`, its data flow is made from them (each op's index when they were made:
// partitioned.origin).
void FillCollectiveShadows(PartitionResult& partitioned, const std::vector<size_t>& segment_starts,
                           const OpNameIds* ids = nullptr);

}  // namespace shardsim::planner
