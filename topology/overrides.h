// Validating and applying the run file's `hardware.link` and `hardware.device` overrides.
#pragma once

#include "sim/time.h"
#include "sim/units.h"
#include "topology/comm_spec.h"
#include "topology/device_spec.h"
#include "topology/topology_spec.h"

namespace shardsim {

// Throws SpecError unless the override's bandwidth is positive ("hardware.link.bandwidth")
// and its latency non-negative ("hardware.link.latency").
void ValidateLinkOverride(const LinkOverride& link);

// `bandwidth` replaced by the override's when given (validate first).
Bandwidth OverrideBandwidth(const LinkOverride& link, Bandwidth bandwidth);

// `latency` replaced by the override's when given (validate first).
Time OverrideLatency(const LinkOverride& link, Time latency);

// `device` with the override applied: each given dtype's rate replaces (or adds) that entry
// of `flops`; HBM bandwidth and capacity, the efficiency factors, op overhead and
// comm/compute slowdown replace the preset's. Throws SpecError for a non-positive value
// ("hardware.device.flops.<dtype>", "hardware.device.hbm_bandwidth",
// "hardware.device.hbm_capacity"), an empty dtype name ("hardware.device.flops"), an
// efficiency outside (0, 1] ("hardware.device.matmul_efficiency",
// "hardware.device.memory_efficiency"), a negative op overhead
// ("hardware.device.op_overhead"), or a negative or non-finite slowdown
// ("hardware.device.comm_compute_slowdown").
DeviceSpec ApplyDeviceOverride(DeviceSpec device, const DeviceOverride& override_spec);

// `comm` with the override's given figures replacing its own. Throws SpecError naming the key
// ("hardware.comm.<field>", "hardware.comm.protocols.<name>.<field>") for a negative latency,
// an efficiency outside (0, 1], channels < 1 or a chunk size <= 0.
CommSpec ApplyCommOverride(CommSpec comm, const CommOverride& override_spec);

}  // namespace shardsim
