#include "collectives/compute_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/local_ops.h"
#include "sim/spec_error.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

// The preset defaults the closed forms below use (topology/presets.cc documents them; the
// topology tests pin them too): TPU matmul 0.85, memory 0.9, overhead 1 us; GPU matmul 0.8,
// memory 0.9, overhead 2 us. Peaks and bandwidths are hardware.md's figures.
constexpr double kTpuMatmulEff = 0.85;
constexpr double kTpuMemoryEff = 0.9;
constexpr double kTpuOverheadUs = 1.0;
constexpr double kGpuMatmulEff = 0.8;
constexpr double kGpuMemoryEff = 0.9;
constexpr double kGpuOverheadUs = 2.0;
constexpr double kMiB = 1024.0 * 1024.0;

// The cost LocalOpCost gives `kind` on shape-only operands (so these cases also check the
// FLOP and byte counts the model is fed).
OpCost CostOf(OpKind kind, DType dtype, const std::vector<Shape>& in_shapes, const Shape& out_shape,
              const std::string& spec = "") {
  std::vector<Array> ins;
  for (const Shape& s : in_shapes) ins.push_back(Array::ShapeOnly(dtype, s));
  Array out = Array::ShapeOnly(dtype, out_shape);
  std::vector<const Array*> in_ptrs;
  for (const Array& a : ins) in_ptrs.push_back(&a);
  return LocalOpCost(kind, in_ptrs, {&out}, spec);
}

RooflineModel PresetModel(const std::string& preset) {
  return RooflineModel(RooflineConfig::FromDevice(PresetDeviceSpec(preset)));
}

// One op on one preset, with the expected time from the closed form
// max(FLOPs / (peak * matmul_eff), bytes / (HBM * memory_eff)) + overhead.
struct OpTimeCase {
  std::string name;
  std::string preset;
  OpKind kind;
  DType dtype;
  OpCost cost;
  double expected_us;
};

void PrintTo(const OpTimeCase& c, std::ostream* os) { *os << c.name; }

class OpTimeTest : public testing::TestWithParam<OpTimeCase> {};

// Tolerance 1%: the expected values are the model's own closed form written independently
// in the table, so they differ from OpTime only by OpTime's round-up to a whole picosecond
// and floating-point evaluation order (far below 1%); every modelling mistake the table
// guards against is far outside it (the wrong dtype peak is 2-3x, a missing efficiency
// factor 10-25%, the wrong roof at least the ratio of the two roofs, a lost overhead tens
// of percent on the small ops).
TEST_P(OpTimeTest, MatchesClosedForm) {
  const OpTimeCase& c = GetParam();
  const double got_us = PresetModel(c.preset).OpTime(c.kind, c.cost, c.dtype).microseconds();
  EXPECT_NEAR(got_us, c.expected_us, 0.01 * c.expected_us);
}

constexpr double k8192 = 8192;
constexpr double k4096 = 4096;

