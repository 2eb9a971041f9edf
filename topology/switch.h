// Builds a single-switch domain: N devices each with one link to a non-blocking switch.
#pragma once

#include <string>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"
#include "topology/topology.h"

namespace shardsim {

// Builds `size` >= 1 devices (vertices 0..size-1, named like "GPU 3") each joined by one duplex
// link of `per_device` bandwidth per direction to one non-blocking switch (vertex `size`). An
// NVSwitch node (4 physical NVSwitch chips in an HGX H100) is modelled as this one switch; the
// per-GPU NVLink bandwidth is the device <-> switch link bandwidth. Device-to-device routes are
// 2 hops (device -> switch -> device).
Topology BuildSwitch(int size, Bandwidth per_device, Time latency, LinkKind kind, DeviceSpec device,
                     std::string name = "");

}  // namespace shardsim
