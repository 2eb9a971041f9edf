#include "collectives/moe_route.h"

#include <algorithm>
#include <string>

#include "collectives/kernel_support.h"

namespace shardsim {

using kernel::Fail;

RoutePriority RoutePriorityOf(const OpSpec& op) {
  return op.priority == "choice" ? RoutePriority::kChoice : RoutePriority::kToken;
}

DType MaskDType(const OpSpec& op) {
  const std::optional<DType> dtype = ParseDType(op.dtype);
  if (!dtype) Fail(OpKindName(op.kind), "unknown dtype '" + op.dtype + "'");
  return *dtype;
}

Array MoeRoute(const Array& indices, int64_t experts, int64_t capacity, RoutePriority priority,
               DType dtype) {
  const char* op = "moe_route";
  if (indices.rank() < 2 || indices.dtype() != DType::kI32) {
    Fail(op, "indices must be i32 [groups..., tokens, k], got " + indices.TypeString());
  }
  if (experts < 1 || capacity < 1) {
    Fail(op, "experts and capacity must be >= 1, got " + std::to_string(experts) + " and " +
                 std::to_string(capacity));
  }
  const Shape& is = indices.shape();
  Shape shape = is;
  shape.back() = experts;
  shape.push_back(capacity);
  if (!indices.has_data()) return Array::ShapeOnly(dtype, shape);
  const int64_t groups = kernel::Product(is, 0, is.size() - 2);
  const int64_t tokens = is[is.size() - 2];
  const int64_t choices = is.back();
  const int64_t slots = experts * capacity;
  std::vector<double> mask(static_cast<size_t>(NumElements(shape)), 0.0);
  std::vector<int64_t> filled(static_cast<size_t>(experts));
  for (int64_t g = 0; g < groups; ++g) {
    std::fill(filled.begin(), filled.end(), 0);
    // Assignment (s, j): token s's j-th choice takes its expert's next slot, if one is left.
    auto assign = [&](int64_t s, int64_t j) {
      const int64_t e = indices.IntAt((g * tokens + s) * choices + j);
      if (e < 0 || e >= experts) {
        Fail(op, "index " + std::to_string(e) + " is outside [0, " + std::to_string(experts) +
                     ") (the experts)");
      }
      const int64_t c = filled[static_cast<size_t>(e)]++;
      if (c < capacity) mask[static_cast<size_t>((g * tokens + s) * slots + e * capacity + c)] = 1;
    };
    if (priority == RoutePriority::kToken) {
      for (int64_t s = 0; s < tokens; ++s) {
        for (int64_t j = 0; j < choices; ++j) assign(s, j);
      }
    } else {
      for (int64_t j = 0; j < choices; ++j) {
        for (int64_t s = 0; s < tokens; ++s) assign(s, j);
      }
    }
  }
  return Array::FromNumbers(dtype, shape, mask);
}

OpCost MoeRouteCost(const std::vector<const Array*>& inputs,
                    const std::vector<const Array*>& outputs) {
  return OpCost{
      static_cast<double>(inputs.at(0)->size()),
      static_cast<double>(inputs.at(0)->bytes().count() + outputs.at(0)->bytes().count())};
}

double DroppedFraction(const Array& dispatch, const Shape& indices) {
  const int64_t assignments = NumElements(indices);
  if (assignments <= 0) return 0;
  double kept = 0;
  for (int64_t i = 0; i < dispatch.size(); ++i) kept += dispatch.ValueAt(i);
  return 1 - kept / static_cast<double>(assignments);
}

}  // namespace shardsim
