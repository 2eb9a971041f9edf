// Builds a two-level fat tree of multi-GPU nodes (an H100 SuperPod-like scale-out network).
#pragma once

#include <optional>
#include <string>

#include "sim/time.h"
#include "sim/units.h"
#include "topology/device_spec.h"
#include "topology/topology.h"

namespace shardsim {

// Nodes under one leaf switch when not given: an H100 SuperPod scalable unit is 32 nodes
// (hardware.md, "Scale-out (H100 SuperPod)": scalable units of 32 nodes (256 GPUs)).
inline constexpr int kDefaultNodesPerLeaf = 32;

// The figures of a fat tree. Zero counts mean "the default" (see ResolveHierarchical).
struct HierarchicalParams {
  int nodes = 1;               // Number of nodes (servers).
  int per_node = 8;            // GPUs per node.
  int nodes_per_leaf = 0;      // Nodes under one leaf switch; 0: min(32, nodes).
  int spines = 0;              // Spine switches; 0: per_node (one per NIC rail). None if 1 leaf.
  Bandwidth nvlink_bandwidth;  // GPU <-> NVSwitch, per direction (the per-GPU NVLink figure).
  Time nvlink_latency;         // GPU <-> NVSwitch, per hop.
  Bandwidth nic_bandwidth;     // GPU <-> leaf (one NIC per GPU), per direction.
  Time nic_latency;            // GPU <-> leaf, per hop.
  Time fabric_latency;         // Leaf <-> spine, per hop.
};

// Fills the defaults: nodes_per_leaf 0 -> min(kDefaultNodesPerLeaf, nodes), capped at nodes;
// spines 0 -> per_node; spines forced to 0 when there is a single leaf.
HierarchicalParams ResolveHierarchical(HierarchicalParams params);

// Where each part of a (resolved) fat tree sits among the vertices.
//   vertices [0, N)                       devices; device d is GPU d % per_node of node
//                                         d / per_node (N = nodes * per_node)
//   [N, N + nodes)                        one NVSwitch vertex per node ("nvswitch<n>")
//   [N + nodes, N + nodes + leaves)       leaf switches ("leaf<l>"); node n hangs off leaf
//                                         n / nodes_per_leaf (the last leaf may hold fewer)
//   [N + nodes + leaves, ... + spines)    spine switches ("spine<s>")
class FatTreeLayout {
 public:
  // Takes resolved params.
  explicit FatTreeLayout(const HierarchicalParams& params);
  // The resolved params.
  const HierarchicalParams& params() const { return params_; }
  // Number of devices.
  int num_devices() const { return params_.nodes * params_.per_node; }
  // Number of leaf switches: ceil(nodes / nodes_per_leaf).
  int num_leaves() const { return leaves_; }
  // Node of a device.
  int NodeOf(int device) const { return device / params_.per_node; }
  // Leaf of a node.
  int LeafOfNode(int node) const { return node / params_.nodes_per_leaf; }
  // Nodes under leaf `leaf`.
  int NodesUnderLeaf(int leaf) const;
  // Vertex of node `node`'s NVSwitch.
  VertexId NodeSwitch(int node) const { return num_devices() + node; }
  // Vertex of leaf `leaf`.
  VertexId Leaf(int leaf) const { return num_devices() + params_.nodes + leaf; }
  // Vertex of spine `spine`.
  VertexId Spine(int spine) const { return num_devices() + params_.nodes + leaves_ + spine; }
  // Bandwidth of each leaf <-> spine link of `leaf`, per direction: the leaf's downlink total
  // (its GPUs' NIC bandwidth) spread evenly over the spines, so the tree is non-blocking.
  Bandwidth UplinkBandwidth(int leaf) const;

 private:
  HierarchicalParams params_;
  int leaves_ = 1;
};

// Builds the fat tree (see FatTreeLayout for the vertex order): every GPU has one duplex NVLink
// link to its node's NVSwitch and one duplex NIC link to its leaf; every leaf has one duplex
// fabric link to every spine, of UplinkBandwidth(leaf) (each link stands for a bundle of
// cables: leaf uplink total = leaf downlink total, a non-blocking tree). With one leaf there
// are no spines. Links are added per device (NVLink, then NIC), then per leaf and spine.
// `params` may hold defaults (it is resolved); counts must be >= 1 (asserted).
Topology BuildHierarchical(const HierarchicalParams& params, DeviceSpec device,
                           std::string name = "");

// The resolved params of `topo` if it is exactly what BuildHierarchical builds (same vertices,
// links, figures and order), else nullopt. Routing and facts use it to apply the structure.
std::optional<HierarchicalParams> RecognizeHierarchical(const Topology& topo);

}  // namespace shardsim
