#include "sim/units.h"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace shardsim {
namespace {

struct Split {
  double number = 0;
  std::string_view unit;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "45 GB/s" into 45 and "GB/s". `what` names the quantity for error messages.
Split SplitQuantity(std::string_view text, const char* what, const char* example) {
  std::string_view s = Trim(text);
  Split out;
  const char* begin = s.data();
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(begin, end, out.number);
  if (ec != std::errc() || s.empty()) {
    throw UnitError("expected " + std::string(what) + " like \"" + example + "\", got \"" +
                    std::string(text) + "\"");
  }
  if (!std::isfinite(out.number) || out.number < 0) {
    throw UnitError(std::string(what) + " must be a finite non-negative number, got \"" +
                    std::string(text) + "\"");
  }
  out.unit = Trim(std::string_view(ptr, static_cast<size_t>(end - ptr)));
  return out;
}

// Returns the multiplier of an SI or binary prefix at the start of `unit`, and strips it.
// Returns false if the prefix is not known.
bool TakePrefix(std::string_view& unit, double& scale, bool allow_binary) {
  struct Prefix {
    std::string_view text;
    double scale;
    bool binary;
  };
  static constexpr std::array<Prefix, 11> kPrefixes = {{
      {"Ki", 1024.0, true},
      {"Mi", 1048576.0, true},
      {"Gi", 1073741824.0, true},
      {"Ti", 1099511627776.0, true},
      {"Pi", 1125899906842624.0, true},
      {"k", 1e3, false},
      {"K", 1e3, false},
      {"M", 1e6, false},
      {"G", 1e9, false},
      {"T", 1e12, false},
      {"P", 1e15, false},
  }};
  for (const Prefix& p : kPrefixes) {
    if (p.binary && !allow_binary) continue;
    if (unit.size() > p.text.size() && unit.substr(0, p.text.size()) == p.text) {
      unit.remove_prefix(p.text.size());
      scale = p.scale;
      return true;
    }
  }
  scale = 1.0;
  return true;
}

// Parses a byte or bit unit ("B", "MiB", "Gb") into bytes per unit; false if not one.
bool ByteUnitScale(std::string_view unit, double& bytes_per_unit) {
  double prefix = 1.0;
  TakePrefix(unit, prefix, /*allow_binary=*/true);
  if (unit == "B") {
    bytes_per_unit = prefix;
    return true;
  }
  if (unit == "b") {
    bytes_per_unit = prefix / 8.0;
    return true;
  }
  return false;
}

// 2^63 as a double: the first value an int64 cannot hold.
constexpr double kInt64Limit = 9223372036854775808.0;

std::string FormatScaled(double value, const char* const* names, int count, double step) {
  int i = 0;
  while (i + 1 < count && std::fabs(value) >= step) {
    value /= step;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4g %s", value, names[i]);
  return buf;
}

}  // namespace

Time Bandwidth::TransferTime(Bytes b) const {
  double ps = std::ceil(static_cast<double>(b.count()) / bps_ * 1e12);
  if (!(ps >= 0 && ps < kInt64Limit)) {
    throw TimeRangeError("moving " + FormatBytes(b) + " at " + FormatBandwidth(*this) +
                         " takes longer than the simulator's time range (about 106 days)");
  }
  return Time::Picoseconds(static_cast<int64_t>(ps));
}

Bytes ParseBytes(std::string_view text) {
  Split q = SplitQuantity(text, "a size", "64 MiB");
  double scale = 1.0;
  if (!q.unit.empty() && !ByteUnitScale(q.unit, scale)) {
    throw UnitError("unknown size unit \"" + std::string(q.unit) +
                    "\" (use B, KiB, MiB, GiB, kB, MB, GB, or b for bits)");
  }
  double bytes = q.number * scale;
  if (!(bytes < kInt64Limit)) {
    throw UnitError("size \"" + std::string(text) + "\" is too large (at most 8 EiB)");
  }
  if (bytes != std::floor(bytes)) {
    throw UnitError("size \"" + std::string(text) + "\" is not a whole number of bytes");
  }
  return Bytes(static_cast<int64_t>(bytes));
}

Bandwidth ParseBandwidth(std::string_view text) {
  Split q = SplitQuantity(text, "a bandwidth", "45 GB/s");
  std::string_view unit = q.unit;
  double scale = 1.0;
  if (unit.size() < 3 || unit.substr(unit.size() - 2) != "/s" ||
      !ByteUnitScale(unit.substr(0, unit.size() - 2), scale)) {
    throw UnitError("expected a bandwidth unit like GB/s or Gb/s in \"" + std::string(text) + "\"");
  }
  double bps = q.number * scale;
  if (!(bps <= kMaxBytesPerSecond)) {
    throw UnitError("bandwidth \"" + std::string(text) + "\" is too large (at most 1 EB/s)");
  }
  return Bandwidth::BytesPerSecond(bps);
}

Time ParseTime(std::string_view text) {
  Split q = SplitQuantity(text, "a time", "1 us");
  struct Unit {
    std::string_view name;
    double ps;
  };
  static constexpr std::array<Unit, 7> kUnits = {{{"ps", 1.0},
                                                  {"ns", 1e3},
                                                  {"us", 1e6},
                                                  {"\xC2\xB5s", 1e6},
                                                  {"ms", 1e9},
                                                  {"s", 1e12},
                                                  {"sec", 1e12}}};
  for (const Unit& u : kUnits) {
    if (q.unit == u.name) {
      double ps = std::round(q.number * u.ps);
      if (!(ps < kInt64Limit)) {
        throw UnitError("time \"" + std::string(text) +
                        "\" is past the simulator's range (at most about 106 days)");
      }
      return Time::Picoseconds(static_cast<int64_t>(ps));
    }
  }
  throw UnitError("expected a time unit (ps, ns, us, ms, s) in \"" + std::string(text) + "\"");
}

FlopRate ParseFlopRate(std::string_view text) {
  Split q = SplitQuantity(text, "a compute rate", "197 TFLOP/s");
  std::string_view unit = q.unit;
  double scale = 1.0;
  TakePrefix(unit, scale, /*allow_binary=*/false);
  if (unit != "FLOP/s" && unit != "FLOPS" && unit != "flop/s" && unit != "OP/s") {
    throw UnitError("expected a compute rate unit like TFLOP/s in \"" + std::string(text) + "\"");
  }
  double flops = q.number * scale;
  if (!(flops <= kMaxFlopsPerSecond)) {
    throw UnitError("compute rate \"" + std::string(text) +
                    "\" is too large (at most 1e21 FLOP/s)");
  }
  return FlopRate::PerSecond(flops);
}

std::string FormatBytes(Bytes b) {
  static const char* const kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return FormatScaled(static_cast<double>(b.count()), kNames, 5, 1024.0);
}

std::string FormatBytesDecimal(Bytes b) {
  static const char* const kNames[] = {"B", "kB", "MB", "GB", "TB"};
  return FormatScaled(static_cast<double>(b.count()), kNames, 5, 1000.0);
}

std::string FormatBandwidth(Bandwidth bw) {
  static const char* const kNames[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"};
  return FormatScaled(bw.bytes_per_second(), kNames, 6, 1000.0);
}

std::string FormatFlopRate(FlopRate f) {
  static const char* const kNames[] = {"FLOP/s",  "kFLOP/s", "MFLOP/s",
                                       "GFLOP/s", "TFLOP/s", "PFLOP/s"};
  return FormatScaled(f.per_second(), kNames, 6, 1000.0);
}

std::string FormatTime(Time t) {
  double ps = static_cast<double>(t.picoseconds());
  const char* unit = "ps";
  double v = ps;
  if (std::fabs(ps) >= 1e12) {
    v = ps / 1e12, unit = "s";
  } else if (std::fabs(ps) >= 1e9) {
    v = ps / 1e9, unit = "ms";
  } else if (std::fabs(ps) >= 1e6) {
    v = ps / 1e6, unit = "us";
  } else if (std::fabs(ps) >= 1e3) {
    v = ps / 1e3, unit = "ns";
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.4g %s", v, unit);
  return buf;
}

}  // namespace shardsim
