#include "collectives/outputs.h"

#include <stdexcept>
#include <utility>

#include "collectives/sharding.h"
#include "sim/spec_error.h"

namespace shardsim {

Shape GlobalShapeOf(const Shape& local, const PartitionSpec& spec, const Mesh& mesh) {
  Shape global = local;
  for (size_t d = 0; d < spec.dims.size() && d < global.size(); ++d) {
    for (const std::string& axis : spec.dims[d]) {
      int a = mesh.AxisIndex(axis);
      if (a >= 0) global[d] *= mesh.axes()[a].size;
    }
  }
  return global;
}

std::map<std::string, Array> AssembleOutputs(const Mesh& mesh, const ProgramSpec& program,
                                             std::vector<std::map<std::string, Array>> env,
                                             const std::vector<int>& output_parts) {
  std::map<std::string, Array> out;
  for (size_t i = 0; i < program.outputs.size(); ++i) {
    const OutputSpec& o = program.outputs[i];
    // The blocks move into the assembly unless a later output names the same array.
    bool again = false;
    for (size_t j = i + 1; j < program.outputs.size(); ++j) {
      again = again || program.outputs[j].name == o.name;
    }
    const bool union_mesh = !mesh.parts().empty();
    if (union_mesh && output_parts.size() != program.outputs.size()) {
      throw std::logic_error("internal error: outputs on several meshes need their meshes");
    }
    const Mesh& home = union_mesh ? mesh.parts()[output_parts[i]] : mesh;
    const int first = union_mesh ? mesh.PartOffset(output_parts[i]) : 0;
    std::vector<Array> locals;
    for (int p = first; p < first + home.size(); ++p) {
      Array& block = env[p].at(o.name);
      locals.push_back(again ? block : std::move(block));
    }
    Shape global = GlobalShapeOf(locals[0].shape(), o.spec, home);
    Sharding sharding(home, o.spec, global);
    std::string axis;
    Array assembled = sharding.Assemble(locals, &axis);
    if (!axis.empty()) {
      throw SpecError(o.key, "output " + o.name + " differs along mesh axis '" + axis +
                                 "', which its out spec " + FormatPartitionSpec(o.spec) +
                                 " does not name: replicas must hold the same values");
    }
    out[o.name] = std::move(assembled);
  }
  return out;
}

}  // namespace shardsim
