#include "collectives/array.h"

#include <cassert>
#include <stdexcept>
#include <utility>

namespace shardsim {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string FormatShape(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(shape[i]);
  }
  out += ']';
  return out;
}

namespace {

// Throws if a dimension is negative: shapes come from users.
void CheckShape(const Shape& shape) {
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + FormatShape(shape));
  }
}

}  // namespace

Array::Array(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  CheckShape(shape_);
  size_ = NumElements(shape_);
  values_.assign(static_cast<size_t>(size_), 0.0f);
  has_data_ = true;
}

Array Array::FromValues(DType dtype, Shape shape, std::vector<float> values) {
  CheckShape(shape);
  int64_t n = NumElements(shape);
  if (static_cast<int64_t>(values.size()) != n) {
    throw std::invalid_argument(std::to_string(values.size()) + " values for shape " +
                                FormatShape(shape) + ", which has " + std::to_string(n) +
                                " elements");
  }
  Array a;
  a.dtype_ = dtype;
  a.shape_ = std::move(shape);
  a.size_ = n;
  a.values_ = std::move(values);
  a.has_data_ = true;
  a.Round();
  return a;
}

Array Array::FromWords(DType dtype, Shape shape, std::vector<float> words) {
  Array a = FromValues(DType::kF32, std::move(shape), std::move(words));  // f32: no rounding.
  a.dtype_ = dtype;
  return a;
}

Array Array::FromInts(Shape shape, const std::vector<int32_t>& values) {
  std::vector<float> words(values.size());
  for (size_t i = 0; i < values.size(); ++i) words[i] = IntToWord(values[i]);
  return FromValues(DType::kI32, std::move(shape), std::move(words));
}

Array Array::FromNumbers(DType dtype, Shape shape, const std::vector<double>& values) {
  std::vector<float> words(values.size());
  if (dtype == DType::kI32) {
    for (size_t i = 0; i < values.size(); ++i) words[i] = IntToWord(DoubleToInt32(values[i]));
  } else {
    for (size_t i = 0; i < values.size(); ++i) words[i] = static_cast<float>(values[i]);
  }
  return FromValues(dtype, std::move(shape), std::move(words));
}

Array Array::ShapeOnly(DType dtype, Shape shape) {
  CheckShape(shape);
  Array a;
  a.dtype_ = dtype;
  a.size_ = NumElements(shape);
  a.shape_ = std::move(shape);
  return a;
}

void Array::Round() {
  if (!has_data_ || dtype_ == DType::kI32) return;
  assert(static_cast<int64_t>(values_.size()) == size());
  RoundToDType(dtype_, values_.data(), static_cast<int64_t>(values_.size()));
}

std::string Array::TypeString() const {
  return std::string(DTypeName(dtype_)) + FormatShape(shape_);
}

}  // namespace shardsim
