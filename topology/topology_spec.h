// The validated description of a machine, as the run file's `hardware:` section gives it.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {

// Overrides of a preset's link figures (per direction).
struct LinkOverride {
  std::optional<Bandwidth> bandwidth;  // hardware.link.bandwidth
  std::optional<Time> latency;         // hardware.link.latency
};

// Overrides of a preset's device figures.
struct DeviceOverride {
  std::map<std::string, FlopRate> flops;        // hardware.device.flops.{dtype}
  std::optional<Bandwidth> hbm_bandwidth;       // hardware.device.hbm_bandwidth
  std::optional<Bytes> hbm_capacity;            // hardware.device.hbm_capacity
  std::optional<double> matmul_efficiency;      // hardware.device.matmul_efficiency, in (0, 1]
  std::optional<double> attention_efficiency;   // hardware.device.attention_efficiency, (0, 1]
  std::optional<double> memory_efficiency;      // hardware.device.memory_efficiency, in (0, 1]
  std::optional<Time> op_overhead;              // hardware.device.op_overhead, >= 0
  std::optional<double> comm_compute_slowdown;  // hardware.device.comm_compute_slowdown, >= 0
  std::optional<Bandwidth> host_bandwidth;      // hardware.device.host_bandwidth, > 0
};

// Overrides of one protocol's figures (`hardware.comm.protocols.<LL|LL128|Simple>`).
struct ProtocolOverride {
  std::optional<Time> step_latency;  // ...step_latency, >= 0
  std::optional<double> efficiency;  // ...efficiency, in (0, 1]
};

// Overrides of the collective library's figures (`hardware.comm`; see comm_spec.h).
struct CommOverride {
  std::optional<bool> nccl;                   // hardware.comm.nccl
  std::optional<Time> launch_latency;         // hardware.comm.launch_latency, >= 0
  std::optional<Time> net_latency;            // hardware.comm.net_latency, >= 0
  std::array<ProtocolOverride, 3> protocols;  // By Protocol: LL, LL128, Simple.
  std::optional<double> nvlink_efficiency;    // hardware.comm.nvlink_efficiency, in (0, 1]
  std::optional<double> nic_efficiency;       // hardware.comm.nic_efficiency, in (0, 1]
  std::optional<int> channels;                // hardware.comm.channels, >= 1
  std::optional<bool> nvls;                   // hardware.comm.nvls
  std::optional<bool> sharp;                  // hardware.comm.sharp
  std::optional<Bytes> chunk_size;            // hardware.comm.chunk_size, > 0
  std::optional<bool> multipath;              // hardware.comm.multipath
  std::optional<Bytes> multipath_min_bytes;   // hardware.comm.multipath_min_bytes, >= 0
};

// One link of an explicit graph (`kind: graph`).
struct ExplicitLinkSpec {
  int src = 0;                // Source device.
  int dst = 0;                // Destination device.
  Bandwidth bandwidth;        // Bandwidth per direction.
  Time latency;               // Latency per hop.
  bool bidirectional = true;  // Also add dst->src with the same figures.
};

// A custom topology (`hardware.topology`).
struct CustomTopologySpec {
  std::string kind;              // torus | ring | switch | hierarchical | fully_connected | graph
  std::vector<int> shape;        // torus: devices per dimension.
  std::vector<bool> wraparound;  // torus: per dimension; empty means all true.
  int size = 0;                  // ring, switch, fully_connected: device count.
  bool bidirectional = true;     // ring: links both ways (else one-way ring).
  int nodes = 0;                 // hierarchical: number of nodes.
  int per_node = 0;              // hierarchical: devices per node.
  int nodes_per_leaf = 0;        // hierarchical: nodes under one leaf switch (0: all).
  int spines = 0;                // hierarchical: spine switches (0: one per leaf uplink set).
  std::optional<Bandwidth> nic_bandwidth;  // hierarchical: scale-out NIC bandwidth per device.
  std::optional<Time> nic_latency;         // hierarchical: scale-out per-hop latency.
  int devices = 0;                         // graph: device count.
  std::vector<ExplicitLinkSpec> links;     // graph: links.
};

// The whole `hardware:` section. Exactly one of `preset` and `topology` is set.
struct HardwareSpec {
  std::string preset;                          // A preset name (SPEC "Presets"), or empty.
  std::optional<CustomTopologySpec> topology;  // A custom machine, or empty.
  std::vector<int> shape;                      // TPU presets: chips per torus dimension.
  std::vector<bool> wraparound;                // Optional override of the preset's rule.
  int nodes = 0;                               // GPU presets: number of nodes (0: one node).
  int slices = 0;         // TPU presets: slices of `shape` joined by DCN (0 or 1: one slice).
  LinkOverride link;      // Link overrides.
  DeviceOverride device;  // Device overrides.
  CommOverride comm;      // Collective library overrides.
};

}  // namespace shardsim
