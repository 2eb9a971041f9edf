#include "collectives/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace shardsim {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI32), 4);
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(ParseDType("int32"), DType::kI32);
  EXPECT_EQ(ParseDType("f64"), std::nullopt);
  EXPECT_STREQ(DTypeName(DType::kF16), "f16");
}

TEST(DTypeTest, Bf16KeepsEightSignificantBits) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(RoundToDType(DType::kBF16, 1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even -> 1 + 2^-6.
  EXPECT_EQ(RoundToDType(DType::kBF16, 1.0f + 3 * std::ldexp(1.0f, -8)),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(RoundToDType(DType::kBF16, 3.0f), 3.0f);
  EXPECT_NEAR(RoundToDType(DType::kBF16, 3.14159265f), 3.140625f, 0);
}

TEST(DTypeTest, F16HasElevenSignificantBitsAndOverflows) {
  EXPECT_EQ(RoundToDType(DType::kF16, 1.0f + std::ldexp(1.0f, -11)), 1.0f);  // Tie to even.
  EXPECT_EQ(RoundToDType(DType::kF16, 1.0f + std::ldexp(1.0f, -10)), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(RoundToDType(DType::kF16, 65504.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(RoundToDType(DType::kF16, 70000.0f)));
  EXPECT_EQ(RoundToDType(DType::kF16, std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));  // Subnormal.
}

TEST(DTypeTest, I32RoundsToIntegers) {
  EXPECT_EQ(RoundToDType(DType::kI32, 2.5f), 2.0f);  // Nearest even.
  EXPECT_EQ(RoundToDType(DType::kI32, -3.7f), -4.0f);
}

}  // namespace
}  // namespace shardsim
