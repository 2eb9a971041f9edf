// Builds a fully connected topology: a direct duplex link between every pair of devices.
#pragma once

#include <string>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"
#include "topology/topology.h"

namespace shardsim {

// Builds `size` >= 1 devices (vertices 0..size-1, named like "GPU 3") with one duplex link of
// `bandwidth` per direction between every pair i < j (i -> j added first): size*(size-1)/2
// physical links, every route one hop.
Topology BuildFullyConnected(int size, Bandwidth bandwidth, Time latency, LinkKind kind,
                             DeviceSpec device, std::string name = "");

}  // namespace shardsim
