#include "collectives/lowering.h"

#include <stdexcept>

#include "collectives/collective_matmul.h"
#include "collectives/local_op.h"
#include "collectives/semantics.h"
#include "collectives/sharding.h"
#include "sim/spec_error.h"

namespace shardsim {
namespace {

class Lowerer {
 public:
  Lowerer(const Mesh& mesh, LoweredProgram& out) : mesh_(mesh), out_(out) {}

  int Define(const std::string& name, Array shape) {
    int id = static_cast<int>(out_.values.size());
    out_.values.push_back(std::move(shape));
    current_[name] = id;
    return id;
  }

  // Checks one primitive op on the current shapes and appends it.
  void Append(OpSpec op, size_t source) {
    LoweredOp lowered;
    std::vector<const Array*> inputs;
    for (const std::string& name : op.in) {
      auto it = current_.find(name);
      if (it == current_.end()) throw SpecError(op.key + ".in", "'" + name + "' is not defined");
      lowered.in_values.push_back(it->second);
      inputs.push_back(&out_.values[it->second]);
    }
    std::vector<Array> results;
    try {
      if (IsCollective(op.kind)) {
        std::vector<int> axes = ResolveCollectiveAxes(op, mesh_);
        int g = mesh_.GroupSize(axes);
        if (inputs.size() != 1) throw std::invalid_argument("takes one input");
        if (op.kind == OpKind::kPpermute) ResolvePermutation(op, mesh_);
        if (!op.algorithm.empty() && op.algorithm != "auto" && op.algorithm != "direct" &&
            (op.kind == OpKind::kAllToAll || op.kind == OpKind::kPpermute)) {
          throw std::invalid_argument(op.algorithm + " does not implement " + OpKindName(op.kind) +
                                      "; use direct");
        }
        results.push_back(
            Array::ShapeOnly(CollectiveOutputDType(op, inputs[0]->dtype()),
                             CollectiveOutputShape(op, inputs[0]->shape(), g, inputs[0]->dtype())));
        lowered.collective = true;
      } else {
        results = ApplyLocalOp(op, inputs, mesh_, 0);
      }
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key, std::string(OpKindName(op.kind)) + ": " + e.what());
    }
    for (size_t k = 0; k < results.size() && k < op.out.size(); ++k) {
      lowered.out_values.push_back(Define(op.out[k], std::move(results[k])));
    }
    lowered.spec = std::move(op);
    lowered.source = source;
    out_.ops.push_back(std::move(lowered));
  }

  void Lower(const ProgramSpec& program) {
    for (const ArraySpec& spec : program.arrays) {
      try {
        ValidatePartitionSpec(spec.sharding, spec.shape, mesh_);
      } catch (const std::invalid_argument& e) {
        throw SpecError("arrays." + spec.name + ".sharding",
                        "array " + spec.name + ": " + e.what());
      }
      Shape local = Sharding(mesh_, spec.sharding, spec.shape).LocalShape();
      out_.inputs.push_back({spec.name, Define(spec.name, Array::ShapeOnly(spec.dtype, local))});
    }
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
      for (OpSpec& sub : expanded) Append(std::move(sub), i);
    }
    for (const OutputSpec& o : program.outputs) {
      auto it = current_.find(o.name);
      if (it == current_.end()) {
        throw SpecError(o.key, "output '" + o.name + "' is never produced");
      }
    }
    out_.final_values = current_;
  }

 private:
  const Mesh& mesh_;
  LoweredProgram& out_;
  std::map<std::string, int> current_;
};

}  // namespace

LoweredProgram LowerProgram(const Mesh& mesh, const ProgramSpec& program) {
  LoweredProgram lowered;
  Lowerer(mesh, lowered).Lower(program);
  return lowered;
}

}  // namespace shardsim
