// Reference semantics of the collectives: every expected array below is written out by hand
// from JAX's definitions (jax.lax.psum ... axis_index); none is produced by the code under
// test.
#include "collectives/semantics.h"

#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardsim {
namespace {

// dp=n, devices 0..n-1.
Mesh Mesh1D(int n) {
  std::vector<int> devices(n);
  std::iota(devices.begin(), devices.end(), 0);
  return Mesh({{"dp", n}}, devices);
}

// dp=2, tp=2 (dp major): position p = 2*dp + tp.
Mesh Mesh2x2() { return Mesh({{"dp", 2}, {"tp", 2}}, {0, 1, 2, 3}); }

OpSpec Op(OpKind kind, std::vector<std::string> axis_name) {
  OpSpec op;
  op.kind = kind;
  op.axis_name = std::move(axis_name);
  return op;
}

// One block per position: block p holds offset + scale * p + k for k = 0, 1, ... (arange).
std::vector<Array> ArangeBlocks(int positions, const Shape& shape, float scale = 10,
                                float offset = 0, DType dtype = DType::kF32) {
  std::vector<Array> blocks;
  for (int p = 0; p < positions; ++p) {
    std::vector<float> v(static_cast<size_t>(NumElements(shape)));
    for (size_t k = 0; k < v.size(); ++k) v[k] = offset + scale * p + static_cast<float>(k);
    blocks.push_back(Array::FromValues(dtype, shape, v));
  }
  return blocks;
}

void ExpectArray(const Array& a, const Shape& shape, const std::vector<float>& values,
                 DType dtype = DType::kF32) {
  EXPECT_EQ(a.dtype(), dtype);
  ASSERT_EQ(a.shape(), shape) << "got " << a.TypeString();
  ASSERT_TRUE(a.has_data());
  std::vector<float> got(static_cast<size_t>(a.size()));
  for (int64_t i = 0; i < a.size(); ++i) got[i] = a.at(i);  // i32: the integers' values.
  EXPECT_EQ(got, values) << "for " << a.TypeString();
}

void ExpectThrowsWith(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument containing \"" << needle << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// ---- psum / pmean / pmax / pmin ----------------------------------------------------------

TEST(ReductionTest, PsumOverOneAxis) {
  // Blocks [0,1], [10,11], [20,21], [30,31].
  auto out = ReferenceCollective(Op(OpKind::kPsum, {"dp"}), Mesh1D(4), ArangeBlocks(4, {2}));
  ASSERT_EQ(out.size(), 4u);
  for (int p = 0; p < 4; ++p) ExpectArray(out[p], {2}, {60, 64});
}

TEST(ReductionTest, PmeanOverOneAxis) {
  auto out = ReferenceCollective(Op(OpKind::kPmean, {"dp"}), Mesh1D(4), ArangeBlocks(4, {2}));
  for (int p = 0; p < 4; ++p) ExpectArray(out[p], {2}, {15, 16});
}

TEST(ReductionTest, PmaxAndPminOverOneAxis) {
  std::vector<Array> in = {
      Array::FromValues(DType::kF32, {2}, {1, 8}), Array::FromValues(DType::kF32, {2}, {5, 2}),
      Array::FromValues(DType::kF32, {2}, {3, 3}), Array::FromValues(DType::kF32, {2}, {-4, 6})};
  auto max = ReferenceCollective(Op(OpKind::kPmax, {"dp"}), Mesh1D(4), in);
  auto min = ReferenceCollective(Op(OpKind::kPmin, {"dp"}), Mesh1D(4), in);
  for (int p = 0; p < 4; ++p) {
    ExpectArray(max[p], {2}, {5, 8});
    ExpectArray(min[p], {2}, {-4, 2});
  }
}

TEST(ReductionTest, PsumOverEachAxisAndTheTuple) {
  // 2x2 mesh; block p = [10p, 10p+1].
  const Mesh mesh = Mesh2x2();
  const auto in = ArangeBlocks(4, {2});
  auto tp = ReferenceCollective(Op(OpKind::kPsum, {"tp"}), mesh, in);  // {0,1}, {2,3}
  ExpectArray(tp[0], {2}, {10, 12});
  ExpectArray(tp[1], {2}, {10, 12});
  ExpectArray(tp[2], {2}, {50, 52});
  ExpectArray(tp[3], {2}, {50, 52});
  auto dp = ReferenceCollective(Op(OpKind::kPsum, {"dp"}), mesh, in);  // {0,2}, {1,3}
  ExpectArray(dp[0], {2}, {20, 22});
  ExpectArray(dp[1], {2}, {40, 42});
  ExpectArray(dp[2], {2}, {20, 22});
  ExpectArray(dp[3], {2}, {40, 42});
  for (auto axes : {std::vector<std::string>{"dp", "tp"}, std::vector<std::string>{"tp", "dp"}}) {
    auto all = ReferenceCollective(Op(OpKind::kPsum, axes), mesh, in);
    for (int p = 0; p < 4; ++p) ExpectArray(all[p], {2}, {60, 64});
  }
}

TEST(ReductionTest, PmaxAndPmeanOverTuple) {
  const Mesh mesh = Mesh2x2();
  const auto in = ArangeBlocks(4, {2});
  auto max = ReferenceCollective(Op(OpKind::kPmax, {"tp", "dp"}), mesh, in);
  auto mean = ReferenceCollective(Op(OpKind::kPmean, {"dp", "tp"}), mesh, in);
  for (int p = 0; p < 4; ++p) {
    ExpectArray(max[p], {2}, {30, 31});
    ExpectArray(mean[p], {2}, {15, 16});
  }
}

TEST(ReductionTest, ResultIsRoundedToTheDtype) {
  // bf16: 256 + 1 = 257 lies halfway between 256 and 258; ties to even gives 256.
  std::vector<Array> bf = {
      Array::FromValues(DType::kBF16, {1}, {256}), Array::FromValues(DType::kBF16, {1}, {1}),
      Array::FromValues(DType::kBF16, {1}, {0}), Array::FromValues(DType::kBF16, {1}, {0})};
  auto sum = ReferenceCollective(Op(OpKind::kPsum, {"dp"}), Mesh1D(4), bf);
  ExpectArray(sum[0], {1}, {256}, DType::kBF16);
  // i32 pmean is f32, as in JAX (psum, then true division): (0 + 1 + 1 + 3) / 4 = 1.25.
  std::vector<Array> i32 = {Array::FromInts({1}, {0}), Array::FromInts({1}, {1}),
                            Array::FromInts({1}, {1}), Array::FromInts({1}, {3})};
  auto mean = ReferenceCollective(Op(OpKind::kPmean, {"dp"}), Mesh1D(4), i32);
  ExpectArray(mean[3], {1}, {1.25f}, DType::kF32);
  EXPECT_EQ(CollectiveOutputDType(Op(OpKind::kPmean, {"dp"}), DType::kI32), DType::kF32);
  EXPECT_EQ(CollectiveOutputDType(Op(OpKind::kPsum, {"dp"}), DType::kI32), DType::kI32);
}

TEST(ReductionTest, Int32SumsWrapAndExtremesAreExact) {
  // XLA adds int32 modulo 2^32: 4 * 2^30 = 2^32 wraps to 0, 2^31 - 1 + 1 to -2^31; above
  // 2^24 every integer stays exact (16777217 + 0 + 0 + 0 would be 16777216 in float32).
  const int32_t kMax = 2147483647;
  std::vector<Array> in;
  for (int p = 0; p < 4; ++p) {
    in.push_back(
        Array::FromInts({3}, {1 << 30, p == 0 ? kMax : (p == 1 ? 1 : 0), p == 0 ? 16777217 : -p}));
  }
  auto sum = ReferenceCollective(Op(OpKind::kPsum, {"dp"}), Mesh1D(4), in);
  EXPECT_EQ(sum[0].dtype(), DType::kI32);
  EXPECT_EQ(sum[0].IntAt(0), 0);
  EXPECT_EQ(sum[0].IntAt(1), -kMax - 1);
  EXPECT_EQ(sum[0].IntAt(2), 16777217 - 6);
  auto mx = ReferenceCollective(Op(OpKind::kPmax, {"dp"}), Mesh1D(4), in);
  EXPECT_EQ(mx[2].IntAt(2), 16777217);
  auto mn = ReferenceCollective(Op(OpKind::kPmin, {"dp"}), Mesh1D(4), in);
  EXPECT_EQ(mn[2].IntAt(2), -3);
  // psum_scatter wraps the same way.
  OpSpec scatter = Op(OpKind::kPsumScatter, {"dp"});
  scatter.tiled = true;
  std::vector<Array> blocks(4, Array::FromInts({4}, {1 << 30, kMax, 5, 16777217}));
  auto parts = ReferenceCollective(scatter, Mesh1D(4), blocks);
  EXPECT_EQ(parts[0].IntAt(0), 0);         // 4 * 2^30 mod 2^32.
  EXPECT_EQ(parts[1].IntAt(0), -4);        // 4 * (2^31 - 1) mod 2^32.
  EXPECT_EQ(parts[3].IntAt(0), 67108868);  // 4 * (2^24 + 1), exact.
}

TEST(ReductionTest, ScalarBlocks) {
  std::vector<Array> in = {Array::FromValues(DType::kF32, {}, {2}),
                           Array::FromValues(DType::kF32, {}, {5})};
  auto out = ReferenceCollective(Op(OpKind::kPsum, {"dp"}), Mesh1D(2), in);
  ExpectArray(out[0], {}, {7});
  ExpectArray(out[1], {}, {7});
}

// ---- psum_scatter ------------------------------------------------------------------------

TEST(PsumScatterTest, TiledDimension0) {
  // Blocks [4,2]: p0 = 0..7, p1 = 10..17; sum = [[10,12],[14,16],[18,20],[22,24]].
  OpSpec op = Op(OpKind::kPsumScatter, {"dp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {4, 2}));
  ExpectArray(out[0], {2, 2}, {10, 12, 14, 16});
  ExpectArray(out[1], {2, 2}, {18, 20, 22, 24});
}

TEST(PsumScatterTest, TiledDimension1) {
  // Blocks [2,4]; sum = [[10,12,14,16],[18,20,22,24]].
  OpSpec op = Op(OpKind::kPsumScatter, {"dp"});
  op.tiled = true;
  op.scatter_dimension = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2, 4}));
  ExpectArray(out[0], {2, 2}, {10, 12, 18, 20});
  ExpectArray(out[1], {2, 2}, {14, 16, 22, 24});
}

TEST(PsumScatterTest, UntiledDimension0RemovesIt) {
  // Blocks [2,3]: sum = [[10,12,14],[16,18,20]].
  auto out =
      ReferenceCollective(Op(OpKind::kPsumScatter, {"dp"}), Mesh1D(2), ArangeBlocks(2, {2, 3}));
  ExpectArray(out[0], {3}, {10, 12, 14});
  ExpectArray(out[1], {3}, {16, 18, 20});
}

TEST(PsumScatterTest, UntiledDimension1RemovesIt) {
  // Blocks [3,2]: sum = [[10,12],[14,16],[18,20]].
  OpSpec op = Op(OpKind::kPsumScatter, {"dp"});
  op.scatter_dimension = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {3, 2}));
  ExpectArray(out[0], {3}, {10, 14, 18});
  ExpectArray(out[1], {3}, {12, 16, 20});
}