INSTANTIATE_TEST_SUITE_P(
    Presets, OpTimeTest,
    testing::Values(
        // 2 * 8192^3 FLOPs against 3 * 128 MiB: intensity ~2730 FLOP/B, far above v5e's ridge.
        OpTimeCase{
            "MatmulBf16ComputeBoundV5e", "tpu-v5e", OpKind::kMatmul, DType::kBF16,
            CostOf(OpKind::kMatmul, DType::kBF16, {{8192, 8192}, {8192, 8192}}, {8192, 8192}),
            2 * k8192* k8192* k8192 / (197e12 * kTpuMatmulEff) * 1e6 + kTpuOverheadUs},
        // f32 runs at bf16 / 3 on a TPU (presets.cc): the same matmul takes 3x the compute.
        OpTimeCase{"MatmulF32ComputeBoundV5e", "tpu-v5e", OpKind::kMatmul, DType::kF32,
                   CostOf(OpKind::kMatmul, DType::kF32, {{8192, 8192}, {8192, 8192}}, {8192, 8192}),
                   2 * k8192* k8192* k8192 / (197e12 / 3 * kTpuMatmulEff) * 1e6 + kTpuOverheadUs},
        // add of two f32 [4096, 4096]: reads 2 x 64 MiB and writes 64 MiB, 1 FLOP/element.
        OpTimeCase{"AddF32MemoryBoundV5e", "tpu-v5e", OpKind::kAdd, DType::kF32,
                   CostOf(OpKind::kAdd, DType::kF32, {{4096, 4096}, {4096, 4096}}, {4096, 4096}),
                   3 * 64 * kMiB / (820e9 * kTpuMemoryEff) * 1e6 + kTpuOverheadUs},
        // A skinny matmul (K = 128) is memory-bound: 2*8192*8192*128 FLOPs against
        // 2 MiB + 2 MiB + 128 MiB, ~124 FLOP/B, under v5e's ridge of ~227.
        OpTimeCase{"SkinnyMatmulMemoryBoundV5e", "tpu-v5e", OpKind::kMatmul, DType::kBF16,
                   CostOf(OpKind::kMatmul, DType::kBF16, {{8192, 128}, {128, 8192}}, {8192, 8192}),
                   (2 * 2 * kMiB + 128 * kMiB) / (820e9 * kTpuMemoryEff) * 1e6 + kTpuOverheadUs},
        // einsum "bd,df->bf" with b = 4096, d = f = 8192 on v5p: 2 * b * d * f FLOPs.
        OpTimeCase{"EinsumBf16ComputeBoundV5p", "tpu-v5p", OpKind::kEinsum, DType::kBF16,
                   CostOf(OpKind::kEinsum, DType::kBF16, {{4096, 8192}, {8192, 8192}}, {4096, 8192},
                          "bd,df->bf"),
                   2 * k4096* k8192* k8192 / (459e12 * kTpuMatmulEff) * 1e6 + kTpuOverheadUs},
        // gelu of bf16 [4096, 4096] on v6e: reads and writes 32 MiB each.
        OpTimeCase{"GeluBf16MemoryBoundV6e", "tpu-v6e", OpKind::kGelu, DType::kBF16,
                   CostOf(OpKind::kGelu, DType::kBF16, {{4096, 4096}}, {4096, 4096}),
                   2 * 32 * kMiB / (1.6e12 * kTpuMemoryEff) * 1e6 + kTpuOverheadUs},
        // i32 elementwise on v4: memory-bound like any other dtype (4 bytes per element).
        OpTimeCase{"MulI32MemoryBoundV4", "tpu-v4", OpKind::kMul, DType::kI32,
                   CostOf(OpKind::kMul, DType::kI32, {{4096, 4096}, {4096, 4096}}, {4096, 4096}),
                   3 * 64 * kMiB / (1.2e12 * kTpuMemoryEff) * 1e6 + kTpuOverheadUs},
        OpTimeCase{
            "MatmulBf16ComputeBoundH100", "h100-dgx", OpKind::kMatmul, DType::kBF16,
            CostOf(OpKind::kMatmul, DType::kBF16, {{8192, 8192}, {8192, 8192}}, {8192, 8192}),
            2 * k8192* k8192* k8192 / (9.9e14 * kGpuMatmulEff) * 1e6 + kGpuOverheadUs},
        // f32 matmuls run on TF32 tensor cores at bf16 / 2 on GPUs (presets.cc).
        OpTimeCase{"MatmulF32ComputeBoundH100", "h100-dgx", OpKind::kMatmul, DType::kF32,
                   CostOf(OpKind::kMatmul, DType::kF32, {{8192, 8192}, {8192, 8192}}, {8192, 8192}),
                   2 * k8192* k8192* k8192 / (9.9e14 / 2 * kGpuMatmulEff) * 1e6 + kGpuOverheadUs},
        OpTimeCase{"AddF32MemoryBoundH100", "h100-dgx", OpKind::kAdd, DType::kF32,
                   CostOf(OpKind::kAdd, DType::kF32, {{4096, 4096}, {4096, 4096}}, {4096, 4096}),
                   3 * 64 * kMiB / (3.35e12 * kGpuMemoryEff) * 1e6 + kGpuOverheadUs},
        // Transpose of f32 [4096, 4096] on B200: a copy, 64 MiB read and 64 MiB written.
        OpTimeCase{"TransposeF32B200", "b200-dgx", OpKind::kTranspose, DType::kF32,
                   CostOf(OpKind::kTranspose, DType::kF32, {{4096, 4096}}, {4096, 4096}),
                   2 * 64 * kMiB / (8.0e12 * kGpuMemoryEff) * 1e6 + kGpuOverheadUs},
        // A tiny op is all overhead: 4 FLOPs and 48 bytes take picoseconds.
        OpTimeCase{"TinyAddIsOverheadA100", "a100-dgx", OpKind::kAdd, DType::kF32,
                   CostOf(OpKind::kAdd, DType::kF32, {{4}, {4}}, {4}),
                   48 / (2.0e12 * kGpuMemoryEff) * 1e6 + kGpuOverheadUs}),
    [](const testing::TestParamInfo<OpTimeCase>& info) { return info.param.name; });

