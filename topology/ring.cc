#include "topology/ring.h"

#include <cassert>
#include <utility>

namespace shardsim {

Topology BuildRing(int size, bool bidirectional, Bandwidth bandwidth, Time latency, LinkKind kind,
                   DeviceSpec device, std::string name) {
  assert(size >= 1 && "a ring needs at least one device");
  if (name.empty()) {
    name = std::string(bidirectional ? "ring " : "one-way ring ") + std::to_string(size);
  }
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int i = 0; i < size; ++i) builder.AddDevice(platform + " " + std::to_string(i), {i});
  // The closing link (size-1) -> 0 is distinct from 0 -> 1 when size >= 3, or when the ring is
  // one-way and size == 2 (then 1 -> 0 is the only way back).
  const bool closes = size >= 3 || (size == 2 && !bidirectional);
  const int links = closes ? size : size - 1;
  for (int i = 0; i < links; ++i) {
    int next = (i + 1) % size;
    if (bidirectional) {
      builder.AddDuplexLink(i, next, bandwidth, latency, kind, /*dimension=*/0);
    } else {
      builder.AddSimplexLink(i, next, bandwidth, latency, kind, /*dimension=*/0,
                             /*direction=*/+1);
    }
  }
  builder.SetDeviceSpec(std::move(device));
  builder.SetTorus(TorusShape{{size}, {closes}});
  return builder.Build();
}

bool IsOneWayRing(const Topology& topo) {
  if (!topo.torus() || topo.torus()->shape.size() != 1 || topo.num_devices() < 2) return false;
  if (topo.num_switches() != 0 || topo.links().empty()) return false;
  // Every duplex link has two directed links; a one-way ring has exactly one per physical link.
  return static_cast<int>(topo.links().size()) == topo.num_physical_links();
}

}  // namespace shardsim
