#include "topology/presets.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "sim/closest_name.h"
#include "sim/spec_error.h"
#include "topology/build.h"
#include "topology/hierarchical.h"
#include "topology/multi_slice.h"
#include "topology/overrides.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// Decimal gigabytes, as HBM capacities are published (1 GB = 1e9 bytes).
constexpr Bytes Gigabytes(int64_t gb) { return Bytes(gb * 1000 * 1000 * 1000); }

// How a TPU preset decides which torus axes wrap around.
enum class WrapRule {
  kFullCubes,  // v4, v5p: axes that are multiples of 4, in slices of full 4x4x4 cubes.
  kLength16,   // v5e, v6e: only an axis of length 16.
};

struct TpuPreset {
  std::string name;
  std::vector<int> default_shape;
  WrapRule wrap_rule;
  Bandwidth ici;  // One way per link.
  DeviceSpec device;
  // DCN bandwidth per chip, one way (multi-slice machines); zero where hardware.md has none.
  Bandwidth dcn;
};

struct GpuPreset {
  std::string name;
  int gpus_per_node;
  Bandwidth nvlink;  // Per GPU, one way.
  DeviceSpec device;
  CommSpec comm;  // How NCCL drives the links.
  Bandwidth nic;  // Scale-out NIC per GPU, one way.
};

// NCCL's figures on a GPU preset (CommSpec). Sources and status of each:
// - Protocol efficiencies follow NCCL's own tuning model (src/graph/tuning.cc): LL moves a
//   4-byte flag with every 4 bytes of data and its ring all-reduce bandwidth is modelled at a
//   quarter of Simple's (0.25); LL128 carries 120 data bytes in every 128 (NCCL models 0.92);
//   Simple 1.
// - nvlink_efficiency: NCCL's tuning model caps an A100 node's ring bus bandwidth at 235 GB/s
//   of the 300 GB/s NVLink (235 / 300 = 0.783), and the A100 fit below left that figure as it
//   was; Hopper and Blackwell take the H100 fit's 0.792.
// - launch_latency, net_latency, the protocols' step latencies and nic_efficiency are
//   CALIBRATED with `shardsim calibrate` (least squares on ln time) against the public
//   nccl-tests curves of measured-steps.md, shipped in tests/data/nccl/:
//     shardsim calibrate --preset a100-dgx tests/data/nccl/a100_8gpu_oci_all_reduce_perf.txt
//       -> launch 28.4 us; step LL 0.217 us, LL128 4.24 us, Simple 5.02 us (rms 0.019)
//     shardsim calibrate --preset h100-dgx tests/data/nccl/h100_2x8gpu_aws_p5_all_reduce_perf.txt
//         --fit net_latency,protocols.LL.step_latency,protocols.LL128.step_latency,
//               protocols.Simple.step_latency,nvlink_efficiency,nic_efficiency
//       -> net 11.8 us; step LL 0.154 us, Simple 14.2 us; nvlink 0.792, nic 0.887 (rms 0.040)
//   Those two curves are therefore a fit, not an independent check (reports/collectives.md
//   says so beside each row). Figures no curve constrains are ASSUMPTIONS: Hopper and
//   Blackwell take the A100 fit's launch latency (one node's launch and synchronisation; the
//   2-node curve cannot tell it from the network's latency, so it was held) and LL128 step
//   latency (the 2-node curve never runs LL128); the A100 preset's NICs take the H100 fit's
//   efficiency and network latency (that machine's EFA; Selene's InfiniBand is likely faster).
//   The H100 Simple step latency is fitted on a curve whose Simple messages all cross the
//   network's pipeline: it likely overstates an NVLink-only step.
// - channels 8: one ring per NIC rail of a DGX node (NCCL runs rail-aligned rings across
//   nodes so every NIC of a node works at once).
// - nvls: NVSwitch in-network reduction exists on Hopper and Blackwell switches (hardware.md,
//   GPUs: "NVSwitch in-network reduction (NVLS/SHARP) exists"), not on A100's.
// - chunk_size 1 MiB: ASSUMPTION, the order of NCCL's Simple chunk per channel (512 KiB) times
//   the two channels a GPU's NVLS or NIC stage keeps busy.
CommSpec NcclComm(bool hopper_or_later) {
  CommSpec c;
  c.nccl = true;
  c.launch_latency = Time::Nanoseconds(28438);
  c.net_latency = Time::Nanoseconds(11815);
  c.protocols[static_cast<int>(Protocol::kLL128)] = {Time::Nanoseconds(4235), 0.92};
  if (hopper_or_later) {
    c.protocols[static_cast<int>(Protocol::kLL)] = {Time::Nanoseconds(154), 0.25};
    c.protocols[static_cast<int>(Protocol::kSimple)] = {Time::Nanoseconds(14202), 1.0};
    c.nvlink_efficiency = 0.7919;
  } else {
    c.protocols[static_cast<int>(Protocol::kLL)] = {Time::Nanoseconds(217), 0.25};
    c.protocols[static_cast<int>(Protocol::kSimple)] = {Time::Nanoseconds(5021), 1.0};
    c.nvlink_efficiency = 235.0 / 300.0;
  }
  c.nic_efficiency = 0.8867;
  c.channels = 8;
  c.nvls = hopper_or_later;
  c.chunk_size = Bytes::MiB(1);
  return c;
}

