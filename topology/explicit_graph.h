// Builds a topology from an explicit list of device-to-device links (`kind: graph`).
#pragma once

#include <string>

#include "topology/device_spec.h"
#include "topology/topology.h"
#include "topology/topology_spec.h"

namespace shardsim {

// Builds `spec.devices` devices (vertex i = device i, named like "TPU 3") and, per entry of
// `spec.links` in order, a duplex link src <-> dst (or a one-way link src -> dst when
// `bidirectional` is false) of kind LinkKind::kGeneric. Parallel links are allowed.
// Throws SpecError for: devices < 1 ("hardware.topology.devices"); a src/dst out of range, a
// self-loop, a non-positive bandwidth or negative latency ("hardware.topology.links", the
// message names the entry); a pair of devices with no directed route between them
// ("hardware.topology.links").
Topology BuildExplicitGraph(const CustomTopologySpec& spec, DeviceSpec device,
                            std::string name = "");

}  // namespace shardsim
