#include "collectives/algorithms/collnet.h"

#include <stdexcept>
#include <utility>

#include "collectives/algorithms/hierarchical.h"

namespace shardsim {
namespace {

// The switch at the far end of member vertex `v`'s NIC link, or -1.
VertexId LeafOf(const Topology& topo, VertexId v) {
  for (LinkId l : topo.out_links(v)) {
    const Link& link = topo.link(l);
    if (link.kind == LinkKind::kNic && topo.node(link.dst).kind == NodeKind::kSwitch) {
      return link.dst;
    }
  }
  return -1;
}

}  // namespace

std::string CollnetSupports(const Network& network, const CollectiveJob& job) {
  if (job.kind != CollectiveKind::kAllReduce) {
    return std::string("collnet implements all-reduce only, not ") + CollectiveKindName(job.kind);
  }
  if (!network.topology().comm().sharp) {
    return "collnet needs scale-out switches that reduce in the network (hardware.comm.sharp: "
           "true)";
  }
  const std::string hierarchical = HierarchicalSupports(network, job);
  if (!hierarchical.empty()) return "collnet, like " + hierarchical;
  const VertexId leaf = LeafOf(network.topology(), job.members[0]);
  for (VertexId v : job.members) {
    if (leaf < 0 || LeafOf(network.topology(), v) != leaf) {
      return "collnet needs every member's NIC on one leaf switch";
    }
  }
  return "";
}

std::vector<ReductionLevel> CollnetLevels(const Network& network, const CollectiveJob& job) {
  std::vector<ReductionLevel> levels = HierarchicalLevels(network, job);
  ReductionLevel& rails = levels[1];
  rails.via_switch = true;
  rails.switches.assign(rails.groups.size(), LeafOf(network.topology(), job.members[0]));
  return levels;
}

std::unique_ptr<CollectiveAlgorithm> MakeCollnetAlgorithm(Network& network, CollectiveJob& job) {
  const std::string why = CollnetSupports(network, job);
  if (!why.empty()) throw std::invalid_argument(why);
  std::vector<ReductionLevel> levels = CollnetLevels(network, job);
  const int segments =
      StagedSegments(job.BytesOf(job.total).count(), network.topology().comm().chunk_size.count(),
                     StagedTransfersPerSegment(levels));
  return MakeStagedAllReduce(network, job, std::move(levels), segments);
}

}  // namespace shardsim
