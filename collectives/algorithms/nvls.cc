#include "collectives/algorithms/nvls.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "collectives/staged_all_reduce.h"

namespace shardsim {

VertexId SharedNvSwitch(const Network& network, const CollectiveJob& job) {
  const Topology& topo = network.topology();
  VertexId hub = -1;
  for (VertexId v : job.members) {
    const VertexId mine = topo.SwitchOver(v, LinkKind::kNvlink);
    if (mine < 0 || (hub >= 0 && mine != hub)) return -1;
    hub = mine;
  }
  return hub;
}

std::string NvlsSupports(const Network& network, const CollectiveJob& job) {
  if (job.kind != CollectiveKind::kAllReduce) {
    return std::string("nvls implements all-reduce only, not ") + CollectiveKindName(job.kind);
  }
  if (!network.topology().comm().nvls) {
    return "nvls needs an NVSwitch that reduces in the network (H100, H200, B200, GB200 "
           "presets, or hardware.comm.nvls: true)";
  }
  if (SharedNvSwitch(network, job) < 0) {
    return "nvls needs every member of the group on one NVSwitch (one node)";
  }
  return "";
}

std::vector<ReductionLevel> NvlsLevels(const Network& network, const CollectiveJob& job) {
  ReductionLevel level;
  level.groups.emplace_back();
  for (int m = 0; m < job.size(); ++m) level.groups[0].push_back(m);
  level.via_switch = true;
  level.switches = {SharedNvSwitch(network, job)};
  std::vector<ReductionLevel> levels;
  levels.push_back(std::move(level));
  return levels;
}

std::unique_ptr<CollectiveAlgorithm> MakeNvlsAlgorithm(Network& network, CollectiveJob& job) {
  const std::string why = NvlsSupports(network, job);
  if (!why.empty()) throw std::invalid_argument(why);
  return MakeStagedAllReduce(network, job, NvlsLevels(network, job));
}

}  // namespace shardsim
