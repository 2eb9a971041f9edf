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

// float8_e4m3fn (ml_dtypes): 3 mantissa bits, exponent bias 7 (smallest normal 2^-6,
// subnormal spacing 2^-9), largest 448, no infinity: what rounds past 448, and infinity, is NaN.
TEST(DTypeTest, F8E4M3HasFourSignificantBitsAndNoInfinity) {
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1);
  EXPECT_EQ(ParseDType("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_STREQ(DTypeName(DType::kF8E4M3), "f8e4m3");
  EXPECT_TRUE(IsFloat8(DType::kF8E4M3));
  // 0.1 at exponent -4: spacing 2^-7, 0.1 / 2^-7 = 12.8 -> 13 * 2^-7.
  EXPECT_EQ(RoundToDType(DType::kF8E4M3, 0.1f), 13.0f / 128);
  EXPECT_EQ(RoundToDType(DType::kF8E4M3, 1.0f + 1.0f / 16), 1.0f);  // Tie to even.
  EXPECT_EQ(RoundToDType(DType::kF8E4M3, -448.0f), -448.0f);
  EXPECT_EQ(RoundToDType(DType::kF8E4M3, 464.0f), 448.0f);  // Tie between 448 and 480: even.
  EXPECT_TRUE(std::isnan(RoundToDType(DType::kF8E4M3, 470.0f)));
  EXPECT_TRUE(std::isnan(RoundToDType(DType::kF8E4M3, INFINITY)));
  EXPECT_EQ(RoundToDType(DType::kF8E4M3, 0.001f), std::ldexp(1.0f, -9));  // Subnormal.
  EXPECT_EQ(RoundToDType(DType::kF8E4M3, 0.0009f), 0.0f);
}

// float8_e5m2: IEEE-like with 2 mantissa bits, largest 57344, overflow to infinity.
TEST(DTypeTest, F8E5M2HasThreeSignificantBitsAndOverflows) {
  EXPECT_EQ(DTypeSize(DType::kF8E5M2), 1);
  EXPECT_EQ(ParseDType("float8_e5m2"), DType::kF8E5M2);
  EXPECT_EQ(RoundToDType(DType::kF8E5M2, 1.2f), 1.25f);
  EXPECT_EQ(RoundToDType(DType::kF8E5M2, 60000.0f), 57344.0f);
  EXPECT_TRUE(std::isinf(RoundToDType(DType::kF8E5M2, 61440.0f)));  // Tie rounds up to 2^16.
  EXPECT_TRUE(std::isinf(RoundToDType(DType::kF8E5M2, -INFINITY)));
  EXPECT_EQ(RoundToDType(DType::kF8E5M2, std::ldexp(1.0f, -16)), std::ldexp(1.0f, -16));
}

TEST(DTypeTest, I32RoundsToIntegers) {
  EXPECT_EQ(RoundToDType(DType::kI32, 2.5f), 2.0f);  // Nearest even.
  EXPECT_EQ(RoundToDType(DType::kI32, -3.7f), -4.0f);
}

}  // namespace
}  // namespace shardsim
