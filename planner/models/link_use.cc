#include "planner/models/link_use.h"

#include <algorithm>
#include <map>

namespace shardsim::planner {

std::vector<std::pair<double, LinkId>> LinkUtilisation(const TrainStepReport& report) {
  std::vector<std::pair<double, LinkId>> use;
  if (report.step_time <= Time()) return use;
  for (const auto& [link, busy] : report.link_busy) {
    use.push_back({busy.seconds() / report.step_time.seconds(), link});
  }
  std::sort(use.begin(), use.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  return use;
}

std::vector<LinkGroupUse> LinkGroups(const TrainStepReport& report, const Topology& topology) {
  std::map<std::string, LinkGroupUse> groups;
  for (const auto& [u, id] : LinkUtilisation(report)) {
    const Link& l = topology.link(id);
    std::string name = LinkKindName(l.kind);
    if (l.dimension >= 0) {
      name += " dimension " + std::to_string(l.dimension) + (l.direction > 0 ? " +" : " -");
    }
    LinkGroupUse& g = groups[name];
    g.name = name;
    ++g.links;
    g.mean += u;  // Summed here, divided below.
    g.busiest = std::max(g.busiest, u);
  }
  std::vector<LinkGroupUse> out;
  for (auto& [name, g] : groups) {
    g.mean /= g.links;
    out.push_back(g);
  }
  return out;
}

}  // namespace shardsim::planner
