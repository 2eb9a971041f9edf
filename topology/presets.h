// The named hardware presets of SPEC "Presets": TPU slices and GPU nodes with public figures.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "topology/device_spec.h"
#include "topology/topology.h"
#include "topology/topology_spec.h"

namespace shardsim {

// Per-hop ICI latency (hardware.md, TPU chips: "ICI latency: about 1 us per hop").
inline constexpr Time kIciLatency = Time::Microseconds(1);
// Per-hop NVLink latency, GPU <-> NVSwitch. ASSUMPTION: hardware.md gives none; 0.5 us per
// hop makes a GPU -> NVSwitch -> GPU route 1 us, the same order as one ICI hop.
inline constexpr Time kNvlinkLatency = Time::Nanoseconds(500);
// Per-hop NIC latency, GPU <-> leaf switch, covering PCIe, NIC and the first switch.
// ASSUMPTION: hardware.md gives none; 1 us per hop.
inline constexpr Time kNicLatency = Time::Microseconds(1);
// Per-hop leaf <-> spine latency. ASSUMPTION: hardware.md gives none; 0.5 us per hop, so a
// route across leaves (NIC, fabric, fabric, NIC) costs 3 us.
inline constexpr Time kFabricLatency = Time::Nanoseconds(500);
// Per-hop DCN latency between a TPU chip and the data-center network's switch (multi-slice
// machines). ASSUMPTION: hardware.md gives none; 10 us per hop (a chip-to-chip trip 20 us,
// the tens of microseconds a host-to-host round through a data-center network takes).
inline constexpr Time kDcnLatency = Time::Microseconds(10);
// Scale-out NIC bandwidth per GPU, per direction, of custom fat trees (hardware.md, GPUs,
// "Scale-out (H100 SuperPod): one 400 Gb/s (50 GB/s) NIC per GPU, 8 per node"); GPU presets
// take their generation's NIC (presets.cc).
inline constexpr Bandwidth kNicBandwidth = Bandwidth::Gbps(400);

// The preset names, in SPEC order: tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, a100-dgx, h100-dgx,
// h200-dgx, b200-dgx, gb200-nvl72.
std::vector<std::string> PresetNames();

// Whether `name` is a preset name (exact, case-sensitive).
bool IsPreset(std::string_view name);

// Whether `name` is a TPU preset (sized by `shape`) rather than a GPU one (sized by `nodes`).
bool IsTpuPreset(std::string_view name);

// The device figures of a preset before overrides. Throws SpecError("hardware.preset") for
// an unknown name (the message lists the presets and suggests the closest).
DeviceSpec PresetDeviceSpec(std::string_view name);

// The torus shape a TPU preset uses when `shape` is not given: 4x4x4 (v4, v5p) or 4x4
// (v5e, v6e). Empty for GPU presets. Throws SpecError("hardware.preset") for unknown names.
std::vector<int> PresetDefaultShape(std::string_view name);

// The preset's wraparound rule applied to `shape` (TPU presets). v4/v5p: an axis wraps when
// its length is a multiple of 4 and the slice holds full 4x4x4 cubes (every axis >= 4);
// slices smaller than a cube (2x2x1, 2x2x2, 2x2x4) have none. v5e/v6e: only an axis of
// length 16 wraps (hardware.md, TPU chips, "Wraparound").
std::vector<bool> PresetWraparound(std::string_view name, const std::vector<int>& shape);

// Builds `spec.preset` with `spec`'s shape/nodes/wraparound and link/device overrides.
// TPU presets: a torus (torus.h). GPU presets: one node is a switch (switch.h); nodes > 1 a
// fat tree (hierarchical.h) with the generation's NICs (200 Gb/s A100, 400 Gb/s H100, H200,
// B200, 800 Gb/s GB200), where the link override applies to the NVLink
// (scale-up) links only. Throws SpecError: unknown preset ("hardware.preset"); shape of the
// wrong rank, a non-positive dimension, too many devices, or a shape on a GPU preset
// ("hardware.shape"); wraparound of the wrong length or on a GPU preset
// ("hardware.wraparound"); nodes on a TPU preset or negative ("hardware.nodes"); bad
// overrides (overrides.h).
Topology BuildPreset(const HardwareSpec& spec);

// Preset `name` with its default figures: `shape` for TPU presets, `nodes` for GPU ones.
Topology BuildPreset(const std::string& name, std::vector<int> shape = {}, int nodes = 0);

}  // namespace shardsim
