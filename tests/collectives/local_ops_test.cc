#include "collectives/local_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

namespace shardsim {
namespace {

Array F32(Shape shape, std::vector<float> values) {
  return Array::FromValues(DType::kF32, std::move(shape), std::move(values));
}

// Values 1, 2, ... scaled by `scale` (distinct, exact in float32 for small arrays).
Array Iota(Shape shape, float scale = 1.0f, float offset = 1.0f) {
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<float>(i) + offset) * scale;
  return F32(std::move(shape), std::move(v));
}

// The message of the std::invalid_argument that `fn` throws.
template <typename Fn>
std::string ErrorOf(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// A slow, obviously correct einsum of two operands (explicit "->" form, no repeats).
Array NaiveEinsum(const std::string& spec, const Array& a, const Array& b) {
  size_t comma = spec.find(','), arrow = spec.find("->");
  std::string la = spec.substr(0, comma), lb = spec.substr(comma + 1, arrow - comma - 1);
  std::string lo = spec.substr(arrow + 2);
  std::map<char, int64_t> size;
  for (size_t i = 0; i < la.size(); ++i) size[la[i]] = a.shape()[i];
  for (size_t i = 0; i < lb.size(); ++i) size[lb[i]] = b.shape()[i];
  std::string all;
  for (const auto& [c, n] : size) all += c;
  Shape out_shape;
  for (char c : lo) out_shape.push_back(size[c]);
  std::vector<double> out(static_cast<size_t>(NumElements(out_shape)), 0.0);
  std::map<char, int64_t> idx;
  for (char c : all) idx[c] = 0;
  auto flat = [&](const std::string& letters) {
    int64_t f = 0;
    for (char c : letters) f = f * size[c] + idx[c];
    return f;
  };
  while (true) {
    out[flat(lo)] += static_cast<double>(a.at(flat(la))) * b.at(flat(lb));
    int d = static_cast<int>(all.size()) - 1;
    for (; d >= 0; --d) {
      if (++idx[all[d]] < size[all[d]]) break;
      idx[all[d]] = 0;
    }
    if (d < 0) break;
  }
  return F32(out_shape, std::vector<float>(out.begin(), out.end()));
}

void ExpectArray(const Array& got, const Shape& shape, const std::vector<float>& values) {
  ASSERT_TRUE(got.has_data());
  EXPECT_EQ(got.shape(), shape);
  EXPECT_EQ(got.values(), values);
}

void ExpectNear(const Array& got, const Array& want, float tol) {
  ASSERT_TRUE(got.has_data());
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got.at(i), want.at(i), tol) << "at " << i;
}

TEST(MatmulTest, TwoByThreeTimesThreeByTwo) {
  Array a = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  Array b = F32({3, 2}, {7, 8, 9, 10, 11, 12});
  ExpectArray(Matmul(a, b), {2, 2}, {58, 64, 139, 154});
}

TEST(MatmulTest, VectorsAsNumPy) {
  Array v = F32({3}, {1, 2, 3});
  Array m = F32({3, 2}, {7, 8, 9, 10, 11, 12});
  ExpectArray(Matmul(v, m), {2}, {58, 64});
  ExpectArray(Matmul(F32({2, 3}, {1, 2, 3, 4, 5, 6}), v), {2}, {14, 32});
  ExpectArray(Matmul(v, v), {}, {14});
}

TEST(MatmulTest, BatchedAndBroadcast) {
  // [2,2,2] @ [2,2]: the batch folds into one sgemm.
  Array a = Iota({2, 2, 2});
  Array w = F32({2, 2}, {1, 0, 1, 1});
  ExpectArray(Matmul(a, w), {2, 2, 2}, {3, 2, 7, 4, 11, 6, 15, 8});
  // [2,2,2] @ [2,2,2]: one sgemm per batch element.
  ExpectNear(Matmul(a, Iota({2, 2, 2}, 0.5f)),
             NaiveEinsum("bij,bjk->bik", a, Iota({2, 2, 2}, 0.5f)), 0);
  // [2,1,3,4] @ [3,4,5] -> [2,3,3,5]: batch dimensions broadcast.
  Array x = Iota({2, 1, 3, 4}, 0.25f);
  Array y = Iota({3, 4, 5}, 0.5f);
  Array got = Matmul(x, y);
  ASSERT_EQ(got.shape(), (Shape{2, 3, 3, 5}));
  Array x3 = Reshape(x, {2, 3, 4});
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) {
      Array want = Matmul(SliceAlong(x3, 0, i, 1), Reshape(SliceAlong(y, 0, j, 1), {4, 5}));
      Array block = Reshape(SliceAlong(SliceAlong(got, 0, i, 1), 1, j, 1), {1, 3, 5});
      ExpectNear(block, want, 0);
    }
  }
}

