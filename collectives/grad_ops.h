// The ops reverse mode (planner::ExpandGrads) emits beyond SPEC's forward ops: helpers JAX's
// transpose rules use (full_like, broadcast_in_dim, pad) and derivative ops that compute in one
// kernel what XLA fuses into one (unary_grad, max_grad). Each is an ordinary registry op, so a
// partitioned backward pass writes and loads back as a `mode: manual` run file.
//
// Same contract as local_ops.h: float32 arithmetic rounded to the output dtype, shape-only
// inputs give shape-only outputs, bad shapes or parameters throw std::invalid_argument with a
// message starting with the op's name.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/array.h"
#include "collectives/local_ops.h"
#include "collectives/program.h"

namespace shardsim {

// Whether `kind` is one of this file's ops.
bool IsGradOp(OpKind kind);
// Runs grad op `op` (IsGradOp) on `inputs`; one array per output.
std::vector<Array> ApplyGradOp(const OpSpec& op, const std::vector<const Array*>& inputs);
// The FLOPs and bytes of grad op `op`: every op reads its inputs and writes its outputs
// (full_like writes only: it reads no element of its input); unary_grad and max_grad do one
// FLOP per output element, the others move data only.
OpCost GradOpCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                  const std::vector<const Array*>& outputs);

// jnp.full_like(x, fill_value): x's shape and dtype, every element fill_value (rounded to the
// dtype; i32 to the nearest integer).
Array FullLike(const Array& x, double fill_value);
// jax.lax.broadcast_in_dim: input dimension i becomes result dimension dims[i] (increasing),
// where its size must be 1 (broadcast) or the result's; the other result dimensions repeat it.
Array BroadcastInDim(const Array& x, const Shape& shape, const std::vector<int64_t>& dims);
// jnp.pad with zeros along `axis` only: `low` zeros before, `high` after.
Array Pad(const Array& x, int64_t low, int64_t high, int64_t axis);
// g * f'(x) for the elementwise op `fn` (relu, gelu, silu, tanh, sqrt, rsqrt, square, abs, sin,
// cos), with JAX's derivatives: relu'(0) = 0, abs'(x) = 1 for x >= 0 else -1 (a select, so an
// infinite g stays finite where the other branch is taken), gelu the tanh approximation the
// forward kernel computes. g and x have one shape; the result has g's dtype.
Array UnaryGrad(OpKind fn, const Array& g, const Array& x);
// The cotangent of a in max(a, b) (jnp.maximum): g * m with m = 1 where a is the maximum and b
// is not, 1/2 where both are (JAX's balanced tie rule), 0 elsewhere (and where the maximum is
// NaN). a and b broadcast to g's shape; the result has g's dtype.
Array MaxGrad(const Array& g, const Array& a, const Array& b);

}  // namespace shardsim
