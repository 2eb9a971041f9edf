// The compute and memory figures of one device (chip or GPU).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {

// What one accelerator can do; later issues' cost models read it.
struct DeviceSpec {
  std::string chip;                       // Marketing name, e.g. "TPU v5p", "H100 SXM".
  std::string platform;                   // "TPU" or "GPU": names trace processes.
  std::map<std::string, FlopRate> flops;  // Peak dense rate per dtype ("bf16", "f32", ...).
  Bandwidth hbm_bandwidth;                // HBM bandwidth.
  Bytes hbm_capacity;                     // HBM capacity.
  // Fraction of the peak FLOP/s a large matmul reaches (roofline compute roof).
  double matmul_efficiency = 1.0;
  // Fraction of the peak FLOP/s a fused attention kernel (FlashAttention's) reaches; unset:
  // matmul_efficiency.
  std::optional<double> attention_efficiency;
  // Fraction of the HBM bandwidth a streaming op reaches (roofline memory roof).
  double memory_efficiency = 1.0;
  // Fixed cost of launching one op (kernel launch, or a TPU program step).
  Time op_overhead;
  // GPUs: communication kernels take SMs, so compute that overlaps communication runs this
  // fraction slower (0.1 = 10% longer). TPUs move data with DMA engines: 0.
  double comm_compute_slowdown = 0.0;
  // The link between the device and its host's memory, one way (host offload's copies; zero:
  // not known).
  Bandwidth host_bandwidth;
};

}  // namespace shardsim