TEST(MatmulTest, InnerDimensionMismatchIsNamed) {
  Array a = Array::ShapeOnly(DType::kF32, {256, 4096});
  Array b = Array::ShapeOnly(DType::kF32, {2048, 256});
  EXPECT_EQ(ErrorOf([&] { Matmul(a, b); }),
            "matmul: inner dimensions differ: f32[256,4096] @ f32[2048,256]");
  EXPECT_EQ(ErrorOf([&] {
              Matmul(Iota({2, 2, 3}), Iota({3, 3, 2}));
            }),
            "matmul: batch dimensions cannot be broadcast: f32[2,2,3] @ f32[3,3,2]");
  EXPECT_EQ(ErrorOf([&] { Matmul(Iota({}), Iota({3})); }),
            "matmul: operands must have rank >= 1: f32[] @ f32[3]");
}

TEST(MatmulTest, Bf16ResultIsRoundedOnce) {
  // Float32 accumulation of 1 + 2^-8 is exact; the bf16 result rounds it (tie to even: 1).
  Array a = Array::FromValues(DType::kBF16, {1, 2}, {1, 1});
  Array b = Array::FromValues(DType::kBF16, {2, 2},
                              {1, 1, std::ldexp(1.0f, -8), 3 * std::ldexp(1.0f, -8)});
  Array c = Matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::kBF16);
  ExpectArray(c, {1, 2}, {1.0f, 1.0f + std::ldexp(1.0f, -6)});
  // With one f32 operand the result is f32 and keeps every bit.
  Array d = Matmul(a, F32({2, 1}, {1, std::ldexp(1.0f, -8)}));
  EXPECT_EQ(d.dtype(), DType::kF32);
  ExpectArray(d, {1, 1}, {1.0f + std::ldexp(1.0f, -8)});
}

// FP8 operands: the product of two f8e4m3 matrices is f8e4m3 (31 has five significant bits:
// e4m3 keeps four, 32); with preferred_element_type bf16 it is accumulated in f32 and keeps 31,
// as an FP8 GEMM with a bf16 output does. Einsum alike. An i32 operand refuses it.
TEST(MatmulTest, PreferredElementTypeRoundsTheResultOnlyOnce) {
  const Array a = Array::FromValues(DType::kF8E4M3, {2, 2}, {1, 2, 3, 5});
  const Array low = Matmul(a, a);
  EXPECT_EQ(low.dtype(), DType::kF8E4M3);
  ExpectArray(low, {2, 2}, {7, 12, 18, 32});
  const Array wide = Matmul(a, a, DType::kBF16);
  EXPECT_EQ(wide.dtype(), DType::kBF16);
  ExpectArray(wide, {2, 2}, {7, 12, 18, 31});
  ExpectArray(Einsum("ij,jk->ik", a, a, DType::kBF16), {2, 2}, {7, 12, 18, 31});
  EXPECT_EQ(Matmul(Array::ShapeOnly(DType::kF8E4M3, {2, 2}), a, DType::kBF16).dtype(),
            DType::kBF16);
  const Array ints = Array::FromInts({2, 2}, {1, 2, 3, 4});
  EXPECT_THROW(Matmul(ints, ints, DType::kF32), std::invalid_argument);
}

