#include "topology/switch.h"

#include <cassert>
#include <utility>

namespace shardsim {

Topology BuildSwitch(int size, Bandwidth per_device, Time latency, LinkKind kind, DeviceSpec device,
                     std::string name) {
  assert(size >= 1 && "a switch domain needs at least one device");
  if (name.empty()) name = "switch " + std::to_string(size);
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int i = 0; i < size; ++i) builder.AddDevice(platform + " " + std::to_string(i));
  VertexId hub = builder.AddSwitch(kind == LinkKind::kNvlink ? "nvswitch" : "switch");
  for (int i = 0; i < size; ++i) builder.AddDuplexLink(i, hub, per_device, latency, kind);
  builder.SetDeviceSpec(std::move(device));
  return builder.Build();
}

}  // namespace shardsim
