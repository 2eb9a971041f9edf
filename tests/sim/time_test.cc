#include "sim/time.h"

#include <gtest/gtest.h>

namespace shardsim {
namespace {

TEST(TimeTest, FactoriesAgree) {
  EXPECT_EQ(Time::Microseconds(1), Time::Nanoseconds(1000));
  EXPECT_EQ(Time::Nanoseconds(1), Time::Picoseconds(1000));
  EXPECT_EQ(Time::Milliseconds(2), Time::Microseconds(2000));
  EXPECT_EQ(Time::FromSeconds(1.5e-6), Time::Nanoseconds(1500));
  EXPECT_EQ(Time::FromSecondsCeil(0.5e-12), Time::Picoseconds(1));
}

TEST(TimeTest, ArithmeticAndConversions) {
  Time t = Time::Microseconds(3) - Time::Nanoseconds(500);
  EXPECT_EQ(t.picoseconds(), 2'500'000);
  EXPECT_DOUBLE_EQ(t.microseconds(), 2.5);
  EXPECT_DOUBLE_EQ(t.seconds(), 2.5e-6);
  EXPECT_EQ(Time::Nanoseconds(2) * 3, Time::Nanoseconds(6));
  EXPECT_LT(Time::Nanoseconds(1), Time::Nanoseconds(2));
}

}  // namespace
}  // namespace shardsim
