// Builds the machine a run file's `hardware:` section describes (a preset or a custom topology).
#pragma once

#include <string>
#include <vector>

#include "topology/topology.h"
#include "topology/topology_spec.h"

namespace shardsim {

// The most devices any topology may have: far above the largest public slice (v5p 16x20x28 =
// 8960 chips) and keeps every count inside int32.
inline constexpr int kMaxDevices = 1 << 20;

// The product of `shape`; throws SpecError(`key`) for an empty shape, a dimension < 1, or a
// product above kMaxDevices. `what` names the machine in messages ("tpu-v5p", "torus").
int CheckedDeviceCount(const std::vector<int>& shape, const std::string& key,
                       const std::string& what);

// Builds the machine: `spec.preset` through BuildPreset (presets.h), or `spec.topology`:
//   torus          shape (required), wraparound (default all true)        -> BuildTorus
//   ring           size (required), bidirectional                         -> BuildRing
//   switch         size (required)                                        -> BuildSwitch
//   fully_connected size (required)                                       -> BuildFullyConnected
//   hierarchical   nodes, per_node (required), nodes_per_leaf, spines, nic_bandwidth,
//                  nic_latency                                            -> BuildHierarchical
//   graph          devices (required), links                              -> BuildExplicitGraph
// Custom machines take `hardware.link` (every link; for hierarchical the NVLink links only)
// and `hardware.device` on top of these DEFAULTS: torus, ring, fully_connected and graph use
// TPU v5e figures (45 GB/s ICI per direction, 1 us per hop, the v5e chip); switch and
// hierarchical use H100 figures (450 GB/s NVLink, 0.5 us, the H100 chip; NICs 400 Gb/s, 1 us).
// A graph link's own bandwidth and latency are replaced when `hardware.link` gives them.
// Throws SpecError naming the key at fault: neither or both of preset/topology
// ("hardware.preset"), unknown kind ("hardware.topology.kind"), a missing or invalid field
// ("hardware.topology.<field>"), preset-only keys on a custom machine ("hardware.shape",
// "hardware.wraparound", "hardware.nodes").
Topology BuildHardware(const HardwareSpec& spec);

}  // namespace shardsim
