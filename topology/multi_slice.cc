#include "topology/multi_slice.h"

#include <cassert>
#include <utility>

#include "topology/torus.h"

namespace shardsim {

Topology BuildMultiSlice(const MultiSliceParams& params, DeviceSpec device, std::string name) {
  assert(params.slices >= 1 && !params.shape.empty() &&
         params.shape.size() == params.wraparound.size());
  int per_slice = 1;
  for (int k : params.shape) {
    assert(k >= 1);
    per_slice *= k;
  }
  const int rank = static_cast<int>(params.shape.size());
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int s = 0; s < params.slices; ++s) {
    for (int i = 0; i < per_slice; ++i) {
      std::vector<int> coords = TorusCoords(params.shape, i);
      std::string label = platform + " " + std::to_string(s * per_slice + i) + " (slice " +
                          std::to_string(s) + ": ";
      for (int d = 0; d < rank; ++d) label += (d ? "," : "") + std::to_string(coords[d]);
      label += ")";
      coords.insert(coords.begin(), s);
      builder.AddDevice(std::move(label), std::move(coords));
    }
  }
  std::vector<bool> has_wrap(params.shape.size());
  for (int d = 0; d < rank; ++d) {
    has_wrap[d] = HasWraparoundLink(params.shape[d], params.wraparound[d]);
  }
  // Each slice's ICI links as BuildTorus adds them, dimensions numbered from 1 (0 is the
  // slices').
  for (int s = 0; s < params.slices; ++s) {
    for (int i = 0; i < per_slice; ++i) {
      const std::vector<int> coords = TorusCoords(params.shape, i);
      for (int d = 0; d < rank; ++d) {
        std::vector<int> next = coords;
        if (coords[d] + 1 < params.shape[d]) {
          next[d] = coords[d] + 1;
        } else if (has_wrap[d]) {
          next[d] = 0;
        } else {
          continue;
        }
        builder.AddDuplexLink(s * per_slice + i, s * per_slice + TorusIndex(params.shape, next),
                              params.ici, params.ici_latency, LinkKind::kIci,
                              static_cast<int32_t>(d + 1));
      }
    }
  }
  const VertexId dcn = builder.AddSwitch("dcn");
  for (int i = 0; i < params.slices * per_slice; ++i) {
    builder.AddDuplexLink(i, dcn, params.dcn, params.dcn_latency, LinkKind::kDcn);
  }
  std::vector<int> shape = params.shape;
  shape.insert(shape.begin(), params.slices);
  has_wrap.insert(has_wrap.begin(), false);
  builder.SetDeviceSpec(std::move(device));
  builder.SetTorus(TorusShape{std::move(shape), std::move(has_wrap), /*dcn_slices=*/true});
  return builder.Build();
}

}  // namespace shardsim
