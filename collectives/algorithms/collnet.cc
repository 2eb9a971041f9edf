#include "collectives/algorithms/collnet.h"

#include <stdexcept>

#include "collectives/algorithms/hierarchical.h"

namespace shardsim {

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
  const VertexId leaf = network.topology().SwitchOver(job.members[0], LinkKind::kNic);
  for (VertexId v : job.members) {
    if (leaf < 0 || network.topology().SwitchOver(v, LinkKind::kNic) != leaf) {
      return "collnet needs every member's NIC on one leaf switch";
    }
  }
  return "";
}

std::vector<ReductionLevel> CollnetLevels(const Network& network, const CollectiveJob& job) {
  std::vector<ReductionLevel> levels = HierarchicalLevels(network, job);
  ReductionLevel& rails = levels[1];
  rails.via_switch = true;
  rails.switches.assign(rails.groups.size(),
                        network.topology().SwitchOver(job.members[0], LinkKind::kNic));
  return levels;
}

std::unique_ptr<CollectiveAlgorithm> MakeCollnetAlgorithm(Network& network, CollectiveJob& job) {
  const std::string why = CollnetSupports(network, job);
  if (!why.empty()) throw std::invalid_argument(why);
  return MakeStagedAllReduce(network, job, CollnetLevels(network, job));
}

}  // namespace shardsim