TEST(PsumScatterTest, FourDevicesUntiledLikeJaxDocstring) {
  // jax.lax.psum_scatter docstring: rows of arange(16).reshape(4, 4) on 4 devices.
  std::vector<Array> in;
  for (int p = 0; p < 4; ++p) {
    in.push_back(
        Array::FromValues(DType::kF32, {4}, {4.f * p, 4.f * p + 1, 4.f * p + 2, 4.f * p + 3}));
  }
  auto out = ReferenceCollective(Op(OpKind::kPsumScatter, {"dp"}), Mesh1D(4), in);
  ExpectArray(out[0], {}, {24});
  ExpectArray(out[1], {}, {28});
  ExpectArray(out[2], {}, {32});
  ExpectArray(out[3], {}, {36});
}

TEST(PsumScatterTest, ReversedTupleScattersInTupleOrder) {
  // 2x2, axis_name (tp, dp): member index g = 2*tp + dp, i.e. p0:g0 p1:g2 p2:g1 p3:g3.
  // Blocks [4]: p -> 10p + 0..3; sum = [60, 64, 68, 72]; member g keeps element g.
  OpSpec op = Op(OpKind::kPsumScatter, {"tp", "dp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh2x2(), ArangeBlocks(4, {4}));
  ExpectArray(out[0], {1}, {60});
  ExpectArray(out[1], {1}, {68});
  ExpectArray(out[2], {1}, {64});
  ExpectArray(out[3], {1}, {72});
}

// ---- all_gather --------------------------------------------------------------------------

TEST(AllGatherTest, UntiledAxis0StacksInFront) {
  // Blocks [2]: [0,1], [10,11].
  auto out = ReferenceCollective(Op(OpKind::kAllGather, {"dp"}), Mesh1D(2), ArangeBlocks(2, {2}));
  ExpectArray(out[0], {2, 2}, {0, 1, 10, 11});
  ExpectArray(out[1], {2, 2}, {0, 1, 10, 11});
}

TEST(AllGatherTest, UntiledAxis1StacksLast) {
  OpSpec op = Op(OpKind::kAllGather, {"dp"});
  op.axis = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2}));
  ExpectArray(out[0], {2, 2}, {0, 10, 1, 11});
  ExpectArray(out[1], {2, 2}, {0, 10, 1, 11});
  op.axis = -1;  // Counts in the output's rank: the same as 1.
  ExpectArray(ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2}))[1], {2, 2}, {0, 10, 1, 11});
}

