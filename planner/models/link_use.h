// How busy a simulated step kept the machine's links: per link, and grouped by technology and
// torus dimension, for reports and comparisons.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "planner/models/train_step_run.h"
#include "topology/topology.h"

namespace shardsim::planner {

// Every link the step's collectives used, with its utilisation (collective bytes / bandwidth
// over the step time, TrainStepReport::link_busy), busiest first (ties by link id).
std::vector<std::pair<double, LinkId>> LinkUtilisation(const TrainStepReport& report);

// The links of one technology and torus dimension and direction ("ICI dimension 2 +",
// "NVLink", "NIC"), as the step used them.
struct LinkGroupUse {
  std::string name;
  int links = 0;       // Links of the group that carried collective bytes.
  double mean = 0;     // Their mean utilisation.
  double busiest = 0;  // The highest.
};

// LinkUtilisation grouped by LinkGroupUse::name, in name order.
std::vector<LinkGroupUse> LinkGroups(const TrainStepReport& report, const Topology& topology);

}  // namespace shardsim::planner