// The time of a cost on `model` without the overhead, in seconds.
double RoofSeconds(const RooflineModel& model, const OpCost& cost, DType dtype) {
  return (model.OpTime(OpKind::kMatmul, cost, dtype) - model.config().op_overhead).seconds();
}

TEST(RooflineTest, RidgePointSwitchesRoof) {
  for (const std::string preset : {"tpu-v5e", "h100-dgx"}) {
    const RooflineModel model = PresetModel(preset);
    const RooflineConfig& c = model.config();
    const double compute_rate = c.peak_flops_bf16.per_second() * c.matmul_efficiency;
    const double memory_rate = c.hbm_bandwidth.bytes_per_second() * c.memory_efficiency;
    const double ridge = compute_rate / memory_rate;  // FLOP per byte.
    const double bytes = 1 << 30;
    // 1% above the ridge the compute roof decides; 1% below, the memory roof (which then
    // gives the same time whatever the FLOPs).
    const OpCost above{ridge * bytes * 1.01, bytes};
    const OpCost below{ridge * bytes * 0.99, bytes};
    EXPECT_EQ(model.OpTime(OpKind::kMatmul, above, DType::kBF16),
              Time::FromSecondsCeil(above.flops / compute_rate) + c.op_overhead)
        << preset;
    EXPECT_EQ(model.OpTime(OpKind::kMatmul, below, DType::kBF16),
              Time::FromSecondsCeil(bytes / memory_rate) + c.op_overhead)
        << preset;
    EXPECT_NEAR(RoofSeconds(model, above, DType::kBF16) / RoofSeconds(model, below, DType::kBF16),
                1.01, 1e-9)
        << preset;
    // Exactly at the ridge both roofs agree.
    const OpCost at{ridge * bytes, bytes};
    EXPECT_NEAR(RoofSeconds(model, at, DType::kBF16), bytes / memory_rate, 2e-12) << preset;
  }
}

TEST(RooflineTest, OverheadIsAddedOnce) {
  RooflineConfig c = RooflineConfig::FromDevice(PresetDeviceSpec("tpu-v5e"));
  const OpCost cost{1e12, 1e9};
  c.op_overhead = Time();
  const Time bare = RooflineModel(c).OpTime(OpKind::kMatmul, cost, DType::kBF16);
  c.op_overhead = Time::Microseconds(7);
  const RooflineModel with(c);
  EXPECT_EQ(with.OpTime(OpKind::kMatmul, cost, DType::kBF16), bare + Time::Microseconds(7));
  // An op with no work (an empty array) still launches: it costs the overhead alone.
  EXPECT_EQ(with.OpTime(OpKind::kAdd, OpCost{0, 0}, DType::kF32), Time::Microseconds(7));
  EXPECT_EQ(with.OpTime(OpKind::kConcatenate, OpCost{0, 0}, DType::kF32), Time::Microseconds(7));
}

