// Fat-tree parameters with H100 SuperPod-like figures, shared by the topology tests.
#pragma once

#include "topology/hierarchical.h"

namespace shardsim::testing_support {

// `nodes` nodes of `per_node` GPUs: 450 GB/s NVLink at 0.5 us, 400 Gb/s NICs at 1 us, fabric
// hops of 0.5 us; nodes_per_leaf and spines 0 take the builder's defaults.
inline HierarchicalParams FatTree(int nodes, int per_node, int nodes_per_leaf = 0, int spines = 0) {
  HierarchicalParams p;
  p.nodes = nodes;
  p.per_node = per_node;
  p.nodes_per_leaf = nodes_per_leaf;
  p.spines = spines;
  p.nvlink_bandwidth = Bandwidth::GBps(450);
  p.nvlink_latency = Time::Nanoseconds(500);
  p.nic_bandwidth = Bandwidth::Gbps(400);
  p.nic_latency = Time::Microseconds(1);
  p.fabric_latency = Time::Nanoseconds(500);
  return p;
}

}  // namespace shardsim::testing_support
