// Value types for data sizes, bandwidths and compute rates, with parsing of unit strings.
#pragma once

#include <compare>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sim/time.h"

namespace shardsim {

// Thrown when a quantity string cannot be parsed; the message says what was expected.
class UnitError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown when a time computed from the user's quantities (a transfer at a tiny bandwidth, a
// compute at a tiny FLOP rate, huge latencies summed) falls outside the simulator's time range
// (int64 picoseconds, about 106 days): the input is at fault, not the simulator.
class TimeRangeError : public std::overflow_error {
 public:
  using std::overflow_error::overflow_error;
};

// Largest bandwidth a parsed quantity may have: 1 EB/s, far above any link or memory.
inline constexpr double kMaxBytesPerSecond = 1e18;
// Largest compute rate a parsed quantity may have: 1 ZFLOP/s.
inline constexpr double kMaxFlopsPerSecond = 1e21;

// A count of bytes.
class Bytes {
 public:
  // Zero bytes.
  constexpr Bytes() = default;
  // An exact count of bytes.
  constexpr explicit Bytes(int64_t count) : count_(count) {}
  // Binary-prefixed factories.
  static constexpr Bytes KiB(int64_t n) { return Bytes(n << 10); }
  static constexpr Bytes MiB(int64_t n) { return Bytes(n << 20); }
  static constexpr Bytes GiB(int64_t n) { return Bytes(n << 30); }

  // The raw byte count.
  constexpr int64_t count() const { return count_; }

  constexpr auto operator<=>(const Bytes&) const = default;
  constexpr Bytes operator+(Bytes o) const { return Bytes(count_ + o.count_); }
  constexpr Bytes operator-(Bytes o) const { return Bytes(count_ - o.count_); }
  constexpr Bytes operator*(int64_t k) const { return Bytes(count_ * k); }
  constexpr Bytes operator/(int64_t k) const { return Bytes(count_ / k); }

 private:
  int64_t count_ = 0;
};

// A data rate in bytes per second.
class Bandwidth {
 public:
  // Zero bandwidth.
  constexpr Bandwidth() = default;
  // Factories in bytes or bits per second.
  static constexpr Bandwidth BytesPerSecond(double bps) { return Bandwidth(bps); }
  static constexpr Bandwidth GBps(double gbps) { return Bandwidth(gbps * 1e9); }
  static constexpr Bandwidth Gbps(double gbits) { return Bandwidth(gbits * 1e9 / 8); }

  // Bytes per second.
  constexpr double bytes_per_second() const { return bps_; }
  // Time to move `b` at this rate, rounded up to a whole picosecond. Throws TimeRangeError
  // if it does not fit the simulator's time range.
  Time TransferTime(Bytes b) const;

  constexpr auto operator<=>(const Bandwidth&) const = default;
  constexpr Bandwidth operator*(double k) const { return Bandwidth(bps_ * k); }
  constexpr Bandwidth operator/(double k) const { return Bandwidth(bps_ / k); }
  constexpr Bandwidth operator+(Bandwidth o) const { return Bandwidth(bps_ + o.bps_); }

 private:
  constexpr explicit Bandwidth(double bps) : bps_(bps) {}
  double bps_ = 0;
};

// A compute rate in floating-point operations per second.
class FlopRate {
 public:
  // Zero rate.
  constexpr FlopRate() = default;
  // From FLOP per second.
  static constexpr FlopRate PerSecond(double flops) { return FlopRate(flops); }
  // FLOP per second.
  constexpr double per_second() const { return flops_; }
  constexpr auto operator<=>(const FlopRate&) const = default;

 private:
  constexpr explicit FlopRate(double f) : flops_(f) {}
  double flops_ = 0;
};

// The parsers below throw UnitError for a malformed quantity, a negative, infinite or NaN
// number, or one out of range: a size of 2^63 bytes or more, a time past the simulator's
// range (about 106 days), a bandwidth above kMaxBytesPerSecond, a compute rate above
// kMaxFlopsPerSecond.

// Parses "64 MiB", "1 GB", "512 B", "8 Mb" or a bare integer count of bytes.
Bytes ParseBytes(std::string_view text);
// Parses "45 GB/s", "400 Gb/s", "1.2 TB/s"; a bare number is an error.
Bandwidth ParseBandwidth(std::string_view text);
// Parses "1 us", "250 ns", "1.5 ms", "2 s", "10 ps"; a bare number is an error.
Time ParseTime(std::string_view text);
// Parses "197 TFLOP/s", "2.75e14 FLOP/s"; a bare number is an error.
FlopRate ParseFlopRate(std::string_view text);

// "64 MiB", "1.5 GiB", "512 B": binary prefixes, up to three significant decimals.
std::string FormatBytes(Bytes b);
// "96 GB", "16 GB": decimal prefixes, as memory capacities are published.
std::string FormatBytesDecimal(Bytes b);
// "45 GB/s", "3.6 TB/s": decimal prefixes.
std::string FormatBandwidth(Bandwidth bw);
// "197 TFLOP/s".
std::string FormatFlopRate(FlopRate f);

}  // namespace shardsim
