// The ops reverse mode (planner::ExpandGrads) emits beyond SPEC's forward ops: helpers JAX's
// transpose rules use (full_like, broadcast_in_dim, pad) and derivative ops that compute in one
// kernel what XLA fuses into one (unary_grad, max_grad, and one per array op of nn_ops.h whose
// derivative is not a composition of existing ops: reduce_max_grad, softmax_grad,
// log_softmax_grad, rms_norm_grad, layer_norm_grad, take_grad, cross_entropy_grad,
// top_k_grad, attention_grad). Each is an ordinary registry op, so a
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
// The FLOPs and bytes of grad op `op`: every op reads its inputs and writes its outputs once
// (full_like writes only: it reads no element of its input), the fused kernel XLA emits;
// FLOPs are counted beside each case in grad_ops.cc (one per element for unary_grad and
// max_grad, none for the data movers, 2.5 times the forward's for attention_grad).
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

// The cotangent of x in reduce_max(x, axes, keepdims) from the result's cotangent g: g split
// evenly among the positions of the maximum (JAX's rule for reductions that choose: g * [x ==
// max] / count, NaN where the maximum is NaN).
Array ReduceMaxGrad(const Array& g, const Array& x, const std::vector<int64_t>& axes,
                    bool keepdims);
// The cotangent of x in y = softmax(x, axis): y (g - sum(g y, axis)).
Array SoftmaxGrad(const Array& g, const Array& y, int64_t axis);
// The cotangent of x in y = log_softmax(x, axis): g - exp(y) sum(g, axis).
Array LogSoftmaxGrad(const Array& g, const Array& y, int64_t axis);
// The cotangents of rms_norm(x, scale, axis, eps) (`center` false) or layer_norm (`center`
// true): dx = r (g s - mean(g s) - xhat mean(g s xhat)) along the axis (no mean(g s) term for
// rms_norm), with xhat the normalized x and r its 1 / sqrt(variance + eps); and g xhat, x's
// shape, whose sum over every other axis is the scale's cotangent. dx has g's dtype.
std::vector<Array> NormGrad(bool center, const Array& g, const Array& x, const Array& scale,
                            int64_t axis, double eps);
// The cotangent of the table in take(table, ids, axis), the table having `size` entries along
// `axis`: g's slices added into zeros at their ids (a scatter-add; ids in [-size, 0) count from
// the end, others outside the table are dropped, as jnp.take's "fill" mode reads nothing).
Array TakeGrad(const Array& g, const Array& ids, int64_t axis, int64_t size);
// The cotangent of the logits in cross_entropy(logits, labels), g the loss's (a scalar):
// g / N (softmax(logits) - onehot(labels)) along the class axis, N the number of labels (a label
// outside the classes adds no onehot term). The result has the logits' dtype.
Array CrossEntropyGrad(const Array& g, const Array& logits, const Array& labels);
// The cotangent of x in top_k(x, k), from the values' cotangent g and the indices top_k chose:
// g scattered along the last axis into zeros of length `size`.
Array TopKGrad(const Array& g, const Array& indices, int64_t size);
// The cotangents [dq, dk, dv] of attention(q, k, v, causal) from the output's cotangent g,
// with the same layout, grouping and mask as the forward kernel (nn_ops.h), in double: with
// p = softmax(s), s = q k^T / sqrt(H): dv = p^T g, dp = g v^T, ds = p (dp - sum(p dp)),
// dq = ds k / sqrt(H), dk = ds^T q / sqrt(H) (dk, dv summed over a kv head's query heads).
std::vector<Array> AttentionGrad(const Array& g, const Array& q, const Array& k, const Array& v,
                                 bool causal);

}  // namespace shardsim
