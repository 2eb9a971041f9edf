#include "collectives/runtime/machine.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/placement.h"
#include "sim/spec_error.h"

namespace shardsim {

namespace {

// The most bandwidth the links into any one device of `topology` carry together.
Bandwidth DeviceInBandwidth(const Topology& topology) {
  std::vector<double> in(topology.num_vertices(), 0.0);
  for (const Link& link : topology.links()) in[link.dst] += link.bandwidth.bytes_per_second();
  double most = 0;
  for (int d = 0; d < topology.num_devices(); ++d) {
    most = std::max(most, in[topology.device_vertex(d)]);
  }
  return Bandwidth::BytesPerSecond(most);
}

}  // namespace

Machine::Machine(Topology topology)
    : topology_(std::move(topology)),
      router_(MakeRouter(topology_)),
      compute_(
          std::make_unique<RooflineModel>(RooflineConfig::FromDevice(topology_.device_spec()))),
      comm_compute_slowdown_(topology_.device_spec().comm_compute_slowdown),
      device_in_(DeviceInBandwidth(topology_)) {}

Machine::Machine(Topology topology, std::unique_ptr<ComputeModel> compute,
                 double comm_compute_slowdown)
    : topology_(std::move(topology)),
      router_(MakeRouter(topology_)),
      compute_(std::move(compute)),
      comm_compute_slowdown_(comm_compute_slowdown),
      device_in_(DeviceInBandwidth(topology_)) {}

const std::vector<int>& Machine::Placement(const std::vector<MeshAxis>& axes,
                                           const std::vector<int>& torus_order) const {
  std::vector<int> key;
  for (const MeshAxis& axis : axes) key.push_back(axis.size);
  key.push_back(-1);
  key.insert(key.end(), torus_order.begin(), torus_order.end());
  auto it = placements_.find(key);
  if (it != placements_.end()) return it->second;
  std::vector<int> devices = torus_order.empty() ? DefaultPlacement(axes, topology_)
                                                 : TorusPlacement(axes, topology_, torus_order);
  return placements_.emplace(std::move(key), std::move(devices)).first->second;
}

Mesh PlaceMesh(const Machine& machine, const std::vector<MeshAxis>& axes,
               const std::vector<int>& devices) {
  std::vector<int> placed = devices;
  try {
    if (placed.empty()) placed = machine.Placement(axes);
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

Mesh PlaceProgramMesh(const Machine& machine, const ProgramSpec& program) {
  if (program.meshes.empty()) return PlaceMesh(machine, program.mesh_axes, program.mesh_devices);
  std::set<int> taken;
  int64_t positions = 0;
  for (const MeshSpec& m : program.meshes) {
    taken.insert(m.devices.begin(), m.devices.end());
    int64_t n = 1;
    for (const MeshAxis& a : m.axes) n *= a.size;
    positions += n;
  }
  if (positions > machine.topology().num_devices()) {
    throw SpecError("meshes", "the meshes have " + std::to_string(positions) +
                                  " positions in all, but the machine has " +
                                  std::to_string(machine.topology().num_devices()) + " devices");
  }
  std::vector<Mesh> parts;
  std::vector<std::string> names;
  int next = 0;
  for (const MeshSpec& m : program.meshes) {
    std::vector<int> devices = m.devices;
    if (devices.empty()) {
      int64_t n = 1;
      for (const MeshAxis& a : m.axes) n *= a.size;
      while (static_cast<int64_t>(devices.size()) < n) {
        if (!taken.count(next)) devices.push_back(next);
        taken.insert(next++);
      }
    }
    const std::string key = "meshes." + m.name + ".devices";
    try {
      Mesh part(m.axes, devices);
      ValidateMeshDevices(part, machine.topology());
      parts.push_back(std::move(part));
    } catch (const std::invalid_argument& e) {
      throw SpecError(key, "mesh " + m.name + ": " + e.what());
    }
    names.push_back(m.name);
  }
  try {
    return Mesh::Union(std::move(parts), std::move(names));
  } catch (const std::invalid_argument& e) {
    throw SpecError("meshes", e.what());
  }
}

}  // namespace shardsim
