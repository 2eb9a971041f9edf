// A simulated machine, wired once: its topology, router and device compute model. Commands,
// tests and benchmarks build one and run programs on it instead of wiring their own copies.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "collectives/compute_model.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "sim/units.h"
#include "topology/routing.h"
#include "topology/topology.h"

namespace shardsim {

// The topology, its router (route tables are cached across runs) and the roofline compute
// model its device figures give. Not thread-safe: the router fills its caches lazily.
class Machine {
 public:
  // Wires `topology` with its router and the roofline model of its device spec.
  explicit Machine(Topology topology);
  // Wires `topology` with its router and another compute model (a calibrated or hand-built
  // one; null: local ops take no time, for studies of communication alone), and a compute
  // slowdown beside collectives of `comm_compute_slowdown`.
  Machine(Topology topology, std::unique_ptr<ComputeModel> compute, double comm_compute_slowdown);
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;

  // The hardware graph.
  const Topology& topology() const { return topology_; }
  // Routes between vertices.
  Router& router() const { return *router_; }
  // Prices local ops; null when built without one (local ops then take no time).
  const ComputeModel* compute_model() const { return compute_.get(); }
  // Fraction by which compute beside an in-flight collective slows down (GPUs).
  double comm_compute_slowdown() const { return comm_compute_slowdown_; }
  // HBM per device.
  Bytes hbm_capacity() const { return topology_.device_spec().hbm_capacity; }
  // The most bandwidth the links into any one device carry together (found once: a plan
  // search asks for it on every plan, and a pod has tens of thousands of links).
  Bandwidth device_in_bandwidth() const { return device_in_; }
  // The devices of a mesh of `axes` in the default placement (DefaultPlacement), or with
  // `torus_order` TorusPlacement's, found once per axis sizes and order (a plan search places
  // the same meshes again and again). Throws as those do.
  const std::vector<int>& Placement(const std::vector<MeshAxis>& axes,
                                    const std::vector<int>& torus_order = {}) const;

 private:
  Topology topology_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<ComputeModel> compute_;
  double comm_compute_slowdown_ = 0;
  Bandwidth device_in_;
  // Placement's answers by the axis sizes, -1, then the torus order.
  mutable std::map<std::vector<int>, std::vector<int>> placements_;
};

// The mesh of `axes` on the machine: `devices` gives each position's device, or, when empty,
// the topology-aware default placement. Throws SpecError ("mesh.axes" or "mesh.devices").
Mesh PlaceMesh(const Machine& machine, const std::vector<MeshAxis>& axes,
               const std::vector<int>& devices = {});

// The mesh `program` runs on: PlaceMesh of its mesh, or with several meshes (program.meshes)
// their Mesh::Union, a mesh without devices taking the lowest devices no other mesh has.
// Throws SpecError ("mesh.axes", "mesh.devices", "meshes.NAME.devices").
Mesh PlaceProgramMesh(const Machine& machine, const ProgramSpec& program);

}  // namespace shardsim
