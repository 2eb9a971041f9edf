// A dense array: shape, dtype and (optionally) real data, row-major (C order).
#pragma once

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

// An array of `dtype` values. With data, elements are float32 in row-major order, already
// rounded to `dtype`. Without data (timing-only runs, `--numerics off`) it carries only its
// shape and dtype, and every op on it computes shapes only.
class Array {
 public:
  // An empty f32 scalar without data.
  Array() = default;
  // Zeros of the given shape, with data.
  Array(DType dtype, Shape shape);
  // Takes `values` (rounded to `dtype`); values.size() must equal NumElements(shape).
  static Array FromValues(DType dtype, Shape shape, std::vector<float> values);
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
  // Element storage (only when has_data()).
  float* data() { return values_.data(); }
  const float* data() const { return values_.data(); }
  // The values as a vector (only when has_data()).
  const std::vector<float>& values() const { return values_; }
  // Element at flat row-major index `i`.
  float at(int64_t i) const { return values_[static_cast<size_t>(i)]; }
  // Moves the values out, leaving a shape-only array of the same type.
  std::vector<float> TakeValues() {
    has_data_ = false;
    return std::move(values_);
  }
  // Rounds the stored values to the dtype (after writing through data()).
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
