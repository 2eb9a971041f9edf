// Simulated time: an integer count of picoseconds.
#pragma once

#include <cmath>
#include <compare>
#include <cstdint>
#include <limits>
#include <string>

namespace shardsim {

// A point in (or span of) simulated time, stored as int64 picoseconds.
// int64 picoseconds cover about 106 days, far beyond any simulated step.
class Time {
 public:
  // Zero time.
  constexpr Time() = default;

  // Factories from integer counts of a unit.
  static constexpr Time Picoseconds(int64_t ps) { return Time(ps); }
  static constexpr Time Nanoseconds(int64_t ns) { return Time(ns * 1000); }
  static constexpr Time Microseconds(int64_t us) { return Time(us * 1000 * 1000); }
  static constexpr Time Milliseconds(int64_t ms) { return Time(ms * 1000 * 1000 * 1000); }
  // From a floating-point number of seconds, rounded to the nearest picosecond.
  static Time FromSeconds(double s) { return Time(static_cast<int64_t>(std::llround(s * 1e12))); }
  // From seconds, rounded up: used for durations that must not finish early.
  static Time FromSecondsCeil(double s) { return Time(static_cast<int64_t>(std::ceil(s * 1e12))); }
  // The largest representable time; used as "never".
  static constexpr Time Max() { return Time(std::numeric_limits<int64_t>::max()); }

  // The raw picosecond count.
  constexpr int64_t picoseconds() const { return ps_; }
  // Seconds as a double (for reports and JSON, which use SI base units).
  constexpr double seconds() const { return static_cast<double>(ps_) * 1e-12; }
  // Microseconds as a double (the Chrome trace's time unit).
  constexpr double microseconds() const { return static_cast<double>(ps_) * 1e-6; }

  constexpr auto operator<=>(const Time&) const = default;
  constexpr Time operator+(Time o) const { return Time(ps_ + o.ps_); }
  constexpr Time operator-(Time o) const { return Time(ps_ - o.ps_); }
  constexpr Time& operator+=(Time o) {
    ps_ += o.ps_;
    return *this;
  }
  constexpr Time& operator-=(Time o) {
    ps_ -= o.ps_;
    return *this;
  }
  constexpr Time operator*(int64_t k) const { return Time(ps_ * k); }

 private:
  constexpr explicit Time(int64_t ps) : ps_(ps) {}
  int64_t ps_ = 0;
};

// Formats a time with a readable unit ("1.5 us", "250 ns", "3.2 ms").
std::string FormatTime(Time t);

}  // namespace shardsim
