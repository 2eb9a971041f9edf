#include "collectives/shard_map.h"

#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "collectives/lowering.h"
#include "collectives/numerics_check.h"
#include "collectives/outputs.h"
#include "collectives/partition_spec.h"
#include "sim/spec_error.h"

namespace shardsim {

bool FromShardMapBody(const OpSpec& op) {
  return op.key.find(kShardMapBodyKey) != std::string::npos;
}

Mesh ShardMapMesh(const ProgramSpec& body) {
  int n = 1;
  for (const MeshAxis& a : body.mesh_axes) n *= a.size;
  std::vector<int> devices(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) devices[static_cast<size_t>(p)] = p;
  return Mesh(body.mesh_axes, devices);
}

std::vector<Array> ShardMapResults(const OpSpec& op, const std::vector<const Array*>& inputs) {
  if (!op.body) throw std::invalid_argument("has no body");
  const ProgramSpec* body_ptr = op.body.get();
  if (inputs.size() != body_ptr->arrays.size()) {
    throw std::invalid_argument("takes " + std::to_string(body_ptr->arrays.size()) +
                                " inputs (its body's arrays), got " +
                                std::to_string(inputs.size()));
  }
  // Arrays a run file declared by their in_specs alone take their inputs' types.
  std::optional<ProgramSpec> typed;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!body_ptr->arrays[i].typed_by_input) continue;
    if (!typed) typed = *body_ptr;
    typed->arrays[i].shape = inputs[i]->shape();
    typed->arrays[i].dtype = inputs[i]->dtype();
  }
  const ProgramSpec& body = typed ? *typed : *body_ptr;
  bool data = !inputs.empty();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ArraySpec& param = body.arrays[i];
    const Array& in = *inputs[i];
    if (in.shape() != param.shape || in.dtype() != param.dtype) {
      throw std::invalid_argument("input " + std::to_string(i) + " is " + in.TypeString() +
                                  " but the body's array '" + param.name + "' it stands for is " +
                                  Array::ShapeOnly(param.dtype, param.shape).TypeString());
    }
    data = data && in.has_data();
  }
  const Mesh mesh = ShardMapMesh(body);
  // Each in_spec must lay out its input: refused at the region's in_specs, not at the body's
  // array (a name the run file never wrote under arrays:).
  for (size_t i = 0; i < inputs.size(); ++i) {
    try {
      ValidatePartitionSpec(body.arrays[i].sharding, body.arrays[i].shape, mesh);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key + ".in_specs." + std::to_string(i),
                      "shard_map: in_spec of '" + body.arrays[i].name + "': " + e.what());
    }
  }
  std::vector<Array> results;
  if (!data) {
    const LoweredProgram lowered = LowerProgram(mesh, body);
    CheckOutputs(mesh, body, lowered);
    for (const OutputSpec& o : body.outputs) {
      const Array& local = lowered.values[static_cast<size_t>(lowered.final_values.at(o.name))];
      results.push_back(
          Array::ShapeOnly(local.dtype(), GlobalShapeOf(local.shape(), o.spec, mesh)));
    }
    return results;
  }
  std::map<std::string, Array> given;
  for (size_t i = 0; i < inputs.size(); ++i) given[body.arrays[i].name] = *inputs[i];
  std::map<std::string, Array> outputs = ReferenceOutputs(mesh, body, "", &given);
  for (const OutputSpec& o : body.outputs) results.push_back(std::move(outputs.at(o.name)));
  return results;
}

}  // namespace shardsim
