#include "topology/build.h"

#include <cstdint>
#include <utility>

#include "sim/closest_name.h"
#include "sim/spec_error.h"
#include "topology/explicit_graph.h"
#include "topology/fully_connected.h"
#include "topology/hierarchical.h"
#include "topology/overrides.h"
#include "topology/presets.h"
#include "topology/ring.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// Defaults of custom machines (see build.h). ICI figures: hardware.md, TPU chips, row v5e
// ("ICI B/s one way per link 4.5e10") and "ICI latency: about 1 us per hop".
constexpr Bandwidth kCustomIciBandwidth = Bandwidth::BytesPerSecond(4.5e10);
// NVLink figure: hardware.md, GPUs, row H100 SXM, "NVLink per GPU, one way 450e9".
constexpr Bandwidth kCustomNvlinkBandwidth = Bandwidth::BytesPerSecond(450e9);

std::vector<std::string> CustomKinds() {
  return {"torus", "ring", "switch", "fully_connected", "hierarchical", "graph"};
}

// Throws SpecError("hardware.topology.<field>") unless `value` >= `minimum`.
void RequireAtLeast(int value, int minimum, const std::string& field, const std::string& kind) {
  if (value < minimum) {
    throw SpecError("hardware.topology." + field,
                    "a " + kind + " topology needs " + field + " >= " + std::to_string(minimum) +
                        (value == 0 ? " (missing?)" : ", got " + std::to_string(value)));
  }
}

void RequireSizeWithinLimit(int64_t count, const std::string& key) {
  if (count > kMaxDevices) {
    throw SpecError(
        key, std::to_string(count) + " devices exceed the limit of " + std::to_string(kMaxDevices));
  }
}

