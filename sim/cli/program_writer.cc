#include "sim/cli/program_writer.h"

#include <cstdio>
#include <filesystem>
#include <type_traits>
#include <variant>

#include "collectives/ir/op_registry.h"

namespace shardsim {
namespace {

// A number as YAML reads it back exactly.
std::string Number(double v) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", v);
  return text;
}

std::string Quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string List(const std::vector<std::string>& items) {
  std::string t = "[";
  for (size_t i = 0; i < items.size(); ++i) t += (i ? ", " : "") + items[i];
  return t + "]";
}

std::string Ints(const std::vector<int64_t>& v) {
  std::vector<std::string> items;
  for (int64_t x : v) items.push_back(std::to_string(x));
  return List(items);
}

// The attribute's value in `op` as YAML, or "" when it holds the default (not written).
std::string AttrYaml(const OpSpec& op, const AttrDef& attr) {
  const OpSpec defaults;
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = op.*member;
        using V = std::decay_t<decltype(v)>;
        if (!attr.required && v == defaults.*member) return "";
        if constexpr (std::is_same_v<V, int64_t>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<V, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<V, std::optional<int>>) {
          return v ? std::to_string(*v) : "";
        } else if constexpr (std::is_same_v<V, std::optional<double>>) {
          return v ? Number(*v) : "";
        } else if constexpr (std::is_same_v<V, std::string>) {
          return Quoted(v);
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          return Ints(v);
        } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
          return List(v);
        } else if constexpr (std::is_same_v<V, std::vector<std::pair<int, int>>>) {
          std::vector<std::string> pairs;
          for (const auto& [a, b] : v) pairs.push_back(Ints({a, b}));
          return List(pairs);
        } else {
          return Quoted(FormatPartitionSpec(v));
        }
      },
      attr.field);
}

std::string Spec(const PartitionSpec& spec) { return Quoted(FormatPartitionSpec(spec)); }

std::string InitYaml(const ArraySpec& a, const std::string& file_dir) {
  switch (a.init.kind) {
    case InitSpec::Kind::kZeros:
      return "zeros";
    case InitSpec::Kind::kOnes:
      return "ones";
    case InitSpec::Kind::kArange:
      return a.init.modulus > 0 ? "{arange: " + std::to_string(a.init.modulus) + "}" : "arange";
    case InitSpec::Kind::kNormal:
      return "normal, seed: " + std::to_string(a.init.seed);
    case InitSpec::Kind::kUniform:
      return "uniform, seed: " + std::to_string(a.init.seed);
    case InitSpec::Kind::kValue: {
      std::vector<std::string> values;
      for (double v : a.init.values) values.push_back(Number(v));
      return "{value: " + List(values) + "}";
    }
    case InitSpec::Kind::kFile: {
      std::filesystem::path p(a.init.file);
      if (p.is_relative() && !file_dir.empty()) p = std::filesystem::path(file_dir) / p;
      return "{file: " + Quoted(std::filesystem::absolute(p).lexically_normal().string()) + "}";
    }
  }
  return "zeros";
}

}  // namespace

std::string OpYaml(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  std::string t = "{op: " + std::string(def.name);
  if (!op.name.empty() && op.name != op.out.at(0)) t += ", name: " + Quoted(op.name);
  if (def.arity != OpArity::kNone) {
    t += ", in: " + (op.in.size() == 1 && def.arity == OpArity::kOne ? op.in[0] : List(op.in));
  }
  t += ", out: " + (op.out.size() == 1 ? op.out[0] : List(op.out));
  if (def.takes_axis_name) {
    t += ", axis_name: " + (op.axis_name.size() == 1 ? op.axis_name[0] : List(op.axis_name));
  }
  for (const AttrDef& attr : def.attrs) {
    std::string v = AttrYaml(op, attr);
    // A shard_map body's device_put always states its input's layout, replicated included.
    if (v.empty() && op.kind == OpKind::kDevicePut && attr.name == std::string("in_sharding")) {
      v = Spec(op.in_sharding);
    }
    if (!v.empty()) t += ", " + std::string(attr.name) + ": " + v;
  }
  if (!op.algorithm.empty()) t += ", algorithm: " + op.algorithm;
  if (!op.mesh.empty()) t += ", mesh: " + op.mesh;
  if (!op.where.empty()) {
    std::string w;
    for (const auto& [axis, index] : op.where) {
      w += (w.empty() ? "" : ", ") + axis + ": " + std::to_string(index);
    }
    t += ", where: {" + w + "}";
  }
  return t + "}";
}

std::string ProgramYaml(const ProgramSpec& program, const std::vector<std::string>& comments,
                        const std::string& file_dir) {
  auto axes = [](const std::vector<MeshAxis>& axes) {
    std::string t = "{";
    for (size_t i = 0; i < axes.size(); ++i) {
      t += (i ? ", " : "") + axes[i].name + ": " + std::to_string(axes[i].size);
    }
    return t + "}";
  };
  auto devices = [](const std::vector<int>& devices) {
    return Ints(std::vector<int64_t>(devices.begin(), devices.end()));
  };
  std::string y = "mode: " + std::string(ProgramModeName(program.mode)) + "\n";
  if (program.meshes.empty()) {
    y += "mesh:\n  axes: " + axes(program.mesh_axes) + "\n";
    if (!program.mesh_devices.empty()) y += "  devices: " + devices(program.mesh_devices) + "\n";
  } else {
    y += "meshes:\n";
    for (const MeshSpec& m : program.meshes) {
      y += "  " + m.name + ": {axes: " + axes(m.axes);
      if (!m.devices.empty()) y += ", devices: " + devices(m.devices);
      y += "}\n";
    }
  }
  if (!program.arrays.empty()) y += "arrays:\n";
  for (const ArraySpec& a : program.arrays) {
    y += "  " + a.name + ": {shape: " + Ints(a.shape) + ", dtype: " + DTypeName(a.dtype) +
         ", init: " + InitYaml(a, file_dir) + ", sharding: " + Spec(a.sharding) +
         (a.mesh.empty() ? "" : ", mesh: " + a.mesh) + "}\n";
  }
  y += "program:\n";
  for (size_t i = 0; i < program.ops.size(); ++i) {
    if (i < comments.size() && !comments[i].empty()) y += "  # " + comments[i] + "\n";
    y += "  - " + OpYaml(program.ops[i]) + "\n";
  }
  y += "outputs:\n";
  for (const OutputSpec& o : program.outputs) y += "  " + o.name + ": " + Spec(o.spec) + "\n";
  return y;
}

}  // namespace shardsim
