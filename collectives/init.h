// The initial values of a run file's global arrays (SPEC "init").
#pragma once

#include <cstdint>
#include <string>

#include "collectives/array.h"
#include "collectives/program.h"

namespace shardsim {

// Makes the global array `spec` describes. With `with_data` false it returns a shape-only
// array, but still checks a literal's element count and a file's header. Values:
// - zeros, ones; arange: 0, 1, 2, ... in row-major order;
// - uniform: element i is k * 2^-p with k the top p bits of the i-th SplitMix64 output
//   (see RandomBits), p = 24 (f32, i32), 8 (bf16), 11 (f16): exact in the dtype, in [0, 1);
// - normal: Box-Muller on pairs of 53-bit uniforms u1, u2 (outputs 2j and 2j+1):
//   element 2j = r cos(2 pi u2), element 2j+1 = r sin(2 pi u2), r = sqrt(-2 ln(1 - u1)),
//   computed in double and rounded to the dtype;
// - value: the literal (flat, NumElements(shape) values); file: a .npy file (relative paths
//   are resolved against `base_dir`) whose shape and dtype match the spec (a bf16 or f16
//   array may read '<f4'/'<f8' files, which is how NumPy stores bf16, rounding each value).
// All values are rounded to the dtype. Throws std::invalid_argument for a wrong literal
// count or an unreadable or mismatched file.
Array MakeInitialArray(const ArraySpec& spec, bool with_data, const std::string& base_dir);

// The random bits of element i: Mix(Mix(seed) + (i + 1) * 0x9e3779b97f4a7c15), Mix being
// SplitMix64's output function, i.e. the i-th output of SplitMix64 seeded with Mix(seed).
// Counter-based and platform-independent: any element can be made on its own.
uint64_t RandomBits(uint64_t seed, uint64_t i);

}  // namespace shardsim