TEST(AllGatherTest, TiledAxis0Concatenates) {
  // Blocks [2,2]: [[0,1],[2,3]], [[10,11],[12,13]].
  OpSpec op = Op(OpKind::kAllGather, {"dp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2, 2}));
  ExpectArray(out[0], {4, 2}, {0, 1, 2, 3, 10, 11, 12, 13});
  ExpectArray(out[1], {4, 2}, {0, 1, 2, 3, 10, 11, 12, 13});
}

TEST(AllGatherTest, TiledAxis1Concatenates) {
  OpSpec op = Op(OpKind::kAllGather, {"dp"});
  op.tiled = true;
  op.axis = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2, 2}));
  ExpectArray(out[0], {2, 4}, {0, 1, 10, 11, 2, 3, 12, 13});
  ExpectArray(out[1], {2, 4}, {0, 1, 10, 11, 2, 3, 12, 13});
}

TEST(AllGatherTest, OneAxisOfTwo) {
  // 2x2, gather over tp: groups {0,1} and {2,3}. Blocks [1]: [0], [10], [20], [30].
  OpSpec op = Op(OpKind::kAllGather, {"tp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh2x2(), ArangeBlocks(4, {1}));
  ExpectArray(out[0], {2}, {0, 10});
  ExpectArray(out[1], {2}, {0, 10});
  ExpectArray(out[2], {2}, {20, 30});
  ExpectArray(out[3], {2}, {20, 30});
}

TEST(AllGatherTest, TupleInMeshOrder) {
  OpSpec op = Op(OpKind::kAllGather, {"dp", "tp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh2x2(), ArangeBlocks(4, {1}));
  for (int p = 0; p < 4; ++p) ExpectArray(out[p], {4}, {0, 10, 20, 30});
}

TEST(AllGatherTest, TupleInReversedOrderFollowsTheTuple) {
  // (tp, dp): member order p0, p2, p1, p3 (tp major).
  OpSpec op = Op(OpKind::kAllGather, {"tp", "dp"});
  op.tiled = true;
  auto tiled = ReferenceCollective(op, Mesh2x2(), ArangeBlocks(4, {1}));
  for (int p = 0; p < 4; ++p) ExpectArray(tiled[p], {4}, {0, 20, 10, 30});
  op.tiled = false;
  auto stacked = ReferenceCollective(op, Mesh2x2(), ArangeBlocks(4, {1}));
  for (int p = 0; p < 4; ++p) ExpectArray(stacked[p], {4, 1}, {0, 20, 10, 30});
}

// ---- all_to_all --------------------------------------------------------------------------

TEST(AllToAllTest, TiledSplit0Concat1) {
  // Blocks [2,2]: p0 [[0,1],[2,3]], p1 [[10,11],[12,13]]; row i goes to member i.
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.tiled = true;
  op.split_axis = 0;
  op.concat_axis = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2, 2}));
  ExpectArray(out[0], {1, 4}, {0, 1, 10, 11});
  ExpectArray(out[1], {1, 4}, {2, 3, 12, 13});
}

TEST(AllToAllTest, TiledSplit1Concat0) {
  // Column i goes to member i; received columns stack as rows, in source order.
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.tiled = true;
  op.split_axis = 1;
  op.concat_axis = 0;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2, 2}));
  ExpectArray(out[0], {4, 1}, {0, 2, 10, 12});
  ExpectArray(out[1], {4, 1}, {1, 3, 11, 13});
}