TEST(MatmulTest, LargerMatchesNaive) {
  Array a = Iota({33, 70}, 0.01f);
  Array b = Iota({70, 17}, -0.02f);
  ExpectNear(Matmul(a, b), NaiveEinsum("ij,jk->ik", a, b), 1e-2f);
}

TEST(EinsumTest, HandComputedCases) {
  Array a = F32({2, 2}, {1, 2, 3, 4});
  Array b = F32({2, 2}, {5, 6, 7, 8});
  ExpectArray(Einsum("bd,df->bf", a, b), {2, 2}, {19, 22, 43, 50});
  ExpectArray(Einsum("ij,kj->ik", a, b), {2, 2}, {17, 23, 39, 53});  // a @ b.T
  ExpectArray(Einsum("ji,jk->ik", a, b), {2, 2}, {26, 30, 38, 44});  // a.T @ b
  ExpectArray(Einsum("ij,jk->ki", a, b), {2, 2}, {19, 43, 22, 50});  // (a @ b).T
  ExpectArray(Einsum("ij,ij->", a, b), {}, {70});                    // Full contraction.
  ExpectArray(Einsum("i j , j k", a, b), {2, 2}, {19, 22, 43, 50});  // Implicit output "ik".
  // Batched: b=2 of 1x2 @ 2x1.
  Array x = F32({2, 1, 2}, {1, 2, 3, 4});
  Array y = F32({2, 2, 1}, {5, 6, 7, 8});
  ExpectArray(Einsum("bij,bjk->bik", x, y), {2, 1, 1}, {17, 53});
}

TEST(EinsumTest, TableMatchesNaive) {
  struct Case {
    const char* spec;
    Shape a, b;
  };
  const Case cases[] = {
      {"bd,df->bf", {5, 7}, {7, 3}},
      {"bij,bjk->bik", {3, 4, 5}, {3, 5, 2}},
      {"ij,kj->ik", {4, 6}, {5, 6}},
      {"bsd,dhk->bshk", {2, 3, 4}, {4, 2, 3}},
      {"bhqd,bhkd->bhqk", {2, 2, 3, 4}, {2, 2, 5, 4}},
      {"bhqk,bhkd->bqhd", {2, 2, 3, 5}, {2, 2, 5, 4}},
      {"ij,kl->ijkl", {2, 3}, {2, 2}},    // Outer product: nothing contracted.
      {"ijk,jl->li", {2, 3, 4}, {3, 5}},  // k summed away first; output transposed.
      {"i,ij->j", {4}, {4, 3}},
      {"abc,cba->b", {2, 3, 4}, {4, 3, 2}},  // Batch and contraction in mixed orders.
      {"XY,Yz->zX", {3, 4}, {4, 2}},         // Capital letters.
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Array a = Iota(c.a, 0.5f);
    Array b = Iota(c.b, -0.25f, -3.0f);
    ExpectNear(Einsum(c.spec, a, b), NaiveEinsum(c.spec, a, b), 1e-3f);
  }
}

