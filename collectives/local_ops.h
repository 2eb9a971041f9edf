// The local (per-device) ops of SPEC's "Ops" table, with NumPy/JAX semantics, and their
// FLOP/byte counts for the cost model.
//
// Every op works on arrays with data (computing values in float32 with float32 accumulation,
// then rounding to the output dtype) and on shape-only arrays (computing only the output's
// shape and dtype); if any input lacks data the result is shape-only. Bad shapes or
// parameters throw std::invalid_argument with a message that starts with the op's name, e.g.
// "matmul: inner dimensions differ: f32[256,4096] @ f32[2048,256]". Negative axes count from
// the end, as in NumPy.
//
// Output dtypes follow JAX: equal dtypes keep theirs; i32 with a float dtype gives the float
// dtype; two different float dtypes give f32. div, exp, tanh and gelu of i32 give f32. An op
// with a Python-like scalar keeps the array's dtype (JAX's weak typing).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/program.h"

namespace shardsim {

// Elementwise ops of two operands.
enum class BinaryKind { kAdd, kSub, kMul, kDiv, kMax };

// The BinaryKind of add/sub/mul/div/max; nullopt for other ops.
std::optional<BinaryKind> BinaryKindOf(OpKind kind);
// Whether `kind` is an elementwise op of one operand with a kernel in Unary: the registry's
// elementwise ops of arity one, convert excepted (it takes a dtype: ConvertElementType).
bool IsUnary(OpKind kind);
// The dtype of an op on `a` and `b` (see the rules above).
DType PromoteTypes(DType a, DType b);

// a @ b as NumPy's matmul: 2-D @ 2-D, 1-D operands as vectors, and for rank > 2 a stack of
// matrices with broadcast batch dimensions ([..., M, K] @ [..., K, N]). Uses OpenBLAS sgemm.
// With `result`, the product is accumulated in f32 and rounded to it (dot_general's
// preferred_element_type) instead of to the operands' promoted type.
Array Matmul(const Array& a, const Array& b, std::optional<DType> result = std::nullopt);

// jnp.einsum of two operands, e.g. "bd,df->bf", "bij,bjk->bik", "ij,kj->ik"; without "->"
// the output is the letters seen once, sorted (NumPy's implicit mode). Letters that appear
// in one operand only and not in the output are summed first; the rest becomes a batched
// sgemm. Repeated letters within an operand (diagonals) and "..." are rejected.
// `result` as Matmul's.
Array Einsum(const std::string& spec, const Array& a, const Array& b,
             std::optional<DType> result = std::nullopt);

// The number of products each output element of Einsum(spec, a, b) sums: the product of the
// sizes of the letters not in the output (contracted, or summed away first).
int64_t EinsumContractionLength(const std::string& spec, const Array& a, const Array& b);

// a (op) b with NumPy broadcasting.
Array Binary(BinaryKind kind, const Array& a, const Array& b);
// a (op) scalar, elementwise.
Array BinaryScalar(BinaryKind kind, const Array& a, double scalar);
// Elementwise op `kind` (IsUnary) of one operand: relu, gelu (tanh approximation,
// jax.nn.gelu's default), exp, tanh, neg, silu, log, sqrt, rsqrt, square, abs, sin, cos.
Array Unary(OpKind kind, const Array& a);
// jax.lax.convert_element_type(a, dtype): floats round to a narrower float type; floats to
// i32 truncate toward zero, saturating at the int32 range, NaN to 0 (XLA's conversion);
// i32 to floats round to the nearest representable value. With `saturate`, float values beyond
// the target's largest finite value (infinities too) clamp to it before rounding, as NVIDIA's
// __NV_SATFINITE conversions and Transformer Engine's FP8 casts do; NaN stays NaN.
Array ConvertElementType(const Array& a, DType dtype, bool saturate = false);

// jnp.reshape: same elements in row-major order; one dimension may be -1 (inferred).
Array Reshape(const Array& a, const Shape& shape);
// jnp.transpose: output dimension i is input dimension axes[i]; empty axes reverse them.
Array Transpose(const Array& a, const std::vector<int64_t>& axes);
// jnp.concatenate of one or more arrays of equal rank whose shapes agree except along `axis`.
Array Concatenate(const std::vector<const Array*>& arrays, int64_t axis);
// jnp.split into `sections` equal parts along `axis` (which must divide evenly).
std::vector<Array> Split(const Array& a, int64_t sections, int64_t axis);
// The `size` elements from `start` along `axis` (lax.slice_in_dim); must lie within it.
Array Slice(const Array& a, int64_t start, int64_t size, int64_t axis);

// Helpers for collectives (same checks and semantics as the ops above).
// Slice with the axis first: the block [start, start + size) along `axis`.
Array SliceAlong(const Array& a, int axis, int64_t start, int64_t size);
// Concatenate of a list of arrays held by value.
Array ConcatAlong(const std::vector<Array>& arrays, int axis);
// jnp.stack: equal-shaped arrays along a new dimension `axis` (in [-(rank+1), rank]).
Array Stack(const std::vector<Array>& arrays, int axis);

// Work an op does on one device.
struct OpCost {
  double flops = 0;  // Floating-point operations.
  double bytes = 0;  // Memory traffic (bytes read plus written).
  // Bytes of temporaries the op holds in HBM while it runs, beyond its inputs and outputs
  // (an unfused attention's scores); they count toward the peak while it runs.
  double workspace = 0;
  // Its FLOPs run in a fused attention kernel (FlashAttention's): priced at the device's
  // attention efficiency rather than its matmul efficiency.
  bool fused_attention = false;
};

// The cost of a local op: matmul/einsum 2*M*N*K per batch element (einsum: 2 * product of
// the sizes of its letters, plus one FLOP per element summed away first); elementwise ops
// one FLOP per output element; every op reads its inputs and writes its outputs, except
// reshape (free: a relabeling) and slice (reads only the slice); convert one FLOP per element.
// `einsum_spec` is needed for einsum only. Collective kinds are not local ops. The ops of
// nn_ops.h cost NnOpCost and those of grad_ops.h GradOpCost, with their attributes at the
// defaults.
OpCost LocalOpCost(OpKind kind, const std::vector<const Array*>& inputs,
                   const std::vector<const Array*>& outputs, const std::string& einsum_spec = "");
// The cost of `op` itself: LocalOpCost of its kind, NnOpCost for the ops of nn_ops.h, GradOpCost
// for those of grad_ops.h, or, for custom_call, the FLOPs and bytes the op states.
OpCost LocalOpCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                   const std::vector<const Array*>& outputs);
// The element type whose FLOP rate prices `op`: a matmul's or einsum's operands' (promoted; an
// 8-bit float when both are), whatever its result type (an FP8 GEMM with a bf16 result runs on
// FP8 units); otherwise its first result's (f32 when it has none).
DType CostDType(const OpSpec& op, const std::vector<const Array*>& inputs,
                const std::vector<const Array*>& outputs);

}  // namespace shardsim
