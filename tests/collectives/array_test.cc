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
  Array i = Array::FromValues(DType::kI32, {3}, {1.4f, 2.5f, -1.6f});
  EXPECT_EQ(i.values(), (std::vector<float>{1, 2, -2}));
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
