// A group of devices that forms a grid on a torus (the group of a mesh axis placed over one or
// more torus dimensions, strided or not): what lets a collective run its rings along the
// physical dimensions, as TPUs do, rather than along the mesh's axes.
#pragma once

#include <optional>
#include <vector>

#include "topology/topology.h"

namespace shardsim {

// Along each torus dimension it spans, the group's members take n coordinates s apart, and
// every combination of those coordinates is one member. Positions count from the least
// coordinate on lines; round a dimension that wraps, from the coordinate after the widest gap,
// or from the first member's where the group goes all the way round (every gap alike). So the
// grid does not depend on the order members are listed in, and a translation of the group
// translates its positions.
struct TorusGrid {
  std::vector<int> dims;     // Torus dimensions the grid spans (n > 1), ascending.
  std::vector<int> sizes;    // Members along each, n.
  std::vector<int> strides;  // Coordinate step between neighbours along each, s.
  // The member (index into the list given) at each row-major position over `sizes`.
  std::vector<int> order;
};

// The grid `members` (device vertices) form on `topo`'s torus, or nullopt: `topo` is not a
// torus, a member has no coordinates, a dimension's coordinates are not evenly spaced, or the
// group is not the whole product of them (a hand-made device list, say). A group of one
// member spans no dimension.
std::optional<TorusGrid> FindTorusGrid(const Topology& topo, const std::vector<VertexId>& members);

}  // namespace shardsim
