#include "topology/hierarchical.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace shardsim {

HierarchicalParams ResolveHierarchical(HierarchicalParams params) {
  assert(params.nodes >= 1 && params.per_node >= 1);
  if (params.nodes_per_leaf <= 0) params.nodes_per_leaf = kDefaultNodesPerLeaf;
  params.nodes_per_leaf = std::min(params.nodes_per_leaf, params.nodes);
  int leaves = (params.nodes + params.nodes_per_leaf - 1) / params.nodes_per_leaf;
  if (leaves == 1) {
    params.spines = 0;
  } else if (params.spines <= 0) {
    params.spines = params.per_node;
  }
  return params;
}

FatTreeLayout::FatTreeLayout(const HierarchicalParams& params) : params_(params) {
  assert(params.nodes_per_leaf >= 1 && "params must be resolved");
  leaves_ = (params.nodes + params.nodes_per_leaf - 1) / params.nodes_per_leaf;
  assert((leaves_ == 1) == (params.spines == 0) && "params must be resolved");
}

int FatTreeLayout::NodesUnderLeaf(int leaf) const {
  int first = leaf * params_.nodes_per_leaf;
  return std::min(params_.nodes_per_leaf, params_.nodes - first);
}

Bandwidth FatTreeLayout::UplinkBandwidth(int leaf) const {
  assert(params_.spines > 0);
  // Downlink total = nodes under the leaf * GPUs per node * NIC bandwidth; one link per spine.
  double gpus = static_cast<double>(NodesUnderLeaf(leaf)) * params_.per_node;
  return params_.nic_bandwidth * (gpus / params_.spines);
}

Topology BuildHierarchical(const HierarchicalParams& raw, DeviceSpec device, std::string name) {
  const HierarchicalParams params = ResolveHierarchical(raw);
  const FatTreeLayout layout(params);
  if (name.empty()) {
    name = "fat tree " + std::to_string(params.nodes) + "x" + std::to_string(params.per_node);
  }
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int d = 0; d < layout.num_devices(); ++d) {
    builder.AddDevice(platform + " " + std::to_string(d) + " (node " +
                      std::to_string(layout.NodeOf(d)) + ")");
  }
  for (int n = 0; n < params.nodes; ++n) {
    [[maybe_unused]] VertexId v = builder.AddSwitch("nvswitch" + std::to_string(n));
    assert(v == layout.NodeSwitch(n));
  }
  for (int l = 0; l < layout.num_leaves(); ++l) {
    [[maybe_unused]] VertexId v = builder.AddSwitch("leaf" + std::to_string(l));
    assert(v == layout.Leaf(l));
  }
  for (int s = 0; s < params.spines; ++s) {
    [[maybe_unused]] VertexId v = builder.AddSwitch("spine" + std::to_string(s));
    assert(v == layout.Spine(s));
  }
  for (int d = 0; d < layout.num_devices(); ++d) {
    int node = layout.NodeOf(d);
    builder.AddDuplexLink(d, layout.NodeSwitch(node), params.nvlink_bandwidth,
                          params.nvlink_latency, LinkKind::kNvlink);
    builder.AddDuplexLink(d, layout.Leaf(layout.LeafOfNode(node)), params.nic_bandwidth,
                          params.nic_latency, LinkKind::kNic);
  }
  for (int l = 0; l < layout.num_leaves(); ++l) {
    for (int s = 0; s < params.spines; ++s) {
      builder.AddDuplexLink(layout.Leaf(l), layout.Spine(s), layout.UplinkBandwidth(l),
                            params.fabric_latency, LinkKind::kFabric);
    }
  }
  builder.SetDeviceSpec(std::move(device));
  return builder.Build();
}

std::optional<HierarchicalParams> RecognizeHierarchical(const Topology& topo) {
  const int n = topo.num_devices();
  if (n < 1 || topo.num_switches() < 2 || topo.torus()) return std::nullopt;
  // Read the candidate figures off the first and last device's two links.
  auto uplinks = [&](int device, LinkId& nvlink, LinkId& nic) {
    const std::vector<LinkId>& out = topo.out_links(topo.device_vertex(device));
    if (out.size() != 2) return false;
    nvlink = out[0];
    nic = out[1];
    return topo.link(nvlink).kind == LinkKind::kNvlink && topo.link(nic).kind == LinkKind::kNic;
  };
  LinkId first_nv = 0, first_nic = 0, last_nv = 0, last_nic = 0;
  if (!uplinks(0, first_nv, first_nic) || !uplinks(n - 1, last_nv, last_nic)) return std::nullopt;
  if (topo.link(first_nv).dst != n) return std::nullopt;
  HierarchicalParams params;
  params.nodes = topo.link(last_nv).dst - n + 1;
  if (params.nodes < 1 || n % params.nodes != 0) return std::nullopt;
  params.per_node = n / params.nodes;
  const VertexId first_leaf = n + params.nodes;
  if (topo.link(first_nic).dst != first_leaf) return std::nullopt;
  const int leaves = topo.link(last_nic).dst - first_leaf + 1;
  if (leaves < 1 || leaves > params.nodes) return std::nullopt;
  params.spines = topo.num_switches() - params.nodes - leaves;
  if (params.spines < 0 || (leaves == 1) != (params.spines == 0)) return std::nullopt;
  // Nodes under leaf 0: the devices whose NIC goes to the first leaf, per node.
  int under_first = 0;
  for (int d = 0; d < n; ++d) {
    const std::vector<LinkId>& out = topo.out_links(topo.device_vertex(d));
    if (out.size() == 2 && topo.link(out[1]).dst == first_leaf) ++under_first;
  }
  if (under_first % params.per_node != 0) return std::nullopt;
  params.nodes_per_leaf = under_first / params.per_node;
  if (params.nodes_per_leaf < 1) return std::nullopt;
  params.nvlink_bandwidth = topo.link(first_nv).bandwidth;
  params.nvlink_latency = topo.link(first_nv).latency;
  params.nic_bandwidth = topo.link(first_nic).bandwidth;
  params.nic_latency = topo.link(first_nic).latency;
  if (params.spines > 0) {
    const std::vector<LinkId>& out = topo.out_links(first_leaf);
    for (LinkId id : out) {
      if (topo.link(id).kind == LinkKind::kFabric) {
        params.fabric_latency = topo.link(id).latency;
        break;
      }
    }
  }
  params = ResolveHierarchical(params);
  const FatTreeLayout layout(params);
  if (layout.num_leaves() != leaves) return std::nullopt;
  // The decisive check: rebuild from the inferred figures and compare link by link.
  Topology rebuilt = BuildHierarchical(params, DeviceSpec{});
  if (rebuilt.num_vertices() != topo.num_vertices() ||
      rebuilt.links().size() != topo.links().size()) {
    return std::nullopt;
  }
  for (VertexId v = 0; v < topo.num_vertices(); ++v) {
    if (rebuilt.node(v).kind != topo.node(v).kind) return std::nullopt;
  }
  for (size_t i = 0; i < topo.links().size(); ++i) {
    const Link& a = topo.links()[i];
    const Link& b = rebuilt.links()[i];
    if (a.src != b.src || a.dst != b.dst || a.kind != b.kind || a.latency != b.latency ||
        a.bandwidth != b.bandwidth) {
      return std::nullopt;
    }
  }
  return params;
}

}  // namespace shardsim