TEST(EinsumTest, BadSpecsAreNamed) {
  Array a = Array::ShapeOnly(DType::kF32, {2, 3});
  Array b = Array::ShapeOnly(DType::kF32, {4, 5});
  struct Case {
    const char* spec;
    const char* error;
  };
  const Case cases[] = {
      {"ij,jk->ik",
       "einsum: letter 'j' has size 3 in operand 0 and 4 in operand 1: f32[2,3], f32[4,5] in "
       "\"ij,jk->ik\""},
      {"ijk,kl->il", "einsum: operand 0 has 3 letters ('ijk') but is f32[2,3] in \"ijk,kl->il\""},
      {"ii,jk->i", "einsum: letter 'i' repeats in operand 0 ('ii'); diagonals are not supported"},
      {"ij,kl->iz", "einsum: output letter 'z' is in neither operand of \"ij,kl->iz\""},
      {"ij,kl->ii", "einsum: output letter 'i' repeats in \"ij,kl->ii\""},
      {"...j,kl->jk", "einsum: ellipsis (...) is not supported: \"...j,kl->jk\""},
      {"ij->ij", "einsum: \"ij->ij\" must name exactly two operands, like \"bd,df->bf\""},
      {"i1,kl->ik", "einsum: invalid character '1' in \"i1,kl->ik\""},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ErrorOf([&] { Einsum(c.spec, a, b); }), c.error);
  }
}

TEST(BinaryTest, BroadcastsAsNumPy) {
  Array a = F32({2, 1}, {1, 2});
  Array b = F32({3}, {10, 20, 30});
  ExpectArray(Binary(BinaryKind::kAdd, a, b), {2, 3}, {11, 21, 31, 12, 22, 32});
  ExpectArray(Binary(BinaryKind::kSub, a, b), {2, 3}, {-9, -19, -29, -8, -18, -28});
  ExpectArray(Binary(BinaryKind::kMul, b, a), {2, 3}, {10, 20, 30, 20, 40, 60});
  ExpectArray(Binary(BinaryKind::kDiv, b, a), {2, 3}, {10, 20, 30, 5, 10, 15});
  ExpectArray(Binary(BinaryKind::kMax, F32({2}, {1, 5}), F32({2}, {3, 4})), {2}, {3, 5});
  ExpectArray(Binary(BinaryKind::kAdd, F32({}, {1}), F32({2}, {1, 2})), {2}, {2, 3});
}

TEST(BinaryTest, GeneralBroadcastMatchesLoops) {
  Array a = Iota({3, 1, 2});
  Array b = Iota({1, 4, 1}, 10.0f);
  Array c = Binary(BinaryKind::kMul, a, b);
  ASSERT_EQ(c.shape(), (Shape{3, 4, 2}));
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) {
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(c.at((i * 4 + j) * 2 + k), a.at(i * 2 + k) * b.at(j));
      }
    }
  }
}

TEST(BinaryTest, ShapesThatDoNotBroadcastAreNamed) {
  EXPECT_EQ(ErrorOf([] {
              Binary(BinaryKind::kAdd, Iota({2, 3}), Iota({2}));
            }),
            "add: shapes f32[2,3] and f32[2] cannot be broadcast");
}

TEST(BinaryTest, DTypes) {
  Array i = Array::FromInts({2}, {3, 4});
  Array h = Array::FromValues(DType::kBF16, {2}, {0.5f, 1});
  EXPECT_EQ(Binary(BinaryKind::kAdd, i, i).dtype(), DType::kI32);
  EXPECT_EQ(Binary(BinaryKind::kAdd, i, h).dtype(), DType::kBF16);
  EXPECT_EQ(Binary(BinaryKind::kAdd, h, F32({2}, {1, 1})).dtype(), DType::kF32);
  EXPECT_EQ(Binary(BinaryKind::kAdd, h, Array::FromValues(DType::kF16, {2}, {1, 1})).dtype(),
            DType::kF32);
  Array q = Binary(BinaryKind::kDiv, i, i);  // True division, as jnp.divide.
  EXPECT_EQ(q.dtype(), DType::kF32);
  EXPECT_EQ(q.values(), (std::vector<float>{1, 1}));
  // i32 + bf16 converts the integers to bf16 values first: 3 + 0.5, 4 + 1.
  EXPECT_EQ(Binary(BinaryKind::kAdd, i, h).values(), (std::vector<float>{3.5f, 5}));
}

