// `shardsim topo`: describe a topology.
#pragma once

#include <optional>
#include <string>

#include "topology/topology.h"

namespace shardsim {

// What `shardsim topo` was asked.
struct TopoCommandOptions {
  std::string target;         // A preset name or a YAML file.
  std::string shape;          // --shape "4x4x4", or empty.
  std::optional<int> nodes;   // --nodes, if given.
  std::optional<int> slices;  // --slices, if given.
  std::string dot_path;       // --dot, or empty.
  std::string json_path;      // --json, or empty.
};

// Builds the topology, prints the description to stdout and writes the requested files.
// Throws InputError for bad input (nothing is written then).
void RunTopoCommand(const TopoCommandOptions& options);

// The human-readable description `shardsim topo` prints.
std::string DescribeTopology(const Topology& topo);
// The JSON document `shardsim topo --json` writes.
std::string TopologyJson(const Topology& topo);

}  // namespace shardsim