TEST(RooflineTest, ReshapeCostsNothing) {
  for (const std::string& preset : PresetNames()) {
    const RooflineModel model = PresetModel(preset);
    EXPECT_GT(model.config().op_overhead, Time()) << preset;
    OpCost cost = CostOf(OpKind::kReshape, DType::kF32, {{4096, 4096}}, {16, 1024, 1024});
    EXPECT_EQ(model.OpTime(OpKind::kReshape, cost, DType::kF32), Time()) << preset;
    // Even with bytes charged to it, a reshape is a relabelling: no kernel, no time.
    EXPECT_EQ(model.OpTime(OpKind::kReshape, OpCost{1e9, 1e9}, DType::kBF16), Time()) << preset;
  }
}

TEST(RooflineTest, DtypePeaks) {
  // v5e: f32 = bf16 / 3, f16 = bf16, i32 takes the int8 rate (3.94e14).
  RooflineConfig tpu = RooflineConfig::FromDevice(PresetDeviceSpec("tpu-v5e"));
  EXPECT_DOUBLE_EQ(tpu.peak_flops_bf16.per_second(), 197e12);
  EXPECT_DOUBLE_EQ(tpu.peak_flops_f16.per_second(), 197e12);
  EXPECT_DOUBLE_EQ(tpu.peak_flops_f32.per_second(), 197e12 / 3);
  EXPECT_DOUBLE_EQ(tpu.peak_flops_i32.per_second(), 394e12);
  // H100: f32 (TF32) = bf16 / 2; no int8 figure, so i32 takes bf16.
  RooflineConfig gpu = RooflineConfig::FromDevice(PresetDeviceSpec("h100-dgx"));
  EXPECT_DOUBLE_EQ(gpu.peak_flops_f32.per_second(), 9.9e14 / 2);
  EXPECT_DOUBLE_EQ(gpu.peak_flops_i32.per_second(), 9.9e14);

  // Compute-bound times scale with 1 / peak.
  const RooflineModel model(tpu);
  const OpCost cost{1e14, 0};
  const double bf16 = RoofSeconds(model, cost, DType::kBF16);
  EXPECT_NEAR(RoofSeconds(model, cost, DType::kF32) / bf16, 3.0, 1e-9);
  EXPECT_NEAR(RoofSeconds(model, cost, DType::kF16) / bf16, 1.0, 1e-9);
  EXPECT_NEAR(RoofSeconds(model, cost, DType::kI32) / bf16, 0.5, 1e-9);
}

