// The array ops global (jit) programs need, as local ops: the reductions jnp.sum, jnp.mean and
// jnp.max (reduce_max), jax.nn.softmax and log_softmax, Flax's RMSNorm and LayerNorm (scale,
// no bias), jnp.take, the mean of optax.softmax_cross_entropy_with_integer_labels,
// jax.lax.top_k, jax.nn.dot_product_attention and jax.nn.one_hot. They run per device in shard_map
// bodies and on whole arrays as the reference of global programs.
//
// Conventions as local_ops.h: shape-only inputs give shape-only outputs; bad shapes, dtypes or
// attributes throw std::invalid_argument with a message that starts with the op's name
// ("softmax: axis 2 is out of range for f32[4,8]"); negative axes count from the end.
//
// Precision: every kernel reads its inputs' exact values, computes in double (at least the
// float32 JAX and Flax use for statistics and softmax, whatever the input dtype; sums
// therefore hardly depend on their order) and rounds each result once to the output dtype.
// i32 sums wrap modulo 2^32 as XLA's do. attention alone rounds once more inside: its
// probabilities are cast to the inputs' dtype before they weight v, as JAX does.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/array.h"
#include "collectives/local_ops.h"
#include "collectives/program.h"

namespace shardsim {

// Whether `kind` is one of this file's ops (kSum ... kAttention, one_hot, moe_route and
// ragged_dot, whose kernels are moe_route.h's and ragged_dot.h's).
bool IsNnOp(OpKind kind);
// Runs op `op` (IsNnOp) on `inputs`; one array per output (top_k: values, then indices).
std::vector<Array> ApplyNnOp(const OpSpec& op, const std::vector<const Array*>& inputs);
// The FLOPs and HBM bytes of op `op` (IsNnOp) with these local inputs and outputs; the counts
// are stated beside each case in nn_ops.cc.
OpCost NnOpCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                const std::vector<const Array*>& outputs);

