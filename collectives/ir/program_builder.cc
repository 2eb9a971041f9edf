#include "collectives/ir/program_builder.h"

#include <memory>
#include <stdexcept>

#include "collectives/ir/op_registry.h"
#include "collectives/shard_map.h"
#include "sim/spec_error.h"

namespace shardsim {

std::vector<std::string> OutputMeshes(const OpSpec& op,
                                      const std::map<std::string, std::string>& mesh_of) {
  std::vector<std::string> meshes(op.out.size(), op.mesh);
  if (op.kind != OpKind::kGrad) return meshes;
  for (size_t i = 0; i < op.out.size() && i < op.wrt.size(); ++i) {
    const auto it = mesh_of.find(op.wrt[i]);
    if (it != mesh_of.end()) meshes[i] = it->second;
  }
  return meshes;
}

ProgramBuilder::ProgramBuilder(std::vector<MeshAxis> axes, std::vector<int> devices,
                               ProgramMode mode) {
  program_.mode = mode;
  program_.mesh_axes = std::move(axes);
  program_.mesh_devices = std::move(devices);
}

void ProgramBuilder::Meshes(std::vector<MeshSpec> meshes) {
  if (!program_.arrays.empty() || !program_.ops.empty()) {
    throw std::logic_error("internal error: meshes are set before arrays and ops");
  }
  if (program_.mesh_axes.empty()) {
    for (const MeshSpec& m : meshes) {
      program_.mesh_axes.insert(program_.mesh_axes.end(), m.axes.begin(), m.axes.end());
    }
  }
  program_.meshes = std::move(meshes);
}

std::string ProgramBuilder::Fresh() {
  std::string name;
  do {
    name = "v" + std::to_string(next_value_++);
  } while (defined_.count(name));
  return name;
}

std::string ProgramBuilder::Input(std::string name, Shape shape, DType dtype,
                                  PartitionSpec sharding, InitSpec init) {
  ArraySpec array;
  array.name = std::move(name);
  array.shape = std::move(shape);
  array.dtype = dtype;
  array.sharding = std::move(sharding);
  array.init = std::move(init);
  return Input(std::move(array));
}

std::string ProgramBuilder::Input(ArraySpec array) {
  if (!defined_.insert(array.name).second) {
    throw SpecError("arrays." + array.name, "array '" + array.name + "' is defined twice");
  }
  mesh_of_[array.name] = array.mesh;
  program_.arrays.push_back(std::move(array));
  return program_.arrays.back().name;
}

std::string ProgramBuilder::Add(OpSpec op) {
  const size_t index = program_.ops.size();
  if (op.key.empty()) op.key = "program." + std::to_string(index);
  op.kind = ResolveOpKind(op);  // max with one input and axes is reduce_max.
  const OpDef& def = Op(op.kind);
  // shard_map has no attributes to read (user_visible is false): ShardMap builds it.
  if (!def.user_visible && op.kind != OpKind::kShardMap) {
    throw SpecError(op.key, std::string(def.name) + " is internal to lowering");
  }
  if (op.kind == OpKind::kShardMap && !op.body) {
    throw SpecError(op.key, "shard_map needs a body: build it with ProgramBuilder::ShardMap");
  }
  const bool manual = program_.mode == ProgramMode::kManual;
  if (def.global_only && manual) {
    throw SpecError(op.key + ".op", std::string(def.name) +
                                        " needs a global program (mode: " + "explicit or auto)");
  }
  if (def.takes_axis_name && !manual) {
    throw SpecError(op.key + ".op",
                    std::string(def.name) + " names mesh axes: only in mode: manual");
  }
  if (!op.where.empty() && !manual) {
    throw SpecError(op.key + ".where", "where: needs mode: manual");
  }
  std::string wrong = CheckArity(op);
  if (!wrong.empty()) throw SpecError(op.key + ".in", wrong);
  if (std::optional<AttrError> attr = CheckAttrs(op)) {
    throw SpecError(op.key + "." + attr->attr, attr->message);
  }
  for (const std::string& name : op.in) {
    if (!defined_.count(name)) throw SpecError(op.key + ".in", "'" + name + "' is not defined");
  }
  // Attributes that name values (grad's of and wrt) name values defined before the op.
  for (const AttrDef& attr : def.attrs) {
    std::vector<std::string> names;
    if (attr.type == AttrType::kValueName) {
      names = {op.*std::get<std::string OpSpec::*>(attr.field)};
    } else if (attr.type == AttrType::kValueNames) {
      names = op.*std::get<std::vector<std::string> OpSpec::*>(attr.field);
    }
    for (const std::string& name : names) {
      if (!defined_.count(name)) {
        throw SpecError(op.key + "." + attr.name, "'" + name + "' is not defined");
      }
    }
  }
  // With several meshes an op runs where its first input lives unless it says (a device_put
  // reverse mode made: where the value it is `like` lives).
  if (!program_.meshes.empty() && op.mesh.empty() && !op.in.empty()) {
    op.mesh = mesh_of_[op.like.empty() ? op.in[0] : op.like];
  }
  // Outputs: as many fresh names as the op makes when none are given.
  if (op.out.empty()) {
    for (int64_t i = 0, n = OutputCount(op); i < n; ++i) op.out.push_back(Fresh());
  }
  wrong = CheckOutputCount(op);
  if (!wrong.empty()) throw SpecError(op.key + ".out", wrong);
  const std::vector<std::string> out_mesh = OutputMeshes(op, mesh_of_);
  for (size_t i = 0; i < op.out.size(); ++i) {
    defined_.insert(op.out[i]);
    mesh_of_[op.out[i]] = out_mesh[i];
  }
  if (op.name.empty())
    op.name = op_names_.count(op.out[0]) ? "op" + std::to_string(index) : op.out[0];
  op_names_.insert(op.name);
  program_.ops.push_back(std::move(op));
  return program_.ops.back().out[0];
}

void ProgramBuilder::Output(const std::string& name, PartitionSpec spec, bool unreduced) {
  std::string key = "outputs." + name;
  if (!defined_.count(name)) throw SpecError(key, "output '" + name + "' is never produced");
  program_.outputs.push_back(OutputSpec{name, std::move(spec), key, unreduced});
}

std::vector<std::string> ProgramBuilder::ShardMap(std::vector<std::string> in, ProgramSpec body,
                                                  std::vector<std::string> out) {
  const std::string key = "program." + std::to_string(program_.ops.size());
  if (program_.mode == ProgramMode::kManual) {
    throw SpecError(key + ".op",
                    "shard_map needs a global program (mode: explicit or auto); in "
                    "a shard_map body write its ops directly");
  }
  if (!program_.meshes.empty()) {
    throw SpecError(key + ".op",
                    "shard_map runs on the program's one mesh; a program of several meshes "
                    "cannot hold one yet");
  }
  if (body.mode != ProgramMode::kManual) {
    throw SpecError(key + ".body", "a shard_map body is a mode: manual program, got mode: " +
                                       std::string(ProgramModeName(body.mode)));
  }
  bool same = body.mesh_axes.size() == program_.mesh_axes.size();
  for (size_t a = 0; same && a < body.mesh_axes.size(); ++a) {
    same = body.mesh_axes[a].name == program_.mesh_axes[a].name &&
           body.mesh_axes[a].size == program_.mesh_axes[a].size;
  }
  if (!same) {
    throw SpecError(key + ".body",
                    "a shard_map body runs on the program's mesh: its axes must be the program's, "
                    "in order");
  }
  const std::string prefix = key + "." + kShardMapBody + ".";
  for (OpSpec& op : body.ops) op.key = prefix + op.key;
  for (OutputSpec& o : body.outputs) o.key = prefix + o.key;
  OpSpec op;
  op.kind = OpKind::kShardMap;
  op.in = std::move(in);
  op.out = std::move(out);
  op.body = std::make_shared<const ProgramSpec>(std::move(body));
  Add(std::move(op));
  return program_.ops.back().out;
}

std::string ProgramBuilder::Matmul(const std::string& a, const std::string& b, std::string out) {
  OpSpec op;
  op.kind = OpKind::kMatmul;
  op.in = {a, b};
  if (!out.empty()) op.out = {std::move(out)};
  return Add(std::move(op));
}

std::string ProgramBuilder::Einsum(const std::string& spec, const std::string& a,
                                   const std::string& b, std::string out) {
  OpSpec op;
  op.kind = OpKind::kEinsum;
  op.spec = spec;
  op.in = {a, b};
  if (!out.empty()) op.out = {std::move(out)};
  return Add(std::move(op));
}

std::string ProgramBuilder::Binary(OpKind kind, const std::string& a, const std::string& b,
                                   std::string out) {
  OpSpec op;
  op.kind = kind;
  op.in = {a, b};
  if (!out.empty()) op.out = {std::move(out)};
  return Add(std::move(op));
}

std::string ProgramBuilder::Unary(OpKind kind, const std::string& x, std::string out) {
  OpSpec op;
  op.kind = kind;
  op.in = {x};
  if (!out.empty()) op.out = {std::move(out)};
  return Add(std::move(op));
}

std::vector<std::string> ProgramBuilder::Grad(const std::string& of, std::vector<std::string> wrt,
                                              std::vector<std::string> out) {
  OpSpec op;
  op.kind = OpKind::kGrad;
  op.of = of;
  op.wrt = std::move(wrt);
  op.out = std::move(out);
  Add(std::move(op));
  return program_.ops.back().out;
}

std::string ProgramBuilder::Collective(OpKind kind, const std::string& x,
                                       std::vector<std::string> axes, std::string out, OpSpec op) {
  op.kind = kind;
  op.in = {x};
  op.axis_name = std::move(axes);
  if (!out.empty()) op.out = {std::move(out)};
  return Add(std::move(op));
}

std::string ProgramBuilder::Reduce(OpKind kind, const std::string& x, std::vector<std::string> axes,
                                   std::string out) {
  return Collective(kind, x, std::move(axes), std::move(out), OpSpec{});
}

std::string ProgramBuilder::AllGather(const std::string& x, std::vector<std::string> axes,
                                      int64_t axis, bool tiled, std::string out) {
  OpSpec op;
  op.axis = axis;
  op.tiled = tiled;
  return Collective(OpKind::kAllGather, x, std::move(axes), std::move(out), std::move(op));
}

std::string ProgramBuilder::PsumScatter(const std::string& x, std::vector<std::string> axes,
                                        int64_t scatter_dimension, bool tiled, std::string out) {
  OpSpec op;
  op.scatter_dimension = scatter_dimension;
  op.tiled = tiled;
  return Collective(OpKind::kPsumScatter, x, std::move(axes), std::move(out), std::move(op));
}

std::string ProgramBuilder::AllToAll(const std::string& x, std::vector<std::string> axes,
                                     int64_t split_axis, int64_t concat_axis, bool tiled,
                                     std::string out) {
  OpSpec op;
  op.split_axis = split_axis;
  op.concat_axis = concat_axis;
  op.tiled = tiled;
  return Collective(OpKind::kAllToAll, x, std::move(axes), std::move(out), std::move(op));
}

std::string ProgramBuilder::Ppermute(const std::string& x, std::vector<std::string> axes, int shift,
                                     std::string out) {
  OpSpec op;
  op.shift = shift;
  return Collective(OpKind::kPpermute, x, std::move(axes), std::move(out), std::move(op));
}

}  // namespace shardsim
