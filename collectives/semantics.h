// The reference semantics of the collective ops (SPEC "Ops"), computed directly from every
// device's block. Every simulated run checks the data its transfers produced against these
// results, so they follow jax.lax exactly (jax/_src/lax/parallel.py), shapes included:
//
//   psum, pmean, pmax, pmin   elementwise over the group; same shape. Sums accumulate in
//                             double in group-index order and are rounded once to the dtype;
//                             pmean divides the sum by the group size. i32 sums wrap
//                             modulo 2^32 (XLA's two's-complement adds), and an i32 pmean
//                             is f32 (the wrapped sum divided in float32), as in JAX.
//   psum_scatter              the group's sum, split along scatter_dimension into n chunks;
//                             member i keeps chunk i. tiled=false: the dimension must equal n
//                             and is removed. tiled=true: it must divide by n and is kept.
//   all_gather                the members' blocks in group-index order, tiled=false: stacked
//                             along a new axis `axis` (0..rank); tiled=true: concatenated
//                             along the existing axis `axis`.
//   all_to_all                every member splits its block along split_axis into n chunks
//                             and sends chunk j to member j; member i joins what it received
//                             in source-index order. tiled=true: concatenated along
//                             concat_axis (split dim / n, concat dim * n). tiled=false (JAX's
//                             default): the split dimension must equal n and is removed, and
//                             the received chunks are stacked along a new axis that sits at
//                             concat_axis of the OUTPUT, i.e. the output shape is
//                             np.insert(np.delete(x.shape, split_axis), concat_axis, n) and
//                             out_i[..., j @ concat_axis, ...] = x_j[..., i @ split_axis, ...].
//   ppermute                  see ResolvePermutation; members that receive nothing get zeros.
//   axis_index                an i32 scalar: the member's index over the named tuple,
//                             index(a) * size(b) + index(b) for [a, b].
//
// Here n is the group size and "member i" / "group index" is JAX's axis_index over the
// op's axis_name tuple in the op's order (Mesh::IndexInGroup): all_gather, psum_scatter and
// all_to_all order their chunks by it, exactly as jax.lax does for a tuple of axes.
// Axis parameters may be negative and count from the end, as in NumPy (all_gather's untiled
// `axis` counts in the output's rank).
#pragma once

#include <optional>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// The mesh axes that op.axis_name names, as axis indices in the op's order (what
// Mesh::Groups takes). Throws std::invalid_argument if the list is empty, names an axis the
// mesh lacks, or names one twice.
std::vector<int> ResolveCollectiveAxes(const OpSpec& op, const Mesh& mesh);

// The local output shape of a collective for a local input of shape `input` and a group of
// `group_size` devices, validating the op's parameters against the shape (axis ranges,
// divisibility, tiled=false sizes). axis_index ignores `input` and returns the scalar shape
// []. `dtype`, when given, only makes error messages name the type ("f32[6,4]"). Throws
// std::invalid_argument, e.g. "psum_scatter: dimension 0 of f32[6,4] does not divide by the
// 4 devices of axis dp". Used by timing-only runs; ReferenceCollective applies the same rule.
Shape CollectiveOutputShape(const OpSpec& op, const Shape& input, int group_size,
                            std::optional<DType> dtype = std::nullopt);

// The dtype of a collective's output for an input of `input`: the input's, except pmean of
// i32 (f32, JAX's true division) and axis_index (i32).
DType CollectiveOutputDType(const OpSpec& op, DType input);

// The shape-only result of collective `op` (axis_index and ragged_all_to_all included) on the
// local `inputs` for a group of `group_size` devices: CollectiveOutputShape and
// CollectiveOutputDType, or ragged_all_to_all's rule (RaggedAllToAllShape). Throws
// std::invalid_argument as they do.
Array CollectiveResultType(const OpSpec& op, const std::vector<const Array*>& inputs,
                           int group_size);

// ppermute: where each member of a group sends its block. Returns dest with one entry per
// group index g (0..n-1, the op-order index of Mesh::Groups / Mesh::IndexInGroup): dest[g]
// is the group index of the member that receives g's block, or -1 if g sends nothing. The
// mapping is the same for every group of Mesh::Groups(ResolveCollectiveAxes(op, mesh)), so
// the position of member g of group G sends to G[dest[g]].
//
// * shift: k   dest[g] = (g + k) mod n (k may be negative or exceed n): a true ring shift
//              along the op's tuple order, the order a P((a, b)) spec lays blocks out in.
// * perm       each (src, dst) pair names members by their linear index over the named
//              axes taken in the MESH's axis order (first major), whatever order axis_name
//              lists them in: that is what JAX does (its ppermute lowering indexes the
//              *sorted* replica group, and mesh positions sort in mesh order). Sources must
//              be distinct, destinations distinct, every index in 0..n-1; unnamed members
//              send nothing. An empty perm with no shift is valid (all zeros).
//
// Why the two differ, and how to convert both ways. Let the op name axes A = (a_0..a_{k-1})
// with sizes s_0..s_{k-1}, and let member m have coordinate c_j along a_j.
//   group index  g = linear index of (c_0..c_{k-1}) over A in the op's order;
//   perm integer p = linear index of the same coordinates over A sorted into mesh order.
//   perm -> group: decode p into coordinates with mesh-order strides, re-encode them with
//                  op-order strides; group -> perm: the reverse.
// When axis_name lists the axes in mesh order the two are the same number; otherwise they
// are a transposition of each other. Example, mesh (dp=2, tp=2), positions p = 2*dp + tp:
//   axis_name [dp, tp]: g == p. shift 1 is the ring p0 -> p1 -> p2 -> p3 -> p0, the same
//                       as perm [[0,1],[1,2],[2,3],[3,0]].
//   axis_name [tp, dp]: g = 2*tp + dp, so members in g order are positions p0, p2, p1, p3.
//                       shift 1 is the ring p0 -> p2 -> p1 -> p3 -> p0 (g0->g1->g2->g3),
//                       while perm [[0,1],[1,2],[2,3],[3,0]] still means p0 -> p1 -> p2 ->
//                       p3 -> p0 (in g terms: 0 -> 2 -> 1 -> 3 -> 0).
// Throws std::invalid_argument for both perm and shift, out-of-range or repeated indices.
std::vector<int> ResolvePermutation(const OpSpec& op, const Mesh& mesh);

// The reference result of a collective `op` (psum, pmean, pmax, pmin, psum_scatter,
// all_gather, all_to_all, ppermute, axis_index) on `mesh`: inputs_by_position[p] is the
// local input block of mesh position p (all positions' blocks have one shape and dtype, as
// in shard_map); returns the local output of every position, same dtype (axis_index: i32
// scalars, and its inputs may be empty). If the inputs carry no data (shape-only), the
// outputs are shape-only too, except axis_index, which always has its values.
// Throws std::invalid_argument for a non-collective op, bad axes or parameters, a wrong
// number of inputs, or inputs of differing types.
std::vector<Array> ReferenceCollective(const OpSpec& op, const Mesh& mesh,
                                       const std::vector<Array>& inputs_by_position);

}  // namespace shardsim
