#include "collectives/lowering.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "collectives/algorithm.h"
#include "collectives/collective_matmul.h"
#include "collectives/ir/op_registry.h"
#include "collectives/local_op.h"
#include "collectives/outputs.h"
#include "collectives/ragged_all_to_all.h"
#include "collectives/semantics.h"
#include "collectives/sharding.h"
#include "sim/spec_error.h"

namespace shardsim {
namespace {

class Lowerer {
 public:
  Lowerer(const Mesh& mesh, LoweredProgram& out,
          const std::map<std::string, std::string>& algorithms)
      : mesh_(mesh), out_(out), algorithms_(algorithms) {}

  int Define(const std::string& name, Array shape, std::vector<std::pair<int, int>> where = {}) {
    int id = static_cast<int>(out_.values.size());
    out_.values.push_back(std::move(shape));
    int part = -1;
    for (const auto& [axis, index] : where) {
      if (axis == part_axis_) part = index;
    }
    out_.value_part.push_back(part);
    out_.in_host.push_back(0);
    value_where_.push_back(std::move(where));
    current_[name] = id;
    return id;
  }

  // Resolves `where` and checks it: known axes and indices, no constraint on a collective's
  // own axes (whole groups run it), and every input of a local op made on all the positions
  // the op runs on. A collective may read a value made on some positions only: the others
  // take part with zeros (a pipeline stage's ppermute to the next, a psum that collects the
  // last stage's result).
  void ResolveWhere(const OpSpec& op, LoweredOp& lowered) {
    for (const auto& [name, index] : op.where) {
      int a = mesh_.AxisIndex(name);
      if (a < 0) throw SpecError(op.key + ".where", "'" + name + "' is not a mesh axis");
      if (index < 0 || index >= mesh_.axes()[a].size) {
        throw SpecError(op.key + ".where",
                        "index " + std::to_string(index) + " is beyond mesh axis '" + name + "'");
      }
      for (const std::string& axis : op.axis_name) {
        if (axis == name && Op(op.kind).stream != OpStream::kFree) {
          throw SpecError(op.key + ".where",
                          std::string(Op(op.kind).name) + " runs over mesh axis '" + name +
                              "': where may not pick one index of it (whole groups run it)");
        }
      }
      lowered.where.push_back({a, index});
    }
    std::sort(lowered.where.begin(), lowered.where.end());
    if (!lowered.where.empty()) out_.has_where = true;
    if (Op(op.kind).stream == OpStream::kCollective) return;
    for (size_t k = 0; k < op.in.size(); ++k) {
      const std::string& name = op.in[k];
      // Append found every input already (lowered.in_values, in op.in's order).
      for (const auto& need : value_where_[lowered.in_values[k]]) {
        if (std::find(lowered.where.begin(), lowered.where.end(), need) == lowered.where.end()) {
          throw SpecError(op.key + ".in", "'" + name + "' is made only where " +
                                              mesh_.axes()[need.first].name + "=" +
                                              std::to_string(need.second) +
                                              ", but this op runs on other positions too");
        }
      }
    }
  }

  // Host memory holds data only: move_to_host takes a value in HBM, move_to_device one in host
  // memory, and every other op reads values in HBM (JAX computes on device memory).
  void CheckMemoryKinds(const OpSpec& op, const LoweredOp& lowered) const {
    for (size_t k = 0; k < lowered.in_values.size(); ++k) {
      const std::string error = CheckMemoryKind(op, op.in[k], out_.in_host[lowered.in_values[k]]);
      if (!error.empty()) throw SpecError(op.key + ".in", error);
    }
  }

