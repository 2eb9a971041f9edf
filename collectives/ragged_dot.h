// jax.lax.ragged_dot: a grouped matmul, the expert FFN of a dropless mixture-of-experts layer
// (MegaBlocks, megablox's gmm). lhs [m, k] holds tokens sorted by group; group_sizes [g] (i32)
// says how many consecutive rows each group has; rows of group e are multiplied by rhs[e]
// [k, n]. Rows past the sum of the sizes give zeros, as in JAX.
#pragma once

#include <vector>

#include "collectives/array.h"
#include "collectives/local_ops.h"

namespace shardsim {

// ragged_dot(lhs [m, k], rhs [g, k, n], group_sizes [g] i32) -> [m, n] of lhs's dtype (lhs and
// rhs of one float dtype). Products accumulate in double and round once to the dtype.
// Shape-only inputs give a shape-only result. Throws std::invalid_argument ("ragged_dot: ...")
// for other ranks or dtypes, mismatched k or g, a negative group size, or sizes summing past m.
Array RaggedDot(const Array& lhs, const Array& rhs, const Array& group_sizes);

// The cotangent of ragged_dot's rhs: lhs [m, k], g [m, n] (the result's cotangent) and
// group_sizes [g] give [g, k, n], block e the sum over group e's rows r of lhs[r]^T g[r]
// (JAX's ragged_dot_general with the ragged dimension contracted); zeros for empty groups.
// Same checks and precision as RaggedDot.
Array RaggedDotRhsGrad(const Array& lhs, const Array& g, const Array& group_sizes);

// The cost of RaggedDot and of RaggedDotRhsGrad (op): 2 r k n FLOPs over the r rows the groups
// fill, each against its group's block once (a grouped matmul kernel, as megablox's, visits the
// groups' row tiles only; the rhs cotangent takes each row's outer product once); those rows
// of lhs (and of g) read, rhs read, the result's rows written (the rhs cotangent whole). r is
// the sum of the group sizes where they hold data, else op.expected_rows, else m.
OpCost RaggedDotCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                     const std::vector<const Array*>& outputs);

}  // namespace shardsim
