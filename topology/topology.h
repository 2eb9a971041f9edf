// A hardware topology: a Boost.Graph directed graph of devices, switches and link directions.
#pragma once

#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/comm_spec.h"
#include "topology/device_spec.h"

namespace shardsim {

// Index of a vertex (device or switch) in the graph.
using VertexId = int32_t;
// Index of a directed link (one direction of a physical link) in Topology::links().
using LinkId = int32_t;

// What a vertex is.
enum class NodeKind { kDevice, kSwitch };

// The technology of a link, for labels and trace track names.
enum class LinkKind { kIci, kNvlink, kNic, kFabric, kDcn, kGeneric };

// Returns "ICI", "NVLink", "NIC", "fabric", "DCN" or "link".
const char* LinkKindName(LinkKind kind);

// A vertex's properties.
struct Node {
  NodeKind kind = NodeKind::kDevice;  // Device or switch.
  std::string name;                   // "TPU 5 (1,1,0)", "nvswitch0", "leaf3".
  int32_t device = -1;                // Device index for devices, -1 for switches.
  std::vector<int> coords;            // Torus coordinates, empty when not a torus.
};

// One direction of a physical link.
struct Link {
  VertexId src = 0;                    // Sending vertex.
  VertexId dst = 0;                    // Receiving vertex.
  Bandwidth bandwidth;                 // Bandwidth in this direction.
  Time latency;                        // Per-hop latency.
  LinkKind kind = LinkKind::kGeneric;  // Technology.
  int32_t physical = 0;    // Physical link id, shared by both directions of a duplex link.
  int32_t dimension = -1;  // Torus dimension it runs along, or -1.
  int32_t direction = 0;   // +1 or -1 along `dimension`, 0 otherwise.
};

// Torus structure of a topology built as a torus (or ring), for routing and facts.
struct TorusShape {
  std::vector<int> shape;        // Devices along each dimension.
  std::vector<bool> wraparound;  // Whether each dimension closes into a ring.
  // Several slices (multi_slice.h): dimension 0 counts the slices, joined by the data-center
  // network (DCN) through a switch rather than by links along it; each slice is the torus of
  // the other dimensions.
  bool dcn_slices = false;
};

// The Boost.Graph type: vertex property Node, edge property the LinkId into links().
using TopologyGraph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Node, LinkId>;

// An immutable hardware topology. Build one with TopologyBuilder or the builders in this
// folder (torus.h, ring.h, switch.h, hierarchical.h, ...).
class Topology {
 public:
  // Topologies of thousands of devices are large: move them, never copy by accident.
  Topology() = default;
  Topology(Topology&&) = default;
  Topology& operator=(Topology&&) = default;
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  // The Boost graph.
  const TopologyGraph& graph() const { return graph_; }
  // A readable description, e.g. "tpu-v5p 4x4x4".
  const std::string& name() const { return name_; }
  // Number of devices (chips/GPUs).
  int num_devices() const { return static_cast<int>(device_vertices_.size()); }
  // Number of switches.
  int num_switches() const { return num_vertices() - num_devices(); }
  // Number of vertices.
  int num_vertices() const { return static_cast<int>(boost::num_vertices(graph_)); }
  // Number of physical links (a duplex link counts once).
  int num_physical_links() const { return num_physical_; }
  // All directed links, indexed by LinkId.
  const std::vector<Link>& links() const { return links_; }
  // One directed link.
  const Link& link(LinkId id) const { return links_[id]; }
  // Each directed link's bandwidth in bytes per second, indexed by LinkId: links()' figures
  // packed densely, for loops that read only them over tens of thousands of links.
  const std::vector<double>& link_bytes_per_second() const { return link_bytes_per_second_; }
  // The vertex of device `d`.
  VertexId device_vertex(int d) const { return device_vertices_[d]; }
  // Each vertex's trace process id, indexed by VertexId: a device's number, and for switches
  // the numbers after the devices', in vertex order.
  const std::vector<int32_t>& process_ids() const { return process_ids_; }
  // A vertex's properties.
  const Node& node(VertexId v) const { return graph_[v]; }
  // Outgoing links of a vertex, in insertion order.
  const std::vector<LinkId>& out_links(VertexId v) const { return out_links_[v]; }
  // The directed link from `a` to `b`, if one exists (the first added).
  std::optional<LinkId> FindLink(VertexId a, VertexId b) const;
  // The first link of `kind` leaving `v`, or nullptr.
  const Link* FirstOutLink(VertexId v, LinkKind kind) const;
  // The switch the first link of `kind` leaving `v` reaches (a GPU's NVSwitch, its NIC's
  // leaf), or -1.
  VertexId SwitchOver(VertexId v, LinkKind kind) const;
  // Compute figures shared by every device.
  const DeviceSpec& device_spec() const { return device_spec_; }
  // Torus structure, when built as a torus or ring.
  const std::optional<TorusShape>& torus() const { return torus_; }
  // How the collective library drives the links (neutral unless a GPU preset or
  // `hardware.comm` set it).
  const CommSpec& comm() const { return comm_; }
  // Replaces the collective library's figures (presets and overrides, before any use).
  void SetCommSpec(CommSpec comm) { comm_ = std::move(comm); }

 private:
  friend class TopologyBuilder;
  TopologyGraph graph_;
  std::string name_;
  std::vector<Link> links_;
  std::vector<double> link_bytes_per_second_;
  std::vector<VertexId> device_vertices_;
  std::vector<int32_t> process_ids_;  // Made by TopologyBuilder::Build.
  std::vector<std::vector<LinkId>> out_links_;
  int num_physical_ = 0;
  DeviceSpec device_spec_;
  std::optional<TorusShape> torus_;
  CommSpec comm_;
};

// Assembles a Topology vertex by vertex and link by link.
class TopologyBuilder {
 public:
  // Starts a topology called `name`.
  explicit TopologyBuilder(std::string name);
  // Adds the next device (device indices count up from 0); returns its vertex.
  VertexId AddDevice(std::string name, std::vector<int> coords = {});
  // Adds a switch; returns its vertex.
  VertexId AddSwitch(std::string name);
  // Adds a duplex link: two directed links a->b and b->a with the same figures each way.
  // `dimension`: the torus dimension, with a->b going in the + direction.
  void AddDuplexLink(VertexId a, VertexId b, Bandwidth bw, Time latency, LinkKind kind,
                     int32_t dimension = -1);
  // Adds a one-way link a->b (a physical link of its own).
  void AddSimplexLink(VertexId a, VertexId b, Bandwidth bw, Time latency, LinkKind kind,
                      int32_t dimension = -1, int32_t direction = 0);
  // Sets the device figures.
  void SetDeviceSpec(DeviceSpec spec);
  // Records the torus structure.
  void SetTorus(TorusShape torus);
  // Finishes; the builder is left empty.
  Topology Build();

 private:
  LinkId AddDirected(VertexId a, VertexId b, Bandwidth bw, Time latency, LinkKind kind,
                     int32_t physical, int32_t dimension, int32_t direction);
  Topology topo_;
};

}  // namespace shardsim