// f32 matmuls on a TPU MXU run as several bf16 passes. ASSUMPTION (hardware.md: "f32 matmul
// throughput is not in the table; a preset may take it as a documented fraction of bf16"):
// f32 = bf16 / 3, XLA's 3-pass bf16 algorithm (Precision.HIGH, close to f32 accuracy).
constexpr double kTpuF32Fraction = 1.0 / 3.0;
// GPUs run f32 matmuls on TF32 tensor cores (JAX's default on Ampere and later); NVIDIA's
// A100/H100/B200 datasheets list dense TF32 at half the dense BF16 rate: f32 = bf16 / 2.
constexpr double kGpuF32Fraction = 1.0 / 2.0;

// Fills bf16 and the derived f32 and f16 rates. f16: ASSUMPTION, the bf16 rate (GPU
// datasheets list equal FP16 and BF16 tensor rates; TPUs take 16-bit floats on the MXU).
DeviceSpec Chip(std::string chip, std::string platform, double bf16, double f32_fraction,
                Bandwidth hbm_bandwidth, Bytes hbm_capacity) {
  DeviceSpec d;
  d.chip = std::move(chip);
  d.platform = std::move(platform);
  d.flops["bf16"] = FlopRate::PerSecond(bf16);
  d.flops["f16"] = FlopRate::PerSecond(bf16);
  d.flops["f32"] = FlopRate::PerSecond(bf16 * f32_fraction);
  d.hbm_bandwidth = hbm_bandwidth;
  d.hbm_capacity = hbm_capacity;
  return d;
}

// The roofline's efficiency factors, launch overhead and comm/compute interference of one
// preset (DeviceSpec's last four fields). hardware.md has no such figures and vendors
// publish none; the values below are ASSUMPTIONS from public benchmark reports, stated as
// such, and every preset says which set it takes. A run file overrides each one under
// hardware.device (matmul_efficiency, memory_efficiency, op_overhead, comm_compute_slowdown).
struct ComputeDefaults {
  double matmul_efficiency;
  double memory_efficiency;
  Time op_overhead;
  double comm_compute_slowdown;
};

// TPUs.
// - matmul_efficiency 0.85. ASSUMPTION: large bf16 matmuls (all dimensions multiples of
//   the 128x128 MXU, thousands wide) are reported at roughly 80-90% of peak on TPU v4/v5
//   in public JAX benchmarks; whole-model MFU is lower, but that loss comes from the other
//   ops and from communication, which the simulator models separately.
// - memory_efficiency 0.9. ASSUMPTION: a streaming elementwise op reaches about 90% of the
//   HBM figure (the same order as STREAM-type results on HBM parts).
// - op_overhead 1 us. ASSUMPTION: XLA runs a TPU program as one compiled executable, so
//   there is no host launch per op; what remains is each fusion's pipeline fill and drain
//   and its synchronisation, taken as about 1 us.
// - comm_compute_slowdown 0: TPU collectives move data with the ICI DMA engines, not with
//   the cores that compute (the issue fixes TPUs at 0).
constexpr ComputeDefaults kTpuDefaults{0.85, 0.9, Time::Microseconds(1), 0.0};

