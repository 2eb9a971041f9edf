#include "collectives/runtime/machine.h"

#include <stdexcept>

#include "collectives/placement.h"
#include "sim/spec_error.h"

namespace shardsim {

Machine::Machine(Topology topology)
    : topology_(std::move(topology)),
      router_(MakeRouter(topology_)),
      compute_(
          std::make_unique<RooflineModel>(RooflineConfig::FromDevice(topology_.device_spec()))),
      comm_compute_slowdown_(topology_.device_spec().comm_compute_slowdown) {}

Machine::Machine(Topology topology, std::unique_ptr<ComputeModel> compute,
                 double comm_compute_slowdown)
    : topology_(std::move(topology)),
      router_(MakeRouter(topology_)),
      compute_(std::move(compute)),
      comm_compute_slowdown_(comm_compute_slowdown) {}

Mesh PlaceMesh(const Machine& machine, const std::vector<MeshAxis>& axes,
               const std::vector<int>& devices) {
  std::vector<int> placed = devices;
  try {
    if (placed.empty()) placed = DefaultPlacement(axes, machine.topology());
  } catch (const std::invalid_argument& e) {
    throw SpecError("mesh.axes", e.what());
  }
  Mesh mesh(axes, placed);
  try {
    ValidateMeshDevices(mesh, machine.topology());
  } catch (const std::invalid_argument& e) {
    throw SpecError("mesh.devices", e.what());
  }
  return mesh;
}

}  // namespace shardsim
