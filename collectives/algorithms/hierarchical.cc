#include "collectives/algorithms/hierarchical.h"

#include <map>
#include <stdexcept>
#include <utility>

#include "collectives/staged_all_reduce.h"

namespace shardsim {

std::vector<std::vector<int>> MembersByNode(const Network& network, const CollectiveJob& job) {
  const Topology& topo = network.topology();
  std::vector<std::vector<int>> nodes;
  std::map<VertexId, int> index;
  for (int m = 0; m < job.size(); ++m) {
    const VertexId hub = topo.SwitchOver(job.members[m], LinkKind::kNvlink);
    if (hub < 0) return {};
    auto [it, inserted] = index.emplace(hub, static_cast<int>(nodes.size()));
    if (inserted) nodes.emplace_back();
    nodes[it->second].push_back(m);
  }
  return nodes;
}

bool EvenNodes(const std::vector<std::vector<int>>& nodes) {
  if (nodes.size() < 2) return false;
  for (const std::vector<int>& node : nodes) {
    if (node.size() != nodes[0].size()) return false;
  }
  return true;
}

std::string HierarchicalSupports(const Network& network, const CollectiveJob& job) {
  if (job.kind != CollectiveKind::kAllReduce) {
    return std::string("hierarchical implements all-reduce only, not ") +
           CollectiveKindName(job.kind);
  }
  const std::vector<std::vector<int>> nodes = MembersByNode(network, job);
  if (nodes.size() < 2) return "hierarchical needs a group spanning two or more NVSwitch nodes";
  for (const std::vector<int>& node : nodes) {
    if (node.size() != nodes[0].size()) {
      return "hierarchical needs the same number of group members in every node, got " +
             std::to_string(nodes[0].size()) + " and " + std::to_string(node.size());
    }
  }
  return "";
}

std::vector<ReductionLevel> HierarchicalLevels(const Network& network, const CollectiveJob& job) {
  const Topology& topo = network.topology();
  const std::vector<std::vector<int>> nodes = MembersByNode(network, job);
  const int k = static_cast<int>(nodes[0].size());
  ReductionLevel intra;
  intra.groups = nodes;
  intra.via_switch = topo.comm().nvls && k > 1;
  if (intra.via_switch) {
    for (const std::vector<int>& node : nodes) {
      intra.switches.push_back(topo.SwitchOver(job.members[node[0]], LinkKind::kNvlink));
    }
  }
  ReductionLevel rails;
  for (int l = 0; l < k; ++l) {
    rails.groups.emplace_back();
    for (const std::vector<int>& node : nodes) rails.groups.back().push_back(node[l]);
  }
  std::vector<ReductionLevel> levels;
  levels.push_back(std::move(intra));
  levels.push_back(std::move(rails));
  return levels;
}

std::unique_ptr<CollectiveAlgorithm> MakeHierarchicalAlgorithm(Network& network,
                                                               CollectiveJob& job) {
  const std::string why = HierarchicalSupports(network, job);
  if (!why.empty()) throw std::invalid_argument(why);
  return MakeStagedAllReduce(network, job, HierarchicalLevels(network, job));
}

}  // namespace shardsim