// FP8: H100 lists 2.0e15 FLOP/s (hardware.md) against 9.9e14 for bf16; a chip without an FP8 figure
// (v5e) runs FP8 operands at its bf16 rate. A matmul's rate follows its operands, not its
// result: an f8e4m3 GEMM with a bf16 result (preferred_element_type) runs at the FP8 rate.
TEST(RooflineTest, Fp8RunsAtTheFp8RateWhereTheChipHasOne) {
  const RooflineConfig gpu = RooflineConfig::FromDevice(PresetDeviceSpec("h100-dgx"));
  EXPECT_DOUBLE_EQ(gpu.peak_flops_f8.per_second(), 2.0e15);
  const RooflineConfig tpu = RooflineConfig::FromDevice(PresetDeviceSpec("tpu-v5e"));
  EXPECT_DOUBLE_EQ(tpu.peak_flops_f8.per_second(), 197e12);
  const RooflineModel model(gpu);
  const OpCost cost{1e14, 0};
  EXPECT_NEAR(RoofSeconds(model, cost, DType::kF8E4M3) / RoofSeconds(model, cost, DType::kBF16),
              9.9e14 / 2.0e15, 1e-9);
  const Array a = Array::ShapeOnly(DType::kF8E4M3, {4096, 4096});
  OpSpec gemm;
  gemm.kind = OpKind::kMatmul;
  gemm.dtype = "bf16";
  const Array out = Matmul(a, a, DType::kBF16);
  EXPECT_EQ(out.dtype(), DType::kBF16);
  EXPECT_EQ(CostDType(gemm, {&a, &a}, {&out}), DType::kF8E4M3);
  // Bytes: 16 MiB of each operand at 1 B an element, 32 MiB of bf16 result.
  const OpCost c = LocalOpCost(gemm, {&a, &a}, {&out});
  EXPECT_DOUBLE_EQ(c.bytes, 4096.0 * 4096 * (1 + 1 + 2));
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4096 * 4096 * 4096);
}

TEST(RooflineTest, FromDeviceCopiesFiguresAndFallsBack) {
  DeviceSpec d;
  d.chip = "test";
  d.flops["bf16"] = FlopRate::PerSecond(100e12);
  d.hbm_bandwidth = Bandwidth::BytesPerSecond(1e12);
  d.matmul_efficiency = 0.5;
  d.memory_efficiency = 0.25;
  d.op_overhead = Time::Nanoseconds(300);
  RooflineConfig c = RooflineConfig::FromDevice(d);
  // Only bf16 given: every dtype falls back to it.
  EXPECT_DOUBLE_EQ(c.peak_flops_f32.per_second(), 100e12);
  EXPECT_DOUBLE_EQ(c.peak_flops_f16.per_second(), 100e12);
  EXPECT_DOUBLE_EQ(c.peak_flops_i32.per_second(), 100e12);
  EXPECT_DOUBLE_EQ(c.hbm_bandwidth.bytes_per_second(), 1e12);
  EXPECT_EQ(c.matmul_efficiency, 0.5);
  EXPECT_EQ(c.memory_efficiency, 0.25);
  EXPECT_EQ(c.op_overhead, Time::Nanoseconds(300));

  // Only f32 given: the 16-bit dtypes take it; an explicit i32 rate wins over int8.
  DeviceSpec f32_only = d;
  f32_only.flops = {{"f32", FlopRate::PerSecond(20e12)},
                    {"i32", FlopRate::PerSecond(5e12)},
                    {"int8", FlopRate::PerSecond(80e12)}};
  c = RooflineConfig::FromDevice(f32_only);
  EXPECT_DOUBLE_EQ(c.peak_flops_bf16.per_second(), 20e12);
  EXPECT_DOUBLE_EQ(c.peak_flops_f16.per_second(), 20e12);
  EXPECT_DOUBLE_EQ(c.peak_flops_i32.per_second(), 5e12);

  DeviceSpec no_rates = d;
  no_rates.flops = {{"fp8", FlopRate::PerSecond(1e15)}};
  EXPECT_THROW(RooflineConfig::FromDevice(no_rates), std::invalid_argument);
  DeviceSpec no_bandwidth = d;
  no_bandwidth.hbm_bandwidth = Bandwidth();
  EXPECT_THROW(RooflineConfig::FromDevice(no_bandwidth), std::invalid_argument);
}

