// Builds several TPU slices joined by the data-center network (DCN), as multi-slice training
// runs them (MaxText's DCN data parallelism: each slice an ICI torus, the slices talking over
// their hosts' NICs).
#pragma once

#include <string>
#include <vector>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"
#include "topology/topology.h"

namespace shardsim {

// The figures of a multi-slice machine.
struct MultiSliceParams {
  int slices = 2;                // Slices, each a torus of `shape`.
  std::vector<int> shape;        // One slice's chips per torus dimension.
  std::vector<bool> wraparound;  // Per dimension of one slice: whether it closes into a ring.
  Bandwidth ici;                 // ICI link bandwidth, per direction.
  Time ici_latency;              // ICI latency per hop.
  Bandwidth dcn;                 // Each chip's share of its host's DCN bandwidth, per direction.
  Time dcn_latency;              // Chip <-> DCN switch, per hop (a chip-to-chip trip is two).
};

// Builds `slices` copies of the torus (torus.h's layout and links, slice s's devices
// [s n, (s + 1) n) with coordinates (s, c...)), then one DCN switch ("dcn") with a duplex DCN
// link from every chip, in device order. The torus shape recorded is (slices, shape...) with
// dcn_slices set: device indices are row-major over it (TorusIndex), and dimension 0 has no
// links of its own (crossing it goes chip -> dcn -> chip). Counts must be >= 1 (asserted).
Topology BuildMultiSlice(const MultiSliceParams& params, DeviceSpec device, std::string name);

}  // namespace shardsim
