// jax.device_put between two disjoint meshes: which device sends which box of the array to
// which, the transfers that move it, and its reference result.
//
// The array is laid out by one Sharding on the source mesh and by another on the destination
// mesh (both plain meshes over their own positions). Each destination position needs the box
// of the global array its block covers; every source block overlapping that box sends the
// overlap, one message per (source, destination) pair (a block is one box, so the overlap is
// one box too). A block held by several source replicas is sent by them in turn, the k-th
// destination needing it taking replica k mod r, so replicated sources share the sending.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/array.h"
#include "collectives/collective.h"
#include "collectives/sharding.h"
#include "topology/network.h"

namespace shardsim {

// One message: the box [lo, hi) of the global array, from a source position to a destination
// position (each a position of its own mesh).
struct DevicePutMessage {
  int from = 0;             // Source mesh position.
  int to = 0;               // Destination mesh position.
  std::vector<int64_t> lo;  // First global index of the box, per dimension.
  std::vector<int64_t> hi;  // One past its last, per dimension.
  int64_t elements = 0;     // Elements in the box.
};

// Every message of one device_put, and where each side's blocks sit in the global array.
struct DevicePutPlan {
  int sources = 0;                                // Positions of the source mesh.
  int destinations = 0;                           // Positions of the destination mesh.
  Shape from_block;                               // A source block's shape.
  Shape to_block;                                 // A destination block's shape.
  std::vector<std::vector<int64_t>> from_offset;  // Per source position: its block's start.
  std::vector<std::vector<int64_t>> to_offset;    // Per destination position: its block's start.
  std::vector<DevicePutMessage> messages;         // By destination, then by source block.
};

// The messages that move an array laid out by `from` into the layout `to`. Throws
// std::invalid_argument when the two global shapes differ.
DevicePutPlan PlanDevicePut(const Sharding& from, const Sharding& to);

// Runs `plan` as point-to-point transfers. `job`'s members are the source positions' devices
// then the destination positions'; with numerics, job.in holds each source's block (flat) and
// job.out receives each destination's. A destination member is done when its last box has
// arrived, a source member when its last message has (at once if it sends none).
std::unique_ptr<CollectiveAlgorithm> MakeDevicePutTransfers(Network& network, CollectiveJob& job,
                                                            const DevicePutPlan& plan);

// The reference: the global array assembled from the source blocks (`blocks[p]`, one per
// source position) and cut by `to`, one block per destination position.
std::vector<Array> ReferenceDevicePut(const Sharding& from, const Sharding& to,
                                      const std::vector<Array>& blocks);

}  // namespace shardsim
