// Deferring the readers of gradient collectives: the part of XLA's latency-hiding scheduler
// that places an asynchronous reduce-scatter's (or all-reduce's) done late, so that the
// backward of the layers before it runs while it is in flight.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/program.h"
#include "planner/name_bindings.h"
#include "planner/partitioner.h"

namespace shardsim::planner {

// The order of a partitioned program's ops (mode manual) with the readers of its tail
// collectives moved later: the new program's op k is manual.ops[order[k]].
// The ops that move are local ops (compute or free; not collectives, collective matmuls or
// host copies) whose inputs and results are names bound once (so every reader sees the
// binding it saw), that only the program's outputs wait for (no op that is not local, and no
// local op that something else waits for, reads them, directly or through local ops), and
// that read results of collectives or of ops that move, and input arrays, only: a weight
// gradient's cast to the parameters' type after its reduce-scatter, the accumulation over
// microbatches, the optimizer's update. The product that makes a weight's gradient from an
// activation does not move (it would keep the activation alive). A tail collective is one that
// some op that moves reads.
// The program splits into phases at `phase_starts` (ascending op indices: a training step's
// backward passes and what follows each) and each phase into segments at `segment_starts`
// (each layer's backward). The ops reading a tail collective (directly, or through ops moved
// so) move to just after the last tail collective of the next segment of its phase that has
// any (the next layer's gradients), or of its own phase where no later segment has any, or
// just before the first op that must follow them (one not moved that reads them), whichever
// comes first, and never earlier than they were: XLA's collective pipeliner and latency-hiding
// scheduler finish a layer's gradient reduce-scatter while the next layer computes its
// backward, and a microbatch's gradients are summed before the next microbatch's forward.
// Moved ops keep their relative order, every other op keeps its place, and the values computed
// are the same. Without it a gradient's cast, next in program order, holds the compute stream
// until its reduce-scatter ends.
std::vector<size_t> DeferOrder(const ProgramSpec& manual, const std::vector<size_t>& phase_starts,
                               const std::vector<size_t>& segment_starts);

// Per op of `manual`: whether it is a tail collective (see DeferOrder).
std::vector<char> TailCollectivesOf(const ProgramSpec& manual);
// TailCollectivesOf on `manual`'s data flow (GraphOf(manual)), made once by the caller.
std::vector<char> TailCollectivesOf(const ProgramSpec& manual, const OpGraph& graph);

// Applies DeferOrder to `partitioned` (its per-op reasons and types follow their ops). With
// `ids`, its data flow is made from them (each op's index when they were made:
// partitioned.origin).
void DeferCollectiveReaders(PartitionResult& partitioned, const std::vector<size_t>& phase_starts,
                            const std::vector<size_t>& segment_starts,
                            const OpNameIds* ids = nullptr);

// Where each layer's backward begins in a global program after ExpandGrads (and ApplyRemat):
// per backward pass (`pass_starts`, [start, end) per pass) and segment (per layer and
// microbatch, the names of the values its forward makes), the first op of the pass that reads
// one of them or its recomputation (v + kRematSuffix), ascending. Values that a forward op of
// another segment reads (the layer's output, which the next layer's backward reads) do not
// count.
std::vector<size_t> LayerBackwardStarts(const ProgramSpec& expanded,
                                        const std::vector<size_t>& pass_starts,
                                        const std::vector<std::vector<std::string>>& segments);

// Where each layer's forward begins in a global program after ExpandGrads: per segment (per
// layer and microbatch, the names of the values its forward makes), the first op outside the
// backward passes that makes one of them, ascending.
std::vector<size_t> LayerForwardStarts(const ProgramSpec& expanded,
                                       const std::vector<size_t>& pass_starts,
                                       const std::vector<std::vector<std::string>>& segments);

}  // namespace shardsim::planner
