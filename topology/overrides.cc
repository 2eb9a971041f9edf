#include "topology/overrides.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/spec_error.h"

namespace shardsim {
namespace {

// `x` as the shortest text that reads back the same ("0.85", "1.5", "nan").
std::string FormatNumber(double x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", x);
  for (int precision = 1; precision <= 17; ++precision) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", precision, x);
    if (std::strtod(shorter, nullptr) == x) return shorter;
  }
  return buffer;
}

// `x` if it lies in (0, 1]; SpecError(`key`) otherwise.
double CheckedFraction(const std::string& key, double x) {
  if (!(x > 0 && x <= 1)) {
    const std::string name = key.substr(key.rfind('.') + 1);
    throw SpecError(key,
                    name + " must be in (0, 1] (a fraction of the peak), got " + FormatNumber(x));
  }
  return x;
}

}  // namespace

void ValidateLinkOverride(const LinkOverride& link) {
  if (link.bandwidth && !(link.bandwidth->bytes_per_second() > 0)) {
    throw SpecError("hardware.link.bandwidth",
                    "link bandwidth must be positive, got " + FormatBandwidth(*link.bandwidth));
  }
  if (link.latency && *link.latency < Time()) {
    throw SpecError("hardware.link.latency",
                    "link latency must not be negative, got " + FormatTime(*link.latency));
  }
}

Bandwidth OverrideBandwidth(const LinkOverride& link, Bandwidth bandwidth) {
  return link.bandwidth ? *link.bandwidth : bandwidth;
}

Time OverrideLatency(const LinkOverride& link, Time latency) {
  return link.latency ? *link.latency : latency;
}

DeviceSpec ApplyDeviceOverride(DeviceSpec device, const DeviceOverride& override_spec) {
  for (const auto& [dtype, rate] : override_spec.flops) {
    if (dtype.empty()) throw SpecError("hardware.device.flops", "a dtype name is empty");
    if (!(rate.per_second() > 0)) {
      throw SpecError("hardware.device.flops." + dtype,
                      "compute rate must be positive, got " + FormatFlopRate(rate));
    }
    device.flops[dtype] = rate;
  }
  if (override_spec.hbm_bandwidth) {
    if (!(override_spec.hbm_bandwidth->bytes_per_second() > 0)) {
      throw SpecError(
          "hardware.device.hbm_bandwidth",
          "HBM bandwidth must be positive, got " + FormatBandwidth(*override_spec.hbm_bandwidth));
    }
    device.hbm_bandwidth = *override_spec.hbm_bandwidth;
  }
  if (override_spec.hbm_capacity) {
    if (override_spec.hbm_capacity->count() <= 0) {
      throw SpecError("hardware.device.hbm_capacity", "HBM capacity must be positive, got " +
                                                          FormatBytes(*override_spec.hbm_capacity));
    }
    device.hbm_capacity = *override_spec.hbm_capacity;
  }
  if (override_spec.matmul_efficiency) {
    device.matmul_efficiency =
        CheckedFraction("hardware.device.matmul_efficiency", *override_spec.matmul_efficiency);
  }
  if (override_spec.memory_efficiency) {
    device.memory_efficiency =
        CheckedFraction("hardware.device.memory_efficiency", *override_spec.memory_efficiency);
  }
  if (override_spec.op_overhead) {
    if (*override_spec.op_overhead < Time()) {
      throw SpecError("hardware.device.op_overhead", "op overhead must not be negative, got " +
                                                         FormatTime(*override_spec.op_overhead));
    }
    device.op_overhead = *override_spec.op_overhead;
  }
  if (override_spec.comm_compute_slowdown) {
    const double x = *override_spec.comm_compute_slowdown;
    if (!(x >= 0) || !std::isfinite(x)) {
      throw SpecError("hardware.device.comm_compute_slowdown",
                      "comm_compute_slowdown must be a finite number >= 0 (0.1 = compute 10% "
                      "slower while communicating), got " +
                          FormatNumber(x));
    }
    device.comm_compute_slowdown = x;
  }
  return device;
}

}  // namespace shardsim
