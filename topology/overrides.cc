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
  if (override_spec.attention_efficiency) {
    device.attention_efficiency = CheckedFraction("hardware.device.attention_efficiency",
                                                  *override_spec.attention_efficiency);
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
  if (override_spec.host_bandwidth) {
    if (!(override_spec.host_bandwidth->bytes_per_second() > 0)) {
      throw SpecError("hardware.device.host_bandwidth",
                      "host link bandwidth must be positive, got " +
                          FormatBandwidth(*override_spec.host_bandwidth));
    }
    device.host_bandwidth = *override_spec.host_bandwidth;
  }
  return device;
}

CommSpec ApplyCommOverride(CommSpec comm, const CommOverride& override_spec) {
  auto latency = [](const std::string& key, Time t) {
    if (t < Time()) {
      const std::string name = key.substr(key.rfind('.') + 1);
      throw SpecError(key, name + " must not be negative, got " + FormatTime(t));
    }
    return t;
  };
  if (override_spec.nccl) comm.nccl = *override_spec.nccl;
  if (override_spec.launch_latency) {
    comm.launch_latency = latency("hardware.comm.launch_latency", *override_spec.launch_latency);
  }
  if (override_spec.net_latency) {
    comm.net_latency = latency("hardware.comm.net_latency", *override_spec.net_latency);
  }
  for (int p = 0; p < kNumProtocols; ++p) {
    const ProtocolOverride& o = override_spec.protocols[p];
    const std::string key =
        std::string("hardware.comm.protocols.") + ProtocolName(static_cast<Protocol>(p));
    if (o.step_latency) {
      comm.protocols[p].step_latency = latency(key + ".step_latency", *o.step_latency);
    }
    if (o.efficiency)
      comm.protocols[p].efficiency = CheckedFraction(key + ".efficiency", *o.efficiency);
  }
  if (override_spec.nvlink_efficiency) {
    comm.nvlink_efficiency =
        CheckedFraction("hardware.comm.nvlink_efficiency", *override_spec.nvlink_efficiency);
  }
  if (override_spec.nic_efficiency) {
    comm.nic_efficiency =
        CheckedFraction("hardware.comm.nic_efficiency", *override_spec.nic_efficiency);
  }
  if (override_spec.channels) {
    if (*override_spec.channels < 1) {
      throw SpecError("hardware.comm.channels",
                      "channels must be >= 1, got " + std::to_string(*override_spec.channels));
    }
    comm.channels = *override_spec.channels;
  }
  if (override_spec.nvls) comm.nvls = *override_spec.nvls;
  if (override_spec.sharp) comm.sharp = *override_spec.sharp;
  if (override_spec.chunk_size) {
    if (override_spec.chunk_size->count() <= 0) {
      throw SpecError("hardware.comm.chunk_size",
                      "chunk_size must be positive, got " + FormatBytes(*override_spec.chunk_size));
    }
    comm.chunk_size = *override_spec.chunk_size;
  }
  if (override_spec.multipath) comm.multipath = *override_spec.multipath;
  if (override_spec.multipath_min_bytes) {
    if (override_spec.multipath_min_bytes->count() < 0) {
      throw SpecError("hardware.comm.multipath_min_bytes",
                      "multipath_min_bytes must not be negative, got " +
                          FormatBytes(*override_spec.multipath_min_bytes));
    }
    comm.multipath_min_bytes = *override_spec.multipath_min_bytes;
  }
  return comm;
}

}  // namespace shardsim
