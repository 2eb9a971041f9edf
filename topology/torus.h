// Builds n-dimensional tori and meshes (TPU ICI slices) and maps device indices to coordinates.
#pragma once

#include <string>
#include <vector>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"
#include "topology/topology.h"

namespace shardsim {

// Device index of torus coordinates `coords` in `shape`: row-major with the FIRST dimension
// major, i.e. index = ((c0 * k1) + c1) * k2 + c2 for a 3D shape {k0, k1, k2}.
int TorusIndex(const std::vector<int>& shape, const std::vector<int>& coords);

// The coordinates of device `index` in `shape` (the inverse of TorusIndex).
std::vector<int> TorusCoords(const std::vector<int>& shape, int index);

// Whether a dimension of `length` devices asked to wrap gets a wraparound link of its own.
// Length 1 has no link at all; on length 2 the wraparound link k-1 -> 0 would join the same
// two devices as the existing link 0 -> 1, so it is not added and the dimension is a line.
bool HasWraparoundLink(int length, bool wraparound);

// Builds a torus (or mesh, or mixed) of prod(shape) devices, any rank >= 1.
// Device i sits at TorusCoords(shape, i) and is named like "TPU 5 (1,1,0)". Along every
// dimension d each device has a duplex link to its + neighbour (coordinate c+1), with the
// directed link low->high tagged dimension d, direction +1; when HasWraparoundLink() the last
// device also links to the first (k-1 -> 0 is the + direction). Torus info records the shape
// and, per dimension, whether a wraparound link exists (false for lengths 1 and 2).
// Every link gets `bandwidth` (per direction), `latency` and `kind`. Dimensions must be >= 1
// and `wraparound` the same length as `shape` (asserted; validate user input before).
Topology BuildTorus(std::vector<int> shape, std::vector<bool> wraparound, Bandwidth bandwidth,
                    Time latency, LinkKind kind, DeviceSpec device, std::string name);

}  // namespace shardsim
