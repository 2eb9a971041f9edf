// A global array's sharding: a mesh, a PartitionSpec and the global shape; how blocks are cut
// from and put back into the global array, and how shardings print.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/partition_spec.h"

namespace shardsim {

// An array of `global_shape` laid out on `mesh` by `spec`, as shard_map's in_specs and
// out_specs do: a dimension sharded over axes (a, b) is cut into size(a) * size(b) equal
// blocks, and the block of a position is idx(a) * size(b) + idx(b) (JAX's axis_index over
// the tuple). Positions differing only along axes the spec does not name hold the same block
// (replicas).
class Sharding {
 public:
  // The block shape of an array of `global_shape` laid out on `mesh` by `spec`, which must be
  // valid for them (ValidatePartitionSpec): each dimension over the product of its axes'
  // sizes. What LocalShape() gives, without a Sharding (and its copy of the mesh).
  static Shape LocalShapeOf(const Mesh& mesh, const PartitionSpec& spec, const Shape& global_shape);

  // Validates `spec` against `global_shape` and `mesh` (ValidatePartitionSpec; throws
  // std::invalid_argument).
  Sharding(Mesh mesh, PartitionSpec spec, Shape global_shape);

  // The mesh.
  const Mesh& mesh() const { return mesh_; }
  // The spec.
  const PartitionSpec& spec() const { return spec_; }
  // The global shape.
  const Shape& global_shape() const { return global_shape_; }

  // Shape of every position's block.
  Shape LocalShape() const;
  // Number of blocks along dimension `dim` (the product of its axes' sizes; 1 if unsharded).
  int64_t NumBlocks(int dim) const;
  // Block index of `position` along each dimension.
  std::vector<int64_t> BlockIndex(int position) const;
  // Start index of `position`'s block along each dimension.
  std::vector<int64_t> BlockOffset(int position) const;
  // Mesh axis indices the array is sharded over, in mesh order.
  std::vector<int> ShardedAxes() const;

  // The block of `global` held at `position` (shape-only in, shape-only out). Throws
  // std::invalid_argument when global's shape is not global_shape().
  Array Shard(const Array& global, int position) const;
  // Builds the global array from every position's block (one per position, each of
  // LocalShape(), all of one dtype). Replicas must agree: values equal up to a few units in
  // the last place of the dtype relative to the blocks' largest magnitude, so
  // reduction-order rounding does not count. On a mismatch,
  // with `mismatch_axis` set, stores the mesh axis the values differ along there and returns
  // the array built from the first replicas; without it, throws std::invalid_argument
  // ("values differ along mesh axis 'tp' ..."). `*mismatch_axis` is cleared on success.
  // Shape-only if any block is. Throws std::invalid_argument for wrong counts or shapes.
  Array Assemble(const std::vector<Array>& locals_by_position,
                 std::string* mismatch_axis = nullptr) const;

  // The global type with sharded dimensions marked: "f32[1024@dp,4096]",
  // "f32[1024@(dp,tp),4096]".
  std::string GlobalType(DType dtype) const;
  // The per-device type with the axes it is sharded over: "f32[256,4096]{dp}"; no braces
  // when replicated.
  std::string LocalType(DType dtype) const;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
  Shape global_shape_;
  // Per dimension, the mesh axis indices that shard it (first major).
  std::vector<std::vector<int>> dim_axes_;
};

// An ASCII grid of which devices hold which block of a 1D or 2D array, like
// jax.debug.visualize_array_sharding: one cell per block (rows: blocks of dimension 0;
// columns: blocks of dimension 1), each naming the physical devices holding it, sorted, runs
// of three or more written "4-7", each prefixed by `device_prefix` once (e.g. "TPU ").
// The grid is at most `max_width` columns wide where possible: narrow cells drop the prefix,
// then cut labels to end in "..". Throws std::invalid_argument for other ranks.
std::string VisualizeSharding(const Sharding& sharding, const std::string& device_prefix = "",
                              int max_width = 80);

}  // namespace shardsim
