#include "sim/units.h"

#include <gtest/gtest.h>

namespace shardsim {
namespace {

TEST(UnitsTest, ParsesBytesWithBinaryAndDecimalPrefixes) {
  EXPECT_EQ(ParseBytes("64 MiB").count(), 64LL << 20);
  EXPECT_EQ(ParseBytes("16GiB").count(), 16LL << 30);
  EXPECT_EQ(ParseBytes("1 KiB").count(), 1024);
  EXPECT_EQ(ParseBytes("1 GB").count(), 1000000000LL);
  EXPECT_EQ(ParseBytes("2 kB").count(), 2000);
  EXPECT_EQ(ParseBytes("8 Mb").count(), 1000000);  // Bits: 8e6 / 8.
  EXPECT_EQ(ParseBytes("512 B").count(), 512);
  EXPECT_EQ(ParseBytes("4096").count(), 4096);  // A bare count of bytes is allowed.
}

TEST(UnitsTest, ParsesBandwidthInBytesAndBits) {
  EXPECT_DOUBLE_EQ(ParseBandwidth("45 GB/s").bytes_per_second(), 45e9);
  EXPECT_DOUBLE_EQ(ParseBandwidth("400 Gb/s").bytes_per_second(), 50e9);
  EXPECT_DOUBLE_EQ(ParseBandwidth("1.2 TB/s").bytes_per_second(), 1.2e12);
  EXPECT_DOUBLE_EQ(ParseBandwidth("1 GiB/s").bytes_per_second(), 1073741824.0);
}

TEST(UnitsTest, ParsesTimes) {
  EXPECT_EQ(ParseTime("1 us"), Time::Microseconds(1));
  EXPECT_EQ(ParseTime("250 ns"), Time::Nanoseconds(250));
  EXPECT_EQ(ParseTime("1.5 ms").picoseconds(), 1'500'000'000LL);
  EXPECT_EQ(ParseTime("2 s").picoseconds(), 2'000'000'000'000LL);
  EXPECT_EQ(ParseTime("10 ps").picoseconds(), 10);
}

TEST(UnitsTest, ParsesFlopRates) {
  EXPECT_DOUBLE_EQ(ParseFlopRate("197 TFLOP/s").per_second(), 197e12);
  EXPECT_DOUBLE_EQ(ParseFlopRate("2.75e14 FLOP/s").per_second(), 2.75e14);
}

TEST(UnitsTest, RejectsInfiniteAndNanQuantities) {
  for (const char* text : {"inf B", "nan B", "+inf B", "-inf B"}) {
    EXPECT_THROW(ParseBytes(text), UnitError) << text;
  }
  for (const char* text : {"inf GB/s", "nan GB/s", "+inf GB/s", "infinity GB/s"}) {
    EXPECT_THROW(ParseBandwidth(text), UnitError) << text;
  }
  EXPECT_THROW(ParseTime("inf s"), UnitError);
  EXPECT_THROW(ParseTime("nan us"), UnitError);
  EXPECT_THROW(ParseFlopRate("inf FLOP/s"), UnitError);
}

// Expects `parse(text)` to throw a UnitError whose message contains `fragment`.
template <typename Parse>
void ExpectUnitError(Parse parse, const std::string& text, const std::string& fragment) {
  try {
    parse(text);
    ADD_FAILURE() << text << " was accepted";
  } catch (const UnitError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(UnitsTest, RejectsQuantitiesOutOfRange) {
  ExpectUnitError(ParseBytes, "1e30 B", "too large (at most 8 EiB)");
  ExpectUnitError(ParseBytes, "8 EB", "");  // Not a known prefix.
  ExpectUnitError(ParseBytes, "9223372036854775808", "too large");
  EXPECT_EQ(ParseBytes("9223372036854774784").count(), 9223372036854774784LL);
  ExpectUnitError(ParseTime, "1e8 s", "past the simulator's range");
  ExpectUnitError(ParseTime, "1e9 s", "past the simulator's range");
  EXPECT_EQ(ParseTime("9e6 s").picoseconds(), 9'000'000'000'000'000'000LL);
  ExpectUnitError(ParseBandwidth, "1e300 TB/s", "too large (at most 1 EB/s)");
  ExpectUnitError(ParseBandwidth, "2 EB/s", "");  // Not a known prefix.
  EXPECT_DOUBLE_EQ(ParseBandwidth("1000 PB/s").bytes_per_second(), 1e18);
  ExpectUnitError(ParseFlopRate, "1e22 FLOP/s", "too large");
}

TEST(UnitsTest, TransferTimeBeyondTheTimeRangeThrows) {
  Bandwidth slow = Bandwidth::BytesPerSecond(1e-3);
  EXPECT_THROW(slow.TransferTime(Bytes::GiB(1)), TimeRangeError);
  EXPECT_EQ(Bandwidth::GBps(1).TransferTime(Bytes(1000)), Time::Nanoseconds(1000));
}

TEST(UnitsTest, RejectsBareNumbersWhereAUnitIsNeeded) {
  EXPECT_THROW(ParseBandwidth("45"), UnitError);
  EXPECT_THROW(ParseTime("1"), UnitError);
  EXPECT_THROW(ParseFlopRate("1e14"), UnitError);
}

TEST(UnitsTest, RejectsUnknownUnitsAndGarbage) {
  EXPECT_THROW(ParseBandwidth("45 GB"), UnitError);
  EXPECT_THROW(ParseBandwidth("45 GX/s"), UnitError);
  EXPECT_THROW(ParseTime("1 fortnight"), UnitError);
  EXPECT_THROW(ParseBytes("lots"), UnitError);
  EXPECT_THROW(ParseBytes("-5 MiB"), UnitError);
  EXPECT_THROW(ParseBytes("1.5 B"), UnitError);
}

TEST(UnitsTest, ErrorMessageSaysWhatWasExpected) {
  try {
    ParseBandwidth("45 GBs");
    FAIL() << "expected UnitError";
  } catch (const UnitError& e) {
    EXPECT_NE(std::string(e.what()).find("GB/s"), std::string::npos) << e.what();
  }
}

TEST(UnitsTest, FormatsReadably) {
  EXPECT_EQ(FormatBytes(Bytes::MiB(64)), "64 MiB");
  EXPECT_EQ(FormatBandwidth(Bandwidth::GBps(450)), "450 GB/s");
  EXPECT_EQ(FormatTime(Time::Microseconds(3)), "3 us");
  EXPECT_EQ(FormatTime(Time::Nanoseconds(250)), "250 ns");
  EXPECT_EQ(FormatFlopRate(FlopRate::PerSecond(197e12)), "197 TFLOP/s");
}

TEST(UnitsTest, TransferTimeRoundsUpToWholePicoseconds) {
  // 1 byte at 3 B/ps (3 TB/s) is 1/3 ps: rounded up to 1 ps so nothing arrives early.
  EXPECT_EQ(Bandwidth::BytesPerSecond(3e12).TransferTime(Bytes(1)).picoseconds(), 1);
  // 64 MiB at 45 GB/s = 67108864 / 45e9 s = 1491.308 us.
  EXPECT_NEAR(Bandwidth::GBps(45).TransferTime(Bytes::MiB(64)).seconds(), 67108864 / 45e9, 1e-12);
}

}  // namespace
}  // namespace shardsim
