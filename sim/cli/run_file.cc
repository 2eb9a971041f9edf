#include "sim/cli/run_file.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "sim/cli/yaml_reader.h"
#include "sim/closest_name.h"

namespace shardsim {
namespace {

// Keys a run file may have at its top level.
std::vector<std::string> TopLevelKeys() {
  return {"hardware", "transfers", "program", "mesh", "arrays", "outputs", "options"};
}

// Top-level keys recognised but not supported by this version.
std::vector<std::string> UnsupportedKeys() { return {"program", "mesh", "arrays", "outputs"}; }

// The kinds of `hardware.topology`.
std::vector<std::string> TopologyKinds() {
  return {"torus", "ring", "switch", "hierarchical", "fully_connected", "graph"};
}

// The keys each topology kind takes.
std::vector<std::string> TopologyKeys(const std::string& kind) {
  if (kind == "torus") return {"kind", "shape", "wraparound"};
  if (kind == "ring") return {"kind", "size", "bidirectional"};
  if (kind == "switch" || kind == "fully_connected") return {"kind", "size"};
  if (kind == "hierarchical") {
    return {"kind",   "nodes",         "per_node",   "nodes_per_leaf",
            "spines", "nic_bandwidth", "nic_latency"};
  }
  return {"kind", "devices", "links"};
}

// Every key of any topology kind.
std::vector<std::string> AllTopologyKeys() {
  std::vector<std::string> all;
  for (const std::string& kind : TopologyKinds()) {
    for (const std::string& key : TopologyKeys(kind)) {
      if (std::find(all.begin(), all.end(), key) == all.end()) all.push_back(key);
    }
  }
  return all;
}

// dtype names accepted under `hardware.device.flops`.
std::vector<std::string> DtypeNames() {
  return {"f32", "bf16",    "f16",  "i32", "float32", "bfloat16", "float16", "int32",
          "f64", "float64", "tf32", "fp8", "f8",      "int8",     "i8"};
}

// Collective algorithms (SPEC "Ops").
std::vector<std::string> AlgorithmNames() {
  return {"ring", "bidirectional_ring", "torus_2d", "direct", "halving_doubling", "tree", "auto"};
}

bool Contains(const std::vector<std::string>& words, const std::string& word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

std::vector<bool> ReadBools(const YamlValue& value) {
  if (!value.IsList()) value.Expected("a list of true/false, one per dimension");
  std::vector<bool> out;
  for (const YamlValue& entry : value.List()) out.push_back(entry.Bool());
  return out;
}

// Checks that a wraparound list has one entry per dimension of `shape`.
void CheckWraparound(const YamlValue& wraparound, size_t got, const std::vector<int>& shape) {
  if (!shape.empty() && got != shape.size()) {
    wraparound.Fail("has " + std::to_string(got) + " entries but the shape has " +
                    std::to_string(shape.size()) + " dimensions");
  }
}

CustomTopologySpec ReadTopology(const YamlValue& value) {
  YamlMap any = value.Map({});
  CustomTopologySpec topo;
  topo.kind = any.Get("kind").OneOf(TopologyKinds());
  const std::vector<std::string> keys = TopologyKeys(topo.kind);
  for (const auto& [name, entry] : any.entries()) {
    if (!Contains(keys, name) && Contains(AllTopologyKeys(), name)) {
      entry.FailAtKey("'" + name + "' does not apply to kind " + topo.kind + " (it takes " +
                      JoinNames(keys) + ")");
    }
  }
  YamlMap map = value.Map(keys);
  if (topo.kind == "torus") {
    topo.shape = map.Get("shape").Shape();
    if (auto w = map.Find("wraparound")) {
      topo.wraparound = ReadBools(*w);
      CheckWraparound(*w, topo.wraparound.size(), topo.shape);
    }
  } else if (topo.kind == "ring") {
    topo.size = map.Get("size").Int(1);
    if (auto b = map.Find("bidirectional")) topo.bidirectional = b->Bool();
  } else if (topo.kind == "switch" || topo.kind == "fully_connected") {
    topo.size = map.Get("size").Int(1);
  } else if (topo.kind == "hierarchical") {
    topo.nodes = map.Get("nodes").Int(1);
    topo.per_node = map.Get("per_node").Int(1);
    if (auto v = map.Find("nodes_per_leaf")) topo.nodes_per_leaf = v->Int(0);
    if (auto v = map.Find("spines")) topo.spines = v->Int(0);
    if (auto v = map.Find("nic_bandwidth")) topo.nic_bandwidth = v->ToBandwidth();
    if (auto v = map.Find("nic_latency")) topo.nic_latency = v->ToTime();
  } else {  // graph
    topo.devices = map.Get("devices").Int(1);
    for (const YamlValue& entry : map.Get("links").List()) {
      YamlMap link_map = entry.Map({"src", "dst", "bandwidth", "latency", "bidirectional"});
      ExplicitLinkSpec link;
      for (auto [field, target] : {std::pair{"src", &link.src}, std::pair{"dst", &link.dst}}) {
        YamlValue end = link_map.Get(field);
        *target = end.Int(0);
        if (*target >= topo.devices) {
          end.Fail(std::string(field) + " " + std::to_string(*target) +
                   " is not a device of the graph (0.." + std::to_string(topo.devices - 1) + ")");
        }
      }
      link.bandwidth = link_map.Get("bandwidth").ToBandwidth();
      link.latency = link_map.Get("latency").ToTime();
      if (auto b = link_map.Find("bidirectional")) link.bidirectional = b->Bool();
      topo.links.push_back(link);
    }
  }
  return topo;
}

HardwareSpec ReadHardware(const YamlValue& value) {
  YamlMap map = value.Map({"preset", "topology", "shape", "wraparound", "nodes", "link", "device"});
  HardwareSpec hw;
  std::optional<YamlValue> preset = map.Find("preset");
  std::optional<YamlValue> topology = map.Find("topology");
  if (preset && topology) {
    const YamlValue& later =
        preset->key_mark().line > topology->key_mark().line ? *preset : *topology;
    later.FailAtKey("give either preset or topology, not both");
  }
  if (!preset && !topology) {
    value.FailChild("preset", "missing required key 'preset' (or 'topology' for a custom machine)");
  }
  if (preset) {
    hw.preset = preset->String();
    if (hw.preset.empty()) preset->Expected("a preset name");
  } else {
    hw.topology = ReadTopology(*topology);
    for (const char* key : {"shape", "wraparound", "nodes"}) {
      if (auto v = map.Find(key)) {
        v->FailAtKey(std::string(key) + " applies to a preset; a custom topology gives its own");
      }
    }
  }
  if (auto v = map.Find("shape")) hw.shape = v->Shape();
  if (auto v = map.Find("wraparound")) {
    hw.wraparound = ReadBools(*v);
    CheckWraparound(*v, hw.wraparound.size(), hw.shape);
  }
  if (auto v = map.Find("nodes")) hw.nodes = v->Int(1);
  if (auto v = map.Find("link")) {
    YamlMap link = v->Map({"bandwidth", "latency"});
    if (auto b = link.Find("bandwidth")) hw.link.bandwidth = b->ToBandwidth();
    if (auto l = link.Find("latency")) hw.link.latency = l->ToTime();
  }
  if (auto v = map.Find("device")) {
    YamlMap device = v->Map({"flops", "hbm_bandwidth", "hbm_capacity"});
    if (auto flops = device.Find("flops")) {
      YamlMap rates = flops->Map(DtypeNames());
      for (const auto& [dtype, rate] : rates.entries()) {
        hw.device.flops[dtype] = rate.ToFlopRate();
      }
    }
    if (auto b = device.Find("hbm_bandwidth")) hw.device.hbm_bandwidth = b->ToBandwidth();
    if (auto c = device.Find("hbm_capacity")) {
      hw.device.hbm_capacity = c->ToBytes();
      if (hw.device.hbm_capacity->count() <= 0) c->Fail("must be positive, got " + c->Describe());
    }
  }
  return hw;
}

std::vector<TransferSpec> ReadTransfers(const YamlValue& value) {
  if (!value.IsList()) value.Expected("a list of transfers like [{src: 0, dst: 1, bytes: 1 MiB}]");
  std::vector<YamlValue> entries = value.List();
  if (entries.empty()) value.Fail("expected at least one transfer, got an empty list");
  std::vector<TransferSpec> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    YamlMap map = entries[i].Map({"src", "dst", "bytes", "at", "name"});
    TransferSpec t;
    t.name = "transfer " + std::to_string(i);
    t.src = map.Get("src").Int(0);
    t.dst = map.Get("dst").Int(0);
    t.bytes = map.Get("bytes").ToBytes();
    if (auto at = map.Find("at")) t.at = at->ToTime();
    if (auto name = map.Find("name")) t.name = name->String();
    out.push_back(t);
  }
  return out;
}

RunOptions ReadOptions(const YamlValue& value) {
  YamlMap map = value.Map({"numerics", "algorithms"});
  RunOptions options;
  if (auto n = map.Find("numerics")) options.numerics = n->OneOf({"auto", "on", "off"});
  if (auto a = map.Find("algorithms")) {
    YamlMap algorithms = a->Map({});
    for (const auto& [op, algorithm] : algorithms.entries()) {
      options.algorithms[op] = algorithm.OneOf(AlgorithmNames());
    }
  }
  return options;
}

// Whether `node` is a mapping with the key `key`.
bool HasKey(const YAML::Node& node, const char* key) {
  return node.IsMap() && node[key].IsDefined();
}

}  // namespace

std::string RunFile::Locate(const SpecError& e) const {
  const std::string& key = e.key();
  std::string candidate = key;
  while (!candidate.empty()) {
    auto it = locations.find(candidate);
    if (it != locations.end()) return FormatLocated(path, it->second, key, e.what());
    size_t dot = candidate.rfind('.');
    if (dot == std::string::npos) break;
    candidate.resize(dot);
  }
  return FormatLocated(path, KeyLocation{}, key, e.what());
}

RunFile LoadRunFile(const std::string& path, const std::vector<std::string>& overrides) {
  YamlSource source(path);
  YAML::Node root = source.Load();
  if (!overrides.empty() && (!root.IsDefined() || root.IsNull())) {
    root = YAML::Node(YAML::NodeType::Map);
  }
  for (const std::string& text : overrides) source.ApplyOverride(root, text);

  YamlValue top(&source, root, "", YAML::Mark());
  if (!root.IsMap()) top.Expected("a mapping with hardware: and transfers:");
  YamlMap map = top.Map(TopLevelKeys());
  for (const auto& [name, value] : map.entries()) {
    if (Contains(UnsupportedKeys(), name)) {
      value.FailAtKey(name + ": is not supported yet; use transfers:");
    }
  }
  RunFile file;
  file.path = path;
  file.hardware = ReadHardware(map.Get("hardware"));
  std::optional<YamlValue> transfers = map.Find("transfers");
  if (!transfers) {
    top.FailChild("transfers", "missing required key 'transfers' (or 'program')");
  }
  file.transfers = ReadTransfers(*transfers);
  if (auto options = map.Find("options")) file.options = ReadOptions(*options);
  file.locations = source.locations();
  return file;
}

RunFile LoadHardwareFile(const std::string& path) {
  YamlSource source(path);
  YAML::Node root = source.Load();
  YamlValue top(&source, root, "", YAML::Mark());
  if (!root.IsMap()) top.Expected("a mapping with hardware: (or preset: or topology:)");
  RunFile file;
  file.path = path;
  if (HasKey(root, "hardware")) {
    file.hardware = ReadHardware(top.Map(TopLevelKeys()).Get("hardware"));
  } else if (HasKey(root, "preset") || HasKey(root, "topology")) {
    file.hardware = ReadHardware(YamlValue(&source, root, "hardware", root.Mark()));
  } else {
    top.FailChild("hardware",
                  "expected a hardware: section, or a mapping with preset: or "
                  "topology:");
  }
  file.locations = source.locations();
  return file;
}

}  // namespace shardsim
