#include "topology/torus.h"

#include <cassert>
#include <utility>

namespace shardsim {

int TorusIndex(const std::vector<int>& shape, const std::vector<int>& coords) {
  assert(shape.size() == coords.size());
  int index = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    assert(coords[d] >= 0 && coords[d] < shape[d]);
    index = index * shape[d] + coords[d];
  }
  return index;
}

std::vector<int> TorusCoords(const std::vector<int>& shape, int index) {
  std::vector<int> coords(shape.size());
  // Peel the minor (last) dimension first.
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = index % shape[d];
    index /= shape[d];
  }
  assert(index == 0 && "device index outside the torus");
  return coords;
}

bool HasWraparoundLink(int length, bool wraparound) { return wraparound && length >= 3; }

Topology BuildTorus(std::vector<int> shape, std::vector<bool> wraparound, Bandwidth bandwidth,
                    Time latency, LinkKind kind, DeviceSpec device, std::string name) {
  assert(!shape.empty() && shape.size() == wraparound.size());
  int count = 1;
  for (int k : shape) {
    assert(k >= 1 && "torus dimensions must be positive");
    count *= k;
  }
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int i = 0; i < count; ++i) {
    std::vector<int> coords = TorusCoords(shape, i);
    std::string label = platform + " " + std::to_string(i) + " (";
    for (size_t d = 0; d < coords.size(); ++d) {
      if (d > 0) label += ",";
      label += std::to_string(coords[d]);
    }
    label += ")";
    VertexId v = builder.AddDevice(std::move(label), std::move(coords));
    assert(v == i && "device i is vertex i");
    (void)v;
  }
  std::vector<bool> has_wrap(shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    has_wrap[d] = HasWraparoundLink(shape[d], wraparound[d]);
  // Links in device order, then dimension order, so link ids are predictable.
  for (int i = 0; i < count; ++i) {
    std::vector<int> coords = TorusCoords(shape, i);
    for (size_t d = 0; d < shape.size(); ++d) {
      std::vector<int> next = coords;
      if (coords[d] + 1 < shape[d]) {
        next[d] = coords[d] + 1;
      } else if (has_wrap[d]) {
        next[d] = 0;  // The wraparound link, still the + direction.
      } else {
        continue;
      }
      builder.AddDuplexLink(i, TorusIndex(shape, next), bandwidth, latency, kind,
                            static_cast<int32_t>(d));
    }
  }
  builder.SetDeviceSpec(std::move(device));
  builder.SetTorus(TorusShape{std::move(shape), std::move(has_wrap)});
  return builder.Build();
}

}  // namespace shardsim
