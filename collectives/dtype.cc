#include "collectives/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace shardsim {
namespace {

// Rounds float32 bits to the nearest bfloat16 (the top 16 bits), ties to even; NaN stays NaN.
// Branch-free (a select), so loops over arrays vectorize.
float RoundBf16(float v) {
  uint32_t bits = std::bit_cast<uint32_t>(v);
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return std::bit_cast<float>(nan ? bits : rounded);
}

// Rounds to the nearest IEEE half-precision value (11-bit significand, exponent -14..15),
// ties to even, overflowing to infinity and flushing through subnormals exactly.
float RoundF16(float v) {
  if (!std::isfinite(v) || v == 0.0f) return v;
  constexpr float kMax = 65504.0f;
  float a = std::fabs(v);
  // Smallest normal exponent is -14; below it the spacing is fixed at 2^-24.
  int exp;
  std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1).
  int e = std::max(exp - 1, -14);
  float ulp = std::ldexp(1.0f, e - 10);
  float r = std::nearbyint(a / ulp) * ulp;  // Default rounding mode: to nearest even.
  if (r > kMax) {
    // Values at or above the midpoint to the next binade step overflow.
    r = std::numeric_limits<float>::infinity();
  }
  return std::copysign(r, v);
}

// Rounds to an 8-bit float with `mantissa` stored bits and smallest normal exponent `emin`
// (subnormals below it keep the spacing 2^(emin - mantissa)), ties to even; a result above
// `largest` becomes `overflow` with v's sign (NaN for e4m3fn, infinity for e5m2), and so does
// an infinity where the format has none.
float RoundFloat8(float v, int mantissa, int emin, float largest, float overflow) {
  if (std::isnan(v) || v == 0.0f) return v;
  if (std::isinf(v)) return std::isnan(overflow) ? overflow : v;
  const float a = std::fabs(v);
  int exp;
  std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1).
  const float ulp = std::ldexp(1.0f, std::max(exp - 1, emin) - mantissa);
  float r = std::nearbyint(a / ulp) * ulp;  // Default rounding mode: to nearest even.
  if (r > largest) r = overflow;
  return std::copysign(r, v);
}

float RoundE4m3(float v) {
  return RoundFloat8(v, 3, -6, 448.0f, std::numeric_limits<float>::quiet_NaN());
}

float RoundE5m2(float v) {
  return RoundFloat8(v, 2, -14, 57344.0f, std::numeric_limits<float>::infinity());
}

}  // namespace

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 4;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kF8E4M3:
      return "f8e4m3";
    case DType::kF8E5M2:
      return "f8e5m2";
  }
  return "f32";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "f8e4m3" || name == "float8_e4m3fn") return DType::kF8E4M3;
  if (name == "f8e5m2" || name == "float8_e5m2") return DType::kF8E5M2;
  return std::nullopt;
}

const std::vector<std::string>& DTypeNames() {
  static const std::vector<std::string> kNames = {
      "f32",     "bf16",     "f16",     "i32",   "f8e4m3",        "f8e5m2",
      "float32", "bfloat16", "float16", "int32", "float8_e4m3fn", "float8_e5m2"};
  return kNames;
}

bool IsFloat8(DType dtype) { return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2; }

float LargestFinite(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::numeric_limits<float>::max();
    case DType::kBF16:
      return std::bit_cast<float>(0x7f7f0000u);  // (2 - 2^-7) 2^127.
    case DType::kF16:
      return 65504.0f;
    case DType::kI32:
      return 2147483647.0f;
    case DType::kF8E4M3:
      return 448.0f;
    case DType::kF8E5M2:
      return 57344.0f;
  }
  return std::numeric_limits<float>::max();
}

float RoundToDType(DType dtype, float value) {
  switch (dtype) {
    case DType::kF32:
      return value;
    case DType::kBF16:
      return RoundBf16(value);
    case DType::kF16:
      return RoundF16(value);
    case DType::kF8E4M3:
      return RoundE4m3(value);
    case DType::kF8E5M2:
      return RoundE5m2(value);
    case DType::kI32: {
      if (std::isnan(value)) return 0.0f;
      constexpr float kLimit = 2147483520.0f;  // Largest float below 2^31.
      return std::nearbyint(std::clamp(value, -kLimit - 128.0f, kLimit));
    }
  }
  return value;
}

void RoundToDType(DType dtype, float* data, int64_t n) {
  // One loop per dtype, so the rounding inlines (and vectorizes for bf16).
  switch (dtype) {
    case DType::kF32:
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) data[i] = RoundBf16(data[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) data[i] = RoundF16(data[i]);
      return;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) data[i] = RoundE4m3(data[i]);
      return;
    case DType::kF8E5M2:
      for (int64_t i = 0; i < n; ++i) data[i] = RoundE5m2(data[i]);
      return;
    case DType::kI32:
      return;
  }
}

int32_t DoubleToInt32(double v) {
  if (std::isnan(v)) return 0;
  double r = std::nearbyint(v);
  if (r <= static_cast<double>(std::numeric_limits<int32_t>::min())) {
    return std::numeric_limits<int32_t>::min();
  }
  if (r >= static_cast<double>(std::numeric_limits<int32_t>::max())) {
    return std::numeric_limits<int32_t>::max();
  }
  return static_cast<int32_t>(r);
}

}  // namespace shardsim
