// A dense array: shape, dtype and (optionally) real data, row-major (C order).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/dtype.h"
#include "sim/units.h"

namespace shardsim {

// Dimensions of an array, outermost first.
using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar).
int64_t NumElements(const Shape& shape);
// "[1024,4096]".
std::string FormatShape(const Shape& shape);

// The storage word of the int32 `v`: its two's-complement bits in a float slot.
inline float IntToWord(int32_t v) { return std::bit_cast<float>(v); }
// The int32 an i32 array's storage word holds.
inline int32_t WordToInt(float w) { return std::bit_cast<int32_t>(w); }

// An array of `dtype` values. With data, elements are 32-bit words in row-major order: for
// f32/bf16/f16 the float32 value, already rounded to `dtype`; for i32 the int32 itself, its
// bits stored in the float slot (IntToWord / WordToInt), so integers are exact over the whole
// int32 range while copies, slices, shards and collective transfers move every dtype as the
// same opaque words (and the f32 paths stay plain float loops). Ops that compute on values
// dispatch on the dtype. Without data (timing-only runs, `--numerics off`) it carries only
// its shape and dtype, and every op on it computes shapes only.
class Array {
 public:
  // An empty f32 scalar without data.
  Array() = default;
  // Zeros of the given shape, with data (all-zero words are 0 in every dtype).
  Array(DType dtype, Shape shape);
  // Takes the storage words `values` (see the class comment: floats rounded to `dtype`, or
  // for i32 IntToWord of each integer); values.size() must equal NumElements(shape).
  static Array FromValues(DType dtype, Shape shape, std::vector<float> values);
  // Takes storage words already in `dtype`'s format (as data() of an array of that dtype
  // holds them): FromValues without the rounding pass.
  static Array FromWords(DType dtype, Shape shape, std::vector<float> words);
  // An i32 array of the integers `values`.
  static Array FromInts(Shape shape, const std::vector<int32_t>& values);
  // An array of `dtype` holding the numbers `values`: rounded to the dtype (i32: to the
  // nearest integer, saturating, NaN -> 0, as DoubleToInt32).
  static Array FromNumbers(DType dtype, Shape shape, const std::vector<double>& values);
  // Shape and dtype only, no data.
  static Array ShapeOnly(DType dtype, Shape shape);

  // Element type.
  DType dtype() const { return dtype_; }
  // Dimensions.
  const Shape& shape() const { return shape_; }
  // Number of dimensions.
  int rank() const { return static_cast<int>(shape_.size()); }
  // Number of elements.
  int64_t size() const { return size_; }
  // Bytes the array occupies on a device (elements times the dtype's size).
  Bytes bytes() const { return Bytes(size() * DTypeSize(dtype_)); }
  // Whether real values are held.
  bool has_data() const { return has_data_; }
  // Element storage words (only when has_data()); for i32 read them with WordToInt.
  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  // The storage words as a vector (only when has_data()).
  const std::vector<float>& values() const { return values_; }
  // The value at flat row-major index `i` as a float (an i32 value rounded to float).
  float at(int64_t i) const {
    float w = values_[static_cast<size_t>(i)];
    float as_int = static_cast<float>(WordToInt(w));  // Both, then a select: no branch in loops.
    return dtype_ == DType::kI32 ? as_int : w;
  }
  // The exact value at flat row-major index `i` (every int32 and float fits a double).
  double ValueAt(int64_t i) const {
    float w = values_[static_cast<size_t>(i)];
    return dtype_ == DType::kI32 ? static_cast<double>(WordToInt(w)) : static_cast<double>(w);
  }
  // The integer at flat index `i` of an i32 array.
  int32_t IntAt(int64_t i) const { return WordToInt(values_[static_cast<size_t>(i)]); }
  // Moves the values out, leaving a shape-only array of the same type.
  std::vector<float> TakeValues() {
    has_data_ = false;
    return std::move(values_);
  }
  // Rounds the stored values to the dtype (after writing through data()); no-op for i32,
  // whose words are integers already.
  void Round();
  // "f32[1024,4096]".
  std::string TypeString() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t size_ = 1;  // NumElements(shape_), kept: hot loops ask for it.
  std::vector<float> values_;
  bool has_data_ = false;
};

}  // namespace shardsim
