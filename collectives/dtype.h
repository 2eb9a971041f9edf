// Element types of arrays and the rounding that emulates them on float32 storage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardsim {

// The element types of SPEC's run file.
enum class DType { kF32, kBF16, kF16, kI32 };

// Bytes per element: what costs count (4, 2, 2, 4).
int64_t DTypeSize(DType dtype);
// The SPEC name: "f32", "bf16", "f16", "i32".
const char* DTypeName(DType dtype);
// Parses "f32", "bf16", "f16", "i32" and the long spellings "float32", "bfloat16",
// "float16", "int32"; nullopt otherwise.
std::optional<DType> ParseDType(std::string_view name);

// Rounds a float32 value to the nearest value representable in `dtype` (round to nearest
// even; i32 rounds to the nearest integer, saturating). Arrays store the floating dtypes as
// float32 and apply this after every op, so bf16/f16 numerics match hardware that rounds each
// op's result.
float RoundToDType(DType dtype, float value);

// Rounds every float element of `data[0..n)` in place: no-op for f32, and for i32, whose
// arrays hold int32 words (Array), not float values.
void RoundToDType(DType dtype, float* data, int64_t n);

// The nearest int32 to `v` (ties to even), saturating at the int32 range; NaN gives 0.
int32_t DoubleToInt32(double v);

}  // namespace shardsim