TEST(BinaryTest, Int32WrapsLikeXla) {
  // XLA's int32 arithmetic is two's complement modulo 2^32: INT_MAX + 1 = INT_MIN, and
  // 65536 * 65536 = 2^32 = 0; values past 2^24 stay exact (float32 would round them).
  const int32_t kMax = 2147483647, kMin = -kMax - 1;
  Array a = Array::FromInts({4}, {kMax, 65536, 16777217, kMin});
  Array b = Array::FromInts({4}, {1, 65536, 2, 1});
  Array sum = Binary(BinaryKind::kAdd, a, b);
  EXPECT_EQ(sum.dtype(), DType::kI32);
  EXPECT_EQ(sum.IntAt(0), kMin);
  EXPECT_EQ(sum.IntAt(2), 16777219);
  EXPECT_EQ(Binary(BinaryKind::kMul, a, b).IntAt(1), 0);
  EXPECT_EQ(Binary(BinaryKind::kSub, a, b).IntAt(3), kMax);
  EXPECT_EQ(Binary(BinaryKind::kMax, a, b).IntAt(3), 1);
  EXPECT_EQ(BinaryScalar(BinaryKind::kAdd, a, 1.0).IntAt(0), kMin);
  EXPECT_EQ(Unary(OpKind::kNeg, a).IntAt(3), kMin);  // -INT_MIN wraps to itself.
  EXPECT_EQ(Unary(OpKind::kRelu, a).IntAt(3), 0);
  // An integer matmul accumulates in int32 too: [16777217, 1] . [1, 1] = 16777218 exactly.
  Array m = Matmul(Array::FromInts({1, 2}, {16777217, 1}), Array::FromInts({2, 1}, {1, 1}));
  EXPECT_EQ(m.dtype(), DType::kI32);
  EXPECT_EQ(m.IntAt(0), 16777218);
  Array e =
      Einsum("ij,jk->ik", Array::FromInts({1, 2}, {kMax, 1}), Array::FromInts({2, 1}, {1, 1}));
  EXPECT_EQ(e.IntAt(0), kMin);
}

TEST(BinaryScalarTest, Ops) {
  Array a = F32({3}, {-1, 2, 4});
  ExpectArray(BinaryScalar(BinaryKind::kAdd, a, 1.0), {3}, {0, 3, 5});
  ExpectArray(BinaryScalar(BinaryKind::kSub, a, 1.0), {3}, {-2, 1, 3});
  ExpectArray(BinaryScalar(BinaryKind::kMul, a, -2.0), {3}, {2, -4, -8});
  ExpectArray(BinaryScalar(BinaryKind::kDiv, a, 4.0), {3}, {-0.25f, 0.5f, 1});
  ExpectArray(BinaryScalar(BinaryKind::kMax, a, 0.0), {3}, {0, 2, 4});
  Array i = Array::FromInts({2}, {3, 4});
  EXPECT_EQ(BinaryScalar(BinaryKind::kMul, i, 2).dtype(), DType::kI32);
  EXPECT_EQ(BinaryScalar(BinaryKind::kMul, i, 2).IntAt(1), 8);
  Array half = BinaryScalar(BinaryKind::kMul, i, 0.5);
  EXPECT_EQ(half.dtype(), DType::kF32);
  ExpectArray(half, {2}, {1.5f, 2});
  // The scalar takes a bf16 array's dtype first (0.1 -> 0.10009765625), then the product
  // rounds.
  Array b = BinaryScalar(BinaryKind::kMul, Array::FromValues(DType::kBF16, {1}, {1}), 0.1);
  EXPECT_EQ(b.at(0), RoundToDType(DType::kBF16, 0.1f));
}