TEST(AllToAllTest, TiledSameAxis) {
  // Blocks [4]: p0 0..3, p1 10..13.
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {4}));
  ExpectArray(out[0], {4}, {0, 1, 10, 11});
  ExpectArray(out[1], {4}, {2, 3, 12, 13});
}

TEST(AllToAllTest, UntiledIsATransposeAcrossFourDevices) {
  // Blocks [4]: p -> 10p + 0..3. out_i[j] = x_j[i].
  auto out = ReferenceCollective(Op(OpKind::kAllToAll, {"dp"}), Mesh1D(4), ArangeBlocks(4, {4}));
  ExpectArray(out[0], {4}, {0, 10, 20, 30});
  ExpectArray(out[1], {4}, {1, 11, 21, 31});
  ExpectArray(out[2], {4}, {2, 12, 22, 32});
  ExpectArray(out[3], {4}, {3, 13, 23, 33});
}

TEST(AllToAllTest, UntiledSplit0Concat0) {
  // Blocks [2,3]: p0 [[0,1,2],[3,4,5]], p1 [[10,11,12],[13,14,15]].
  // Shape insert(delete([2,3], 0), 0, 2) = [2,3]; out_i[j, :] = x_j[i, :].
  auto out = ReferenceCollective(Op(OpKind::kAllToAll, {"dp"}), Mesh1D(2), ArangeBlocks(2, {2, 3}));
  ExpectArray(out[0], {2, 3}, {0, 1, 2, 10, 11, 12});
  ExpectArray(out[1], {2, 3}, {3, 4, 5, 13, 14, 15});
}

