// Small helpers the local-op kernel files share (local_ops.cc, nn_ops.cc, grad_ops.cc,
// local_op.cc): their error form, axis normalization, shape-only detection, and arrays seen as
// rows along one axis. Internal to the collectives library's kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collectives/array.h"

namespace shardsim::kernel {

// Throws std::invalid_argument("OP: WHAT").
[[noreturn]] inline void Fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// An axis in [-rank, rank) as an index in [0, rank); `type` names the array in the error.
inline int NormalizeAxis(const char* op, int64_t axis, int rank, const std::string& type) {
  if (axis < -rank || axis >= rank) {
    Fail(op, "axis " + std::to_string(axis) + " is out of range for " + type);
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// NormalizeAxis for an axis of `a`.
inline int NormalizeAxis(const char* op, int64_t axis, const Array& a) {
  return NormalizeAxis(op, axis, a.rank(), a.TypeString());
}

// Whether any input lacks data (then ops compute shapes only).
inline bool AnyShapeOnly(std::initializer_list<const Array*> arrays) {
  return std::any_of(arrays.begin(), arrays.end(), [](const Array* a) { return !a->has_data(); });
}

// Product of shape[begin, end).
inline int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

// An array seen as rows along one axis: element i of row (o, j) at (o * n + i) * inner + j.
struct Rows {
  int64_t outer = 1;  // Product of the dimensions before the axis.
  int64_t n = 1;      // The axis's length.
  int64_t inner = 1;  // Product of the dimensions after it.
  // Flat index of element i of row (o, j).
  int64_t At(int64_t o, int64_t i, int64_t j) const { return (o * n + i) * inner + j; }
  // Number of rows.
  int64_t count() const { return outer * inner; }
};

// `shape` seen as rows along `axis` (in [0, rank)).
inline Rows RowsAlong(const Shape& shape, int axis) {
  return Rows{Product(shape, 0, static_cast<size_t>(axis)), shape[static_cast<size_t>(axis)],
              Product(shape, static_cast<size_t>(axis) + 1, shape.size())};
}

// Calls fn(o, j) for every row of `rows`.
template <typename Fn>
void ForEachRow(const Rows& rows, Fn fn) {
  for (int64_t o = 0; o < rows.outer; ++o) {
    for (int64_t j = 0; j < rows.inner; ++j) fn(o, j);
  }
}

// The largest of a row of n values get(i), NaN if any is (jnp.max propagates NaN).
template <typename Get>
double RowMax(int64_t n, const Get& get) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const double v = get(i);
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return m;
}

// A one-output result. (`return {array};` would copy: initializer lists hold const elements.)
inline std::vector<Array> One(Array a) {
  std::vector<Array> out;
  out.push_back(std::move(a));
  return out;
}

}  // namespace shardsim::kernel
