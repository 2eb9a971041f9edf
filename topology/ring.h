// Builds a ring of devices, bidirectional (duplex links) or one-way.
#pragma once

#include <string>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"
#include "topology/topology.h"

namespace shardsim {

// Builds a ring of `size` >= 1 devices; device i is vertex i, named like "GPU 3".
// Bidirectional: duplex links i <-> i+1 (i -> i+1 is dimension 0, direction +1), closed by
// (size-1) <-> 0 when size >= 3 (on 2 devices the closing link would duplicate 0 <-> 1).
// One-way (`bidirectional` false): simplex links i -> i+1 (mod size) only, including
// 1 -> 0 when size == 2. Torus info is {shape {size}, wraparound {closing link exists}}, so
// the torus router applies; on a one-way ring every route goes in the + direction.
Topology BuildRing(int size, bool bidirectional, Bandwidth bandwidth, Time latency, LinkKind kind,
                   DeviceSpec device, std::string name = "");

// True when `topo` is a one-way ring as BuildRing(..., bidirectional=false) makes it: a
// rank-1 torus of >= 2 devices whose links are all simplex.
bool IsOneWayRing(const Topology& topo);

}  // namespace shardsim
