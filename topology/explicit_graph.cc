#include "topology/explicit_graph.h"

#include <deque>
#include <utility>
#include <vector>

#include "sim/spec_error.h"

namespace shardsim {
namespace {

constexpr const char* kLinksKey = "hardware.topology.links";

// Marks every device reachable from device 0 following links forwards (or backwards).
std::vector<bool> Reachable(const CustomTopologySpec& spec, bool forward) {
  std::vector<std::vector<int>> next(spec.devices);
  for (const ExplicitLinkSpec& l : spec.links) {
    int from = forward ? l.src : l.dst;
    int to = forward ? l.dst : l.src;
    next[from].push_back(to);
    if (l.bidirectional) next[to].push_back(from);
  }
  std::vector<bool> seen(spec.devices, false);
  std::deque<int> queue = {0};
  seen[0] = true;
  while (!queue.empty()) {
    int v = queue.front();
    queue.pop_front();
    for (int w : next[v]) {
      if (!seen[w]) {
        seen[w] = true;
        queue.push_back(w);
      }
    }
  }
  return seen;
}

}  // namespace

Topology BuildExplicitGraph(const CustomTopologySpec& spec, DeviceSpec device, std::string name) {
  if (spec.devices < 1) {
    throw SpecError("hardware.topology.devices",
                    "a graph topology needs devices >= 1, got " + std::to_string(spec.devices));
  }
  for (size_t i = 0; i < spec.links.size(); ++i) {
    const ExplicitLinkSpec& l = spec.links[i];
    const std::string where = "links[" + std::to_string(i) + "]: ";
    for (int end : {l.src, l.dst}) {
      if (end < 0 || end >= spec.devices) {
        throw SpecError(kLinksKey, where + "device " + std::to_string(end) +
                                       " is out of range (devices are 0.." +
                                       std::to_string(spec.devices - 1) + ")");
      }
    }
    if (l.src == l.dst) {
      throw SpecError(kLinksKey, where + "a link must join two different devices, got " +
                                     std::to_string(l.src) + " -> " + std::to_string(l.dst));
    }
    if (!(l.bandwidth.bytes_per_second() > 0)) {
      throw SpecError(kLinksKey, where + "bandwidth must be positive");
    }
    if (l.latency < Time()) throw SpecError(kLinksKey, where + "latency must not be negative");
  }
  // Every device must reach every other: with a directed graph that is strong connectivity,
  // i.e. everything reachable from device 0 and device 0 reachable from everything.
  for (bool forward : {true, false}) {
    std::vector<bool> seen = Reachable(spec, forward);
    for (int d = 0; d < spec.devices; ++d) {
      if (!seen[d]) {
        int from = forward ? 0 : d;
        int to = forward ? d : 0;
        throw SpecError(kLinksKey, "no route from device " + std::to_string(from) + " to device " +
                                       std::to_string(to) +
                                       ": every device must reach every other");
      }
    }
  }
  if (name.empty()) name = "graph " + std::to_string(spec.devices);
  TopologyBuilder builder(std::move(name));
  const std::string platform = device.platform.empty() ? "device" : device.platform;
  for (int i = 0; i < spec.devices; ++i) builder.AddDevice(platform + " " + std::to_string(i));
  for (const ExplicitLinkSpec& l : spec.links) {
    if (l.bidirectional) {
      builder.AddDuplexLink(l.src, l.dst, l.bandwidth, l.latency, LinkKind::kGeneric);
    } else {
      builder.AddSimplexLink(l.src, l.dst, l.bandwidth, l.latency, LinkKind::kGeneric);
    }
  }
  builder.SetDeviceSpec(std::move(device));
  return builder.Build();
}

}  // namespace shardsim
