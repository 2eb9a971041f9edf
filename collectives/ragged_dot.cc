#include "collectives/ragged_dot.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardsim {
namespace {

[[noreturn]] void Fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// Checks that `a` and `b` are float arrays of one dtype and group_sizes is i32 [groups].
void CheckTypes(const char* op, const Array& a, const Array& b, const Array& group_sizes,
                int64_t groups) {
  if (a.dtype() == DType::kI32 || a.dtype() != b.dtype()) {
    Fail(op, "lhs and " + std::string(b.rank() == 3 ? "rhs" : "g") +
                 " must be float arrays of one dtype, got " + a.TypeString() + " and " +
                 b.TypeString());
  }
  if (group_sizes.dtype() != DType::kI32 || group_sizes.rank() != 1 ||
      group_sizes.shape()[0] != groups) {
    Fail(op, "group_sizes must be i32[" + std::to_string(groups) + "] (one entry per group), got " +
                 group_sizes.TypeString());
  }
}

// The first row of each group and, last, the end of the last: group e is rows
// [starts[e], starts[e + 1]). Refuses negative sizes and sizes summing past `rows`.
std::vector<int64_t> GroupStarts(const char* op, const Array& group_sizes, int64_t rows,
                                 const Array& lhs) {
  std::vector<int64_t> starts = {0};
  for (int64_t e = 0; e < group_sizes.size(); ++e) {
    const int64_t size = group_sizes.IntAt(e);
    if (size < 0) Fail(op, "group " + std::to_string(e) + " has size " + std::to_string(size));
    if (starts.back() + size > rows) {
      Fail(op, "group_sizes reach row " + std::to_string(starts.back() + size) + " of lhs " +
                   lhs.TypeString());
    }
    starts.push_back(starts.back() + size);
  }
  return starts;
}

}  // namespace

Array RaggedDot(const Array& lhs, const Array& rhs, const Array& group_sizes) {
  const char* op = "ragged_dot";
  if (lhs.rank() != 2 || rhs.rank() != 3) {
    Fail(op, "takes lhs [m, k], rhs [g, k, n] and group_sizes [g], got " + lhs.TypeString() + ", " +
                 rhs.TypeString() + " and " + group_sizes.TypeString());
  }
  CheckTypes(op, lhs, rhs, group_sizes, rhs.shape()[0]);
  const int64_t m = lhs.shape()[0], k = lhs.shape()[1], n = rhs.shape()[2];
  if (rhs.shape()[1] != k) {
    Fail(op, "lhs " + lhs.TypeString() + " and rhs " + rhs.TypeString() +
                 " differ in the contracting dimension");
  }
  const Shape out_shape{m, n};
  if (!lhs.has_data() || !rhs.has_data() || !group_sizes.has_data()) {
    return Array::ShapeOnly(lhs.dtype(), out_shape);
  }
  const std::vector<int64_t> starts = GroupStarts(op, group_sizes, m, lhs);
  std::vector<float> out(static_cast<size_t>(m * n), 0.0f);
  std::vector<double> acc(static_cast<size_t>(n));
  for (size_t e = 0; e + 1 < starts.size(); ++e) {
    const float* w = rhs.data() + static_cast<int64_t>(e) * k * n;
    for (int64_t r = starts[e]; r < starts[e + 1]; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t c = 0; c < k; ++c) {
        const double a = lhs.data()[r * k + c];
        for (int64_t j = 0; j < n; ++j) acc[j] += a * w[c * n + j];
      }
      for (int64_t j = 0; j < n; ++j) out[r * n + j] = static_cast<float>(acc[j]);
    }
  }
  return Array::FromValues(lhs.dtype(), out_shape, std::move(out));
}

Array RaggedDotRhsGrad(const Array& lhs, const Array& g, const Array& group_sizes) {
  const char* op = "ragged_dot_rhs_grad";
  if (lhs.rank() != 2 || g.rank() != 2 || g.shape()[0] != lhs.shape()[0] ||
      group_sizes.rank() != 1) {
    Fail(op, "takes lhs [m, k], g [m, n] and group_sizes [groups], got " + lhs.TypeString() + ", " +
                 g.TypeString() + " and " + group_sizes.TypeString());
  }
  const int64_t groups = group_sizes.shape()[0];
  CheckTypes(op, lhs, g, group_sizes, groups);
  const int64_t m = lhs.shape()[0], k = lhs.shape()[1], n = g.shape()[1];
  const Shape out_shape{groups, k, n};
  if (!lhs.has_data() || !g.has_data() || !group_sizes.has_data()) {
    return Array::ShapeOnly(lhs.dtype(), out_shape);
  }
  const std::vector<int64_t> starts = GroupStarts(op, group_sizes, m, lhs);
  std::vector<float> out(static_cast<size_t>(groups * k * n), 0.0f);
  std::vector<double> acc(static_cast<size_t>(n));
  for (int64_t e = 0; e < groups; ++e) {
    for (int64_t c = 0; c < k; ++c) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t r = starts[e]; r < starts[e + 1]; ++r) {
        const double a = lhs.data()[r * k + c];
        for (int64_t j = 0; j < n; ++j) acc[j] += a * g.data()[r * n + j];
      }
      for (int64_t j = 0; j < n; ++j) out[(e * k + c) * n + j] = static_cast<float>(acc[j]);
    }
  }
  return Array::FromValues(lhs.dtype(), out_shape, std::move(out));
}

OpCost RaggedDotCost(const OpSpec& op, const std::vector<const Array*>& inputs,
                     const std::vector<const Array*>& outputs) {
  // lhs [m, k] is inputs[0] for both ops; n is the result's last dimension for both.
  const Shape& lhs = inputs.at(0)->shape();
  const int64_t m = lhs.at(0);
  int64_t rows = m;
  if (const Array& sizes = *inputs.at(2); sizes.has_data()) {
    rows = 0;
    for (int64_t e = 0; e < sizes.size(); ++e) rows += std::max<int64_t>(0, sizes.IntAt(e));
  } else if (op.expected_rows > 0) {
    rows = op.expected_rows;
  }
  rows = std::min(rows, m);
  const double filled = m > 0 ? static_cast<double>(rows) / static_cast<double>(m) : 0;
  const double n = static_cast<double>(outputs.at(0)->shape().back());
  // Row-indexed operands and results move their filled rows; the others move whole: ragged_dot
  // reads lhs's rows and rhs and writes rows of [m, n]; the rhs cotangent reads lhs's and g's
  // rows and writes [g, k, n].
  auto bytes = [](const Array* a) { return static_cast<double>(a->bytes().count()); };
  const bool rhs_grad = op.kind == OpKind::kRaggedDotRhsGrad;
  double moved = filled * bytes(inputs[0]) + bytes(inputs[2]);
  moved += rhs_grad ? filled * bytes(inputs[1]) + bytes(outputs[0])
                    : bytes(inputs[1]) + filled * bytes(outputs[0]);
  return OpCost{2.0 * static_cast<double>(rows) * static_cast<double>(lhs.at(1)) * n, moved};
}

}  // namespace shardsim
