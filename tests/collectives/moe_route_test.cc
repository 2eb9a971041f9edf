// moe_route (collectives/moe_route.h) and one_hot: the capacity routing on fixed choices worked
// out by hand for both priorities, groups routing alone, the dropped fraction, shapes, errors
// and cost.
#include "collectives/moe_route.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/nn_ops.h"

namespace shardsim {
namespace {

// The (group, token, expert, slot) of every 1 of a mask [G, S, E, C].
std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> Ones(const Array& mask) {
  const Shape& s = mask.shape();
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> ones;
  for (int64_t i = 0; i < mask.size(); ++i) {
    const double v = mask.ValueAt(i);
    EXPECT_TRUE(v == 0 || v == 1) << v;
    if (v == 0) continue;
    ones.insert({i / (s[1] * s[2] * s[3]), i / (s[2] * s[3]) % s[1], i / s[3] % s[2], i % s[3]});
  }
  return ones;
}

// Four tokens' two choices among 3 experts of capacity 2:
//   token 0: experts 0, 1   token 1: 0, 2   token 2: 0, 1   token 3: 1, 0
Array Choices(int64_t groups = 1) {
  std::vector<int32_t> one = {0, 1, 0, 2, 0, 1, 1, 0};
  std::vector<int32_t> all;
  all.reserve(one.size() * static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    for (int32_t e : one) all.push_back(e);
  }
  return Array::FromInts({groups, 4, 2}, all);
}

// Token priority (MaxText): token by token, each token's choices in turn. Token 0 takes slot 0
// of experts 0 and 1; token 1 slot 1 of expert 0 and slot 0 of expert 2; token 2 finds expert
// 0 full (dropped) and takes slot 1 of expert 1; token 3 finds experts 1 and 0 full: 3 of 8
// assignments dropped.
TEST(MoeRouteTest, TokenPriorityFillsTokenByToken) {
  const Array mask = MoeRoute(Choices(), 3, 2, RoutePriority::kToken, DType::kF32);
  EXPECT_EQ(mask.shape(), (Shape{1, 4, 3, 2}));
  using T = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  EXPECT_EQ(Ones(mask),
            (std::set<T>{{0, 0, 0, 0}, {0, 0, 1, 0}, {0, 1, 0, 1}, {0, 1, 2, 0}, {0, 2, 1, 1}}));
  EXPECT_DOUBLE_EQ(DroppedFraction(mask, Choices().shape()), 3.0 / 8);
}

// Choice priority (GShard): every first choice in token order, then every second. Firsts:
// tokens 0 and 1 take expert 0's slots, token 2 is dropped, token 3 takes expert 1 slot 0;
// seconds: token 0 expert 1 slot 1, token 1 expert 2 slot 0, tokens 2 and 3 dropped.
TEST(MoeRouteTest, ChoicePriorityFillsFirstChoicesFirst) {
  const Array mask = MoeRoute(Choices(), 3, 2, RoutePriority::kChoice, DType::kBF16);
  EXPECT_EQ(mask.dtype(), DType::kBF16);
  using T = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  EXPECT_EQ(Ones(mask),
            (std::set<T>{{0, 0, 0, 0}, {0, 1, 0, 1}, {0, 3, 1, 0}, {0, 0, 1, 1}, {0, 1, 2, 0}}));
}

// Each group has its own slots: three groups with the same choices route alike.
TEST(MoeRouteTest, GroupsRouteAlone) {
  const Array one = MoeRoute(Choices(), 3, 2, RoutePriority::kToken, DType::kF32);
  const Array three = MoeRoute(Choices(3), 3, 2, RoutePriority::kToken, DType::kF32);
  const auto ones = Ones(one);
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> want;
  for (int64_t g = 0; g < 3; ++g) {
    for (const auto& [zero, s, e, c] : ones) want.insert({g, s, e, c});
  }
  EXPECT_EQ(Ones(three), want);
}

// With room for every assignment nothing is dropped; each token's chosen experts hold exactly
// one 1 each and the others none.
TEST(MoeRouteTest, EnoughCapacityKeepsEveryAssignment) {
  const Array mask = MoeRoute(Choices(), 3, 4, RoutePriority::kToken, DType::kF32);
  EXPECT_DOUBLE_EQ(DroppedFraction(mask, Choices().shape()), 0.0);
  const Array choices = Choices();
  for (int64_t s = 0; s < 4; ++s) {
    for (int64_t e = 0; e < 3; ++e) {
      double ones = 0;
      for (int64_t c = 0; c < 4; ++c) ones += mask.ValueAt((s * 3 + e) * 4 + c);
      const bool chosen = choices.IntAt(2 * s) == e || choices.IntAt(2 * s + 1) == e;
      EXPECT_EQ(ones, chosen ? 1 : 0) << s << " " << e;
    }
  }
}

TEST(MoeRouteTest, ShapesErrorsAndCost) {
  const Array shape_only = Array::ShapeOnly(DType::kI32, {2, 8, 2});
  const Array mask = MoeRoute(shape_only, 4, 5, RoutePriority::kToken, DType::kBF16);
  EXPECT_FALSE(mask.has_data());
  EXPECT_EQ(mask.shape(), (Shape{2, 8, 4, 5}));
  EXPECT_THROW(MoeRoute(Array::FromInts({1, 1, 1}, {3}), 3, 1, RoutePriority::kToken, DType::kF32),
               std::invalid_argument);  // Index 3 of 3 experts.
  EXPECT_THROW(
      MoeRoute(Array::ShapeOnly(DType::kF32, {1, 2, 1}), 3, 1, RoutePriority::kToken, DType::kF32),
      std::invalid_argument);  // Float indices.
  EXPECT_THROW(
      MoeRoute(Array::ShapeOnly(DType::kI32, {2}), 3, 1, RoutePriority::kToken, DType::kF32),
      std::invalid_argument);  // No token axis.
  // As a local op, from its registry entry and attributes; its cost writes the mask whole.
  OpSpec op;
  op.kind = OpKind::kMoeRoute;
  op.experts = 4;
  op.capacity = 5;
  op.dtype = "bf16";
  op.priority = "choice";
  EXPECT_EQ(CheckAttrs(op), std::nullopt);
  const Array out = ApplyNnOp(op, {&shape_only}).at(0);
  EXPECT_EQ(out.TypeString(), "bf16[2,8,4,5]");
  const OpCost cost = LocalOpCost(op, {&shape_only}, {&out});
  EXPECT_EQ(cost.flops, 32);                          // One count per assignment.
  EXPECT_EQ(cost.bytes, 32 * 4 + 2 * 8 * 4 * 5 * 2);  // The indices read, the mask written.
}

TEST(OneHotTest, MarksEachIdsClassAndZeroesOutOfRangeIds) {
  const Array ids = Array::FromInts({2, 2}, {1, 0, 3, -1});
  const Array hot = OneHot(ids, 3, DType::kF32);
  EXPECT_EQ(hot.shape(), (Shape{2, 2, 3}));
  const std::vector<double> want = {0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < hot.size(); ++i) EXPECT_EQ(hot.ValueAt(i), want[i]) << i;
  EXPECT_THROW(OneHot(Array::ShapeOnly(DType::kF32, {2}), 3, DType::kF32), std::invalid_argument);
}

}  // namespace
}  // namespace shardsim
