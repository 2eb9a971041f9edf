#include "topology/overrides.h"

#include <string>

#include "sim/spec_error.h"

namespace shardsim {

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
  return device;
}

}  // namespace shardsim