// jnp.sum, jnp.mean or jnp.max (`kind` kSum, kMean, kReduceMax) over `axes` (empty: every
// axis; each named once). sum and max keep the dtype (i32 sums wrap); mean of i32 is f32. An
// empty sum is 0 and an empty mean NaN; max over no elements is an error (no identity).
Array Reduction(OpKind kind, const Array& x, const std::vector<int64_t>& axes, bool keepdims);
// jax.nn.softmax along `axis`: exp(x - max) / sum(exp(x - max)); i32 gives f32. A +inf or
// NaN in a row makes the row NaN, as in JAX.
Array Softmax(const Array& x, int64_t axis);
// jax.nn.log_softmax along `axis`: (x - max) - log(sum(exp(x - max))); i32 gives f32.
Array LogSoftmax(const Array& x, int64_t axis);
// The eps Flax uses by default: 1e-6 for RMSNorm (kRmsNorm), 1e-5 for LayerNorm (kLayerNorm).
double DefaultEps(OpKind kind);
// Flax RMSNorm: x * rsqrt(mean(x^2, axis) + eps) * scale, scale of shape [x.shape[axis]]
// broadcast along `axis`. x and scale are float; the result has their promoted dtype.
Array RmsNorm(const Array& x, const Array& scale, int64_t axis, double eps);
// Flax LayerNorm without bias: (x - mean) * rsqrt(var + eps) * scale (biased variance, as Flax).
Array LayerNorm(const Array& x, const Array& scale, int64_t axis, double eps);
// jnp.take(table, ids, axis): shape table.shape[:axis] + ids.shape + table.shape[axis+1:].
// ids are i32; one in [-n, 0) counts from the end; one outside [-n, n) takes the fill value
// (jnp.take's default mode "fill": NaN for float tables, the most negative int32 for i32).
Array Take(const Array& table, const Array& ids, int64_t axis);
// take_shard: `table` is block `block` of a table `size` long along `axis`, split into equal
// blocks; rows for the ids in the block's range, zeros for the others, take's fill for ids
// outside the whole table on block 0 only (so the blocks' sum is Take of the whole table).
Array TakeShard(const Array& table, const Array& ids, int64_t axis, int64_t size, int64_t block);
// The mean over every label position of -log_softmax(logits)[label]: logits [..., C] float,
// labels [...] i32 (optax.softmax_cross_entropy_with_integer_labels, then jnp.mean). The
// result is an f32 scalar whatever the logits' dtype (the loss as training loops log it). A
// label outside [-C, C) makes the loss NaN (take_along_axis's "fill"); one in [-C, 0) counts
// from the end.
Array CrossEntropy(const Array& logits, const Array& labels);
// jax.lax.top_k: the k largest values along the last axis, in descending order, and their
// indices (i32); equal values keep the lower index first. NaN ranks above every number.
std::vector<Array> TopK(const Array& x, int64_t k);
// jnp.cumsum(x, axis): inclusive prefix sums along `axis` (suffix sums with `reverse`, as
// lax.cumsum's), in x's dtype (float sums in double, each rounded once; i32 sums wrap as int32
// does).
Array Cumsum(const Array& x, int64_t axis, bool reverse = false);
// jnp.argsort(x, axis) (stable, ascending): per row along `axis`, the i32 indices that sort it,
// equal values in index order; NaN sorts last, as in numpy.
Array Argsort(const Array& x, int64_t axis);
// jnp.repeat(a, repeats, axis, total_repeat_length): slice j of `a` along `axis` repeated
// repeats[j] times (repeats i32 [a's length along axis], none negative), in order, cut to
// `total` slices; past the repeats' sum, the slices are a's last (JAX's fill: the gather index
// there is the last one).
Array Repeat(const Array& a, const Array& repeats, int64_t axis, int64_t total);
// jax.nn.one_hot(x, num_classes, dtype): x i32, the result x's shape + [num_classes], 1 where
// the last index equals x's element; an element outside [0, num_classes) gives a row of zeros.
Array OneHot(const Array& x, int64_t num_classes, DType dtype);
// jax.nn.dot_product_attention: q [B, T, N, H], k and v [B, S, K, H] of one float dtype, N a
// multiple of K (query head n reads kv head n / (N / K)); softmax(q k^T / sqrt(H)) v in
// double, the probabilities rounded to the dtype before weighting v. causal: query t sees keys
// j <= t + S - T (the last query aligned with the last key; needs T <= S).
Array Attention(const Array& q, const Array& k, const Array& v, bool causal);
// Whether an attention or attention_grad runs unfused (kernel: unfused: its B N T S scores
// materialized in HBM) rather than in a fused kernel (flash, mmha).
bool UnfusedAttention(const OpSpec& op);
// The HBM bytes an `unfused` attention (kernel: unfused) or attention_grad (`backward`) adds for
// its materialized B N T S scores of q's dtype (q [B, T, N, H], S keys; see nn_ops.cc); 0 for
// flash.
double UnfusedAttentionBytes(const OpSpec& op, const Array& q, int64_t s, bool backward);
// The HBM an unfused attention (or attention_grad: `backward`) holds for its B N T S scores
// while it runs (see nn_ops.cc); 0 for flash.
double UnfusedAttentionWorkspace(const OpSpec& op, const Array& q, int64_t s, bool backward);
// The (query, key) pairs attention scores per batch element and head: T * S, or causally
// T * S - T (T - 1) / 2.
double AttentionPairs(int64_t t, int64_t s, bool causal);
// For error bounds of rms_norm and layer_norm: the smallest, over the rows along the op's axis,
// of the denominator sqrt(mean(x^2) + eps) (rms_norm) or sqrt(var + eps) (layer_norm) of `x`;
// +inf when x has no rows or no data.
double SmallestNormScale(const OpSpec& op, const Array& x);

}  // namespace shardsim