TEST(AllToAllTest, UntiledSplit0Concat1) {
  // Shape insert(delete([2,3], 0), 1, 2) = [3,2]; out_i[k, j] = x_j[i, k].
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.concat_axis = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {2, 3}));
  ExpectArray(out[0], {3, 2}, {0, 10, 1, 11, 2, 12});
  ExpectArray(out[1], {3, 2}, {3, 13, 4, 14, 5, 15});
}

TEST(AllToAllTest, UntiledSplit1Concat0) {
  // Blocks [3,2]: p0 [[0,1],[2,3],[4,5]], p1 [[10,11],[12,13],[14,15]].
  // Shape insert(delete([3,2], 1), 0, 2) = [2,3]; out_i[j, k] = x_j[k, i].
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.split_axis = 1;
  op.concat_axis = 0;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {3, 2}));
  ExpectArray(out[0], {2, 3}, {0, 2, 4, 10, 12, 14});
  ExpectArray(out[1], {2, 3}, {1, 3, 5, 11, 13, 15});
}

TEST(AllToAllTest, UntiledSplit1Concat1) {
  // Shape insert(delete([3,2], 1), 1, 2) = [3,2]; out_i[k, j] = x_j[k, i].
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.split_axis = 1;
  op.concat_axis = 1;
  auto out = ReferenceCollective(op, Mesh1D(2), ArangeBlocks(2, {3, 2}));
  ExpectArray(out[0], {3, 2}, {0, 10, 2, 12, 4, 14});
  ExpectArray(out[1], {3, 2}, {1, 11, 3, 13, 5, 15});
}

TEST(AllToAllTest, ReversedTupleUsesTupleOrder) {
  // (tp, dp): members g0..g3 are p0, p2, p1, p3. Blocks [4]: p -> 10p + 0..3.
  // Member g receives element g of each source, sources in g order (p0, p2, p1, p3).
  OpSpec op = Op(OpKind::kAllToAll, {"tp", "dp"});
  op.tiled = true;
  auto out = ReferenceCollective(op, Mesh2x2(), ArangeBlocks(4, {4}));
  ExpectArray(out[0], {4}, {0, 20, 10, 30});
  ExpectArray(out[2], {4}, {1, 21, 11, 31});
  ExpectArray(out[1], {4}, {2, 22, 12, 32});
  ExpectArray(out[3], {4}, {3, 23, 13, 33});
}

// ---- ppermute ----------------------------------------------------------------------------

// Blocks [1]: p -> [10p + 1], so a zero is never a real block.
std::vector<Array> PermBlocks() { return ArangeBlocks(4, {1}, 10, 1); }

void ExpectScalars(const std::vector<Array>& out, const std::vector<float>& values) {
  ASSERT_EQ(out.size(), values.size());
  for (size_t p = 0; p < out.size(); ++p) ExpectArray(out[p], {1}, {values[p]});
}

TEST(PpermuteTest, ShiftForwardOneAxis) {
  OpSpec op = Op(OpKind::kPpermute, {"dp"});
  op.shift = 1;
  ExpectScalars(ReferenceCollective(op, Mesh1D(4), PermBlocks()), {31, 1, 11, 21});
}

TEST(PpermuteTest, ShiftBackwardOneAxis) {
  OpSpec op = Op(OpKind::kPpermute, {"dp"});
  op.shift = -1;
  ExpectScalars(ReferenceCollective(op, Mesh1D(4), PermBlocks()), {11, 21, 31, 1});
}

TEST(PpermuteTest, PartialPermFillsZeros) {
  OpSpec op = Op(OpKind::kPpermute, {"dp"});
  op.perm = {{0, 2}, {1, 0}};
  ExpectScalars(ReferenceCollective(op, Mesh1D(4), PermBlocks()), {11, 0, 1, 0});
}