// GPUs.
// - matmul_efficiency 0.8. ASSUMPTION: cuBLAS bf16 GEMMs of size ~8192 are reported at
//   roughly 75-85% of the dense datasheet peak on A100 and H100 (power and clock limits
//   keep the tensor cores below their peak clock under sustained load).
// - memory_efficiency 0.9. ASSUMPTION: bandwidth tests on A100/H100 reach about 85-93% of
//   the HBM datasheet figure.
// - op_overhead 2 us. ASSUMPTION: one CUDA kernel launch plus its ramp and tail costs a few
//   microseconds back to back (less under CUDA graphs); 2 us.
// - comm_compute_slowdown 0.1. ASSUMPTION from NCCL's design: each NCCL channel runs as one
//   thread block on one SM, and NVLink collectives typically use about 8-16 channels, so
//   8-16 of the 132 SMs of an H100 (108 on A100, 148 on B200) are busy communicating.
//   A compute kernel overlapping them has 88-94% of the SMs: 6-14% slower (132/124 = 1.06,
//   132/116 = 1.14), plus some HBM bandwidth taken by the copies; 0.1 = 10% longer.
constexpr ComputeDefaults kGpuDefaults{0.8, 0.9, Time::Microseconds(2), 0.1};

// hardware.md, TPU chips: "PCIe host link about 1.6e10 B/s" (taken as each direction's, per
// chip). hardware.md gives no GPU host link: GPU presets leave it unset (host offload then
// asks for hardware.device.host_bandwidth).
constexpr double kTpuHostLinkBytesPerSecond = 1.6e10;

// Sets `d`'s efficiency factors, overhead and slowdown from `defaults`.
void SetComputeDefaults(DeviceSpec& d, const ComputeDefaults& defaults) {
  d.matmul_efficiency = defaults.matmul_efficiency;
  d.memory_efficiency = defaults.memory_efficiency;
  d.op_overhead = defaults.op_overhead;
  d.comm_compute_slowdown = defaults.comm_compute_slowdown;
}