  // Checks one primitive op on the current shapes and appends it (`op` stays where it is: the
  // lowered op points at it).
  void Append(const OpSpec& op, size_t source) {
    LoweredOp lowered;
    std::vector<const Array*> inputs;
    for (const std::string& name : op.in) {
      auto it = current_.find(name);
      if (it == current_.end()) throw SpecError(op.key + ".in", "'" + name + "' is not defined");
      lowered.in_values.push_back(it->second);
      inputs.push_back(&out_.values[it->second]);
    }
    const OpDef& def = Op(op.kind);
    lowered.def = &def;
    CheckMemoryKinds(op, lowered);
    const int part = ResolvePart(op, lowered);
    // An op runs on its mesh's positions only: where kMeshPartAxis is its mesh's index.
    if (part >= 0 && op.kind != OpKind::kDevicePut) lowered.where.push_back({part_axis_, part});
    ResolveWhere(op, lowered);
    if (op.kind == OpKind::kDevicePut) {
      if (!op.where.empty()) {
        throw SpecError(op.key + ".where",
                        "device_put runs on every device of its two meshes; where: cannot "
                        "pick some of them");
      }
      LowerDevicePut(op, source, std::move(lowered), *inputs[0]);
      return;
    }
    std::vector<Array> results;
    try {
      if (def.takes_axis_name) {
        lowered.axes = ResolveCollectiveAxes(op, mesh_);
        for (int a : lowered.axes) {
          if (part >= 0 && mesh_.PartOfAxis(a) != part) {
            throw std::invalid_argument("mesh axis '" + mesh_.axes()[a].name +
                                        "' is not an axis of mesh '" + op.mesh + "'");
          }
          lowered.axis_sizes.push_back(mesh_.axes()[a].size);
        }
        lowered.group_size = mesh_.GroupSize(lowered.axes);
      }
      std::string wrong = CheckArity(op);
      if (!wrong.empty()) throw std::invalid_argument(wrong);
      if (def.stream == OpStream::kCollective) {
        int g = lowered.group_size;
        if (op.kind == OpKind::kPpermute) lowered.destination = ResolvePermutation(op, mesh_);
        results.push_back(CollectiveResultType(op, inputs, g));
        lowered.collective = true;
      } else {
        results = ApplyLocalOp(op, inputs, mesh_, 0);
      }
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key, NamedOnce(op, e.what()));
    }
    if (lowered.collective) {
      bool own = !op.algorithm.empty();
      lowered.algorithm = own ? op.algorithm : DefaultAlgorithm(op, algorithms_);
      // Its messages have data-dependent sizes, one per pair of members: only `direct` sends
      // them as they are (the run's all_to_all default does not apply).
      if (op.kind == OpKind::kRaggedAllToAll) {
        if (own && op.algorithm != "direct" && op.algorithm != "auto") {
          throw SpecError(op.key + ".algorithm",
                          "ragged_all_to_all runs only as direct (one message of its own size "
                          "per pair of members), got '" +
                              op.algorithm + "'");
        }
        lowered.algorithm = "direct";
      }
      std::string refused =
          AlgorithmSupports(lowered.algorithm, def.collective, lowered.group_size);
      if (!refused.empty()) {
        throw SpecError(own ? op.key + ".algorithm" : op.key,
                        std::string(def.name) + ": " + refused);
      }
    }
    // Elementwise ops may write over an input of the output's size (XLA's buffer sharing).
    if (def.elementwise) {
      for (size_t k = 0; k < inputs.size() && !results.empty(); ++k) {
        int v = lowered.in_values[k];
        if (inputs[k]->bytes() == results[0].bytes() &&
            std::find(lowered.reusable_inputs.begin(), lowered.reusable_inputs.end(), v) ==
                lowered.reusable_inputs.end()) {
          lowered.reusable_inputs.push_back(v);
        }
      }
    }
    for (size_t k = 0; k < results.size() && k < op.out.size(); ++k) {
      lowered.out_values.push_back(Define(op.out[k], std::move(results[k]), lowered.where));
      out_.in_host.back() = op.kind == OpKind::kMoveToHost;
    }
    lowered.spec = &op;
    lowered.source = source;
    out_.ops.push_back(std::move(lowered));
  }

