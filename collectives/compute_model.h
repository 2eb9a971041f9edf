// How long a local op takes on a device: the cost model interface and the roofline model.
#pragma once

#include "collectives/dtype.h"
#include "collectives/local_ops.h"
#include "collectives/program.h"
#include "sim/time.h"
#include "topology/device_spec.h"

namespace shardsim {

// Prices a local op from its FLOPs and bytes. Behind an interface so a calibrated or profiled
// model can replace the roofline.
class ComputeModel {
 public:
  virtual ~ComputeModel() = default;
  // Time of one local op of `kind` with `cost`, computing in `dtype`.
  virtual Time OpTime(OpKind kind, const OpCost& cost, DType dtype) const = 0;
};

// The roofline model's typed configuration (defaults from the device's preset figures).
struct RooflineConfig {
  FlopRate peak_flops_f32;         // Peak for f32 work.
  FlopRate peak_flops_bf16;        // Peak for bf16 work.
  FlopRate peak_flops_f16;         // Peak for f16 work.
  FlopRate peak_flops_i32;         // Peak for i32 work (elementwise only in practice).
  FlopRate peak_flops_f8;          // Peak for f8e4m3 / f8e5m2 work (FP8 tensor cores).
  Bandwidth hbm_bandwidth;         // HBM bandwidth.
  double matmul_efficiency = 1.0;  // Fraction of peak FLOP/s reached.
  // Fraction of peak FLOP/s a fused attention kernel reaches (OpCost::fused_attention).
  double attention_efficiency = 1.0;
  double memory_efficiency = 1.0;  // Fraction of HBM bandwidth reached.
  Time op_overhead;                // Fixed launch cost per op.

  // The configuration a device's figures give.
  static RooflineConfig FromDevice(const DeviceSpec& device);
};

// time = max(FLOPs / (peak(dtype) * matmul_efficiency),
//            bytes / (HBM bandwidth * memory_efficiency)) + op_overhead,
// with attention_efficiency for the FLOPs of a fused attention kernel.
// An op is compute-bound when its arithmetic intensity (FLOPs per byte) exceeds the
// device's ridge point peak / bandwidth, memory-bound otherwise.
class RooflineModel : public ComputeModel {
 public:
  // A model with `config`.
  explicit RooflineModel(RooflineConfig config);
  Time OpTime(OpKind kind, const OpCost& cost, DType dtype) const override;
  // The configuration.
  const RooflineConfig& config() const { return config_; }

 private:
  RooflineConfig config_;
};

}  // namespace shardsim