Topology BuildCustom(const CustomTopologySpec& topo, const HardwareSpec& spec) {
  if (!spec.shape.empty()) {
    throw SpecError("hardware.shape",
                    "`hardware.shape` sizes TPU presets; a custom topology takes "
                    "`hardware.topology.shape` (kind: torus)");
  }
  if (!spec.wraparound.empty()) {
    throw SpecError("hardware.wraparound",
                    "`hardware.wraparound` applies to TPU presets; a custom torus takes "
                    "`hardware.topology.wraparound`");
  }
  if (spec.nodes != 0) {
    throw SpecError("hardware.nodes",
                    "`hardware.nodes` sizes GPU presets; a custom fat tree takes "
                    "`hardware.topology.nodes` (kind: hierarchical)");
  }
  ValidateLinkOverride(spec.link);
  const std::string& kind = topo.kind;
  const DeviceSpec tpu_like = ApplyDeviceOverride(PresetDeviceSpec("tpu-v5e"), spec.device);
  const DeviceSpec gpu_like = ApplyDeviceOverride(PresetDeviceSpec("h100-dgx"), spec.device);
  const Bandwidth ici = OverrideBandwidth(spec.link, kCustomIciBandwidth);
  const Time ici_latency = OverrideLatency(spec.link, kIciLatency);
  const Bandwidth nvlink = OverrideBandwidth(spec.link, kCustomNvlinkBandwidth);
  const Time nvlink_latency = OverrideLatency(spec.link, kNvlinkLatency);

  if (kind == "torus") {
    if (topo.shape.empty()) {
      throw SpecError("hardware.topology.shape",
                      "a torus topology needs shape: [..] (devices per dimension)");
    }
    int count = CheckedDeviceCount(topo.shape, "hardware.topology.shape", "torus");
    (void)count;
    std::vector<bool> wrap = topo.wraparound;
    if (wrap.empty()) wrap.assign(topo.shape.size(), true);
    if (wrap.size() != topo.shape.size()) {
      throw SpecError("hardware.topology.wraparound",
                      "wraparound has " + std::to_string(wrap.size()) + " entries but shape has " +
                          std::to_string(topo.shape.size()) + " dimensions");
    }
    std::string name = "torus ";
    for (size_t i = 0; i < topo.shape.size(); ++i) {
      name += (i > 0 ? "x" : "") + std::to_string(topo.shape[i]);
    }
    return BuildTorus(topo.shape, wrap, ici, ici_latency, LinkKind::kIci, tpu_like, name);
  }
  if (kind == "ring") {
    RequireAtLeast(topo.size, 1, "size", kind);
    RequireSizeWithinLimit(topo.size, "hardware.topology.size");
    return BuildRing(topo.size, topo.bidirectional, ici, ici_latency, LinkKind::kIci, tpu_like);
  }
  if (kind == "switch") {
    RequireAtLeast(topo.size, 1, "size", kind);
    RequireSizeWithinLimit(topo.size, "hardware.topology.size");
    return BuildSwitch(topo.size, nvlink, nvlink_latency, LinkKind::kNvlink, gpu_like);
  }
  if (kind == "fully_connected") {
    RequireAtLeast(topo.size, 1, "size", kind);
    // size^2 / 2 links: keep the graph buildable.
    constexpr int kMaxFullyConnected = 4096;
    if (topo.size > kMaxFullyConnected) {
      throw SpecError("hardware.topology.size", "a fully connected topology is limited to " +
                                                    std::to_string(kMaxFullyConnected) +
                                                    " devices, got " + std::to_string(topo.size));
    }
    return BuildFullyConnected(topo.size, ici, ici_latency, LinkKind::kGeneric, tpu_like);
  }
  if (kind == "hierarchical") {
    RequireAtLeast(topo.nodes, 1, "nodes", kind);
    RequireAtLeast(topo.per_node, 1, "per_node", kind);
    RequireAtLeast(topo.nodes_per_leaf, 0, "nodes_per_leaf", kind);
    RequireAtLeast(topo.spines, 0, "spines", kind);
    RequireSizeWithinLimit(static_cast<int64_t>(topo.nodes) * topo.per_node,
                           "hardware.topology.nodes");
    if (topo.nic_bandwidth && !(topo.nic_bandwidth->bytes_per_second() > 0)) {
      throw SpecError("hardware.topology.nic_bandwidth", "NIC bandwidth must be positive");
    }
    if (topo.nic_latency && *topo.nic_latency < Time()) {
      throw SpecError("hardware.topology.nic_latency", "NIC latency must not be negative");
    }
    HierarchicalParams params;
    params.nodes = topo.nodes;
    params.per_node = topo.per_node;
    params.nodes_per_leaf = topo.nodes_per_leaf;
    params.spines = topo.spines;
    params.nvlink_bandwidth = nvlink;
    params.nvlink_latency = nvlink_latency;
    params.nic_bandwidth = topo.nic_bandwidth.value_or(kNicBandwidth);
    params.nic_latency = topo.nic_latency.value_or(kNicLatency);
    params.fabric_latency = kFabricLatency;
    return BuildHierarchical(params, gpu_like);
  }
  if (kind == "graph") {
    RequireAtLeast(topo.devices, 1, "devices", kind);
    RequireSizeWithinLimit(topo.devices, "hardware.topology.devices");
    CustomTopologySpec graph = topo;
    for (ExplicitLinkSpec& l : graph.links) {
      l.bandwidth = OverrideBandwidth(spec.link, l.bandwidth);
      l.latency = OverrideLatency(spec.link, l.latency);
    }
    return BuildExplicitGraph(graph, tpu_like);
  }
  std::string message = kind.empty() ? std::string("a custom topology needs a kind")
                                     : "unknown topology kind '" + kind + "'";
  std::string closest = kind.empty() ? "" : ClosestName(kind, CustomKinds());
  message += closest.empty() ? "." : "; did you mean '" + closest + "'?";
  message += " Known kinds: " + JoinNames(CustomKinds());
  throw SpecError("hardware.topology.kind", message);
}

}  // namespace

int CheckedDeviceCount(const std::vector<int>& shape, const std::string& key,
                       const std::string& what) {
  if (shape.empty()) throw SpecError(key, what + ": shape must have at least one dimension");
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      throw SpecError(key, what + ": every dimension must be >= 1, got " +
                               std::to_string(shape[i]) + " in dimension " + std::to_string(i));
    }
    count *= shape[i];
    if (count > kMaxDevices) {
      throw SpecError(key,
                      what + ": shape has more than " + std::to_string(kMaxDevices) + " devices");
    }
  }
  return static_cast<int>(count);
}

Topology BuildHardware(const HardwareSpec& spec) {
  if (!spec.preset.empty() && spec.topology) {
    throw SpecError("hardware.preset",
                    "give either `preset` or `topology`, not both (preset '" + spec.preset + "')");
  }
  if (spec.topology) {
    Topology topo = BuildCustom(*spec.topology, spec);
    topo.SetCommSpec(ApplyCommOverride(topo.comm(), spec.comm));
    return topo;
  }
  if (spec.preset.empty()) {
    throw SpecError("hardware.preset", "hardware needs a `preset` (one of " +
                                           JoinNames(PresetNames()) + ") or a custom `topology`");
  }
  return BuildPreset(spec);
}

}  // namespace shardsim
