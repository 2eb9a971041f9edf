#include "topology/topology.h"

#include <stdexcept>
#include <utility>

namespace shardsim {

const char* LinkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kIci:
      return "ICI";
    case LinkKind::kNvlink:
      return "NVLink";
    case LinkKind::kNic:
      return "NIC";
    case LinkKind::kFabric:
      return "fabric";
    case LinkKind::kDcn:
      return "DCN";
    case LinkKind::kGeneric:
      return "link";
  }
  return "link";
}

std::optional<LinkId> Topology::FindLink(VertexId a, VertexId b) const {
  for (LinkId id : out_links_[a]) {
    if (links_[id].dst == b) return id;
  }
  return std::nullopt;
}

const Link* Topology::FirstOutLink(VertexId v, LinkKind kind) const {
  for (LinkId id : out_links_[v]) {
    if (links_[id].kind == kind) return &links_[id];
  }
  return nullptr;
}

VertexId Topology::SwitchOver(VertexId v, LinkKind kind) const {
  const Link* link = FirstOutLink(v, kind);
  return link && node(link->dst).kind == NodeKind::kSwitch ? link->dst : -1;
}

TopologyBuilder::TopologyBuilder(std::string name) { topo_.name_ = std::move(name); }

VertexId TopologyBuilder::AddDevice(std::string name, std::vector<int> coords) {
  Node n;
  n.kind = NodeKind::kDevice;
  n.name = std::move(name);
  n.device = static_cast<int32_t>(topo_.device_vertices_.size());
  n.coords = std::move(coords);
  VertexId v = static_cast<VertexId>(boost::add_vertex(std::move(n), topo_.graph_));
  topo_.device_vertices_.push_back(v);
  topo_.out_links_.emplace_back();
  return v;
}

VertexId TopologyBuilder::AddSwitch(std::string name) {
  Node n;
  n.kind = NodeKind::kSwitch;
  n.name = std::move(name);
  VertexId v = static_cast<VertexId>(boost::add_vertex(std::move(n), topo_.graph_));
  topo_.out_links_.emplace_back();
  return v;
}

LinkId TopologyBuilder::AddDirected(VertexId a, VertexId b, Bandwidth bw, Time latency,
                                    LinkKind kind, int32_t physical, int32_t dimension,
                                    int32_t direction) {
  if (a == b) throw std::logic_error("a link must join two different vertices");
  if (!(bw.bytes_per_second() > 0)) throw std::logic_error("a link needs a positive bandwidth");
  LinkId id = static_cast<LinkId>(topo_.links_.size());
  topo_.links_.push_back(Link{a, b, bw, latency, kind, physical, dimension, direction});
  topo_.link_bytes_per_second_.push_back(bw.bytes_per_second());
  boost::add_edge(a, b, id, topo_.graph_);
  topo_.out_links_[a].push_back(id);
  return id;
}

void TopologyBuilder::AddDuplexLink(VertexId a, VertexId b, Bandwidth bw, Time latency,
                                    LinkKind kind, int32_t dimension) {
  int32_t physical = topo_.num_physical_++;
  AddDirected(a, b, bw, latency, kind, physical, dimension, dimension >= 0 ? +1 : 0);
  AddDirected(b, a, bw, latency, kind, physical, dimension, dimension >= 0 ? -1 : 0);
}

void TopologyBuilder::AddSimplexLink(VertexId a, VertexId b, Bandwidth bw, Time latency,
                                     LinkKind kind, int32_t dimension, int32_t direction) {
  AddDirected(a, b, bw, latency, kind, topo_.num_physical_++, dimension, direction);
}

void TopologyBuilder::SetDeviceSpec(DeviceSpec spec) { topo_.device_spec_ = std::move(spec); }

void TopologyBuilder::SetTorus(TorusShape torus) { topo_.torus_ = std::move(torus); }

Topology TopologyBuilder::Build() {
  topo_.process_ids_.assign(topo_.num_vertices(), 0);
  int32_t next_switch = topo_.num_devices();
  for (VertexId v = 0; v < topo_.num_vertices(); ++v) {
    const Node& n = topo_.node(v);
    topo_.process_ids_[v] = n.kind == NodeKind::kDevice ? n.device : next_switch++;
  }
  return std::exchange(topo_, Topology());
}

}  // namespace shardsim