// A fused attention kernel's FLOPs run at the attention efficiency: the A100 preset's 0.6
// (FlashAttention-2's 50-73% of its peak), against its GEMMs' 0.8; presets without a figure
// of their own (H100) run it at the matmul efficiency, and a run file may set it.
TEST(RooflineTest, FusedAttentionRunsAtTheAttentionEfficiency) {
  OpCost attention;
  attention.flops = 4.0 * 32 * 128 * 8192 * 8193 / 2;  // One causal layer: 4 N H pairs.
  attention.bytes = 4 * 8192 * 32 * 128 * 2.0;         // q, k, v, out in bf16.
  attention.fused_attention = true;
  OpCost products = attention;
  products.fused_attention = false;
  const RooflineModel a100 = PresetModel("a100-dgx");
  const double fused_us = attention.flops / (3.1e14 * 0.6) * 1e6 + kGpuOverheadUs;
  const double gemm_us = attention.flops / (3.1e14 * kGpuMatmulEff) * 1e6 + kGpuOverheadUs;
  EXPECT_NEAR(a100.OpTime(OpKind::kAttention, attention, DType::kBF16).microseconds(), fused_us,
              0.01 * fused_us);
  EXPECT_NEAR(a100.OpTime(OpKind::kAttention, products, DType::kBF16).microseconds(), gemm_us,
              0.01 * gemm_us);
  const RooflineModel h100 = PresetModel("h100-dgx");
  EXPECT_EQ(h100.OpTime(OpKind::kAttention, attention, DType::kBF16),
            h100.OpTime(OpKind::kAttention, products, DType::kBF16));
  HardwareSpec spec;
  spec.preset = "h100-dgx";
  spec.device.attention_efficiency = 0.4;
  const RooflineModel set(RooflineConfig::FromDevice(BuildHardware(spec).device_spec()));
  const double set_us = attention.flops / (9.9e14 * 0.4) * 1e6 + kGpuOverheadUs;
  EXPECT_NEAR(set.OpTime(OpKind::kAttention, attention, DType::kBF16).microseconds(), set_us,
              0.01 * set_us);
  spec.device.attention_efficiency = 1.5;
  EXPECT_THROW(BuildHardware(spec), SpecError);
}

TEST(RooflineTest, RunFileOverridesChangeTheResult) {
  HardwareSpec spec;
  spec.preset = "tpu-v5e";
  spec.device.flops["bf16"] = FlopRate::PerSecond(100e12);
  spec.device.hbm_bandwidth = Bandwidth::BytesPerSecond(500e9);
  spec.device.matmul_efficiency = 0.5;
  spec.device.memory_efficiency = 0.8;
  spec.device.op_overhead = Time::Microseconds(10);
  const RooflineModel model(RooflineConfig::FromDevice(BuildHardware(spec).device_spec()));
  const OpCost matmul =
      CostOf(OpKind::kMatmul, DType::kBF16, {{8192, 8192}, {8192, 8192}}, {8192, 8192});
  const double matmul_us = 2 * k8192 * k8192 * k8192 / (100e12 * 0.5) * 1e6 + 10;
  EXPECT_NEAR(model.OpTime(OpKind::kMatmul, matmul, DType::kBF16).microseconds(), matmul_us,
              0.01 * matmul_us);
  const OpCost add = CostOf(OpKind::kAdd, DType::kF32, {{4096, 4096}, {4096, 4096}}, {4096, 4096});
  const double add_us = 3 * 64 * kMiB / (500e9 * 0.8) * 1e6 + 10;
  EXPECT_NEAR(model.OpTime(OpKind::kAdd, add, DType::kF32).microseconds(), add_us, 0.01 * add_us);
  // The default model differs: the overrides took effect.
  EXPECT_GT(model.OpTime(OpKind::kMatmul, matmul, DType::kBF16),
            PresetModel("tpu-v5e").OpTime(OpKind::kMatmul, matmul, DType::kBF16) * 3);
}

// ComputeModel is an interface: a different model can stand in for the roofline.
TEST(RooflineTest, UsableThroughTheInterface) {
  const RooflineModel roofline = PresetModel("tpu-v5e");
  const ComputeModel& model = roofline;
  EXPECT_EQ(model.OpTime(OpKind::kAdd, OpCost{0, 0}, DType::kF32), Time::Microseconds(1));
}

}  // namespace
}  // namespace shardsim
