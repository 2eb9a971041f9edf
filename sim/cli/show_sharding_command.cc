#include "sim/cli/show_sharding_command.h"

#include <iostream>
#include <numeric>
#include <sstream>

#include "collectives/dtype.h"
#include "collectives/partition_spec.h"
#include "collectives/placement.h"
#include "collectives/sharding.h"
#include "sim/cli/flags.h"
#include "sim/cli/run_file.h"
#include "sim/closest_name.h"
#include "topology/build.h"

namespace shardsim {
namespace {

// Largest mesh show-sharding describes.
constexpr int64_t kMaxShownDevices = int64_t{1} << 16;

}  // namespace

std::string ShowShardingDTypeChoices() {
  std::vector<std::string> names;
  for (DType d : kDTypes) names.emplace_back(DTypeName(d));
  return JoinNamesOr(names);
}

void RunShowShardingCommand(const ShowShardingOptions& o) {
  std::vector<MeshAxis> axes = ParseMeshFlag("--mesh", o.mesh);
  Shape shape = ParseShapeFlag("--shape", o.shape);
  std::optional<DType> dtype = ParseDType(o.dtype);
  if (!dtype) throw InputError("--dtype " + o.dtype + ": expected " + ShowShardingDTypeChoices());
  PartitionSpec spec;
  try {
    spec = ParsePartitionSpec(o.spec);
  } catch (const std::invalid_argument& e) {
    throw InputError("--spec " + o.spec + ": " + e.what());
  }
  // Every device is listed: refuse meshes too large to list before allocating for them.
  int64_t n = 1;
  for (const MeshAxis& a : axes) {
    n *= a.size;
    if (n > kMaxShownDevices) {
      throw InputError("--mesh " + o.mesh + ": more than " + std::to_string(kMaxShownDevices) +
                       " devices; show-sharding lists every device");
    }
  }
  std::vector<int> devices(n);
  std::iota(devices.begin(), devices.end(), 0);
  std::string prefix;
  std::string placement;
  if (!o.hardware.empty()) {
    HardwareSpec hw;
    hw.preset = o.hardware;
    if (!o.hw_shape.empty()) {
      for (int64_t v : ParseShapeFlag("--hw-shape", o.hw_shape)) {
        hw.shape.push_back(static_cast<int>(v));
      }
    }
    Topology topo;
    try {
      topo = BuildHardware(hw);
      devices = DefaultPlacement(axes, topo);
    } catch (const SpecError& e) {
      throw InputError("--hardware " + o.hardware + ": " + e.what());
    } catch (const std::invalid_argument& e) {
      throw InputError("--mesh " + o.mesh + ": " + e.what());
    }
    prefix = topo.device_spec().platform + " ";
    placement = DescribePlacement(Mesh(axes, devices), topo);
  }
  Mesh mesh(axes, devices);
  try {
    ValidatePartitionSpec(spec, shape, mesh);
  } catch (const std::invalid_argument& e) {
    throw InputError("--spec " + o.spec + ": " + e.what());
  }
  Sharding sharding(mesh, spec, shape);
  std::ostringstream out;
  out << "global: " << sharding.GlobalType(*dtype) << "   " << FormatPartitionSpec(spec) << "\n";
  out << "local:  " << sharding.LocalType(*dtype) << " on each of " << n << " devices\n";
  if (!placement.empty()) out << "placement: " << placement << "\n";
  if (shape.size() == 1 || shape.size() == 2) {
    out << "\n" << VisualizeSharding(sharding, prefix);
  } else {
    out << "(the grid is drawn for 1D and 2D arrays only)\n";
  }
  std::cout << out.str();
}

}  // namespace shardsim
