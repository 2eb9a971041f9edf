#include "collectives/array.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace shardsim {
namespace {

TEST(ArrayTest, NumElementsAndFormatShape) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({1024, 4096}), 1024 * 4096);
  EXPECT_EQ(NumElements({3, 0, 2}), 0);
  EXPECT_EQ(FormatShape({}), "[]");
  EXPECT_EQ(FormatShape({1024, 4096}), "[1024,4096]");
  EXPECT_EQ(FormatShape({7}), "[7]");
}

TEST(ArrayTest, ConstructorMakesZerosWithData) {
  Array a(DType::kBF16, {2, 3});
  EXPECT_TRUE(a.has_data());
  EXPECT_EQ(a.rank(), 2);
  EXPECT_EQ(a.size(), 6);
  EXPECT_EQ(a.bytes(), Bytes(12));
  for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.at(i), 0.0f);
  EXPECT_EQ(a.TypeString(), "bf16[2,3]");
}

TEST(ArrayTest, DefaultIsAnF32ScalarWithoutData) {
  Array a;
  EXPECT_FALSE(a.has_data());
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.size(), 1);
  EXPECT_EQ(a.TypeString(), "f32[]");
}

TEST(ArrayTest, FromValuesRoundsToTheDType) {
  float tie = 1.0f + std::ldexp(1.0f, -8);  // Halfway between two bf16 values.
  Array a = Array::FromValues(DType::kBF16, {2}, {tie, 3.14159265f});
  EXPECT_EQ(a.at(0), 1.0f);
  EXPECT_EQ(a.at(1), 3.140625f);
  Array b = Array::FromValues(DType::kF32, {2}, {tie, 3.14159265f});
  EXPECT_EQ(b.at(0), tie);
  Array i = Array::FromNumbers(DType::kI32, {3}, {1.4, 2.5, -1.6});  // Nearest, ties to even.
  EXPECT_EQ(i.IntAt(0), 1);
  EXPECT_EQ(i.IntAt(1), 2);
  EXPECT_EQ(i.IntAt(2), -2);
}

TEST(ArrayTest, Int32IsExactOverItsWholeRange) {
  // float32 holds integers exactly only up to 2^24; i32 arrays store int32 words.
  const std::vector<int32_t> ints = {16777217, -16777217, 2147483647, -2147483647 - 1, 0};
  Array a = Array::FromInts({5}, ints);
  EXPECT_EQ(a.dtype(), DType::kI32);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(a.IntAt(i), ints[i]);
    EXPECT_EQ(a.ValueAt(i), static_cast<double>(ints[i]));
  }
  Array copy = a;  // Copies move words: bit-exact.
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(copy.IntAt(i), ints[i]);
  // Numbers saturate at the int32 range, as DoubleToInt32.
  Array s = Array::FromNumbers(DType::kI32, {3}, {3e9, -3e9, NAN});
  EXPECT_EQ(s.IntAt(0), 2147483647);
  EXPECT_EQ(s.IntAt(1), -2147483647 - 1);
  EXPECT_EQ(s.IntAt(2), 0);
}

TEST(ArrayTest, FromValuesChecksTheCount) {
  try {
    Array::FromValues(DType::kF32, {2, 3}, {1, 2, 3});
    FAIL() << "expected an exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "3 values for shape [2,3], which has 6 elements");
  }
}

TEST(ArrayTest, NegativeDimensionsAreRejected) {
  EXPECT_THROW(Array(DType::kF32, {2, -1}), std::invalid_argument);
  EXPECT_THROW(Array::ShapeOnly(DType::kF32, {-3}), std::invalid_argument);
}

TEST(ArrayTest, ShapeOnlyHasNoData) {
  Array a = Array::ShapeOnly(DType::kF16, {1024, 4096});
  EXPECT_FALSE(a.has_data());
  EXPECT_EQ(a.size(), 1024 * 4096);
  EXPECT_EQ(a.bytes(), Bytes::MiB(8));
  EXPECT_EQ(a.TypeString(), "f16[1024,4096]");
  a.Round();  // No data: nothing to do.
}

TEST(ArrayTest, RoundAppliesAfterWritingThroughData) {
  Array a(DType::kF16, {2});
  a.data()[0] = 1.0f + std::ldexp(1.0f, -12);
  a.data()[1] = 70000.0f;
  a.Round();
  EXPECT_EQ(a.at(0), 1.0f);
  EXPECT_TRUE(std::isinf(a.at(1)));
}

}  // namespace
}  // namespace shardsim
