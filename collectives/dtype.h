// Element types of arrays and the rounding that emulates them on float32 storage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardsim {

// The element types of SPEC's run file, and the two 8-bit floats of FP8 training and serving
// (ml_dtypes' float8_e4m3fn: 3 mantissa bits, largest 448, no infinity; float8_e5m2: IEEE-like
// with 2 mantissa bits, largest 57344).
enum class DType { kF32, kBF16, kF16, kI32, kF8E4M3, kF8E5M2 };
// Every dtype, in declaration order.
inline constexpr DType kDTypes[] = {DType::kF32, DType::kBF16,   DType::kF16,
                                    DType::kI32, DType::kF8E4M3, DType::kF8E5M2};

// Bytes per element: what costs count (4, 2, 2, 4, 1, 1).
int64_t DTypeSize(DType dtype);
// The name: "f32", "bf16", "f16", "i32", "f8e4m3", "f8e5m2".
const char* DTypeName(DType dtype);
// Parses those names and the long spellings "float32", "bfloat16", "float16", "int32",
// "float8_e4m3fn", "float8_e5m2"; nullopt otherwise.
std::optional<DType> ParseDType(std::string_view name);
// The names ParseDType reads, short then long, for messages and choices.
const std::vector<std::string>& DTypeNames();
// Whether `dtype` is one of the 8-bit floats.
bool IsFloat8(DType dtype);
// The largest finite value of a floating `dtype` (448 for f8e4m3, 57344 for f8e5m2, 65504 for
// f16), what a saturating conversion clamps to; 2^31 - 1 for i32.
float LargestFinite(DType dtype);

// Rounds a float32 value to the nearest value representable in `dtype` (round to nearest
// even; i32 rounds to the nearest integer, saturating; f8e4m3 turns what overflows, and
// infinities, into NaN, as ml_dtypes does; f8e5m2 overflows to infinity). Arrays store the floating
// dtypes as float32 and apply this after every op, so bf16/f16 numerics match hardware that rounds
// each op's result.
float RoundToDType(DType dtype, float value);

// Rounds every float element of `data[0..n)` in place: no-op for f32, and for i32, whose
// arrays hold int32 words (Array), not float values.
void RoundToDType(DType dtype, float* data, int64_t n);

// The nearest int32 to `v` (ties to even), saturating at the int32 range; NaN gives 0.
int32_t DoubleToInt32(double v);

}  // namespace shardsim
