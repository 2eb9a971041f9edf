// Reading and writing NumPy .npy files (format versions 1.0, 2.0 and 3.0, C order).
#pragma once

#include <cstdint>
#include <string>

#include "collectives/array.h"

namespace shardsim {

// What a .npy header says, after mapping its element type to a DType.
struct NpyHeader {
  std::string descr;          // The header's dtype string as written: "<f4", "<f8", ...
  DType dtype = DType::kF32;  // The closest DType: <f4,<f8 -> f32; <f2 -> f16; <i4,<i8 -> i32.
  Shape shape;                // Dimensions, outermost first.
  int64_t data_offset = 0;    // Bytes before the first element.
};

// Reads only the header of the .npy file at `path`. Accepts little-endian '<f4', '<f2',
// '<i4', '<f8' and '<i8' in C order; throws std::invalid_argument naming the path and the
// problem (missing file, bad magic, big-endian, fortran_order True, unsupported dtype).
NpyHeader ReadNpyHeader(const std::string& path);

// Reads a whole .npy file: '<f8' becomes f32 (rounded), '<i8' becomes i32 (values must fit
// in int32). Throws std::invalid_argument as ReadNpyHeader does, and for truncated data.
Array ReadNpy(const std::string& path);

// Writes `array` (which must hold data) to `path` atomically, C order, as '<f4' (f32 and
// bf16, which NumPy lacks), '<f2' (f16) or '<i4' (i32). Throws std::invalid_argument for an
// array without data and std::runtime_error if the file cannot be written.
void WriteNpy(const Array& array, const std::string& path);
// The bytes of the .npy file WriteNpy writes (the array must hold data).
std::string EncodeNpy(const Array& array);

// Converts IEEE half-precision bits to float (exact, including subnormals, inf and NaN).
float HalfBitsToFloat(uint16_t bits);
// Converts a float to the nearest IEEE half-precision bits (ties to even, overflow to inf).
uint16_t FloatToHalfBits(float value);

}  // namespace shardsim
