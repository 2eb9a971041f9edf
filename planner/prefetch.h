// Prefetching weight collectives: the part of XLA's latency-hiding scheduler that issues an
// FSDP weight all-gather ahead of its use, so that it overlaps the compute before it.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/program.h"
#include "planner/name_bindings.h"
#include "planner/partitioner.h"

namespace shardsim::planner {

// The order of a partitioned program's ops (mode manual) with its weight collectives moved
// earlier: the new program's op k is manual.ops[order[k]]. A weight collective reads an input
// array through a chain of one-input ops only (a parameter's block, its compute-dtype cast,
// an earlier gather of it; token ids): nothing the step computes, so it may start at any
// time. Taking the weight collectives in program order w_0, w_1, ..., each w_i (with the chain
// it needs, as the cast feeding it) is issued just before the first reader of
// w_{i-distance}, `distance` weight collectives ahead (the first `distance` at the program's
// start). The executor issues collectives in program order as their inputs are ready, so this
// order is the schedule. Every other op keeps its relative order, each op still follows what
// it reads, and the values computed are the same. Only ops binding names bound nowhere else
// move (and read only such names, or input arrays), so every reader sees the binding it saw.
// distance <= 0 keeps the program's order.
std::vector<size_t> PrefetchOrder(const ProgramSpec& manual, int distance);

// Per op of `manual`: whether it is a weight op (one input: an input array never rebound, or a
// weight op's result; as a parameter's block, its casts and gathers), the ops PrefetchOrder
// may move.
std::vector<char> WeightOpsOf(const ProgramSpec& manual);
// WeightOpsOf on `manual`'s data flow (GraphOf(manual)), made once by the caller.
std::vector<char> WeightOpsOf(const ProgramSpec& manual, const OpGraph& graph);

// Issues `partitioned`'s weight collectives one group ahead, for a program whose weight
// collectives fall into `groups` runs of equal length (a training step: a layer's forward or
// backward, 2 x microbatches x layers; the embedding's and head's few extra are rounded away):
// PrefetchOrder with distance = max(1, weight collectives / groups), so each layer's weights
// are gathered while the layer before it computes, as XLA's latency-hiding scheduler and
// collective pipeliner overlap FSDP gathers. Its per-op reasons and types follow. groups <= 0
// keeps the program's order. With `ids`, its data flow is made from them (each op's index
// when they were made: partitioned.origin).
void PrefetchWeightCollectives(PartitionResult& partitioned, int groups,
                               const OpNameIds* ids = nullptr);

}  // namespace shardsim::planner