TEST(PpermuteTest, EmptyPermGivesZeros) {
  ExpectScalars(ReferenceCollective(Op(OpKind::kPpermute, {"dp"}), Mesh1D(4), PermBlocks()),
                {0, 0, 0, 0});
}

TEST(PpermuteTest, ShiftOverOneAxisOfTwo) {
  // 2x2, tp: groups {p0, p1} and {p2, p3} swap.
  OpSpec op = Op(OpKind::kPpermute, {"tp"});
  op.shift = 1;
  ExpectScalars(ReferenceCollective(op, Mesh2x2(), PermBlocks()), {11, 1, 31, 21});
}

TEST(PpermuteTest, TupleInMeshOrderShiftEqualsPerm) {
  // (dp, tp): ring p0 -> p1 -> p2 -> p3 -> p0 both ways.
  OpSpec shift = Op(OpKind::kPpermute, {"dp", "tp"});
  shift.shift = 1;
  OpSpec perm = Op(OpKind::kPpermute, {"dp", "tp"});
  perm.perm = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};
  ExpectScalars(ReferenceCollective(shift, Mesh2x2(), PermBlocks()), {31, 1, 11, 21});
  ExpectScalars(ReferenceCollective(perm, Mesh2x2(), PermBlocks()), {31, 1, 11, 21});
}

TEST(PpermuteTest, ReversedTupleShiftAndPermDiffer) {
  // (tp, dp): shift follows the tuple order p0 -> p2 -> p1 -> p3 -> p0 ...
  OpSpec shift = Op(OpKind::kPpermute, {"tp", "dp"});
  shift.shift = 1;
  ExpectScalars(ReferenceCollective(shift, Mesh2x2(), PermBlocks()), {31, 21, 1, 11});
  // ... while perm integers stay mesh-order linear indices: p0 -> p1 -> p2 -> p3 -> p0.
  OpSpec perm = Op(OpKind::kPpermute, {"tp", "dp"});
  perm.perm = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};
  ExpectScalars(ReferenceCollective(perm, Mesh2x2(), PermBlocks()), {31, 1, 11, 21});
  // A single pair (0, 1) is p0 -> p1 (mesh order), not member 0 -> member 1 (= p2).
  perm.perm = {{0, 1}};
  ExpectScalars(ReferenceCollective(perm, Mesh2x2(), PermBlocks()), {0, 1, 0, 0});
}

TEST(ResolvePermutationTest, ReversedTupleInGroupIndices) {
  // (tp, dp) on 2x2: mesh-order index m -> group index g: 0->0, 1->2, 2->1, 3->3.
  OpSpec op = Op(OpKind::kPpermute, {"tp", "dp"});
  op.perm = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};  // g: 0->2, 2->1, 1->3, 3->0.
  EXPECT_EQ(ResolvePermutation(op, Mesh2x2()), (std::vector<int>{2, 3, 1, 0}));
  op.perm.clear();
  op.shift = 1;
  EXPECT_EQ(ResolvePermutation(op, Mesh2x2()), (std::vector<int>{1, 2, 3, 0}));
  op.shift = -1;
  EXPECT_EQ(ResolvePermutation(op, Mesh2x2()), (std::vector<int>{3, 0, 1, 2}));
  op.shift = 5;
  EXPECT_EQ(ResolvePermutation(op, Mesh2x2()), (std::vector<int>{1, 2, 3, 0}));
}

TEST(ResolvePermutationTest, NonSquareReversedTuple) {
  // Mesh (a=2, b=3); axis_name (b, a): perm integer m = 3a + b, group index g = 2b + a.
  // m=1 is (a0,b1) -> g=2; m=3 is (a1,b0) -> g=1; m=5 is (a1,b2) -> g=5; m=2 is (a0,b2) -> g=4.
  Mesh mesh({{"a", 2}, {"b", 3}}, {0, 1, 2, 3, 4, 5});
  OpSpec op = Op(OpKind::kPpermute, {"b", "a"});
  op.perm = {{1, 3}, {5, 2}};
  EXPECT_EQ(ResolvePermutation(op, mesh), (std::vector<int>{-1, -1, 1, -1, -1, 4}));
  op.perm.clear();
  op.shift = 1;
  EXPECT_EQ(ResolvePermutation(op, mesh), (std::vector<int>{1, 2, 3, 4, 5, 0}));
}

// ---- axis_index --------------------------------------------------------------------------

void ExpectIndices(const std::vector<Array>& out, const std::vector<float>& values) {
  ASSERT_EQ(out.size(), values.size());
  for (size_t p = 0; p < out.size(); ++p) ExpectArray(out[p], {}, {values[p]}, DType::kI32);
}