TEST(UnaryTest, Values) {
  Array a = F32({5}, {-3, -1, 0, 0.5f, 2});
  ExpectArray(Unary(OpKind::kRelu, a), {5}, {0, 0, 0, 0.5f, 2});
  ExpectArray(Unary(OpKind::kNeg, a), {5}, {3, 1, -0.0f, -0.5f, -2});
  // jax.nn.gelu(approximate=True) = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
  ExpectNear(Unary(OpKind::kGelu, a),
             F32({5}, {-0.0036373921f, -0.15880801f, 0, 0.34571401f, 1.9545977f}), 1e-6f);
  ExpectNear(Unary(OpKind::kExp, a),
             F32({5}, {0.049787068f, 0.36787944f, 1, 1.6487213f, 7.3890561f}), 1e-6f);
  ExpectNear(Unary(OpKind::kTanh, a),
             F32({5}, {-0.99505475f, -0.76159416f, 0, 0.46211716f, 0.96402758f}), 1e-6f);
  EXPECT_TRUE(std::isnan(Unary(OpKind::kRelu, F32({1}, {NAN})).at(0)));
  EXPECT_EQ(Unary(OpKind::kExp, Array::FromInts({1}, {0})).values(), std::vector<float>{1});
  EXPECT_EQ(Unary(OpKind::kExp, Array::FromInts({1}, {0})).dtype(), DType::kF32);
  EXPECT_EQ(Unary(OpKind::kRelu, Array::FromInts({1}, {0})).dtype(), DType::kI32);
  // Far in the negative tail the result keeps its relative precision (float64 reference).
  Array tail = Unary(OpKind::kGelu, F32({2}, {-5, -8}));
  EXPECT_NEAR(tail.at(0) / -2.2917962e-7f, 1.0f, 1e-4f);
  EXPECT_NEAR(tail.at(1) / -3.1077829e-21f, 1.0f, 1e-4f);
  Array g = Unary(OpKind::kGelu, Array::FromValues(DType::kBF16, {1}, {1}));
  EXPECT_EQ(g.at(0), RoundToDType(DType::kBF16, 0.84119199f));
}

TEST(ShapeOpsTest, Reshape) {
  Array a = Iota({2, 3});
  ExpectArray(Reshape(a, {3, -1}), {3, 2}, {1, 2, 3, 4, 5, 6});
  ExpectArray(Reshape(a, {-1}), {6}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(ErrorOf([&] {
              Reshape(a, {4, -1});
            }),
            "reshape: cannot reshape f32[2,3] (6 elements) into [4,-1]");
  EXPECT_EQ(ErrorOf([&] {
              Reshape(a, {-1, -1});
            }),
            "reshape: only one dimension may be -1 in [-1,-1]");
  EXPECT_EQ(ErrorOf([&] { Reshape(a, {7}); }),
            "reshape: cannot reshape f32[2,3] (6 elements) into [7]");
}

TEST(ShapeOpsTest, Transpose) {
  Array a = Iota({2, 3});
  ExpectArray(Transpose(a, {}), {3, 2}, {1, 4, 2, 5, 3, 6});
  ExpectArray(Transpose(a, {1, 0}), {3, 2}, {1, 4, 2, 5, 3, 6});
  ExpectArray(Transpose(a, {-2, -1}), {2, 3}, {1, 2, 3, 4, 5, 6});
  Array b = Iota({2, 3, 4});
  Array t = Transpose(b, {2, 0, 1});
  ASSERT_EQ(t.shape(), (Shape{4, 2, 3}));
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) EXPECT_EQ(t.at((k * 2 + i) * 3 + j), b.at((i * 3 + j) * 4 + k));
    }
  }
  EXPECT_EQ(ErrorOf([&] {
              Transpose(a, {0, 0});
            }),
            "transpose: axes [0,0] are not a permutation of the 2 dimensions of f32[2,3]");
  EXPECT_EQ(ErrorOf([&] {
              Transpose(a, {1, 0, 2});
            }),
            "transpose: axes [1,0,2] are not a permutation of the 2 dimensions of f32[2,3]");
}

