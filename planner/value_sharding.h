// How the partitioner sees a value of a global program: the mesh axes that split each
// dimension, and the axes over which it is still an unreduced partial sum (XLA's "partial"
// sharding: after a contraction over a sharded dimension, before its psum).
#pragma once

#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/partition_spec.h"

namespace shardsim::planner {

// A value's layout over the mesh, by mesh axis index.
struct ValueSharding {
  // Per dimension, the mesh axes (first major) that split it; empty: not split. As many
  // entries as the value has dimensions.
  std::vector<std::vector<int>> dims;
  // Mesh axes over which every position holds a partial sum of the value (ascending).
  std::vector<int> partial;
  bool operator==(const ValueSharding&) const = default;
};

// Replicated on every axis, for a value of `rank` dimensions.
ValueSharding Replicated(int rank);
// The sharding `spec` gives a value of `rank` dimensions on a mesh of `axes` (dimensions past
// the spec replicated). Axis names must be axes of the mesh (throws std::invalid_argument).
ValueSharding FromSpec(const PartitionSpec& spec, int rank, const std::vector<MeshAxis>& axes);
// The PartitionSpec of `sharding` (partial axes are not part of a PartitionSpec), trailing
// unsplit dimensions dropped as JAX prints them.
PartitionSpec ToSpec(const ValueSharding& sharding, const std::vector<MeshAxis>& axes);
// The names of mesh axes `ids` (indices into `axes`), in that order.
std::vector<std::string> AxisNames(const std::vector<int>& ids, const std::vector<MeshAxis>& axes);
// Mesh axes the value uses to split some dimension, ascending.
std::vector<int> SplitAxes(const ValueSharding& sharding);
// The block shape each position holds of a value of global `shape`. Throws
// std::invalid_argument when a split dimension does not divide.
Shape LocalShape(const Shape& shape, const ValueSharding& sharding,
                 const std::vector<MeshAxis>& axes);
// JAX's type notation: "f32[1024@dp,4096]", "bf16[8@(dp,tp),16]"; partial axes follow as
// "{partial: tp}".
std::string FormatType(DType dtype, const Shape& shape, const ValueSharding& sharding,
                       const std::vector<MeshAxis>& axes);

}  // namespace shardsim::planner
