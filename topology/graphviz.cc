#include "topology/graphviz.h"

#include <boost/graph/filtered_graph.hpp>
#include <boost/graph/graphviz.hpp>
#include <string>
#include <vector>

namespace shardsim {
namespace {

// Quotes a string for dot: wraps it in double quotes and escapes quotes and backslashes.
std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Keeps one directed edge per physical link: the first one added.
struct FirstOfPhysical {
  const TopologyGraph* graph = nullptr;
  const std::vector<bool>* keep = nullptr;
  bool operator()(TopologyGraph::edge_descriptor e) const { return (*keep)[(*graph)[e]]; }
};

}  // namespace

void WriteGraphviz(const Topology& topo, std::ostream& out) {
  const TopologyGraph& g = topo.graph();
  // Per link: whether it is the first direction of its physical link, and how many
  // directions that physical link has (2 = duplex).
  std::vector<bool> keep(topo.links().size(), false);
  std::vector<int> directions(topo.num_physical_links(), 0);
  for (size_t i = 0; i < topo.links().size(); ++i) {
    int physical = topo.links()[i].physical;
    keep[i] = directions[physical]++ == 0;
  }
  boost::filtered_graph<TopologyGraph, FirstOfPhysical> shown(g, FirstOfPhysical{&g, &keep});

  auto vertex_writer = [&topo](std::ostream& os, TopologyGraph::vertex_descriptor v) {
    const Node& node = topo.node(static_cast<VertexId>(v));
    os << "[label=" << Quote(node.name)
       << (node.kind == NodeKind::kSwitch ? ", shape=box" : ", shape=ellipse") << "]";
  };
  auto edge_writer = [&topo, &g, &directions](std::ostream& os, TopologyGraph::edge_descriptor e) {
    const Link& link = topo.link(g[e]);
    std::string label = FormatBandwidth(link.bandwidth) + ", " + FormatTime(link.latency);
    if (link.kind != LinkKind::kIci && link.kind != LinkKind::kGeneric) {
      label += " (" + std::string(LinkKindName(link.kind)) + ")";
    }
    os << "[label=" << Quote(label);
    if (directions[link.physical] == 2) os << ", dir=both";
    os << "]";
  };
  auto graph_writer = [&topo](std::ostream& os) {
    os << "label=" << Quote(topo.name()) << ";\n";
    os << "node [fontsize=10];\n";
    os << "edge [fontsize=8];\n";
  };
  boost::write_graphviz(out, shown, vertex_writer, edge_writer, graph_writer);
}

}  // namespace shardsim
