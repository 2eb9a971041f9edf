// The ring family: ring, bidirectional_ring and torus_2d (multi-dimensional rings).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// Shape of a ring-family run.
struct RingPlan {
  // Sizes of the group's axes (first major; product = group size). One entry for a plain
  // ring over the whole group.
  std::vector<int> axis_sizes;
  // Parts the data is split into, each taking the axes in a rotated order (torus_2d: one per
  // axis, so every axis's links are busy in every phase; ring: 1).
  int parts = 1;
  // 1: every ring sends forward only. 2: each part is halved and the halves go around the
  // rings in opposite directions, using both directions of every link (bidirectional_ring).
  int directions = 1;
  // Channels: when not empty, each entry is one ring over the whole group (member ids in ring
  // order), run as a lane of its own carrying 1 / channels of the data; parts and directions
  // are then 1. NCCL's rail-aligned rings across nodes: each channel leaves every node through
  // a different GPU's NIC.
  std::vector<std::vector<int>> channels;
  // The member at each row-major position over `axis_sizes` (empty: position p is member p).
  // Rings run along positions; reduce-scatter and all-gather still leave block m on member m.
  std::vector<int> order;
};

// NCCL's rings over a group spread across `nodes` (member ids per node, equal counts): ring c
// visits every node in order, starting inside each node at its member c mod k and taking the
// others in turn, so its node crossings leave through member (c - 1) mod k's NIC and enter
// through member c mod k's: with c = 0..k-1 every NIC of a node works in both directions.
// (NCCL machines run min(channels, k) of them: more would repeat the same links.)
std::vector<std::vector<int>> RailAlignedRings(const std::vector<std::vector<int>>& nodes,
                                               int channels);

// Builds the plan of the `ring`, `bidirectional_ring` or `torus_2d` algorithm for a group of
// `axis_sizes` (torus_2d uses every axis of size > 1, with rings both ways when
// `bidirectional_axes` is true; the others treat the group as one ring).
RingPlan MakeRingPlan(const std::string& algorithm, const std::vector<int>& axis_sizes,
                      bool bidirectional_axes);

// Runs all-gather, reduce-scatter or all-reduce (reduce-scatter then all-gather, chained per
// member) with the plan. Derivation for one ring of n members, chunk C = V/n bytes, link
// bandwidth B, hop latency a: each of the n - 1 steps moves one chunk over every ring link
// at once, so a pass takes (n - 1)(a + V/(nB)) and all-reduce twice that. Two directions
// halve the chunk; k parts over k axes put 1/k of the data on each axis's links in every
// phase, so the bandwidth term of a k-axis all-gather of V bytes over N devices is
// (N - 1)/N * V / (k B) (Scaling Book, sharding.md).
std::unique_ptr<CollectiveAlgorithm> MakeRingAlgorithm(Network& network, CollectiveJob& job,
                                                       RingPlan plan);

}  // namespace shardsim