TEST(AxisIndexTest, OneAxis) {
  const Mesh mesh = Mesh2x2();
  ExpectIndices(ReferenceCollective(Op(OpKind::kAxisIndex, {"tp"}), mesh, {}), {0, 1, 0, 1});
  ExpectIndices(ReferenceCollective(Op(OpKind::kAxisIndex, {"dp"}), mesh, {}), {0, 0, 1, 1});
}

TEST(AxisIndexTest, Tuple) {
  const Mesh mesh = Mesh2x2();
  ExpectIndices(ReferenceCollective(Op(OpKind::kAxisIndex, {"dp", "tp"}), mesh, {}), {0, 1, 2, 3});
  // index(tp) * size(dp) + index(dp).
  ExpectIndices(ReferenceCollective(Op(OpKind::kAxisIndex, {"tp", "dp"}), mesh, {}), {0, 2, 1, 3});
}

// ---- Shapes (timing-only runs) -----------------------------------------------------------

TEST(OutputShapeTest, FollowsJax) {
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  op.split_axis = 1;
  op.concat_axis = 0;
  EXPECT_EQ(CollectiveOutputShape(op, {2, 4, 3}, 4), (Shape{4, 2, 3}));
  op.concat_axis = 2;
  EXPECT_EQ(CollectiveOutputShape(op, {2, 4, 3}, 4), (Shape{2, 3, 4}));
  op.tiled = true;
  op.split_axis = 0;
  op.concat_axis = 1;
  EXPECT_EQ(CollectiveOutputShape(op, {8, 4}, 4), (Shape{2, 16}));

  OpSpec gather = Op(OpKind::kAllGather, {"dp"});
  gather.axis = -1;
  EXPECT_EQ(CollectiveOutputShape(gather, {2, 3}, 4), (Shape{2, 3, 4}));
  gather.tiled = true;
  EXPECT_EQ(CollectiveOutputShape(gather, {2, 3}, 4), (Shape{2, 12}));

  OpSpec scatter = Op(OpKind::kPsumScatter, {"dp"});
  EXPECT_EQ(CollectiveOutputShape(scatter, {4, 3}, 4), (Shape{3}));
  scatter.tiled = true;
  EXPECT_EQ(CollectiveOutputShape(scatter, {8, 3}, 4), (Shape{2, 3}));

  EXPECT_EQ(CollectiveOutputShape(Op(OpKind::kPsum, {"dp"}), {5, 7}, 4), (Shape{5, 7}));
  EXPECT_EQ(CollectiveOutputShape(Op(OpKind::kAxisIndex, {"dp"}), {5, 7}, 4), (Shape{}));
}

TEST(OutputShapeTest, ShapeOnlyInputsGiveShapeOnlyOutputs) {
  OpSpec op = Op(OpKind::kAllGather, {"dp", "tp"});
  op.tiled = true;
  std::vector<Array> in(4, Array::ShapeOnly(DType::kBF16, {3, 5}));
  auto out = ReferenceCollective(op, Mesh2x2(), in);
  ASSERT_EQ(out.size(), 4u);
  for (const Array& a : out) {
    EXPECT_FALSE(a.has_data());
    EXPECT_EQ(a.shape(), (Shape{12, 5}));
    EXPECT_EQ(a.dtype(), DType::kBF16);
  }
}

// ---- Errors ------------------------------------------------------------------------------

TEST(SemanticsErrorTest, PsumScatterIndivisible) {
  OpSpec op = Op(OpKind::kPsumScatter, {"dp"});
  op.tiled = true;
  std::vector<Array> in(4, Array(DType::kF32, {6, 4}));
  ExpectThrowsWith([&] { ReferenceCollective(op, Mesh1D(4), in); },
                   "psum_scatter: dimension 0 of f32[6,4] does not divide by the 4 devices of "
                   "axis dp");
  op.tiled = false;
  ExpectThrowsWith([&] { ReferenceCollective(op, Mesh1D(4), in); },
                   "tiled=false needs dimension 0 of f32[6,4] to equal the 4 devices of axis dp");
}

TEST(SemanticsErrorTest, TupleAxesAreNamedInMessages) {
  OpSpec op = Op(OpKind::kPsumScatter, {"dp", "tp"});
  op.tiled = true;
  op.scatter_dimension = 1;
  std::vector<Array> in(4, Array(DType::kBF16, {4, 6}));
  ExpectThrowsWith([&] { ReferenceCollective(op, Mesh2x2(), in); },
                   "dimension 1 of bf16[4,6] does not divide by the 4 devices of axes (dp, tp)");
}

