#include "topology/torus_grid.h"

#include <algorithm>

namespace shardsim {

std::optional<TorusGrid> FindTorusGrid(const Topology& topo, const std::vector<VertexId>& members) {
  if (!topo.torus() || members.empty()) return std::nullopt;
  const TorusShape& torus = *topo.torus();
  const size_t rank = torus.shape.size();
  for (VertexId v : members) {
    if (topo.node(v).coords.size() != rank) return std::nullopt;
  }
  // Offsets from the origin along every dimension, per member.
  const size_t g = members.size();
  std::vector<std::vector<int>> offset(rank, std::vector<int>(g));
  TorusGrid grid;
  int64_t product = 1;
  for (size_t d = 0; d < rank; ++d) {
    const int length = torus.shape[d];
    std::vector<int> at;
    for (VertexId v : members) at.push_back(topo.node(v).coords[d]);
    std::sort(at.begin(), at.end());
    at.erase(std::unique(at.begin(), at.end()), at.end());
    // A line's progression starts at its least coordinate. Round a ring it starts after the
    // widest gap between neighbouring coordinates, or, where every gap is alike (the group
    // goes all the way round), at the first member's.
    int origin = at[0];
    if (torus.wraparound[d] && at.size() > 1) {
      const int m = static_cast<int>(at.size());
      int widest = m - 1;  // The gap from at[i] to the next coordinate round the ring.
      bool alike = true;
      auto gap = [&](int i) { return i + 1 < m ? at[i + 1] - at[i] : at[0] + length - at[i]; };
      for (int i = 0; i < m; ++i) {
        alike = alike && gap(i) == gap(0);
        if (gap(i) > gap(widest)) widest = i;
      }
      origin = alike ? topo.node(members[0]).coords[d] : at[(widest + 1) % m];
    }
    auto from_origin = [&](int c) { return ((c - origin) % length + length) % length; };
    for (size_t m = 0; m < g; ++m) offset[d][m] = from_origin(topo.node(members[m]).coords[d]);
    std::vector<int> distinct;  // The offsets of `at`, ascending.
    for (int c : at) distinct.push_back(from_origin(c));
    std::sort(distinct.begin(), distinct.end());
    const int n = static_cast<int>(distinct.size());
    if (n == 1) continue;
    // Evenly spaced from 0: {0, s, 2s, ..., (n - 1)s}.
    const int s = distinct[1];
    for (int i = 0; i < n; ++i) {
      if (distinct[i] != i * s) return std::nullopt;
    }
    grid.dims.push_back(static_cast<int>(d));
    grid.sizes.push_back(n);
    grid.strides.push_back(s);
    product *= n;
  }
  if (product != static_cast<int64_t>(g)) return std::nullopt;
  // Row-major positions; the product equals the member count, so the map is onto exactly
  // when no two members share a position.
  grid.order.assign(g, -1);
  for (size_t m = 0; m < g; ++m) {
    int64_t position = 0;
    for (size_t i = 0; i < grid.dims.size(); ++i) {
      position = position * grid.sizes[i] + offset[grid.dims[i]][m] / grid.strides[i];
    }
    if (grid.order[position] >= 0) return std::nullopt;
    grid.order[position] = static_cast<int>(m);
  }
  return grid;
}

}  // namespace shardsim
