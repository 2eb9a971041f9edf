// Collective matmuls: allgather_matmul and matmul_reduce_scatter lowered into the primitive
// ops (ppermute shifts, partial matmuls, adds) that overlap communication with compute.
#pragma once

#include <vector>

#include "collectives/array.h"
#include "collectives/program.h"

namespace shardsim {

// Expands a kAllgatherMatmul or kMatmulReduceScatter op, whose operands have local shapes
// `x` and `w` and whose axis group has `n` devices, into ops that compute the same result:
//
// allgather_matmul, gather rhs (x[B, K] @ all_gather(w[K/n, F]) over the axis, the seed
// notebook's FSDP matmul):
// - blocking: all_gather(w, axis 0, tiled) then one matmul;
// - unidirectional: n steps; at step s the device holds the w block of device i - s (shifted
//   one device forward per step), multiplies it with the matching column block of x and
//   accumulates, while the next shift is in flight (n - 1 ppermutes);
// - bidirectional: each w block split into top and bottom halves; top halves travel forward,
//   bottom halves backward, so both directions of every link carry half the data.
// allgather_matmul, gather lhs (all_gather(x[B/n, K]) @ w[K, F], the Scaling Book's
// A[B_X, D_Y] @ W[D, F_Y]): the row blocks of x travel instead; each step's product is a row
// block of the result, placed by a dynamic concatenation; bidirectional splits each block's
// rows in halves.
// `axis` (default 0) names the gathered operand's dimension, as all_gather's does: the forms
// above gather rhs along 0 (its contracting dimension) and lhs along 0 (its rows). axis 1
// gathers lhs along its contracting dimension (all_gather(x[B, K/n], axis 1) @ w[K, F]: the
// column blocks of x travel, each step multiplies one with the matching row block of w and
// accumulates) or rhs along its columns (x[B, K] @ all_gather(w[K, F/n], axis 1): each step's
// product is a column block of the result); bidirectional splits the travelling blocks in
// halves as above.
// matmul_reduce_scatter (psum_scatter(x[B, K/n] @ w[K/n, F]) over the axis, scatter
// dimension 0 or 1):
// - blocking: matmul then psum_scatter(tiled);
// - unidirectional: at step s device i computes the partial product of result block
//   i - s - 1, adds the partial sum received from device i - 1 (which computed the same block
//   one step earlier) and shifts the sum forward; after n - 1 shifts it holds block i;
// - bidirectional: top halves of the blocks accumulate forward, bottom halves backward.
//
// Generated ops are named "<op name>/<what><step>" and their arrays "<op name>/...", the last
// op writing op.out[0]. Throws std::invalid_argument for shapes the variant cannot split.
std::vector<OpSpec> ExpandCollectiveMatmul(const OpSpec& op, const Shape& x, const Shape& w, int n);

}  // namespace shardsim