  void Lower(const ProgramSpec& program) {
    if (program.meshes.size() != mesh_.parts().size()) {
      throw std::logic_error("internal error: a program of " +
                             std::to_string(program.meshes.size()) + " meshes lowered on " +
                             std::to_string(mesh_.parts().size()));
    }
    if (!mesh_.parts().empty()) {
      part_axis_ = static_cast<int>(mesh_.axes().size()) - 1;
      out_.has_where = true;
    }
    // Room for a value per array and op result (most ops make one).
    const size_t values = program.arrays.size() + program.ops.size();
    current_.reserve(values);
    out_.values.reserve(values);
    out_.value_part.reserve(values);
    out_.in_host.reserve(values);
    value_where_.reserve(values);
    for (const ArraySpec& spec : program.arrays) {
      int part = -1;
      if (part_axis_ >= 0) {
        part = mesh_.PartIndex(spec.mesh);
        if (part < 0) {
          throw SpecError(
              "arrays." + spec.name + ".mesh",
              "array " + spec.name +
                  (spec.mesh.empty() ? " names no mesh"
                                     : " names mesh '" + spec.mesh + "', which is not one"));
        }
      }
      const Mesh& home = part >= 0 ? mesh_.parts()[part] : mesh_;
      try {
        ValidatePartitionSpec(spec.sharding, spec.shape, home);
      } catch (const std::invalid_argument& e) {
        throw SpecError("arrays." + spec.name + ".sharding",
                        "array " + spec.name + ": " + e.what());
      }
      Shape local = Sharding::LocalShapeOf(home, spec.sharding, spec.shape);
      std::vector<std::pair<int, int>> where;
      if (part >= 0) where.push_back({part_axis_, part});
      out_.inputs.push_back(
          {spec.name, Define(spec.name, Array::ShapeOnly(spec.dtype, local), std::move(where))});
    }
    out_.program_ops = program.ops.data();
    out_.ops.reserve(program.ops.size());
    for (size_t i = 0; i < program.ops.size(); ++i) {
      const OpSpec& op = program.ops[i];
      if (op.kind != OpKind::kAllgatherMatmul && op.kind != OpKind::kMatmulReduceScatter) {
        Append(op, i);
        continue;
      }
      std::vector<OpSpec> expanded;
      try {
        if (op.in.size() != 2) throw std::invalid_argument("takes two inputs [x, w]");
        for (const std::string& name : op.in) {
          if (!current_.count(name)) {
            throw SpecError(op.key + ".in", "'" + name + "' is not defined");
          }
        }
        int n = mesh_.GroupSize(ResolveCollectiveAxes(op, mesh_));
        expanded = ExpandCollectiveMatmul(op, out_.values[current_[op.in[0]]].shape(),
                                          out_.values[current_[op.in[1]]].shape(), n);
      } catch (const std::invalid_argument& e) {
        throw SpecError(op.key, std::string(OpKindName(op.kind)) + ": " + e.what());
      }
      for (OpSpec& sub : expanded) {
        sub.where = op.where;
        sub.mesh = op.mesh;
        out_.internal_ops.push_back(std::make_unique<const OpSpec>(std::move(sub)));
        Append(*out_.internal_ops.back(), i);
      }
    }
    for (const OutputSpec& o : program.outputs) {
      auto it = current_.find(o.name);
      if (it == current_.end()) {
        throw SpecError(o.key, "output '" + o.name + "' is never produced");
      }
      for (const auto& [axis, index] : value_where_[it->second]) {
        if (axis == part_axis_) continue;  // Its mesh's positions: all it needs.
        throw SpecError(o.key, "output '" + o.name +
                                   "' is made on some positions only (its op has where:); an "
                                   "output needs a block on every position");
      }
    }
    for (const OutputSpec& o : program.outputs) out_.output_values.push_back(current_.at(o.name));
    out_.final_values = std::move(current_);
  }

 private:
  // With several meshes: the index of the op's mesh (checking that its inputs live there and
  // that `where` names its axes); -1 on a single mesh. device_put's is its destination, and
  // its source is its input's mesh.
  int ResolvePart(const OpSpec& op, LoweredOp& lowered) {
    if (part_axis_ < 0) {
      if (op.kind == OpKind::kDevicePut) {
        throw SpecError(op.key,
                        "device_put moves arrays between meshes; the run has one mesh "
                        "(write meshes: to have several)");
      }
      return -1;
    }
    const int part = mesh_.PartIndex(op.mesh);
    if (part < 0) {
      throw SpecError(op.key + ".mesh",
                      std::string(Op(op.kind).name) +
                          (op.mesh.empty() ? " names no mesh (give mesh:, one of the meshes)"
                                           : ": mesh '" + op.mesh + "' is not one of the meshes"));
    }
    for (size_t k = 0; k < op.in.size(); ++k) {
      const auto it = current_.find(op.in[k]);
      if (it == current_.end()) continue;
      const int home = out_.value_part[it->second];
      if (op.kind == OpKind::kDevicePut) {
        lowered.from_part = home;
        lowered.to_part = part;
        if (home == part) {
          throw SpecError(op.key, "device_put: '" + op.in[k] + "' is on mesh '" + op.mesh +
                                      "' already; device_put moves it to another mesh");
        }
      } else if (home != part) {
        throw SpecError(op.key + ".in", std::string(Op(op.kind).name) + ": '" + op.in[k] +
                                            "' lives on mesh '" + mesh_.part_names()[home] +
                                            "' but the op runs on mesh '" + op.mesh +
                                            "'; device_put it there first");
      }
    }
    for (const auto& [name, index] : op.where) {
      const int a = mesh_.AxisIndex(name);
      if (a >= 0 && mesh_.PartOfAxis(a) != part) {
        throw SpecError(op.key + ".where",
                        "'" + name + "' is not an axis of mesh '" + op.mesh + "'");
      }
    }
    return part;
  }

