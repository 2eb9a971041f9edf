#include "collectives/init.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "collectives/npy.h"

namespace shardsim {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// SplitMix64's output function (Steele, Lea and Flood 2014).
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Significant bits a uniform value of `dtype` gets.
int UniformBits(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 8;
    case DType::kF16:
      return 11;
    case DType::kF8E4M3:
      return 4;
    case DType::kF8E5M2:
      return 3;
    case DType::kF32:
    case DType::kI32:
      return 24;
  }
  return 24;
}

// Fills `out` with uniform values of `dtype` precision in [0, 1).
void FillUniform(uint64_t seed, DType dtype, std::vector<float>& out) {
  int p = UniformBits(dtype);
  float scale = std::ldexp(1.0f, -p);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(RandomBits(seed, i) >> (64 - p)) * scale;
  }
}

// Fills `out` with standard normal values (Box-Muller on pairs).
void FillNormal(uint64_t seed, std::vector<float>& out) {
  constexpr double kUnit = 1.0 / 9007199254740992.0;  // 2^-53.
  for (size_t i = 0; i < out.size(); i += 2) {
    double u1 = static_cast<double>(RandomBits(seed, i) >> 11) * kUnit;
    double u2 = static_cast<double>(RandomBits(seed, i + 1) >> 11) * kUnit;
    double r = std::sqrt(-2.0 * std::log(1.0 - u1));  // 1 - u1 is in (0, 1].
    double theta = 2.0 * std::numbers::pi * u2;
    out[i] = static_cast<float>(r * std::cos(theta));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(r * std::sin(theta));
  }
}

// Reads and checks an init file; returns a shape-only array when `with_data` is false.
Array FromFile(const ArraySpec& spec, bool with_data, const std::string& base_dir) {
  std::filesystem::path path(spec.init.file);
  if (path.is_relative() && !base_dir.empty()) path = std::filesystem::path(base_dir) / path;
  NpyHeader header = ReadNpyHeader(path.string());
  // Half-precision arrays may start from float32/float64 data, rounded to their dtype.
  bool half = spec.dtype == DType::kBF16 || spec.dtype == DType::kF16 || IsFloat8(spec.dtype);
  bool dtype_ok =
      header.dtype == spec.dtype || (half && (header.descr == "<f4" || header.descr == "<f8"));
  if (header.shape != spec.shape || !dtype_ok) {
    throw std::invalid_argument(path.string() + " holds '" + header.descr + "' " +
                                FormatShape(header.shape) + ", but the array is " +
                                DTypeName(spec.dtype) + FormatShape(spec.shape));
  }
  if (!with_data) return Array::ShapeOnly(spec.dtype, spec.shape);
  Array read = ReadNpy(path.string());
  if (read.dtype() == spec.dtype) return read;
  return Array::FromValues(spec.dtype, spec.shape, read.values());  // f32 -> bf16 or f16.
}

}  // namespace

uint64_t RandomBits(uint64_t seed, uint64_t i) { return Mix(Mix(seed) + (i + 1) * kGolden); }

Array MakeInitialArray(const ArraySpec& spec, bool with_data, const std::string& base_dir) {
  const InitSpec& init = spec.init;
  int64_t n = NumElements(spec.shape);
  if (init.kind == InitSpec::Kind::kFile) return FromFile(spec, with_data, base_dir);
  if (init.kind == InitSpec::Kind::kValue && static_cast<int64_t>(init.values.size()) != n) {
    throw std::invalid_argument("the value has " + std::to_string(init.values.size()) +
                                " elements, but shape " + FormatShape(spec.shape) + " needs " +
                                std::to_string(n));
  }
  if (!with_data) return Array::ShapeOnly(spec.dtype, spec.shape);
  std::vector<float> values(static_cast<size_t>(n), 0.0f);
  switch (init.kind) {
    case InitSpec::Kind::kZeros:
      break;
    case InitSpec::Kind::kOnes:
      std::fill(values.begin(), values.end(), 1.0f);
      break;
    case InitSpec::Kind::kArange:
      for (int64_t i = 0; i < n; ++i) {
        values[i] = static_cast<float>(init.modulus > 0 ? i % init.modulus : i);
      }
      break;
    case InitSpec::Kind::kUniform:
      FillUniform(init.seed, spec.dtype, values);
      break;
    case InitSpec::Kind::kNormal:
      FillNormal(init.seed, values);
      break;
    case InitSpec::Kind::kValue:
      // Rounded to float32 here as float arrays are made; i32 arrays read the doubles below.
      for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(init.values[i]);
      break;
    case InitSpec::Kind::kFile:
      break;  // Handled above.
  }
  if (spec.dtype != DType::kI32) {
    return Array::FromValues(spec.dtype, spec.shape, std::move(values));
  }
  // Integers are made exactly: arange counts in int64 and literals are read from their doubles
  // (float32 would stop at 2^24: 16777217 read as 16777216); the other inits convert their
  // float values to the nearest integer.
  std::vector<int32_t> ints(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = init.modulus > 0 ? i % init.modulus : i;
    switch (init.kind) {
      case InitSpec::Kind::kArange:
        ints[i] = static_cast<int32_t>(static_cast<uint32_t>(k));
        break;
      case InitSpec::Kind::kValue:
        ints[i] = DoubleToInt32(init.values[i]);
        break;
      default:
        ints[i] = DoubleToInt32(values[i]);
    }
  }
  return Array::FromInts(spec.shape, ints);
}

}  // namespace shardsim
