#include "topology/fully_connected.h"

#include <cassert>
#include <utility>

namespace shardsim {

Topology BuildFullyConnected(int size, Bandwidth bandwidth, Time latency, LinkKind kind,
                             DeviceSpec device, std::string name) {
  assert(size >= 1 && "a fully connected topology needs at least one device");
  if (name.empty()) name = "fully connected " + std::to_string(size);
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int i = 0; i < size; ++i) builder.AddDevice(platform + " " + std::to_string(i));
  for (int i = 0; i < size; ++i) {
    for (int j = i + 1; j < size; ++j) builder.AddDuplexLink(i, j, bandwidth, latency, kind);
  }
  builder.SetDeviceSpec(std::move(device));
  return builder.Build();
}

}  // namespace shardsim
