#include "sim/cli/run_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/dtype.h"
#include "collectives/ir/op_registry.h"
#include "collectives/ir/program_builder.h"
#include "collectives/mesh.h"
#include "collectives/partition_spec.h"
#include "collectives/shard_map.h"
#include "planner/models/logical_rules.h"
#include "sim/cli/plan_search_file.h"
#include "sim/cli/yaml_reader.h"
#include "sim/closest_name.h"

namespace shardsim {
namespace {

// Keys a run file may have at its top level.
std::vector<std::string> TopLevelKeys() {
  return {"hardware", "mode",  "transfers", "program", "mesh", "meshes",  "arrays",
          "outputs",  "model", "train",     "serve",   "plan", "options", "search"};
}

// Top-level keys that belong to a program (not to a `transfers:` study).
std::vector<std::string> ProgramOnlyKeys() {
  return {"mode", "mesh", "meshes", "arrays", "outputs"};
}

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

// The key a `hardware.device.flops` dtype is stored under: the short spelling the presets
// and the cost model use ("float32" -> "f32", "bfloat16" -> "bf16", "float16" -> "f16",
// "int32" -> "i32", "float64" -> "f64", "f8" -> "fp8", "i8" -> "int8"); others as written.
std::string CanonicalDtypeKey(const std::string& dtype) {
  static const std::map<std::string, std::string> kAliases = {
      {"float32", "f32"}, {"bfloat16", "bf16"}, {"float16", "f16"}, {"int32", "i32"},
      {"float64", "f64"}, {"f8", "fp8"},        {"i8", "int8"}};
  auto it = kAliases.find(dtype);
  return it == kAliases.end() ? dtype : it->second;
}

}  // namespace

std::string ReadAlgorithm(const YamlValue& value) {
  const std::string text = value.String();
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return value.OneOf(AlgorithmNames());
  const std::vector<std::string>& names = AlgorithmNames();
  const std::string base = text.substr(0, slash);
  if (std::find(names.begin(), names.end(), base) == names.end() ||
      !ParseProtocol(text.substr(slash + 1))) {
    value.Fail("unknown value \"" + text + "\": expected an algorithm (" + JoinNames(names) +
               ") or one with an NCCL protocol, like ring/LL128 (LL, LL128 or Simple)");
  }
  return text;
}

namespace {

// A `hardware.device` efficiency factor: a number in (0, 1].
double Fraction(const YamlValue& value) {
  const double x = value.Number();
  if (!(x > 0 && x <= 1)) {
    value.Fail("expected a fraction of the peak in (0, 1] like 0.85, got " + value.Describe());
  }
  return x;
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

// `hardware.comm`: the collective library's figures (comm_spec.h).
CommOverride ReadCommOverride(const YamlValue& value) {
  YamlMap map = value.Map({"nccl", "launch_latency", "net_latency", "protocols",
                           "nvlink_efficiency", "nic_efficiency", "channels", "nvls", "sharp",
                           "chunk_size", "multipath", "multipath_min_bytes"});
  CommOverride comm;
  if (auto v = map.Find("nccl")) comm.nccl = v->Bool();
  if (auto v = map.Find("launch_latency")) comm.launch_latency = v->ToTime();
  if (auto v = map.Find("net_latency")) comm.net_latency = v->ToTime();
  if (auto v = map.Find("protocols")) {
    std::vector<std::string> names;
    for (int p = 0; p < kNumProtocols; ++p) names.push_back(ProtocolName(static_cast<Protocol>(p)));
    YamlMap protocols = v->Map(names);
    for (int p = 0; p < kNumProtocols; ++p) {
      if (auto entry = protocols.Find(names[p])) {
        YamlMap figures = entry->Map({"step_latency", "efficiency"});
        if (auto l = figures.Find("step_latency")) comm.protocols[p].step_latency = l->ToTime();
        if (auto e = figures.Find("efficiency")) comm.protocols[p].efficiency = Fraction(*e);
      }
    }
  }
  if (auto v = map.Find("nvlink_efficiency")) comm.nvlink_efficiency = Fraction(*v);
  if (auto v = map.Find("nic_efficiency")) comm.nic_efficiency = Fraction(*v);
  if (auto v = map.Find("channels")) comm.channels = v->Int(1);
  if (auto v = map.Find("nvls")) comm.nvls = v->Bool();
  if (auto v = map.Find("sharp")) comm.sharp = v->Bool();
  if (auto v = map.Find("chunk_size")) {
    comm.chunk_size = v->ToBytes();
    if (comm.chunk_size->count() <= 0) v->Fail("must be positive, got " + v->Describe());
  }
  if (auto v = map.Find("multipath")) comm.multipath = v->Bool();
  if (auto v = map.Find("multipath_min_bytes")) comm.multipath_min_bytes = v->ToBytes();
  return comm;
}

HardwareSpec ReadHardware(const YamlValue& value) {
  YamlMap map = value.Map(
      {"preset", "topology", "shape", "wraparound", "nodes", "slices", "link", "device", "comm"});
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
    for (const char* key : {"shape", "wraparound", "nodes", "slices"}) {
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
  if (auto v = map.Find("slices")) hw.slices = v->Int(1);
  if (auto v = map.Find("link")) {
    YamlMap link = v->Map({"bandwidth", "latency"});
    if (auto b = link.Find("bandwidth")) hw.link.bandwidth = b->ToBandwidth();
    if (auto l = link.Find("latency")) hw.link.latency = l->ToTime();
  }
  if (auto v = map.Find("device")) {
    YamlMap device = v->Map({"flops", "hbm_bandwidth", "hbm_capacity", "matmul_efficiency",
                             "attention_efficiency", "memory_efficiency", "op_overhead",
                             "comm_compute_slowdown", "host_bandwidth"});
    if (auto flops = device.Find("flops")) {
      YamlMap rates = flops->Map(DtypeNames());
      std::map<std::string, std::string> written;  // Canonical dtype -> the key as written.
      for (const auto& [dtype, rate] : rates.entries()) {
        // Long spellings name the same entry as the short ones the cost model reads.
        const std::string canonical = CanonicalDtypeKey(dtype);
        const auto [it, inserted] = written.emplace(canonical, dtype);
        if (!inserted) {
          rate.FailAtKey("'" + dtype + "' and '" + it->second + "' name the same dtype");
        }
        hw.device.flops[canonical] = rate.ToFlopRate();
      }
    }
    if (auto b = device.Find("hbm_bandwidth")) hw.device.hbm_bandwidth = b->ToBandwidth();
    if (auto b = device.Find("host_bandwidth")) hw.device.host_bandwidth = b->ToBandwidth();
    if (auto c = device.Find("hbm_capacity")) {
      hw.device.hbm_capacity = c->ToBytes();
      if (hw.device.hbm_capacity->count() <= 0) c->Fail("must be positive, got " + c->Describe());
    }
    if (auto e = device.Find("matmul_efficiency")) hw.device.matmul_efficiency = Fraction(*e);
    if (auto e = device.Find("attention_efficiency")) {
      hw.device.attention_efficiency = Fraction(*e);
    }
    if (auto e = device.Find("memory_efficiency")) hw.device.memory_efficiency = Fraction(*e);
    if (auto o = device.Find("op_overhead")) hw.device.op_overhead = o->ToTime();
    if (auto s = device.Find("comm_compute_slowdown")) {
      const double x = s->Number();
      if (!(x >= 0 && x <= std::numeric_limits<double>::max())) {
        s->Fail(
            "expected a finite number >= 0 like 0.1 (compute 10% slower while "
            "communicating), got " +
            s->Describe());
      }
      hw.device.comm_compute_slowdown = x;
    }
  }
  if (auto v = map.Find("comm")) hw.comm = ReadCommOverride(*v);
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

// ---- Programs: `mesh:`, `arrays:`, `program:`, `outputs:` ----

// Whether `name` is an identifier: [A-Za-z_][A-Za-z0-9_]*.
bool IsIdentifier(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// Fails at `at` unless `name` is an identifier; `what` is "array", "output", "mesh axis".
void CheckIdentifier(const YamlValue& at, const std::string& name, const std::string& what,
                     bool at_key) {
  if (IsIdentifier(name)) return;
  const std::string message = "'" + name + "' is not a valid " + what +
                              " name (use letters, digits and _, not starting with a digit)";
  if (at_key) at.FailAtKey(message);
  at.Fail(message);
}

// "; did you mean 'x'?" for a misspelled name, or "".
std::string DidYouMean(const std::string& typed, const std::vector<std::string>& known) {
  const std::string suggestion = SuggestKey(typed, known);
  return suggestion.empty() ? "" : "; did you mean '" + suggestion + "'?";
}

// "[2, 4]" for messages.
std::string ShapeText(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

// Of two keys that may not be given together, the one to blame: the one a --set gave, else
// the later in the file.
const YamlValue& Later(const YamlValue& a, const YamlValue& b) {
  if (!b.SetKey().empty()) return b;
  if (!a.SetKey().empty()) return a;
  auto place = [](const YamlValue& v) { return std::pair(v.key_mark().line, v.key_mark().column); };
  return place(a) > place(b) ? a : b;
}

std::vector<std::string> AxisNames(const std::vector<MeshAxis>& axes) {
  std::vector<std::string> names;
  for (const MeshAxis& axis : axes) names.push_back(axis.name);
  return names;
}

// Fails at `at` unless `name` is an axis of the mesh.
void CheckMeshAxis(const YamlValue& at, const std::string& name,
                   const std::vector<MeshAxis>& axes) {
  const std::vector<std::string> names = AxisNames(axes);
  if (Contains(names, name)) return;
  const std::string suggestion = DidYouMean(name, names);
  at.Fail("'" + name + "' is not a mesh axis" +
          (suggestion.empty() ? " (mesh axes: " + JoinNames(names) + ")" : suggestion));
}

// Whether a value is YAML null (or Python's None) in a sharding list.
bool IsNone(const YamlValue& value) {
  const YAML::Node& node = value.node();
  return !node.IsDefined() || node.IsNull() || (node.IsScalar() && node.Scalar() == "None");
}

// A sharding: JAX's "P('dp', None)" or a YAML list [dp, null] / [[dp, tp], null]. Every axis
// must be a mesh axis, used once.
PartitionSpec ReadPartitionSpec(const YamlValue& value, const std::vector<MeshAxis>& axes) {
  PartitionSpec spec;
  if (value.IsScalar()) {
    try {
      spec = ParsePartitionSpec(value.String());
    } catch (const std::invalid_argument& e) {
      value.Fail(e.what());
    }
    for (const std::vector<std::string>& dim : spec.dims) {
      for (const std::string& name : dim) CheckMeshAxis(value, name, axes);
    }
  } else if (value.IsList()) {
    for (const YamlValue& entry : value.List()) {
      std::vector<std::string> names;
      if (IsNone(entry)) {
        // A replicated dimension.
      } else if (entry.IsScalar()) {
        names.push_back(entry.String());
        CheckMeshAxis(entry, names.back(), axes);
      } else if (entry.IsList()) {
        for (const YamlValue& sub : entry.List()) {
          if (!sub.IsScalar() || IsNone(sub)) sub.Expected("a mesh axis name");
          names.push_back(sub.String());
          CheckMeshAxis(sub, names.back(), axes);
        }
      } else {
        entry.Expected("a mesh axis name, a list of them, or null");
      }
      spec.dims.push_back(names);
    }
  } else {
    value.Expected("a PartitionSpec like \"P('dp', None)\" or a list like [dp, null]");
  }
  std::map<std::string, size_t> used;  // Axis -> the dimension that uses it.
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    for (const std::string& name : spec.dims[d]) {
      const auto [it, inserted] = used.emplace(name, d);
      if (!inserted) {
        value.Fail("uses mesh axis '" + name + "' twice (dimensions " + std::to_string(it->second) +
                   " and " + std::to_string(d) + ")");
      }
    }
  }
  return spec;
}

// `mesh:` {axes: {name: size, ...} in order, devices: [...]}.
void ReadMesh(const YamlValue& value, ProgramSpec& program) {
  YamlMap mesh = value.Map({"axes", "devices"});
  program.mesh_axes = ReadMeshAxes(mesh.Get("axes"));
  if (auto devices = mesh.Find("devices")) {
    program.mesh_devices = ReadMeshDevices(*devices, program.mesh_axes);
  }
}

// `meshes:` NAME: {axes: {...}, devices: [...]}, several disjoint meshes (SPEC): axis names
// and devices are each in one mesh only. program.mesh_axes becomes every mesh's axes in turn.
void ReadMeshes(const YamlValue& value, ProgramSpec& program) {
  YamlMap meshes = value.Map({});
  if (meshes.entries().empty()) {
    value.Fail("expected at least one mesh, like {infer: {axes: {tp: 4}, devices: [0, 1, 2, 3]}}");
  }
  std::map<std::string, std::string> axis_mesh;  // Axis name -> its mesh.
  std::map<int, std::string> device_mesh;        // Device -> its mesh.
  for (const auto& [name, entry] : meshes.entries()) {
    CheckIdentifier(entry, name, "mesh", /*at_key=*/true);
    YamlMap map = entry.Map({"axes", "devices"});
    MeshSpec mesh;
    mesh.name = name;
    YamlValue axes = map.Get("axes");
    mesh.axes = ReadMeshAxes(axes);
    const YamlMap axis_map = axes.Map({});
    for (const auto& [axis, size] : axis_map.entries()) {
      const auto [it, fresh] = axis_mesh.emplace(axis, name);
      if (!fresh) {
        size.FailAtKey("mesh axis '" + axis + "' is an axis of mesh '" + it->second +
                       "' too; give each mesh's axes their own names");
      }
    }
    if (auto devices = map.Find("devices")) {
      mesh.devices = ReadMeshDevices(*devices, mesh.axes);
      const std::vector<YamlValue> entries = devices->List();
      for (size_t i = 0; i < entries.size(); ++i) {
        const auto [it, fresh] = device_mesh.emplace(mesh.devices[i], name);
        if (!fresh) {
          entries[i].Fail("device " + std::to_string(mesh.devices[i]) + " is in mesh '" +
                          it->second + "' too; meshes are disjoint");
        }
      }
    }
    program.mesh_axes.insert(program.mesh_axes.end(), mesh.axes.begin(), mesh.axes.end());
    program.meshes.push_back(std::move(mesh));
  }
}

// The names of the meshes, for messages.
std::vector<std::string> MeshNames(const std::vector<MeshSpec>& meshes) {
  std::vector<std::string> names;
  for (const MeshSpec& m : meshes) names.push_back(m.name);
  return names;
}

// The axes of the mesh `value` names (a `mesh:` key), which must be one of `meshes`.
const MeshSpec& NamedMesh(const YamlValue& value, const std::vector<MeshSpec>& meshes) {
  if (meshes.empty()) {
    value.FailAtKey("mesh: names one of the run's meshes:, and this run has one mesh (mesh:)");
  }
  if (!value.IsScalar()) value.Expected("a mesh name");
  const std::string name = value.String();
  for (const MeshSpec& m : meshes) {
    if (m.name == name) return m;
  }
  const std::string hint = DidYouMean(name, MeshNames(meshes));
  value.Fail("'" + name + "' is not a mesh" +
             (hint.empty() ? "; the meshes are " + JoinNames(MeshNames(meshes)) : hint));
}

// An array's shape: a list of positive integers ([] for a scalar), or "1024x4096".
Shape ReadArrayShape(const YamlValue& value) {
  Shape shape;
  if (value.IsList()) {
    for (const YamlValue& entry : value.List()) shape.push_back(entry.Int64(1));
  } else if (value.IsScalar()) {
    for (int size : value.Shape()) shape.push_back(size);
  } else {
    value.Expected("a list of positive integers like [1024, 4096]");
  }
  int64_t count = 1;
  for (int64_t size : shape) {
    if (count > std::numeric_limits<int64_t>::max() / size) value.Fail("has too many elements");
    count *= size;
  }
  return shape;
}

// A literal's number for an array of `dtype`: within float32's range (infinities and NaN
// written as such are kept), or for i32 a whole number within int32's (JAX refuses to wrap a
// Python int into int32, too).
double LiteralNumber(const YamlValue& value, DType dtype) {
  const double x = value.Number();
  if (dtype == DType::kI32) {
    if (!(x == std::nearbyint(x)) || x < -2147483648.0 || x > 2147483647.0) {
      value.Fail("value " + value.Describe() +
                 " is not an int32 (a whole number from -2147483648 to 2147483647)");
    }
    return x;
  }
  if (std::isfinite(x) && std::fabs(x) > std::numeric_limits<float>::max()) {
    value.Fail("value " + value.Describe() + " is outside the float32 range (about 3.4e38)");
  }
  return x;
}

// The values of a literal nested like `shape`, from dimension `dim` on, appended row-major.
void ReadNested(const YamlValue& value, const Shape& shape, DType dtype, size_t dim,
                std::vector<double>& out) {
  if (dim == shape.size()) {
    if (value.IsList()) value.Fail("is nested deeper than the shape " + ShapeText(shape));
    out.push_back(LiteralNumber(value, dtype));
    return;
  }
  const std::string along =
      " along dimension " + std::to_string(dim) + " of shape " + ShapeText(shape);
  if (!value.IsList()) {
    value.Fail("expected a list of " + std::to_string(shape[dim]) + " entries" + along + ", got " +
               value.Describe());
  }
  std::vector<YamlValue> entries = value.List();
  if (static_cast<int64_t>(entries.size()) != shape[dim]) {
    value.Fail("has " + std::to_string(entries.size()) + " entries but needs " +
               std::to_string(shape[dim]) + along);
  }
  for (const YamlValue& entry : entries) ReadNested(entry, shape, dtype, dim + 1, out);
}

// `init: {value: ...}`: numbers nested like the shape, or flat in row-major order.
std::vector<double> ReadLiteral(const YamlValue& value, const Shape& shape, DType dtype) {
  std::vector<double> out;
  if (value.IsList()) {
    std::vector<YamlValue> entries = value.List();
    const bool nested =
        std::any_of(entries.begin(), entries.end(), [](const YamlValue& e) { return e.IsList(); });
    if (nested) {
      ReadNested(value, shape, dtype, 0, out);
      return out;
    }
    const int64_t count = NumElements(shape);
    if (static_cast<int64_t>(entries.size()) != count) {
      value.Fail("has " + std::to_string(entries.size()) + " values but the shape " +
                 ShapeText(shape) + " needs " + std::to_string(count));
    }
    for (const YamlValue& entry : entries) out.push_back(LiteralNumber(entry, dtype));
    return out;
  }
  if (value.IsScalar() && shape.empty()) {
    out.push_back(LiteralNumber(value, dtype));
    return out;
  }
  value.Expected("a list of numbers, nested like the shape or flat");
}

// `init:` a name, {value: [...]}, {file: x.npy} or {arange: N} (a shardsim extension: element
// i holds i mod N, as a model step's token ids within its vocabulary).
InitSpec ReadInit(const YamlValue& value, const Shape& shape, DType dtype) {
  InitSpec init;
  if (value.IsMap()) {
    YamlMap map = value.Map({"value", "file", "arange"});
    std::optional<YamlValue> literal = map.Find("value");
    std::optional<YamlValue> file = map.Find("file");
    std::optional<YamlValue> arange = map.Find("arange");
    if (literal && file) Later(*literal, *file).FailAtKey("give either value or file, not both");
    if (arange && (literal || file)) arange->FailAtKey("give one of value, file or arange");
    if (arange) {
      init.kind = InitSpec::Kind::kArange;
      init.modulus = arange->Int64(1);
    } else if (literal) {
      init.kind = InitSpec::Kind::kValue;
      init.values = ReadLiteral(*literal, shape, dtype);
    } else if (file) {
      init.kind = InitSpec::Kind::kFile;
      init.file = file->String();
      if (init.file.empty()) file->Expected("a .npy file path");
    } else {
      value.Fail("expected {value: [...]} or {file: x.npy}, got an empty mapping");
    }
    return init;
  }
  const std::vector<std::string> kinds = {"zeros", "ones", "arange", "normal", "uniform"};
  if (!value.IsScalar()) {
    value.Expected("one of " + JoinNames(kinds) + ", {value: [...]} or {file: x.npy}");
  }
  const std::string kind = value.OneOf(kinds);
  if (kind == "zeros") init.kind = InitSpec::Kind::kZeros;
  if (kind == "ones") init.kind = InitSpec::Kind::kOnes;
  if (kind == "arange") init.kind = InitSpec::Kind::kArange;
  if (kind == "normal") init.kind = InitSpec::Kind::kNormal;
  if (kind == "uniform") init.kind = InitSpec::Kind::kUniform;
  return init;
}

// A Mesh over positions 0..n-1, for checking shardings against the axes.
Mesh CheckingMesh(const std::vector<MeshAxis>& axes) {
  int positions = 1;
  for (const MeshAxis& axis : axes) positions *= axis.size;
  std::vector<int> devices(positions);
  std::iota(devices.begin(), devices.end(), 0);
  return Mesh(axes, devices);
}

// `arrays:` name -> {shape, dtype, init, seed, sharding, mesh}; `mesh` names the array's mesh
// when the run has several (`meshes`), whose axes its sharding uses.
std::vector<ArraySpec> ReadArrays(const YamlValue& value, const std::vector<MeshAxis>& all_axes,
                                  const std::vector<MeshSpec>& meshes) {
  YamlMap arrays = value.Map({});
  const std::vector<std::string>& dtypes = DTypeNames();
  std::vector<ArraySpec> out;
  for (const auto& [name, entry] : arrays.entries()) {
    CheckIdentifier(entry, name, "array", /*at_key=*/true);
    YamlMap map = entry.Map({"shape", "dtype", "init", "seed", "sharding", "mesh"});
    ArraySpec array;
    array.name = name;
    const std::vector<MeshAxis>* home = &all_axes;
    if (auto v = map.Find("mesh")) {
      const MeshSpec& m = NamedMesh(*v, meshes);
      array.mesh = m.name;
      home = &m.axes;
    } else if (!meshes.empty()) {
      entry.FailChild("mesh", "missing required key 'mesh' (the array's mesh, one of " +
                                  JoinNames(MeshNames(meshes)) + ")");
    }
    const std::vector<MeshAxis>& axes = *home;
    const Mesh mesh = CheckingMesh(axes);
    array.shape = ReadArrayShape(map.Get("shape"));
    if (auto dtype = map.Find("dtype")) array.dtype = *ParseDType(dtype->OneOf(dtypes));
    array.init.kind = InitSpec::Kind::kNormal;
    if (auto init = map.Find("init")) array.init = ReadInit(*init, array.shape, array.dtype);
    if (auto seed = map.Find("seed")) array.init.seed = static_cast<uint64_t>(seed->Int64(0));
    if (auto sharding = map.Find("sharding")) {
      array.sharding = ReadPartitionSpec(*sharding, axes);
      try {
        ValidatePartitionSpec(array.sharding, array.shape, mesh);
      } catch (const std::invalid_argument& e) {
        sharding->Fail(e.what());
      }
    }
    out.push_back(std::move(array));
  }
  return out;
}

// A name or a list of names (at least one); the value of each.
std::vector<YamlValue> NameValues(const YamlValue& value, const std::string& what) {
  if (value.IsScalar()) return {value};
  if (!value.IsList()) value.Expected(what + " or a list of them");
  std::vector<YamlValue> entries = value.List();
  if (entries.empty())
    value.Fail("expected at least one " + what.substr(what.find(' ') + 1) + ", got an empty list");
  for (const YamlValue& entry : entries) {
    if (!entry.IsScalar()) entry.Expected(what);
  }
  return entries;
}

// Which names the program has defined so far, for checking each op's inputs.
struct NameFlow {
  std::vector<std::string> defined;            // Arrays, then op outputs, in order.
  std::set<std::string> defined_set;           // The same names, for lookups.
  std::map<std::string, size_t> made_by;       // Output name -> the first op that makes it.
  std::map<std::string, std::string> mesh_of;  // With several meshes: each name's mesh.

  bool Has(const std::string& name) const { return defined_set.count(name) > 0; }
  void Add(const std::string& name) {
    if (defined_set.insert(name).second) defined.push_back(name);
  }
  // " ; did you mean 'x'?" or " (defined: a, b)" for an undefined `name`.
  std::string Hint(const std::string& name) const {
    std::string hint = DidYouMean(name, defined);
    if (hint.empty() && !defined.empty() && defined.size() <= 12) {
      hint = " (defined: " + JoinNames(defined) + ")";
    }
    return hint;
  }
};

// The name `entry` holds, which must be defined before op `index` (an array or an earlier op's
// output).
std::string DefinedName(const YamlValue& entry, const NameFlow& flow, size_t index) {
  const std::string name = entry.String();
  if (!flow.Has(name)) {
    auto later = flow.made_by.find(name);
    if (later != flow.made_by.end() && later->second >= index) {
      entry.Fail("'" + name + "' is not defined before this op (" +
                 (later->second == index
                      ? std::string("this op makes it")
                      : "program." + std::to_string(later->second) + " makes it") +
                 ")");
    }
    entry.Fail("'" + name + "' is not defined" + flow.Hint(name));
  }
  return name;
}

// The ops' `out` names as written, before reading the ops, for "made only later" hints.
std::map<std::string, size_t> OutputsByOp(const std::vector<YamlValue>& entries) {
  std::map<std::string, size_t> made_by;
  for (size_t i = 0; i < entries.size(); ++i) {
    const YAML::Node& node = entries[i].node();
    if (!node.IsMap()) continue;
    const YAML::Node out = node["out"];
    if (!out.IsDefined()) continue;
    if (out.IsScalar()) made_by.emplace(out.Scalar(), i);
    if (out.IsSequence()) {
      for (const YAML::Node& name : out) {
        if (name.IsScalar()) made_by.emplace(name.Scalar(), i);
      }
    }
  }
  return made_by;
}

// `axis_name`: one mesh axis or a list, each once.
std::vector<std::string> ReadAxisNames(const YamlValue& value, const std::vector<MeshAxis>& axes) {
  std::vector<std::string> names;
  for (const YamlValue& entry : NameValues(value, "a mesh axis name")) {
    const std::string name = entry.String();
    CheckMeshAxis(entry, name, axes);
    if (Contains(names, name)) entry.Fail("names mesh axis '" + name + "' twice");
    names.push_back(name);
  }
  return names;
}

// `perm: [[src, dst], ...]`: linear indices in [0, group), each source and destination once.
std::vector<std::pair<int, int>> ReadPerm(const YamlValue& value, const char* expected, int group,
                                          const std::vector<std::string>& axis_name) {
  if (!value.IsList()) value.Expected(expected);
  std::vector<std::pair<int, int>> perm;
  std::set<int> sources;
  std::set<int> destinations;
  for (const YamlValue& pair : value.List()) {
    if (!pair.IsList() || pair.node().size() != 2) pair.Expected("a [source, destination] pair");
    std::vector<YamlValue> ends = pair.List();
    const int src = ends[0].Int(0);
    const int dst = ends[1].Int(0);
    for (const auto& [end, index] : {std::pair{&ends[0], src}, std::pair{&ends[1], dst}}) {
      if (index >= group) {
        end->Fail("index " + std::to_string(index) + " is outside the group of " +
                  std::to_string(group) + " over " + JoinNames(axis_name) + " (0.." +
                  std::to_string(group - 1) + ")");
      }
    }
    if (!sources.insert(src).second) {
      ends[0].Fail("source " + std::to_string(src) + " appears twice in perm");
    }
    if (!destinations.insert(dst).second) {
      ends[1].Fail("destination " + std::to_string(dst) + " appears twice in perm");
    }
    perm.emplace_back(src, dst);
  }
  return perm;
}

// reshape's `shape`: positive sizes, at most one -1; `expected` describes the form.
Shape ReadReshape(const YamlValue& value, const char* expected) {
  if (!value.IsList()) value.Expected(expected);
  Shape shape;
  bool inferred = false;
  for (const YamlValue& entry : value.List()) {
    const int64_t size = entry.Int64();
    if (size == -1) {
      if (inferred) entry.Fail("only one size may be -1");
      inferred = true;
    } else if (size < 1) {
      entry.Fail("must be positive (or -1 for the rest), got " + std::to_string(size));
    }
    shape.push_back(size);
  }
  return shape;
}

// What reading an op's attributes needs beyond the value: the op's group size and axes (for
// perm), the mesh axes (for shardings), and the names defined before op `index` (for value
// names).
struct AttrContext {
  int group;
  const std::vector<std::string>& axis_name;
  const std::vector<MeshAxis>& axes;
  const NameFlow& flow;
  size_t index;
};

// The value of op attribute `attr`, read by its type.
AttrValue ReadAttr(const YamlValue& value, const AttrDef& attr, const AttrContext& context) {
  switch (attr.type) {
    case AttrType::kInt:
      // A field of C++ int (ppermute's shift) is range-checked here, with the location.
      if (std::holds_alternative<std::optional<int> OpSpec::*>(attr.field)) {
        return int64_t{value.Int(std::numeric_limits<int>::min())};
      }
      return value.Int64();
    case AttrType::kNonNegativeInt:
      return value.Int64(0);
    case AttrType::kPositiveInt:
      return value.Int64(1);
    case AttrType::kBool:
      return value.Bool();
    case AttrType::kIntList: {
      if (!value.IsList()) value.Expected(attr.expected);
      std::vector<int64_t> list;
      for (const YamlValue& entry : value.List()) list.push_back(entry.Int64());
      return list;
    }
    case AttrType::kShape:
      return ReadReshape(value, attr.expected);
    case AttrType::kString:
      return value.String();
    case AttrType::kOneOf:
      return value.OneOf(std::vector<std::string>(attr.values.begin(), attr.values.end()));
    case AttrType::kNumber:
      return value.Number();
    case AttrType::kBytes:
      return static_cast<double>(value.ToBytes().count());
    case AttrType::kPerm:
      return ReadPerm(value, attr.expected, context.group, context.axis_name);
    case AttrType::kSharding:
      return ReadPartitionSpec(value, context.axes);
    case AttrType::kValueName:
      if (!value.IsScalar()) value.Expected("a value name");
      return DefinedName(value, context.flow, context.index);
    case AttrType::kValueNames: {
      if (!value.IsList()) value.Expected(attr.expected);
      std::vector<std::string> names;
      for (const YamlValue& entry : value.List()) {
        if (!entry.IsScalar()) entry.Expected("a value name");
        names.push_back(DefinedName(entry, context.flow, context.index));
      }
      if (names.empty()) value.Fail("expected at least one value name, got an empty list");
      return names;
    }
    case AttrType::kAxisList: {
      if (value.IsScalar()) return std::vector<int64_t>{value.Int64()};
      if (!value.IsList()) value.Expected(attr.expected);
      std::vector<int64_t> list;
      for (const YamlValue& entry : value.List()) list.push_back(entry.Int64());
      // An empty list would read as "not given" (all axes): refused rather than misread.
      if (list.empty()) value.Fail("expected at least one axis; leave axis out to reduce all");
      return list;
    }
  }
  throw std::logic_error("internal error: attribute type without a reader");
}

// The axes of mesh `name` of `meshes`.
const std::vector<MeshAxis>& MeshAxesOf(const std::vector<MeshSpec>& meshes,
                                        const std::string& name) {
  for (const MeshSpec& m : meshes) {
    if (m.name == name) return m.axes;
  }
  throw std::logic_error("internal error: no mesh '" + name + "'");
}

// device_put's shardings: `sharding` over the destination mesh's axes, `in_sharding` (a
// shard_map body's only) over the input's.
void CheckDevicePut(const YamlMap& map, const OpSpec& op, ProgramMode mode,
                    const std::vector<MeshSpec>& meshes, const NameFlow& flow) {
  auto check = [&](const char* key, const PartitionSpec& spec, const std::string& mesh) {
    const std::vector<MeshAxis>& axes = MeshAxesOf(meshes, mesh);
    for (const std::vector<std::string>& dim : spec.dims) {
      for (const std::string& axis : dim) {
        bool found = false;
        for (const MeshAxis& a : axes) found = found || a.name == axis;
        if (!found) {
          map.Find(key)->Fail("'" + axis + "' is not an axis of mesh '" + mesh + "'" +
                              DidYouMean(axis, AxisNames(axes)));
        }
      }
    }
  };
  check("sharding", op.sharding, op.mesh);
  if (mode == ProgramMode::kManual && !map.Has("in_sharding")) {
    map.Find("sharding")
        ->FailAtKey(
            "a shard_map body's device_put needs in_sharding, the layout of its input's blocks on "
            "their mesh (\"P()\" when every device holds the whole array)");
  }
  if (auto v = map.Find("in_sharding")) {
    if (mode != ProgramMode::kManual) {
      v->FailAtKey(
          "in_sharding: a global program's device_put moves its input as it is laid "
          "out; only a shard_map body (mode: manual) writes it");
    }
    check("in_sharding", op.in_sharding, flow.mesh_of.at(op.in.at(0)));
  }
}

OpSpec ReadOp(const YamlValue& value, size_t index, const std::vector<MeshAxis>& all_axes,
              const std::vector<MeshSpec>& meshes, ProgramMode mode, NameFlow& flow,
              std::set<std::string>& op_names);
std::vector<OpSpec> ReadOps(const YamlValue& value, const std::vector<MeshAxis>& axes,
                            const std::vector<MeshSpec>& meshes, ProgramMode mode, NameFlow& flow);

// `name:` of op `index`, or its first output's name (op<index> when another op has that name
// already); recorded in `op_names`.
void ReadOpName(const YamlMap& map, size_t index, OpSpec& op, std::set<std::string>& op_names) {
  if (auto name = map.Find("name")) {
    op.name = name->String();
    if (op.name.empty()) name->Expected("a name");
  } else {
    op.name = op_names.count(op.out[0]) ? "op" + std::to_string(index) : op.out[0];
  }
  op_names.insert(op.name);
}

// A list of `count` PartitionSpecs over `axes`, one per `what` ("input" or "output").
std::vector<PartitionSpec> ReadSpecList(const YamlValue& value, const std::vector<MeshAxis>& axes,
                                        size_t count, const std::string& what) {
  if (!value.IsList()) value.Expected("a list of PartitionSpecs like [\"P('ep', None)\"]");
  std::vector<YamlValue> entries = value.List();
  if (entries.size() != count) {
    value.Fail("expected one spec per " + what + " (" + std::to_string(count) + "), got " +
               std::to_string(entries.size()));
  }
  std::vector<PartitionSpec> specs;
  for (const YamlValue& entry : entries) specs.push_back(ReadPartitionSpec(entry, axes));
  return specs;
}

// `{op: shard_map, in: [...], in_specs: [...], out: [...], out_specs: [...], body: [ops]}` in a
// global program: the body's ops (a shard_map body, mode: manual) read the inputs' blocks under
// the inputs' names and bind the outputs' names; the body's arrays are the inputs, typed as
// they are when the program is (ArraySpec::typed_by_input).
OpSpec ReadShardMap(const YamlValue& value, size_t index, const std::vector<MeshAxis>& axes,
                    const std::vector<MeshSpec>& meshes, ProgramMode mode, NameFlow& flow,
                    std::set<std::string>& op_names) {
  YamlMap map = value.Map({"op", "in", "in_specs", "out", "out_specs", kShardMapBody, "name"});
  if (mode == ProgramMode::kManual) {
    map.Get("op").Fail(
        "shard_map needs a global program (mode: explicit or auto); in a "
        "shard_map body write its ops directly");
  }
  if (!meshes.empty()) {
    map.Get("op").Fail(
        "shard_map runs on the program's one mesh; a program of several meshes "
        "cannot hold one yet");
  }
  OpSpec op;
  op.kind = OpKind::kShardMap;
  op.key = value.path();
  const YamlValue in = map.Get("in");
  for (const YamlValue& entry : NameValues(in, "an array name")) {
    const std::string name = DefinedName(entry, flow, index);
    if (Contains(op.in, name)) entry.Fail("'" + name + "' is an input twice");
    op.in.push_back(name);
  }
  const YamlValue out = map.Get("out");
  std::vector<YamlValue> out_entries = NameValues(out, "an output name");
  for (const YamlValue& entry : out_entries) {
    const std::string name = entry.String();
    if (Contains(op.out, name)) entry.Fail("'" + name + "' is an output twice");
    op.out.push_back(name);
  }
  const std::vector<PartitionSpec> in_specs =
      ReadSpecList(map.Get("in_specs"), axes, op.in.size(), "input");
  const std::vector<PartitionSpec> out_specs =
      ReadSpecList(map.Get("out_specs"), axes, op.out.size(), "output");
  auto body = std::make_shared<ProgramSpec>();
  body->mode = ProgramMode::kManual;
  body->mesh_axes = axes;
  for (size_t i = 0; i < op.in.size(); ++i) {
    ArraySpec param;
    param.name = op.in[i];
    param.sharding = in_specs[i];
    param.typed_by_input = true;
    body->arrays.push_back(std::move(param));
  }
  // The body sees the inputs alone, under their names.
  NameFlow inner;
  for (const std::string& name : op.in) inner.Add(name);
  body->ops = ReadOps(map.Get(kShardMapBody), axes, {}, ProgramMode::kManual, inner);
  for (size_t j = 0; j < op.out.size(); ++j) {
    if (!inner.Has(op.out[j])) {
      out_entries[j].Fail("'" + op.out[j] + "' is not made by the body" + inner.Hint(op.out[j]));
    }
    body->outputs.push_back(
        OutputSpec{op.out[j], out_specs[j], map.Get("out_specs").path() + "." + std::to_string(j)});
  }
  op.body = std::move(body);
  ReadOpName(map, index, op, op_names);
  for (const std::string& name : op.out) flow.Add(name);
  return op;
}

// One op of `program:` (the entry at `index`).
OpSpec ReadOp(const YamlValue& value, size_t index, const std::vector<MeshAxis>& all_axes,
              const std::vector<MeshSpec>& meshes, ProgramMode mode, NameFlow& flow,
              std::set<std::string>& op_names) {
  OpSpec op;
  op.key = value.path();
  YamlMap any = value.Map({});
  YamlValue kind_value = any.Get("op");
  if (!kind_value.IsScalar()) kind_value.Expected("an op name like psum or matmul");
  const std::string kind_name = kind_value.String();
  // The op the entry means: `{op: max, in: x, axis: 0}` is the reduction reduce_max.
  std::vector<std::string> written;
  for (const auto& [name, entry] : any.entries()) written.push_back(name);
  size_t inputs = 0;
  if (auto v = any.Find("in")) inputs = v->IsList() ? v->List().size() : 1;
  if (kind_name == Op(OpKind::kShardMap).name) {
    return ReadShardMap(value, index, all_axes, meshes, mode, flow, op_names);
  }
  const OpDef* def = ResolveOp(kind_name, inputs, written);
  if (!def) {
    const std::string hint = DidYouMean(kind_name, UserOpNames());
    kind_value.Fail("unknown op '" + kind_name + "'" +
                    (hint.empty() ? "; expected one of " + JoinNames(UserOpNames()) : hint));
  }
  op.kind = def->kind;
  // Global-only ops need a global program; ops that name mesh axes need a shard_map body.
  if (def->global_only && mode == ProgramMode::kManual) {
    kind_value.Fail(kind_name + " works on global arrays: it needs mode: explicit or auto");
  }
  if (def->takes_axis_name && mode != ProgramMode::kManual) {
    kind_value.Fail(kind_name + " names mesh axes, which only a shard_map body (mode: manual) " +
                    "can; in mode: " + ProgramModeName(mode) +
                    " write the global computation and let shardings place the communication");
  }
  const std::vector<std::string> keys = OpKeys(op.kind);
  const std::vector<std::string> all_keys = AllOpKeys();
  for (const auto& [name, entry] : any.entries()) {
    if (!Contains(keys, name) && Contains(all_keys, name)) {
      if (const OpDef* alias = OpWrittenAs(kind_name);
          alias && alias != def && Contains(OpKeys(alias->kind), name)) {
        entry.FailAtKey("key '" + name + "' does not apply to op " + kind_name + " with " +
                        std::to_string(inputs) + " input" + (inputs == 1 ? "" : "s") +
                        (any.Has("scalar") ? " and scalar:" : "") + "; the reduction " + kind_name +
                        " (" + alias->name + ") takes one input and no scalar");
      }
      const std::string hint = DidYouMean(name, keys);
      entry.FailAtKey("key '" + name + "' does not apply to op " + kind_name +
                      (hint.empty() ? " (it takes " + JoinNames(keys) + ")" : hint));
    }
  }
  YamlMap map = value.Map(keys);

  // Inputs, each defined by an array or an earlier op.
  std::optional<YamlValue> in;
  if (def->arity != OpArity::kNone) {
    in = map.Get("in");
    for (const YamlValue& entry : NameValues(*in, "an array name")) {
      op.in.push_back(DefinedName(entry, flow, index));
    }
  }

  // Its mesh: `mesh:` (device_put's destination), else its inputs'; the axes it may name.
  const std::vector<MeshAxis>* op_axes = &all_axes;
  const bool device_put = op.kind == OpKind::kDevicePut;
  if (auto v = map.Find("mesh")) {
    const MeshSpec& m = NamedMesh(*v, meshes);
    op.mesh = m.name;
    op_axes = &m.axes;
  } else if (device_put) {
    value.FailChild("mesh", meshes.empty()
                                ? "device_put moves arrays between meshes; the run has one mesh "
                                  "(write meshes: to have several)"
                                : "missing required key 'mesh' (the destination mesh, one of " +
                                      JoinNames(MeshNames(meshes)) + ")");
  } else if (!meshes.empty() && op.kind == OpKind::kGrad) {
    // grad: the mesh of the scalar it differentiates (read from `of`, before the attributes).
    if (auto of = map.Find("of"); of && of->IsScalar() && flow.mesh_of.count(of->String())) {
      op.mesh = flow.mesh_of.at(of->String());
      op_axes = &MeshAxesOf(meshes, op.mesh);
    }
  } else if (!meshes.empty()) {
    if (op.in.empty()) {
      value.FailChild("mesh",
                      "missing required key 'mesh' (the op has no input to tell its "
                      "mesh; one of " +
                          JoinNames(MeshNames(meshes)) + ")");
    }
    op.mesh = flow.mesh_of.at(op.in[0]);
    for (const MeshSpec& m : meshes) {
      if (m.name == op.mesh) op_axes = &m.axes;
    }
  }
  if (!meshes.empty()) {
    for (size_t k = 0; k < op.in.size(); ++k) {
      const std::string& home = flow.mesh_of.at(op.in[k]);
      const YamlValue at = in->IsList() ? in->List()[k] : *in;
      if (device_put && home == op.mesh) {
        at.Fail("'" + op.in[k] + "' is on mesh '" + home +
                "' already; device_put moves it to another mesh");
      }
      if (!device_put && home != op.mesh) {
        at.Fail("'" + op.in[k] + "' lives on mesh '" + home + "' but the op runs on mesh '" +
                op.mesh + "'; device_put it there first");
      }
    }
  }
  // device_put reads its shardings over every axis, then checks each against its own mesh.
  const std::vector<MeshAxis>& axes = device_put ? all_axes : *op_axes;

  // Outputs.
  YamlValue out = map.Get("out");
  for (const YamlValue& entry : NameValues(out, "an output name")) {
    const std::string name = entry.String();
    CheckIdentifier(entry, name, "output", /*at_key=*/false);
    if (Contains(op.out, name)) entry.Fail("'" + name + "' is named twice in out");
    op.out.push_back(name);
  }
  // The count is known now unless an attribute gives it (split's sections, read below).
  if (!def->output_count) {
    if (const std::string wrong = CheckOutputCount(op); !wrong.empty()) out.Fail(wrong);
  }

  ReadOpName(map, index, op, op_names);

  int group = 1;
  if (Contains(keys, "axis_name")) {
    op.axis_name = ReadAxisNames(map.Get("axis_name"), axes);
    for (const std::string& name : op.axis_name) {
      for (const MeshAxis& axis : axes) {
        if (axis.name == name) group *= axis.size;
      }
    }
  }

  if (auto v = map.Find("where"); v && mode != ProgramMode::kManual) {
    v->FailAtKey("where: runs an op on some devices of a shard_map body; it needs mode: manual");
  }
  if (auto v = map.Find("where")) {
    // where: {axis: index, ...}: the positions the op runs on.
    YamlMap where = v->Map({});
    for (const auto& [name, entry] : where.entries()) {
      const MeshAxis* axis = nullptr;
      for (const MeshAxis& a : axes) {
        if (a.name == name) axis = &a;
      }
      if (!axis) {
        entry.FailAtKey("'" + name + "' is not a mesh axis" + DidYouMean(name, AxisNames(axes)));
      }
      const int index = entry.Int(0);
      if (index >= axis->size) {
        entry.Fail("index " + std::to_string(index) + " is beyond mesh axis '" + name + "' (0.." +
                   std::to_string(axis->size - 1) + ")");
      }
      op.where.push_back({name, index});
    }
  }
  // The op's attributes, each read by its type and stored where the registry says.
  for (const ExactlyOneOf& group_def : def->exactly_one_of) {
    std::vector<std::pair<std::string, YamlValue>> given;
    for (const char* name : group_def.names) {
      if (auto v = map.Find(name)) given.emplace_back(name, *v);
    }
    if (given.size() > 1) {
      Later(given[0].second, given[1].second)
          .FailAtKey("give either " + given[0].first + " or " + given[1].first + ", not both");
    }
    if (given.empty()) value.FailChild(group_def.names[0], group_def.missing);
  }
  for (const AttrDef& attr : def->attrs) {
    std::optional<YamlValue> v = attr.required ? map.Get(attr.name) : map.Find(attr.name);
    if (!v) continue;
    SetAttr(op, attr, ReadAttr(*v, attr, AttrContext{group, op.axis_name, axes, flow, index}));
    if (attr.check) {
      const std::string wrong = attr.check(op);
      if (!wrong.empty()) v->Fail(wrong);
    }
  }
  if (def->output_count) {
    const std::string wrong = CheckOutputCount(op);
    if (!wrong.empty()) out.Fail(wrong);
  }
  if (auto v = map.Find("algorithm")) op.algorithm = ReadAlgorithm(*v);

  // Input counts, by the op's arity in the registry.
  if (in) {
    const std::string wrong = CheckArity(op);
    if (!wrong.empty()) {
      if (const char* attr = ArityBlamesAttr(op)) map.Find(attr)->FailAtKey(wrong);
      in->Fail(wrong);
    }
  }

  if (device_put) CheckDevicePut(map, op, mode, meshes, flow);
  const std::vector<std::string> out_mesh = OutputMeshes(op, flow.mesh_of);
  for (size_t i = 0; i < op.out.size(); ++i) {
    flow.Add(op.out[i]);
    if (!meshes.empty()) flow.mesh_of[op.out[i]] = out_mesh[i];
  }
  return op;
}

// `program:` a list of ops.
std::vector<OpSpec> ReadOps(const YamlValue& value, const std::vector<MeshAxis>& axes,
                            const std::vector<MeshSpec>& meshes, ProgramMode mode, NameFlow& flow) {
  if (!value.IsList()) {
    value.Expected("a list of ops like [{op: psum, in: x, out: y, axis_name: dp}]");
  }
  std::vector<YamlValue> entries = value.List();
  if (entries.empty()) value.Fail("expected at least one op, got an empty list");
  flow.made_by = OutputsByOp(entries);
  std::set<std::string> op_names;  // Names given so far, for defaults that stay unique.
  std::vector<OpSpec> ops;
  for (size_t i = 0; i < entries.size(); ++i) {
    ops.push_back(ReadOp(entries[i], i, axes, meshes, mode, flow, op_names));
  }
  return ops;
}

// `outputs:` name -> out_spec; every name must be an array or an op's output.
std::vector<OutputSpec> ReadOutputs(const YamlValue& value, const std::vector<MeshAxis>& all_axes,
                                    const std::vector<MeshSpec>& meshes, const NameFlow& flow) {
  YamlMap map = value.Map({});
  if (map.entries().empty()) {
    value.Fail("expected at least one output, like {y: \"P('dp', None)\"}");
  }
  std::vector<OutputSpec> outputs;
  for (const auto& [name, entry] : map.entries()) {
    if (!flow.Has(name)) entry.FailAtKey("'" + name + "' is never produced" + flow.Hint(name));
    OutputSpec output;
    output.name = name;
    output.key = entry.path();
    // With several meshes, over the axes of the mesh the value lives on.
    output.spec = ReadPartitionSpec(
        entry, meshes.empty() ? all_axes : MeshAxesOf(meshes, flow.mesh_of.at(name)));
    outputs.push_back(std::move(output));
  }
  return outputs;
}

// A program run file's mesh/arrays/program/outputs.
ProgramSpec ReadProgram(const YamlValue& top, const YamlMap& map, const YamlValue& ops) {
  std::optional<YamlValue> mesh = map.Find("mesh");
  std::optional<YamlValue> meshes = map.Find("meshes");
  if (mesh && meshes) meshes->FailAtKey("give mesh: (one mesh) or meshes: (several), not both");
  if (!mesh && !meshes) {
    top.FailChild("mesh",
                  "missing required key 'mesh' (the program's device mesh, like mesh: {axes: "
                  "{dp: 4}})");
  }
  std::optional<YamlValue> outputs = map.Find("outputs");
  if (!outputs) {
    top.FailChild("outputs",
                  "missing required key 'outputs' (the program's out_specs, like outputs: {y: "
                  "\"P('dp', None)\"})");
  }
  ProgramSpec read;
  if (auto mode = map.Find("mode")) {
    std::vector<std::string> names;
    for (ProgramMode m : kProgramModes) names.push_back(ProgramModeName(m));
    const std::string name = mode->OneOf(names);
    for (ProgramMode m : kProgramModes) {
      if (name == ProgramModeName(m)) read.mode = m;
    }
  }
  if (mesh) {
    ReadMesh(*mesh, read);
  } else {
    ReadMeshes(*meshes, read);
  }
  std::vector<ArraySpec> arrays;
  if (auto a = map.Find("arrays")) arrays = ReadArrays(*a, read.mesh_axes, read.meshes);
  NameFlow flow;
  for (const ArraySpec& array : arrays) {
    flow.Add(array.name);
    if (!read.meshes.empty()) flow.mesh_of[array.name] = array.mesh;
  }
  std::vector<OpSpec> program_ops = ReadOps(ops, read.mesh_axes, read.meshes, read.mode, flow);
  std::vector<OutputSpec> program_outputs =
      ReadOutputs(*outputs, read.mesh_axes, read.meshes, flow);
  // Validated with locations above; the builder assembles the program as for any client.
  ProgramBuilder builder(std::move(read.mesh_axes), std::move(read.mesh_devices), read.mode);
  builder.Meshes(std::move(read.meshes));
  for (ArraySpec& array : arrays) builder.Input(std::move(array));
  for (OpSpec& op : program_ops) builder.Add(std::move(op));
  for (OutputSpec& output : program_outputs) builder.Output(output.name, std::move(output.spec));
  return std::move(builder).Build();
}

}  // namespace

std::vector<MeshAxis> ReadMeshAxes(const YamlValue& value) {
  YamlMap axes = value.Map({});
  if (axes.entries().empty()) value.Fail("expected at least one axis, like {dp: 4, tp: 2}");
  std::vector<MeshAxis> read;
  int64_t positions = 1;
  for (const auto& [name, size] : axes.entries()) {
    CheckIdentifier(size, name, "mesh axis", /*at_key=*/true);
    read.push_back(MeshAxis{name, size.Int(1)});
    positions *= read.back().size;
    if (positions > (int64_t{1} << 30)) size.Fail("the mesh has too many positions");
  }
  return read;
}

std::vector<int> ReadMeshDevices(const YamlValue& value, const std::vector<MeshAxis>& axes) {
  if (!value.IsList()) value.Expected("a list of device indices like [0, 1, 2, 3]");
  std::vector<int> devices;
  std::map<int, size_t> seen;  // Device -> its first entry.
  std::vector<YamlValue> entries = value.List();
  for (size_t i = 0; i < entries.size(); ++i) {
    const int device = entries[i].Int(0);
    const auto [it, inserted] = seen.emplace(device, i);
    if (!inserted) {
      entries[i].Fail("device " + std::to_string(device) + " is listed twice (entries " +
                      std::to_string(it->second) + " and " + std::to_string(i) + ")");
    }
    devices.push_back(device);
  }
  int64_t positions = 1;
  for (const MeshAxis& axis : axes) positions *= axis.size;
  if (static_cast<int64_t>(entries.size()) != positions) {
    value.Fail("has " + std::to_string(entries.size()) + " devices but the mesh has " +
               std::to_string(positions) + " positions (" + DescribeMeshAxes(axes) + ")");
  }
  return devices;
}

std::string DescribeRules(const std::map<std::string, std::vector<std::string>>& rules) {
  std::string text;
  for (const std::string& name : planner::LogicalRules::Names()) {
    auto it = rules.find(name);
    if (it == rules.end() || it->second.empty()) continue;
    std::string axes;
    for (const std::string& a : it->second) axes += (axes.empty() ? "" : "+") + a;
    text += (text.empty() ? "" : ", ") + name + ": " + axes;
  }
  return text.empty() ? "(none: replicated)" : text;
}

std::string DescribeMeshAxes(const std::vector<MeshAxis>& axes) {
  std::string text;
  for (const MeshAxis& a : axes) {
    text += (text.empty() ? "" : " x ") + a.name + "=" + std::to_string(a.size);
  }
  return text;
}

std::vector<std::string> AlgorithmKeys() {
  std::vector<std::string> keys = CollectiveOpNames();
  for (CollectiveKind kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
        CollectiveKind::kAllToAll, CollectiveKind::kPermute}) {
    std::string name = CollectiveKindName(kind);
    if (!Contains(keys, name)) keys.push_back(name);
  }
  return keys;
}

namespace {

RunOptions ReadOptions(const YamlValue& value) {
  YamlMap map = value.Map({"numerics", "algorithms", "chunk_size"});
  RunOptions options;
  if (auto n = map.Find("numerics")) options.numerics = n->OneOf({"auto", "on", "off"});
  if (auto c = map.Find("chunk_size")) {
    options.chunk_size = c->ToBytes();
    if (options.chunk_size.count() <= 0) c->Fail("chunk_size must be positive");
  }
  if (auto a = map.Find("algorithms")) {
    YamlMap algorithms = a->Map(AlgorithmKeys());
    for (const auto& [op, algorithm] : algorithms.entries()) {
      options.algorithms[op] = ReadAlgorithm(algorithm);
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

RunFile LoadRunFile(const std::string& path, const std::vector<std::string>& overrides,
                    bool plan_search) {
  YamlSource source(path);
  YAML::Node root = source.Load();
  if (!overrides.empty() && (!root.IsDefined() || root.IsNull())) {
    root = YAML::Node(YAML::NodeType::Map);
  }
  for (const std::string& text : overrides) source.ApplyOverride(root, text);

  YamlValue top(&source, root, "", YAML::Mark());
  if (!root.IsMap()) top.Expected("a mapping with hardware: and transfers:");
  YamlMap map = top.Map(TopLevelKeys());
  RunFile file;
  file.path = path;
  file.hardware = ReadHardware(map.Get("hardware"));
  if (auto search = map.Find("search"); search && !plan_search) {
    search->FailAtKey("search: is read by shardsim plan (shardsim run simulates one plan)");
  }
  if (plan_search && !map.Has("model")) {
    top.FailChild("model", "missing required key 'model' (shardsim plan searches a model's plans)");
  }
  std::optional<YamlValue> transfers = map.Find("transfers");
  std::optional<YamlValue> program = map.Find("program");
  if (map.Has("model")) {
    std::vector<std::string> program_keys = ProgramOnlyKeys();
    program_keys.insert(program_keys.end(), {"transfers", "program"});
    for (const std::string& key : program_keys) {
      if (auto v = map.Find(key)) {
        v->FailAtKey(key + ": does not go with model: (a model run builds its program)");
      }
    }
    if (plan_search) {
      file.search = ReadPlanSearch(map);
    } else {
      file.model = ReadModelRun(map);
    }
  } else {
    for (const char* key : {"train", "serve", "plan"}) {
      if (auto v = map.Find(key)) v->FailAtKey(std::string(key) + ": applies only with model:");
    }
    if (transfers && program) {
      Later(*transfers, *program).FailAtKey("give either transfers: or program:, not both");
    }
    if (!transfers && !program) {
      top.FailChild("transfers", "missing required key 'transfers' (or 'program', or 'model')");
    }
    if (transfers) {
      for (const std::string& key : ProgramOnlyKeys()) {
        if (auto v = map.Find(key)) {
          v->FailAtKey(key + ": applies only with program:, not with transfers:");
        }
      }
      file.transfers = ReadTransfers(*transfers);
    } else {
      file.program = ReadProgram(top, map, *program);
    }
  }
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
