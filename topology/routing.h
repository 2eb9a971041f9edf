// Routes: the ordered directed links a transfer takes from one vertex to another.
#pragma once

#include <memory>
#include <vector>

#include "topology/topology.h"

namespace shardsim {

// Chooses the path of every transfer. Deterministic: the same (src, dst) always gets the same
// route. Not thread-safe. The Topology must outlive the router.
class Router {
 public:
  virtual ~Router() = default;
  // The directed links from `src` to `dst`, in order; empty when src == dst. The reference
  // stays valid until the next call of Route on this router (copy it to keep it). `dst` must
  // be reachable from `src` (asserted; every builder makes connected topologies). A function
  // of its ends: Network remembers the last route from each source.
  virtual const std::vector<LinkId>& Route(VertexId src, VertexId dst) = 0;
  // Distinct minimal routes from `src` to `dst`, Route's first (at most 8): on a torus the
  // other dimension orders and ways round, so most leave through other ports (ones that only
  // differ later share their first links). The default knows only Route's.
  virtual std::vector<std::vector<LinkId>> MinimalRoutes(VertexId src, VertexId dst) {
    return {Route(src, dst)};
  }
};

// The router suited to `topo`:
//  - a torus or ring (Topology::torus() set, no switches): dimension-order routing, dimension
//    0 first; on a wrapping dimension the shorter way round (ties: the + direction), on a
//    non-wrapping one straight; on a one-way ring always the + direction. MinimalRoutes:
//    the rotations of the order of the dimensions that move (each leaves on another
//    dimension's port), each with both ways round on dimensions whose ways tie.
//  - several slices joined by DCN (multi_slice.h): dimension-order routing inside a slice,
//    chip -> DCN switch -> chip between slices.
//  - a fat tree from BuildHierarchical: within a node through the NVSwitch (never a NIC);
//    between nodes under one leaf GPU -> leaf -> GPU; across leaves through spine
//    (src_node + dst_node) % spines, an ECMP-like deterministic spread over the spines.
//  - anything else: MakeShortestPathRouter.
std::unique_ptr<Router> MakeRouter(const Topology& topo);

// A shortest-path router for any topology: Dijkstra (Boost.Graph) with link weight
// latency + 1 MiB / bandwidth, so that among paths of equal latency the higher-bandwidth one
// wins; ties go to the first path found (links in insertion order), so routes are
// deterministic. One predecessor tree per source is computed on first use and cached.
std::unique_ptr<Router> MakeShortestPathRouter(const Topology& topo);

}  // namespace shardsim