TEST(ShapeOpsTest, LargeTransposeUsesTilesCorrectly) {
  Array a = Iota({70, 45});
  Array t = Transpose(a, {});
  for (int i = 0; i < 70; ++i) {
    for (int j = 0; j < 45; ++j) ASSERT_EQ(t.at(j * 70 + i), a.at(i * 45 + j));
  }
  ExpectArray(Transpose(t, {}), a.shape(), a.values());
}

TEST(ShapeOpsTest, ConcatenateSplitSliceRoundTrip) {
  Array a = Iota({2, 2});
  Array b = Iota({2, 1}, 10.0f);
  ExpectArray(Concatenate({&a, &b}, 1), {2, 3}, {1, 2, 10, 3, 4, 20});
  ExpectArray(Concatenate({&a, &a}, 0), {4, 2}, {1, 2, 3, 4, 1, 2, 3, 4});
  ExpectArray(Concatenate({&a, &b}, -1), {2, 3}, {1, 2, 10, 3, 4, 20});

  Array x = Iota({4, 6});
  for (int axis : {0, 1, -1}) {
    SCOPED_TRACE(axis);
    std::vector<Array> parts = Split(x, 2, axis);
    ASSERT_EQ(parts.size(), 2u);
    ExpectArray(ConcatAlong(parts, axis), x.shape(), x.values());
  }
  std::vector<Array> thirds = Split(x, 3, 1);
  ExpectArray(thirds[1], {4, 2}, {3, 4, 9, 10, 15, 16, 21, 22});
  ExpectArray(Slice(x, 1, 2, 0), {2, 6}, {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18});
  ExpectArray(SliceAlong(x, 1, 5, 1), {4, 1}, {6, 12, 18, 24});
  ExpectArray(ConcatAlong({Slice(x, 0, 3, 1), Slice(x, 3, 3, 1)}, 1), x.shape(), x.values());
}

TEST(ShapeOpsTest, Stack) {
  Array a = F32({2}, {1, 2});
  Array b = F32({2}, {3, 4});
  ExpectArray(Stack({a, b}, 0), {2, 2}, {1, 2, 3, 4});
  ExpectArray(Stack({a, b}, 1), {2, 2}, {1, 3, 2, 4});
  ExpectArray(Stack({a, b}, -1), {2, 2}, {1, 3, 2, 4});
  EXPECT_EQ(ErrorOf([&] { Stack({a, Iota({3})}, 0); }), "stack: shapes differ: f32[2] and f32[3]");
  EXPECT_EQ(ErrorOf([&] {
              Stack({a, b}, 2);
            }),
            "stack: axis 2 is out of range for stacking f32[2] (a new axis is in [-2, 1])");
}

TEST(ShapeOpsTest, ErrorsAreNamed) {
  Array x = Iota({6, 4});
  EXPECT_EQ(ErrorOf([&] { Split(x, 4, 0); }),
            "split: dimension 0 of f32[6,4] (size 6) does not split into 4 equal sections");
  EXPECT_EQ(ErrorOf([&] { Slice(x, 4, 3, 0); }),
            "slice: start 4 and size 3 do not fit in dimension 0 (size 6) of f32[6,4]");
  EXPECT_EQ(ErrorOf([&] { Slice(x, 0, 1, 2); }), "slice: axis 2 is out of range for f32[6,4]");
  Array y = Iota({5, 3});
  EXPECT_EQ(ErrorOf([&] {
              Concatenate({&x, &y}, 0);
            }),
            "concatenate: shapes differ outside axis 0: f32[6,4] and f32[5,3]");
  EXPECT_EQ(ErrorOf([&] { Concatenate({}, 0); }), "concatenate: needs at least one array");
}

