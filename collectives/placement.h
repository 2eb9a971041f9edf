// The default placement of a logical mesh onto physical devices, topology-aware like
// jax.experimental.mesh_utils.create_device_mesh, and a readable account of a placement.
//
// The rule (DefaultPlacement):
//  - The mesh must use the whole machine: the product of the axis sizes equals the device
//    count (as create_device_mesh requires); anything else is an error. To use part of a
//    machine, list the devices in `mesh.devices`.
//  - Torus (and ring) topologies: physical dimensions are handed to mesh axes greedily, from
//    the LAST (innermost) mesh axis to the first and from the last (innermost, row-major
//    minor) torus dimension to the first. Each axis takes, dimension by dimension from the
//    innermost out, the largest factor its remaining size shares with the dimension's
//    unassigned part (the whole part when that divides the axis, or what the axis still
//    needs), the inner axis taking the low (stride-1) factor so its members stay neighbours;
//    a dimension sharing no factor is left to the outer axes. Examples: mesh {dp: 2, tp: 8}
//    on a 4x4 torus: tp takes dim 1 (4) and the low factor 2 of dim 0, dp the high factor 2
//    of dim 0; {data: 35, fsdp: 64, tensor: 4} on 16x20x28: tensor the low 4 of dim 2, fsdp
//    the low 4 of dim 1 and all of dim 0 (16), data the high 7 of dim 2 and the high 5 of
//    dim 1. An axis over several pieces walks them in snake
//    (boustrophedon) order, major to minor: strided (high) factors first, then the others
//    in torus-dimension order, so consecutive members along every axis are physical
//    neighbours wherever the pieces allow. Such a factorization always exists when the mesh
//    uses the whole machine ({a: 3, b: 4} on 4x3: b takes dim 0, a dim 1).
//  - Every other topology (switch, hierarchical fat tree, fully connected, ring-less graph):
//    row-major device order, position p on device p. On hierarchical GPU machines devices
//    are numbered node * per_node + local, so the innermost axes whose sizes multiply to a
//    divisor of per_node stay inside a node (NVLink) and the outer axes go across nodes.
#pragma once

#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "topology/topology.h"

namespace shardsim {

// The physical device of each mesh position (row-major over `axes`) under the rule above.
// Throws std::invalid_argument when the mesh size differs from topo.num_devices().
std::vector<int> DefaultPlacement(const std::vector<MeshAxis>& axes, const Topology& topo);

// The torus dimensions in the order the rule above hands them out: the last (innermost) first.
std::vector<int> DefaultTorusOrder(int dims);

// The rule above on a torus, handing the torus dimensions out in `torus_order` (the first to
// the innermost mesh axes) instead of the last first. Throws std::invalid_argument when the
// topology is no torus, `torus_order` is not a permutation of its dimensions, or the mesh size
// differs from the device count.
std::vector<int> TorusPlacement(const std::vector<MeshAxis>& axes, const Topology& topo,
                                const std::vector<int>& torus_order);

// "torus_order [1, 2, 0]", as run files write it.
std::string TorusOrderText(const std::vector<int>& torus_order);

// Checks that every device of `mesh` exists on `topo` (0 <= device < num_devices()); throws
// std::invalid_argument naming the first one that does not.
void ValidateMeshDevices(const Mesh& mesh, const Topology& topo);

// A one-line account of how `mesh` sits on `topo`, e.g. "dp -> torus dim 0 (4, wraps),
// tp -> torus dim 1 (2, line)" or "dp across nodes, tp inside nodes (NVLink)"; it says when
// the default placement fell back to row-major order or when mesh.devices gave the order.
// Throws like ValidateMeshDevices.
std::string DescribePlacement(const Mesh& mesh, const Topology& topo);

}  // namespace shardsim
