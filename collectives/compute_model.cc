#include "collectives/compute_model.h"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardsim {
namespace {

// The first of `names` that `device.flops` lists with a positive rate; a zero rate if none.
FlopRate FirstRate(const DeviceSpec& device, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto it = device.flops.find(name);
    if (it != device.flops.end() && it->second.per_second() > 0) return it->second;
  }
  return FlopRate();
}

}  // namespace

// Peaks per dtype, each the first rate the device lists of:
//   f32:  "f32", then "bf16", then "f16"
//   bf16: "bf16", then "f16", then "f32"
//   f16:  "f16", then "bf16", then "f32"
//   i32:  "i32", then "int8", then the bf16 peak above.
//   f8e4m3, f8e5m2: "fp8" (one published rate for both, as NVIDIA's datasheets give it), then
//   the bf16 peak above: a chip without FP8 units (A100, the TPU presets) runs FP8 operands
//   through its bf16 units, so FP8 there saves bytes but no FLOP time.
// Presets list f32, bf16 and f16 (presets.cc), so the fallbacks serve devices built by hand
// or with a run file's flops override only. i32: ASSUMPTION, no chip publishes an int32
// matmul rate; the integer (int8) MXU/tensor-core rate is the nearest published figure, and
// i32 ops are elementwise and memory-bound in practice, so the choice rarely matters.
// A device with none of f32, bf16 and f16, or without a positive HBM bandwidth, cannot be
// priced: std::invalid_argument.
RooflineConfig RooflineConfig::FromDevice(const DeviceSpec& device) {
  RooflineConfig c;
  c.peak_flops_f32 = FirstRate(device, {"f32", "bf16", "f16"});
  c.peak_flops_bf16 = FirstRate(device, {"bf16", "f16", "f32"});
  c.peak_flops_f16 = FirstRate(device, {"f16", "bf16", "f32"});
  c.peak_flops_i32 = FirstRate(device, {"i32", "int8"});
  if (!(c.peak_flops_i32.per_second() > 0)) c.peak_flops_i32 = c.peak_flops_bf16;
  c.peak_flops_f8 = FirstRate(device, {"fp8"});
  if (!(c.peak_flops_f8.per_second() > 0)) c.peak_flops_f8 = c.peak_flops_bf16;
  if (!(c.peak_flops_bf16.per_second() > 0)) {
    throw std::invalid_argument("device '" + device.chip +
                                "' has no f32, bf16 or f16 FLOP/s figure to price ops with");
  }
  if (!(device.hbm_bandwidth.bytes_per_second() > 0)) {
    throw std::invalid_argument("device '" + device.chip +
                                "' has no positive HBM bandwidth to price ops with");
  }
  c.hbm_bandwidth = device.hbm_bandwidth;
  c.matmul_efficiency = device.matmul_efficiency;
  c.attention_efficiency = device.attention_efficiency.value_or(device.matmul_efficiency);
  c.memory_efficiency = device.memory_efficiency;
  c.op_overhead = device.op_overhead;
  return c;
}

RooflineModel::RooflineModel(RooflineConfig config) : config_(std::move(config)) {}

// Rules:
// - reshape costs nothing at all (Time()): it is a relabelling of the same buffer, no
//   kernel runs, so not even the launch overhead is paid.
// - every other kind, local ops and the per-device parts of fused ops alike, costs the
//   roofline plus op_overhead; the kind does not change the formula, since LocalOpCost
//   already gives each op its FLOPs and bytes (elementwise ops have 1 FLOP per element
//   and several bytes, so they land on the memory roof by themselves). An op with 0 FLOPs
//   and 0 bytes (an empty array) still pays op_overhead: a kernel is still launched.
// - FLOPs run at peak(dtype) * matmul_efficiency (a fused attention kernel's at
//   attention_efficiency), bytes at HBM bandwidth * memory_efficiency; a zero count
//   contributes no time whatever the rate.
// The roofline term is computed in double seconds and rounded up to a whole picosecond.
Time RooflineModel::OpTime(OpKind kind, const OpCost& cost, DType dtype) const {
  if (kind == OpKind::kReshape) return Time();
  FlopRate peak;
  switch (dtype) {
    case DType::kF32:
      peak = config_.peak_flops_f32;
      break;
    case DType::kBF16:
      peak = config_.peak_flops_bf16;
      break;
    case DType::kF16:
      peak = config_.peak_flops_f16;
      break;
    case DType::kI32:
      peak = config_.peak_flops_i32;
      break;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      peak = config_.peak_flops_f8;
      break;
  }
  double compute_s = 0;
  const double efficiency =
      cost.fused_attention ? config_.attention_efficiency : config_.matmul_efficiency;
  if (cost.flops > 0) compute_s = cost.flops / (peak.per_second() * efficiency);
  double memory_s = 0;
  if (cost.bytes > 0) {
    memory_s = cost.bytes / (config_.hbm_bandwidth.bytes_per_second() * config_.memory_efficiency);
  }
  return Time::FromSecondsCeil(std::max(compute_s, memory_s)) + config_.op_overhead;
}

}  // namespace shardsim