TEST(ShapeOnlyTest, EveryOpPropagatesShapesWithoutData) {
  Array x = Array::ShapeOnly(DType::kBF16, {1024, 4096});
  Array w = Array::ShapeOnly(DType::kBF16, {4096, 256});
  auto expect = [](const Array& a, const std::string& type) {
    EXPECT_FALSE(a.has_data());
    EXPECT_EQ(a.TypeString(), type);
  };
  expect(Matmul(x, w), "bf16[1024,256]");
  expect(Matmul(x, Iota({4096, 8})), "f32[1024,8]");  // One operand without data suffices.
  expect(Einsum("bd,df->fb", x, w), "bf16[256,1024]");
  expect(Binary(BinaryKind::kAdd, x, Array::ShapeOnly(DType::kBF16, {4096})), "bf16[1024,4096]");
  expect(BinaryScalar(BinaryKind::kMul, x, 2.0), "bf16[1024,4096]");
  expect(Unary(OpKind::kGelu, x), "bf16[1024,4096]");
  expect(Reshape(x, {-1, 2048}), "bf16[2048,2048]");
  expect(Transpose(x, {}), "bf16[4096,1024]");
  expect(Concatenate({&x, &x}, 0), "bf16[2048,4096]");
  std::vector<Array> parts = Split(x, 4, 1);
  ASSERT_EQ(parts.size(), 4u);
  expect(parts[3], "bf16[1024,1024]");
  expect(Slice(x, 10, 20, 0), "bf16[20,4096]");
  expect(Stack({w, w}, 0), "bf16[2,4096,256]");
  EXPECT_EQ(ErrorOf([&] { Matmul(w, w); }),
            "matmul: inner dimensions differ: bf16[4096,256] @ bf16[4096,256]");
}

TEST(OpCostTest, MatmulEinsumElementwise) {
  Array a = Array::ShapeOnly(DType::kBF16, {4, 8});
  Array b = Array::ShapeOnly(DType::kBF16, {8, 16});
  Array c = Matmul(a, b);
  OpCost m = LocalOpCost(OpKind::kMatmul, {&a, &b}, {&c});
  EXPECT_EQ(m.flops, 2.0 * 4 * 16 * 8);
  EXPECT_EQ(m.bytes, 2.0 * (32 + 128 + 64));
  Array x = Array::ShapeOnly(DType::kF32, {3, 4, 5});
  Array y = Array::ShapeOnly(DType::kF32, {3, 5, 6});
  Array z = Einsum("bij,bjk->bik", x, y);
  EXPECT_EQ(LocalOpCost(OpKind::kEinsum, {&x, &y}, {&z}, "bij,bjk->bik").flops,
            2.0 * 3 * 4 * 5 * 6);
  Array s = Einsum("bij,bjk->ik", x, y);  // b is contracted too.
  EXPECT_EQ(LocalOpCost(OpKind::kEinsum, {&x, &y}, {&s}, "bij,bjk->ik").flops, 2.0 * 3 * 4 * 5 * 6);
  OpCost add = LocalOpCost(OpKind::kAdd, {&c, &c}, {&c});
  EXPECT_EQ(add.flops, 64);
  EXPECT_EQ(add.bytes, 3 * 128);
  EXPECT_EQ(LocalOpCost(OpKind::kGelu, {&c}, {&c}).flops, 64);
  EXPECT_EQ(LocalOpCost(OpKind::kReshape, {&c}, {&c}).bytes, 0);
  Array part = Slice(c, 0, 1, 0);
  EXPECT_EQ(LocalOpCost(OpKind::kSlice, {&c}, {&part}).bytes, 2 * 32);
  EXPECT_EQ(LocalOpCost(OpKind::kTranspose, {&c}, {&c}).bytes, 256);
}

TEST(OpKindTest, KindsMapToOps) {
  EXPECT_EQ(BinaryKindOf(OpKind::kDiv), BinaryKind::kDiv);
  EXPECT_EQ(BinaryKindOf(OpKind::kRelu), std::nullopt);
  EXPECT_TRUE(IsUnary(OpKind::kTanh));
  EXPECT_FALSE(IsUnary(OpKind::kMatmul));
}

}  // namespace
}  // namespace shardsim
