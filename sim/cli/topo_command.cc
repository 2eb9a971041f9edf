#include "sim/cli/topo_command.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/atomic_file.h"
#include "sim/cli/flags.h"
#include "sim/cli/run_file.h"
#include "sim/json_writer.h"
#include "topology/build.h"
#include "topology/graph_facts.h"
#include "topology/graphviz.h"

namespace shardsim {

namespace {

bool LooksLikeFile(const std::string& target) {
  auto ends_with = [&](const char* suffix) {
    std::string s(suffix);
    return target.size() >= s.size() && target.compare(target.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".yaml") || ends_with(".yml") || target.find('/') != std::string::npos ||
         std::filesystem::exists(target);
}

// Physical links grouped by kind and figures, for the summary.
struct LinkGroup {
  LinkKind kind;
  double bandwidth;
  int64_t latency_ps;
  bool operator<(const LinkGroup& o) const {
    return std::tie(kind, bandwidth, latency_ps) < std::tie(o.kind, o.bandwidth, o.latency_ps);
  }
};

std::map<LinkGroup, int> GroupLinks(const Topology& topo) {
  std::map<LinkGroup, int> groups;
  std::vector<bool> seen(topo.num_physical_links(), false);
  for (const Link& l : topo.links()) {
    if (seen[l.physical]) continue;
    seen[l.physical] = true;
    ++groups[LinkGroup{l.kind, l.bandwidth.bytes_per_second(), l.latency.picoseconds()}];
  }
  return groups;
}

}  // namespace

std::string DescribeTopology(const Topology& topo) {
  GraphFacts facts = ComputeFacts(topo);
  const DeviceSpec& dev = topo.device_spec();
  std::ostringstream out;
  out << topo.name() << "\n";
  out << "  devices:    " << facts.devices << (dev.chip.empty() ? "" : " x " + dev.chip) << "\n";
  out << "  switches:   " << facts.switches << "\n";
  out << "  links:      " << facts.physical_links << " physical (each both ways unless noted)\n";
  for (const auto& [g, count] : GroupLinks(topo)) {
    out << "    " << count << " x " << LinkKindName(g.kind) << ": "
        << FormatBandwidth(Bandwidth::BytesPerSecond(g.bandwidth)) << " per direction, "
        << FormatTime(Time::Picoseconds(g.latency_ps)) << " latency\n";
  }
  if (topo.torus()) {
    const TorusShape& t = *topo.torus();
    out << "  shape:      ";
    for (size_t d = 0; d < t.shape.size(); ++d) out << (d ? "x" : "") << t.shape[d];
    if (t.dcn_slices) out << " (dim 0: the slices, joined by DCN)";
    out << "\n  wraparound: ";
    for (size_t d = 0; d < t.wraparound.size(); ++d) {
      out << (d ? ", " : "") << "dim " << d << (t.wraparound[d] ? " yes" : " no");
    }
    out << "\n";
  }
  out << "  diameter:   " << facts.diameter << " hops\n";
  out << "  bisection:  " << FormatBandwidth(facts.bisection) << " one way ("
      << facts.bisection_method << ")\n";
  if (!dev.chip.empty()) {
    out << "  device:     " << dev.chip;
    for (const auto& [dtype, rate] : dev.flops) out << ", " << dtype << " " << FormatFlopRate(rate);
    out << ", HBM " << FormatBandwidth(dev.hbm_bandwidth) << ", " << FormatBytes(dev.hbm_capacity);
    if (dev.host_bandwidth.bytes_per_second() > 0) {
      out << ", host link " << FormatBandwidth(dev.host_bandwidth);
    }
    out << "\n";
  }
  const CommSpec& comm = topo.comm();
  if (comm.nccl) {
    out << "  nccl:       launch " << FormatTime(comm.launch_latency) << ", "
        << FormatTime(comm.net_latency) << " per message over a NIC; steps";
    for (int p = 0; p < kNumProtocols; ++p) {
      out << (p ? ", " : " ") << ProtocolName(static_cast<Protocol>(p)) << " "
          << FormatTime(comm.protocols[p].step_latency) << " at "
          << std::lround(100 * comm.protocols[p].efficiency) << "%";
    }
    out << "; NVLink at " << std::lround(100 * comm.nvlink_efficiency) << "%, NICs at "
        << std::lround(100 * comm.nic_efficiency) << "%; " << comm.channels << " channels"
        << (comm.nvls ? "; NVLS" : "") << (comm.sharp ? "; SHARP" : "") << "\n";
  }
  if (comm.multipath) {
    out << "  multipath:  permutes of " << FormatBytes(comm.multipath_min_bytes)
        << " and more split over every minimal route\n";
  }
  return out.str();
}

std::string TopologyJson(const Topology& topo) {
  GraphFacts facts = ComputeFacts(topo);
  const DeviceSpec& dev = topo.device_spec();
  std::string j = "{\n  \"name\": ";
  AppendJsonString(j, topo.name());
  j += ",\n  \"devices\": " + std::to_string(facts.devices);
  j += ",\n  \"switches\": " + std::to_string(facts.switches);
  j += ",\n  \"links\": " + std::to_string(facts.physical_links);
  j += ",\n  \"directed_links\": " + std::to_string(topo.links().size());
  j += ",\n  \"diameter\": " + std::to_string(facts.diameter);
  j += ",\n  \"bisection_bandwidth\": ";
  AppendJsonNumber(j, facts.bisection.bytes_per_second());
  j += ",\n  \"bisection_method\": ";
  AppendJsonString(j, facts.bisection_method);
  j += ",\n  \"shape\": [";
  if (topo.torus()) {
    for (size_t d = 0; d < topo.torus()->shape.size(); ++d) {
      j += (d ? ", " : "") + std::to_string(topo.torus()->shape[d]);
    }
  }
  j += "],\n  \"wraparound\": [";
  for (size_t d = 0; d < facts.wraparound.size(); ++d) {
    j += std::string(d ? ", " : "") + (facts.wraparound[d] ? "true" : "false");
  }
  j += "],\n  \"link_groups\": [";
  bool first = true;
  for (const auto& [g, count] : GroupLinks(topo)) {
    j += first ? "\n    " : ",\n    ";
    first = false;
    j += "{\"kind\": ";
    AppendJsonString(j, LinkKindName(g.kind));
    j += ", \"count\": " + std::to_string(count) + ", \"bandwidth\": ";
    AppendJsonNumber(j, g.bandwidth);
    j += ", \"latency_s\": ";
    AppendJsonNumber(j, static_cast<double>(g.latency_ps) * 1e-12);
    j += "}";
  }
  j += "\n  ],\n  \"device\": {\"chip\": ";
  AppendJsonString(j, dev.chip);
  j += ", \"platform\": ";
  AppendJsonString(j, dev.platform);
  j += ", \"flops\": {";
  first = true;
  for (const auto& [dtype, rate] : dev.flops) {
    if (!first) j += ", ";
    first = false;
    AppendJsonString(j, dtype);
    j += ": ";
    AppendJsonNumber(j, rate.per_second());
  }
  j += "}, \"hbm_bandwidth\": ";
  AppendJsonNumber(j, dev.hbm_bandwidth.bytes_per_second());
  j += ", \"hbm_capacity\": " + std::to_string(dev.hbm_capacity.count());
  if (dev.host_bandwidth.bytes_per_second() > 0) {
    j += ", \"host_bandwidth\": ";
    AppendJsonNumber(j, dev.host_bandwidth.bytes_per_second());
  }
  const CommSpec& comm = topo.comm();
  j += "},\n  \"comm\": {\"nccl\": ";
  j += comm.nccl ? "true" : "false";
  j += ", \"launch_latency_s\": ";
  AppendJsonNumber(j, comm.launch_latency.seconds());
  j += ", \"net_latency_s\": ";
  AppendJsonNumber(j, comm.net_latency.seconds());
  j += ", \"protocols\": {";
  for (int p = 0; p < kNumProtocols; ++p) {
    j += p ? ", " : "";
    AppendJsonString(j, ProtocolName(static_cast<Protocol>(p)));
    j += ": {\"step_latency_s\": ";
    AppendJsonNumber(j, comm.protocols[p].step_latency.seconds());
    j += ", \"efficiency\": ";
    AppendJsonNumber(j, comm.protocols[p].efficiency);
    j += "}";
  }
  j += "}, \"nvlink_efficiency\": ";
  AppendJsonNumber(j, comm.nvlink_efficiency);
  j += ", \"nic_efficiency\": ";
  AppendJsonNumber(j, comm.nic_efficiency);
  j += ", \"channels\": " + std::to_string(comm.channels);
  j += std::string(", \"nvls\": ") + (comm.nvls ? "true" : "false");
  j += std::string(", \"sharp\": ") + (comm.sharp ? "true" : "false");
  j += std::string(", \"multipath\": ") + (comm.multipath ? "true" : "false");
  j += ", \"multipath_min_bytes\": " + std::to_string(comm.multipath_min_bytes.count());
  j += "}\n}\n";
  return j;
}

void RunTopoCommand(const TopoCommandOptions& options) {
  CheckDistinctOutputs({{"--json", options.json_path}, {"--dot", options.dot_path}});
  HardwareSpec spec;
  RunFile file;
  bool from_file = LooksLikeFile(options.target);
  if (from_file) {
    file = LoadHardwareFile(options.target);
    spec = file.hardware;
  } else {
    spec.preset = options.target;
  }
  if (!options.shape.empty()) {
    for (int64_t v : ParseShapeFlag("--shape", options.shape))
      spec.shape.push_back(static_cast<int>(v));
  }
  if (options.nodes) spec.nodes = PositiveNodesFlag(*options.nodes);
  if (options.slices) spec.slices = *options.slices;
  Topology topo;
  try {
    topo = BuildHardware(spec);
  } catch (const SpecError& e) {
    if (from_file) throw InputError(file.Locate(e));
    // On the command line the preset is the positional argument; shape, nodes and slices are
    // flags.
    std::string where = e.key() == "hardware.shape"    ? "--shape"
                        : e.key() == "hardware.nodes"  ? "--nodes"
                        : e.key() == "hardware.slices" ? "--slices"
                                                       : options.target;
    throw InputError(where + ": " + e.what());
  }
  std::string description = DescribeTopology(topo);
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!options.json_path.empty()) outputs.emplace_back(options.json_path, TopologyJson(topo));
  if (!options.dot_path.empty()) {
    std::ostringstream dot;
    WriteGraphviz(topo, dot);
    outputs.emplace_back(options.dot_path, dot.str());
  }
  WriteOutputFiles(outputs);
  std::cout << description;
}

}  // namespace shardsim