  // device_put: the input laid out by in_sharding on its mesh becomes the global array laid
  // out by sharding on the destination mesh, moved by the messages PlanDevicePut makes.
  void LowerDevicePut(const OpSpec& op, size_t source, LoweredOp lowered, const Array& input) {
    const Mesh& from = mesh_.parts()[lowered.from_part];
    const Mesh& to = mesh_.parts()[lowered.to_part];
    Shape global = GlobalShapeOf(input.shape(), op.in_sharding, from);
    Array result;
    try {
      ValidatePartitionSpec(op.in_sharding, global, from);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key + ".in_sharding", std::string("device_put: ") + e.what());
    }
    try {
      ValidatePartitionSpec(op.sharding, global, to);
      Sharding in(from, op.in_sharding, global);
      Sharding out(to, op.sharding, global);
      lowered.device_put = std::make_shared<const DevicePutPlan>(PlanDevicePut(in, out));
      result = Array::ShapeOnly(input.dtype(), out.LocalShape());
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key + ".sharding", std::string("device_put: ") + e.what());
    }
    if (!op.algorithm.empty() && op.algorithm != "direct" && op.algorithm != "auto") {
      throw SpecError(op.key + ".algorithm",
                      "device_put runs only as direct (one message per pair of devices that "
                      "share a box of the array), got '" +
                          op.algorithm + "'");
    }
    lowered.algorithm = "direct";
    lowered.collective = true;
    lowered.out_values.push_back(
        Define(op.out.at(0), std::move(result), {{part_axis_, lowered.to_part}}));
    lowered.spec = &op;
    lowered.source = source;
    out_.ops.push_back(std::move(lowered));
  }

  const Mesh& mesh_;
  LoweredProgram& out_;
  const std::map<std::string, std::string>& algorithms_;
  int part_axis_ = -1;  // With several meshes: the index of kMeshPartAxis.
  std::unordered_map<std::string_view, int> current_;          // Views of the program's names.
  std::vector<std::vector<std::pair<int, int>>> value_where_;  // Per value: its op's where.
};

}  // namespace

LoweredProgram LowerProgram(const Mesh& mesh, const ProgramSpec& program,
                            const std::map<std::string, std::string>& algorithms) {
  LoweredProgram lowered;
  Lowerer(mesh, lowered, algorithms).Lower(program);
  return lowered;
}

int64_t SequentialPeakElements(const LoweredProgram& lowered) {
  std::vector<size_t> last(lowered.values.size(), 0);
  std::vector<char> held(lowered.values.size(), 0), read(lowered.values.size(), 0);
  for (size_t i = 0; i < lowered.ops.size(); ++i) {
    for (int v : lowered.ops[i].in_values) {
      last[v] = i;
      read[v] = 1;
    }
  }
  int64_t live = 0;
  for (const auto& [name, v] : lowered.inputs) {
    held[v] = 1;
    live += lowered.values[v].size();
  }
  for (int v : lowered.output_values) held[v] = 1;
  int64_t peak = live;
  for (size_t i = 0; i < lowered.ops.size(); ++i) {
    const LoweredOp& op = lowered.ops[i];
    for (int v : op.out_values) live += lowered.values[v].size();
    peak = std::max(peak, live);
    for (int v : op.in_values) {
      if (last[v] == i && !held[v]) {
        live -= lowered.values[v].size();
        held[v] = 1;  // Freed once, even if read twice by this op.
      }
    }
    for (int v : op.out_values) {
      if (!read[v] && !held[v]) live -= lowered.values[v].size();
    }
  }
  return peak;
}

bool RunsAt(const LoweredOp& op, const std::vector<int>& coords) {
  if (op.to_part >= 0 && coords.back() != op.to_part && coords.back() != op.from_part) {
    return false;
  }
  for (const auto& [axis, index] : op.where) {
    if (coords[axis] != index) return false;
  }
  return true;
}

bool RunsAt(const OpSpec& op, const Mesh& mesh, int position) {
  if (!mesh.parts().empty() && mesh.PartIndex(op.mesh) != mesh.PartOf(position)) return false;
  if (op.where.empty()) return true;
  std::vector<int> coords = mesh.Coords(position);
  for (const auto& [name, index] : op.where) {
    int a = mesh.AxisIndex(name);
    if (a >= 0 && coords[a] != index) return false;
  }
  return true;
}

void CheckOutputs(const Mesh& mesh, const ProgramSpec& program, const LoweredProgram& lowered) {
  for (const OutputSpec& o : program.outputs) {
    const Array& local = lowered.values[lowered.final_values.at(o.name)];
    Shape global = GlobalShapeOf(local.shape(), o.spec, mesh);
    try {
      ValidatePartitionSpec(o.spec, global, mesh);
    } catch (const std::invalid_argument& e) {
      throw SpecError(o.key, "output " + o.name + ": " + e.what());
    }
  }
}

void CheckProgram(const Mesh& mesh, const ProgramSpec& program) {
  CheckOutputs(mesh, program, LowerProgram(mesh, program));
}

std::string DefaultAlgorithm(const OpSpec& op,
                             const std::map<std::string, std::string>& algorithms) {
  auto by_op = algorithms.find(OpKindName(op.kind));
  if (by_op != algorithms.end()) return by_op->second;
  auto by_kind = algorithms.find(CollectiveKindName(Op(op.kind).collective));
  if (by_kind != algorithms.end()) return by_kind->second;
  return "auto";
}

}  // namespace shardsim