std::vector<TpuPreset> TpuPresets() {
  std::vector<TpuPreset> out;
  {
    // hardware.md, TPU chips (Scaling Book tpus.md, "TPU specs"), row v4:
    // HBM 32 GB, HBM 1.2e12 B/s, bf16 2.75e14 FLOP/s, int8 2.75e14 OP/s,
    // ICI 4.5e10 B/s one way per link; 6 links (3D torus, largest slice 16x16x16).
    DeviceSpec d = Chip("TPU v4", "TPU", 2.75e14, kTpuF32Fraction,
                        Bandwidth::BytesPerSecond(1.2e12), Gigabytes(32));
    d.flops["int8"] = FlopRate::PerSecond(2.75e14);
    SetComputeDefaults(d, kTpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    d.host_bandwidth = Bandwidth::BytesPerSecond(kTpuHostLinkBytesPerSecond);
    out.push_back({"tpu-v4",
                   {4, 4, 4},
                   WrapRule::kFullCubes,
                   Bandwidth::BytesPerSecond(4.5e10),
                   std::move(d),
                   Bandwidth()});  // hardware.md gives no DCN figure for v4.
  }
  {
    // hardware.md, TPU chips (Scaling Book tpus.md, "TPU specs"), row v5e:
    // HBM 16 GB, HBM 8.2e11 B/s, bf16 1.97e14 FLOP/s, int8 3.94e14 OP/s,
    // ICI 4.5e10 B/s one way per link; 4 links (2D torus, largest slice 16x16).
    DeviceSpec d = Chip("TPU v5e", "TPU", 1.97e14, kTpuF32Fraction,
                        Bandwidth::BytesPerSecond(8.2e11), Gigabytes(16));
    d.flops["int8"] = FlopRate::PerSecond(3.94e14);
    SetComputeDefaults(d, kTpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    d.host_bandwidth = Bandwidth::BytesPerSecond(kTpuHostLinkBytesPerSecond);
    // hardware.md, TPU chips: "DCN: ... 3.125e9 (v5e)" B/s per chip.
    out.push_back({"tpu-v5e",
                   {4, 4},
                   WrapRule::kLength16,
                   Bandwidth::BytesPerSecond(4.5e10),
                   std::move(d),
                   Bandwidth::BytesPerSecond(3.125e9)});
  }
  {
    // hardware.md, TPU chips (Scaling Book tpus.md, "TPU specs"), row v5p:
    // HBM 96 GB, HBM 2.8e12 B/s, bf16 4.59e14 FLOP/s, int8 9.18e14 OP/s,
    // ICI 9.0e10 B/s one way per link; 6 links (3D torus, largest slice 16x20x28).
    DeviceSpec d = Chip("TPU v5p", "TPU", 4.59e14, kTpuF32Fraction,
                        Bandwidth::BytesPerSecond(2.8e12), Gigabytes(96));
    d.flops["int8"] = FlopRate::PerSecond(9.18e14);
    SetComputeDefaults(d, kTpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    d.host_bandwidth = Bandwidth::BytesPerSecond(kTpuHostLinkBytesPerSecond);
    // hardware.md, TPU chips: "DCN: 6.25e9 B/s per chip (v5p)".
    out.push_back({"tpu-v5p",
                   {4, 4, 4},
                   WrapRule::kFullCubes,
                   Bandwidth::BytesPerSecond(9.0e10),
                   std::move(d),
                   Bandwidth::BytesPerSecond(6.25e9)});
  }
  {
    // hardware.md, TPU chips (Scaling Book tpus.md, "TPU specs"), row v6e:
    // HBM 32 GB, HBM 1.6e12 B/s, bf16 9.20e14 FLOP/s, int8 1.84e15 OP/s,
    // ICI 9.0e10 B/s one way per link; 4 links (2D torus, largest slice 16x16).
    DeviceSpec d = Chip("TPU v6e", "TPU", 9.20e14, kTpuF32Fraction,
                        Bandwidth::BytesPerSecond(1.6e12), Gigabytes(32));
    d.flops["int8"] = FlopRate::PerSecond(1.84e15);
    SetComputeDefaults(d, kTpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    d.host_bandwidth = Bandwidth::BytesPerSecond(kTpuHostLinkBytesPerSecond);
    // hardware.md, TPU chips: "DCN: ... 1.25e10 (v6e)" B/s per chip.
    out.push_back({"tpu-v6e",
                   {4, 4},
                   WrapRule::kLength16,
                   Bandwidth::BytesPerSecond(9.0e10),
                   std::move(d),
                   Bandwidth::BytesPerSecond(1.25e10)});
  }
  return out;
}

std::vector<GpuPreset> GpuPresets() {
  std::vector<GpuPreset> out;
  // Node size: hardware.md, GPUs, "HGX/DGX H100 node: 8 GPUs" (DGX A100/H200/B200 are also
  // 8-GPU NVSwitch nodes per NVIDIA's DGX datasheets); the NVSwitches are one switch vertex.
  // NICs: hardware.md, "Scale-out per GPU generation": DGX A100 (Selene) one 200 Gb/s HDR
  // InfiniBand port per GPU; DGX H100 and DGX B200 one 400 Gb/s ConnectX-7 per GPU (H200:
  // ASSUMPTION, the H100 figure, as HGX H200 uses the same ConnectX-7); GB200 NVL72 one
  // 800 Gb/s ConnectX-8 per GPU.
  {
    // hardware.md, GPUs (Scaling Book gpus.md; NVIDIA datasheets), row A100 SXM:
    // HBM 80 GB, 2.0e12 B/s, bf16 dense 3.1e14 FLOP/s, no fp8, NVLink 300e9 B/s one way
    // (12 links x 25 GB/s).
    DeviceSpec d = Chip("A100 SXM", "GPU", 3.1e14, kGpuF32Fraction,
                        Bandwidth::BytesPerSecond(2.0e12), Gigabytes(80));
    SetComputeDefaults(d, kGpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    // attention_efficiency 0.6: FlashAttention-2 reaches 50-73% of the A100's peak FLOP/s
    // over its benchmarks (Dao 2023, "FlashAttention-2", abstract), below the GEMMs' 0.8;
    // 0.6 is about the middle of that range. Taken after reports/validation.md showed every
    // A100 row fast, from the paper, not fitted to those rows. The other presets' attention
    // runs at their matmul efficiency (no such figure for their kernels).
    d.attention_efficiency = 0.6;
    out.push_back({"a100-dgx", 8, Bandwidth::BytesPerSecond(300e9), std::move(d), NcclComm(false),
                   Bandwidth::Gbps(200)});
  }
  {
    // hardware.md, GPUs, row H100 SXM: HBM 80 GB, 3.35e12 B/s, bf16 dense 9.9e14 FLOP/s,
    // fp8 2.0e15 FLOP/s, NVLink 450e9 B/s one way (18 links x 25 GB/s).
    DeviceSpec d = Chip("H100 SXM", "GPU", 9.9e14, kGpuF32Fraction,
                        Bandwidth::BytesPerSecond(3.35e12), Gigabytes(80));
    d.flops["fp8"] = FlopRate::PerSecond(2.0e15);
    SetComputeDefaults(d, kGpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    out.push_back({"h100-dgx", 8, Bandwidth::BytesPerSecond(450e9), std::move(d), NcclComm(true),
                   Bandwidth::Gbps(400)});
  }
  {
    // hardware.md, GPUs, row H200: HBM 141 GB, 4.8e12 B/s, bf16 dense 9.9e14 FLOP/s,
    // fp8 2.0e15 FLOP/s, NVLink 450e9 B/s one way.
    DeviceSpec d = Chip("H200", "GPU", 9.9e14, kGpuF32Fraction, Bandwidth::BytesPerSecond(4.8e12),
                        Gigabytes(141));
    d.flops["fp8"] = FlopRate::PerSecond(2.0e15);
    SetComputeDefaults(d, kGpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    out.push_back({"h200-dgx", 8, Bandwidth::BytesPerSecond(450e9), std::move(d), NcclComm(true),
                   Bandwidth::Gbps(400)});
  }
  {
    // hardware.md, GPUs, row B200: HBM 192 GB, 8.0e12 B/s, bf16 dense 2.3e15 FLOP/s,
    // fp8 4.5e15 FLOP/s, NVLink 900e9 B/s one way (18 links x 50 GB/s).
    DeviceSpec d = Chip("B200", "GPU", 2.3e15, kGpuF32Fraction, Bandwidth::BytesPerSecond(8.0e12),
                        Gigabytes(192));
    d.flops["fp8"] = FlopRate::PerSecond(4.5e15);
    SetComputeDefaults(d, kGpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    out.push_back({"b200-dgx", 8, Bandwidth::BytesPerSecond(900e9), std::move(d), NcclComm(true),
                   Bandwidth::Gbps(400)});
  }
  {
    // hardware.md, GPUs, "GB200 NVL72: 72 GPUs in one NVLink domain, 900e9 B/s per GPU one
    // way". ASSUMPTION: hardware.md gives no separate GB200 GPU row; its Blackwell GPUs take
    // the B200 row (HBM 192 GB, 8.0e12 B/s, bf16 2.3e15, fp8 4.5e15).
    DeviceSpec d = Chip("B200 (GB200 NVL72)", "GPU", 2.3e15, kGpuF32Fraction,
                        Bandwidth::BytesPerSecond(8.0e12), Gigabytes(192));
    d.flops["fp8"] = FlopRate::PerSecond(4.5e15);
    SetComputeDefaults(d, kGpuDefaults);  // Efficiencies, overhead, slowdown: see above.
    out.push_back({"gb200-nvl72", 72, Bandwidth::BytesPerSecond(900e9), std::move(d),
                   NcclComm(true), Bandwidth::Gbps(800)});
  }
  return out;
}

[[noreturn]] void ThrowUnknownPreset(std::string_view name) {
  std::vector<std::string> names = PresetNames();
  std::string message = "unknown preset '" + std::string(name) + "'";
  std::string closest = ClosestName(name, names);
  message += closest.empty() ? "." : "; did you mean '" + closest + "'?";
  message += " Known presets: " + JoinNames(names);
  throw SpecError("hardware.preset", message);
}

std::optional<TpuPreset> FindTpu(std::string_view name) {
  for (TpuPreset& p : TpuPresets()) {
    if (p.name == name) return std::move(p);
  }
  return std::nullopt;
}

std::optional<GpuPreset> FindGpu(std::string_view name) {
  for (GpuPreset& p : GpuPresets()) {
    if (p.name == name) return std::move(p);
  }
  return std::nullopt;
}

std::string ShapeText(const std::vector<int>& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += "x";
    out += std::to_string(shape[i]);
  }
  return out;
}

std::vector<bool> WrapByRule(WrapRule rule, const std::vector<int>& shape) {
  std::vector<bool> wrap(shape.size(), false);
  const bool full_cubes = std::all_of(shape.begin(), shape.end(), [](int k) { return k >= 4; });
  for (size_t i = 0; i < shape.size(); ++i) {
    switch (rule) {
      case WrapRule::kFullCubes:
        wrap[i] = full_cubes && shape[i] % 4 == 0;
        break;
      case WrapRule::kLength16:
        wrap[i] = shape[i] == 16;
        break;
    }
  }
  return wrap;
}

Topology BuildTpu(const TpuPreset& preset, const HardwareSpec& spec) {
  if (spec.nodes != 0) {
    throw SpecError("hardware.nodes", preset.name +
                                          " is a TPU preset: size the slice with `shape` "
                                          "(e.g. shape: [" +
                                          ShapeText(preset.default_shape) + "]), not `nodes`");
  }
  std::vector<int> shape = spec.shape.empty() ? preset.default_shape : spec.shape;
  const size_t rank = preset.default_shape.size();
  if (shape.size() != rank) {
    throw SpecError("hardware.shape", preset.name + " is a " + std::to_string(rank) +
                                          "D torus: shape needs " + std::to_string(rank) +
                                          " dimensions (like " + ShapeText(preset.default_shape) +
                                          "), got " + std::to_string(shape.size()));
  }
  CheckedDeviceCount(shape, "hardware.shape", preset.name);
  std::vector<bool> wrap = WrapByRule(preset.wrap_rule, shape);
  if (!spec.wraparound.empty()) {
    if (spec.wraparound.size() != shape.size()) {
      throw SpecError("hardware.wraparound",
                      "wraparound has " + std::to_string(spec.wraparound.size()) +
                          " entries but the shape " + ShapeText(shape) + " has " +
                          std::to_string(shape.size()) + " dimensions");
    }
    wrap = spec.wraparound;
  }
  ValidateLinkOverride(spec.link);
  DeviceSpec device = ApplyDeviceOverride(preset.device, spec.device);
  if (spec.slices < 0) {
    throw SpecError("hardware.slices", "slices must be >= 1, got " + std::to_string(spec.slices));
  }
  if (spec.slices > 1) {
    if (preset.dcn == Bandwidth()) {
      throw SpecError("hardware.slices", preset.name +
                                             ": the reference gives no DCN bandwidth for this "
                                             "chip, so several slices cannot be built");
    }
    CheckedDeviceCount({spec.slices, CheckedDeviceCount(shape, "hardware.shape", preset.name)},
                       "hardware.slices", preset.name);
    MultiSliceParams params;
    params.slices = spec.slices;
    params.shape = shape;
    params.wraparound = wrap;
    params.ici = OverrideBandwidth(spec.link, preset.ici);
    params.ici_latency = OverrideLatency(spec.link, kIciLatency);
    params.dcn = preset.dcn;
    params.dcn_latency = kDcnLatency;
    return BuildMultiSlice(
        params, std::move(device),
        preset.name + " " + std::to_string(spec.slices) + " slices of " + ShapeText(shape));
  }
  return BuildTorus(shape, wrap, OverrideBandwidth(spec.link, preset.ici),
                    OverrideLatency(spec.link, kIciLatency), LinkKind::kIci, std::move(device),
                    preset.name + " " + ShapeText(shape));
}

Topology BuildGpu(const GpuPreset& preset, const HardwareSpec& spec) {
  if (!spec.shape.empty()) {
    throw SpecError("hardware.shape", preset.name +
                                          " is a GPU preset: use `nodes: N` for more GPUs; "
                                          "`shape` applies to TPU presets");
  }
  if (!spec.wraparound.empty()) {
    throw SpecError("hardware.wraparound",
                    preset.name + " is a GPU preset: wraparound applies to TPU tori only");
  }
  if (spec.slices != 0) {
    throw SpecError("hardware.slices", preset.name +
                                           " is a GPU preset: use `nodes: N` for more GPUs; "
                                           "`slices` applies to TPU presets");
  }
  if (spec.nodes < 0) {
    throw SpecError("hardware.nodes", "nodes must be >= 1, got " + std::to_string(spec.nodes));
  }
  const int nodes = std::max(spec.nodes, 1);
  if (static_cast<int64_t>(nodes) * preset.gpus_per_node > kMaxDevices) {
    throw SpecError("hardware.nodes",
                    std::to_string(nodes) + " nodes of " + std::to_string(preset.gpus_per_node) +
                        " GPUs exceed the limit of " + std::to_string(kMaxDevices) + " devices");
  }
  ValidateLinkOverride(spec.link);
  DeviceSpec device = ApplyDeviceOverride(preset.device, spec.device);
  const Bandwidth nvlink = OverrideBandwidth(spec.link, preset.nvlink);
  const Time nvlink_latency = OverrideLatency(spec.link, kNvlinkLatency);
  if (nodes == 1) {
    return BuildSwitch(preset.gpus_per_node, nvlink, nvlink_latency, LinkKind::kNvlink,
                       std::move(device), preset.name);
  }
  // Scale-out: hardware.md, GPUs, "Scale-out (H100 SuperPod): one NIC per GPU, 8 per node;
  // fat tree ... scalable units of 32 nodes (256 GPUs) under leaf switches, spine above", with
  // each preset's NIC (above). The same fat tree is assumed for every GPU preset.
  HierarchicalParams params;
  params.nodes = nodes;
  params.per_node = preset.gpus_per_node;
  params.nvlink_bandwidth = nvlink;
  params.nvlink_latency = nvlink_latency;
  params.nic_bandwidth = preset.nic;
  params.nic_latency = kNicLatency;
  params.fabric_latency = kFabricLatency;
  return BuildHierarchical(params, std::move(device),
                           preset.name + ", " + std::to_string(nodes) + " nodes");
}

}  // namespace

std::vector<std::string> PresetNames() {
  return {"tpu-v4",   "tpu-v5e",  "tpu-v5p",  "tpu-v6e",    "a100-dgx",
          "h100-dgx", "h200-dgx", "b200-dgx", "gb200-nvl72"};
}

bool IsPreset(std::string_view name) {
  std::vector<std::string> names = PresetNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool IsTpuPreset(std::string_view name) { return FindTpu(name).has_value(); }

DeviceSpec PresetDeviceSpec(std::string_view name) {
  if (std::optional<TpuPreset> tpu = FindTpu(name)) return tpu->device;
  if (std::optional<GpuPreset> gpu = FindGpu(name)) return gpu->device;
  ThrowUnknownPreset(name);
}

std::vector<int> PresetDefaultShape(std::string_view name) {
  if (std::optional<TpuPreset> tpu = FindTpu(name)) return tpu->default_shape;
  if (FindGpu(name)) return {};
  ThrowUnknownPreset(name);
}

std::vector<bool> PresetWraparound(std::string_view name, const std::vector<int>& shape) {
  std::optional<TpuPreset> tpu = FindTpu(name);
  if (!tpu) return std::vector<bool>(shape.size(), false);
  return WrapByRule(tpu->wrap_rule, shape);
}

Topology BuildPreset(const HardwareSpec& spec) {
  Topology topo;
  if (std::optional<TpuPreset> tpu = FindTpu(spec.preset)) {
    topo = BuildTpu(*tpu, spec);
    // ICI moves a large transfer over every minimal route at once: the Scaling Book's
    // corner-to-corner ppermute on a v5e 4x4 sends over both ports, in half the time of one
    // path (hardware.md; sharding.md). ASSUMPTION: transfers from 64 KiB up are split (the
    // DMA engines stripe a message; smaller ones are latency-bound either way).
    CommSpec comm;
    comm.multipath = true;
    comm.multipath_min_bytes = Bytes::KiB(64);
    topo.SetCommSpec(comm);
  } else if (std::optional<GpuPreset> gpu = FindGpu(spec.preset)) {
    topo = BuildGpu(*gpu, spec);
    topo.SetCommSpec(gpu->comm);
  } else {
    ThrowUnknownPreset(spec.preset);
  }
  topo.SetCommSpec(ApplyCommOverride(topo.comm(), spec.comm));
  return topo;
}

Topology BuildPreset(const std::string& name, std::vector<int> shape, int nodes) {
  HardwareSpec spec;
  spec.preset = name;
  spec.shape = std::move(shape);
  spec.nodes = nodes;
  return BuildPreset(spec);
}

}  // namespace shardsim