TEST(SemanticsErrorTest, AxisOutOfRange) {
  OpSpec op = Op(OpKind::kAllGather, {"dp"});
  op.tiled = true;
  op.axis = 2;
  ExpectThrowsWith(
      [&] {
        CollectiveOutputShape(op, {2, 2}, 2, DType::kF32);
      },
      "all_gather: axis 2 is out of range for f32[2,2]");
  op.tiled = false;
  EXPECT_EQ(CollectiveOutputShape(op, {2, 2}, 2), (Shape{2, 2, 2}));  // New last axis.
  op.axis = 3;
  ExpectThrowsWith([&] { CollectiveOutputShape(op, {2, 2}, 2); }, "axis 3 is out of range");
  OpSpec scatter = Op(OpKind::kPsumScatter, {"dp"});
  ExpectThrowsWith([&] { CollectiveOutputShape(scatter, {}, 2); },
                   "scatter_dimension 0 is out of range for [] (it has no dimensions)");
}

TEST(SemanticsErrorTest, AllToAllSizes) {
  OpSpec op = Op(OpKind::kAllToAll, {"dp"});
  ExpectThrowsWith(
      [&] {
        CollectiveOutputShape(op, {3, 4}, 4, DType::kF32);
      },
      "all_to_all: tiled=false needs split_axis dimension 0 of f32[3,4] to equal "
      "the 4 devices of axis dp");
  op.tiled = true;
  ExpectThrowsWith(
      [&] {
        CollectiveOutputShape(op, {6, 4}, 4, DType::kF32);
      },
      "all_to_all: split_axis dimension 0 of f32[6,4] does not divide by the 4 "
      "devices of axis dp");
  op.concat_axis = -3;
  ExpectThrowsWith([&] { CollectiveOutputShape(op, {8, 4}, 4); }, "concat_axis -3 is out of range");
}

TEST(SemanticsErrorTest, BadPermutations) {
  const Mesh mesh = Mesh1D(4);
  OpSpec op = Op(OpKind::kPpermute, {"dp"});
  op.perm = {{0, 1}};
  op.shift = 1;
  ExpectThrowsWith([&] { ResolvePermutation(op, mesh); }, "either perm or shift, not both");
  op.shift.reset();
  op.perm = {{0, 1}, {2, 1}};
  ExpectThrowsWith([&] { ResolvePermutation(op, mesh); }, "destination 1 appears twice");
  op.perm = {{0, 1}, {0, 2}};
  ExpectThrowsWith([&] { ResolvePermutation(op, mesh); }, "source 0 appears twice");
  op.perm = {{0, 4}};
  ExpectThrowsWith([&] { ReferenceCollective(op, mesh, PermBlocks()); },
                   "ppermute: perm index 4 is out of range for the 4 devices of axis dp");
}

TEST(SemanticsErrorTest, BadAxisNames) {
  const Mesh mesh = Mesh2x2();
  const auto in = ArangeBlocks(4, {2});
  ExpectThrowsWith([&] { ReferenceCollective(Op(OpKind::kPsum, {"pp"}), mesh, in); },
                   "psum: unknown mesh axis 'pp' in axis_name (the mesh has dp, tp)");
  ExpectThrowsWith(
      [&] {
        ReferenceCollective(Op(OpKind::kPsum, {"dp", "dp"}), mesh, in);
      },
      "axis 'dp' appears twice in axis_name");
  ExpectThrowsWith([&] { ReferenceCollective(Op(OpKind::kPsum, {}), mesh, in); },
                   "axis_name is empty");
}

TEST(SemanticsErrorTest, BadInputs) {
  const Mesh mesh = Mesh2x2();
  ExpectThrowsWith(
      [&] { ReferenceCollective(Op(OpKind::kPsum, {"dp"}), mesh, ArangeBlocks(3, {2})); },
      "expected one input block per mesh position (4), got 3");
  auto in = ArangeBlocks(4, {2});
  in[3] = Array(DType::kF32, {3});
  ExpectThrowsWith([&] { ReferenceCollective(Op(OpKind::kPsum, {"dp"}), mesh, in); },
                   "local blocks differ in type: f32[2] at position 0, f32[3] at position 3");
  ExpectThrowsWith(
      [&] { ReferenceCollective(Op(OpKind::kMatmul, {"dp"}), mesh, ArangeBlocks(4, {2})); },
      "not a collective with reference semantics");
}

}  // namespace
}  // namespace shardsim
