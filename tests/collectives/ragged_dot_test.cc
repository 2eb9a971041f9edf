// jax.lax.ragged_dot and its rhs cotangent: hand-computed groups (empty groups, rows past the
// groups), the type and size checks with their messages, and the cost.
#include "collectives/ragged_dot.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/ir/op_registry.h"

namespace shardsim {
namespace {

std::vector<float> Flat(const Array& a) {
  std::vector<float> v;
  for (int64_t i = 0; i < a.size(); ++i) v.push_back(a.at(i));
  return v;
}

// lhs rows [0, 1], [2, 3], [4, 5], [6, 7], [8, 9]; groups of 2 and 2 rows (row 4 is past
// them); rhs[0] = [[1, 0, 0], [0, 1, 0]], rhs[1] = [[1, 1, 1], [2, 2, 2]].
Array Lhs() { return Array::FromNumbers(DType::kF32, {5, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}); }
Array Rhs() {
  return Array::FromNumbers(DType::kF32, {2, 2, 3}, {1, 0, 0, 0, 1, 0, 1, 1, 1, 2, 2, 2});
}

TEST(RaggedDotTest, EachGroupTakesItsOwnBlock) {
  const Array sizes = Array::FromInts({2}, {2, 2});
  // Rows 0, 1 by rhs[0]: [0, 1, 0], [2, 3, 0]; rows 2, 3 by rhs[1]: 4 + 2 * 5 = 14 and
  // 6 + 2 * 7 = 20 in every column; row 4 is in no group: zeros.
  EXPECT_EQ(Flat(RaggedDot(Lhs(), Rhs(), sizes)),
            (std::vector<float>{0, 1, 0, 2, 3, 0, 14, 14, 14, 20, 20, 20, 0, 0, 0}));
  // An empty first group: rows 0..3 all take rhs[1].
  EXPECT_EQ(Flat(RaggedDot(Lhs(), Rhs(), Array::FromInts({2}, {0, 4}))),
            (std::vector<float>{2, 2, 2, 8, 8, 8, 14, 14, 14, 20, 20, 20, 0, 0, 0}));
}

TEST(RaggedDotTest, RhsCotangentSumsEachGroupsRows) {
  const Array g = Array::FromNumbers(DType::kF32, {5, 3}, std::vector<double>(15, 1.0));
  // Group 0 (rows 0, 1): column sums of lhs 0 + 2 = 2 and 1 + 3 = 4, times a row of ones;
  // group 1 (rows 2, 3): 4 + 6 = 10 and 5 + 7 = 12. Row 4 adds to neither.
  EXPECT_EQ(Flat(RaggedDotRhsGrad(Lhs(), g, Array::FromInts({2}, {2, 2}))),
            (std::vector<float>{2, 2, 2, 4, 4, 4, 10, 10, 10, 12, 12, 12}));
}

std::string Refusal(const Array& lhs, const Array& rhs, const Array& sizes) {
  try {
    RaggedDot(lhs, rhs, sizes);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(RaggedDotTest, Refusals) {
  EXPECT_EQ(Refusal(Lhs(), Rhs(), Array::FromInts({2}, {3, 3})),
            "ragged_dot: group_sizes reach row 6 of lhs f32[5,2]");
  EXPECT_EQ(Refusal(Lhs(), Rhs(), Array::FromInts({2}, {-1, 3})),
            "ragged_dot: group 0 has size -1");
  EXPECT_EQ(Refusal(Lhs(), Rhs(), Array::FromInts({3}, {1, 1, 1})),
            "ragged_dot: group_sizes must be i32[2] (one entry per group), got i32[3]");
  EXPECT_EQ(Refusal(Lhs(), Array::ShapeOnly(DType::kF32, {2, 3, 3}), Array::FromInts({2}, {1, 1})),
            "ragged_dot: lhs f32[5,2] and rhs f32[2,3,3] differ in the contracting dimension");
  EXPECT_EQ(Refusal(Lhs(), Array::ShapeOnly(DType::kBF16, {2, 2, 3}), Array::FromInts({2}, {1, 1})),
            "ragged_dot: lhs and rhs must be float arrays of one dtype, got f32[5,2] and "
            "bf16[2,2,3]");
  EXPECT_EQ(Refusal(Lhs(), Lhs(), Array::FromInts({2}, {1, 1})),
            "ragged_dot: takes lhs [m, k], rhs [g, k, n] and group_sizes [g], got f32[5,2], "
            "f32[5,2] and i32[2]");
}

TEST(RaggedDotTest, ShapeOnlyInputsGiveTheShape) {
  const Array out =
      RaggedDot(Array::ShapeOnly(DType::kBF16, {64, 16}),
                Array::ShapeOnly(DType::kBF16, {8, 16, 32}), Array::ShapeOnly(DType::kI32, {8}));
  EXPECT_FALSE(out.has_data());
  EXPECT_EQ(out.TypeString(), "bf16[64,32]");
}

// Without data: 2 m k n FLOPs (each row against one block) and every buffer once; with
// expected_rows r, 2 r k n and r rows of lhs and of the result. With group sizes that hold
// data, the rows they fill (here 3 + 0 + 10 = 13 of 64), for the product and for the rhs
// cotangent (which writes its [g, k, n] whole).
TEST(RaggedDotTest, CostCountsTheRowsTheGroupsFill) {
  const Array lhs = Array::ShapeOnly(DType::kBF16, {64, 16});
  const Array rhs = Array::ShapeOnly(DType::kBF16, {3, 16, 32});
  const Array sizes = Array::ShapeOnly(DType::kI32, {3});
  const Array out = Array::ShapeOnly(DType::kBF16, {64, 32});
  OpSpec dot;
  dot.kind = OpKind::kRaggedDot;
  OpCost c = RaggedDotCost(dot, {&lhs, &rhs, &sizes}, {&out});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 64 * 16 * 32);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (64 * 16 + 3 * 16 * 32 + 64 * 32) + 4 * 3);
  dot.expected_rows = 16;
  c = RaggedDotCost(dot, {&lhs, &rhs, &sizes}, {&out});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 16 * 16 * 32);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (16 * 16 + 3 * 16 * 32 + 16 * 32) + 4 * 3);
  const Array filled = Array::FromInts({3}, {3, 0, 10});
  c = RaggedDotCost(dot, {&lhs, &rhs, &filled}, {&out});  // Data overrides expected_rows.
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 13 * 16 * 32);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (13 * 16 + 3 * 16 * 32 + 13 * 32) + 4 * 3);
  OpSpec grad;
  grad.kind = OpKind::kRaggedDotRhsGrad;
  const Array g = Array::ShapeOnly(DType::kBF16, {64, 32});
  const Array d_rhs = Array::ShapeOnly(DType::kBF16, {3, 16, 32});
  c = RaggedDotCost(grad, {&lhs, &g, &filled}, {&d_rhs});
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 13 * 16 * 32);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (13 * 16 + 13 * 32 + 3 * 16 * 32) + 4 * 3);
  EXPECT_EQ(FindOp("ragged_dot")->arity, OpArity::kThree);
  EXPECT_TRUE(FindOp("ragged_dot")->cost_reads_data);
}

}  // namespace
}  // namespace shardsim
