#include "collectives/shard_map.h"

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "collectives/ir/op_registry.h"
#include "collectives/lowering.h"
#include "collectives/numerics_check.h"
#include "collectives/outputs.h"
#include "collectives/partition_spec.h"
#include "sim/spec_error.h"

namespace shardsim {

bool FromShardMapBody(const OpSpec& op) {
  return op.key.find("." + std::string(kShardMapBody) + ".") != std::string::npos;
}

Mesh ShardMapMesh(const ProgramSpec& body) {
  int n = 1;
  for (const MeshAxis& a : body.mesh_axes) n *= a.size;
  std::vector<int> devices(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) devices[static_cast<size_t>(p)] = p;
  return Mesh(body.mesh_axes, devices);
}

namespace {

// The mesh axes (indices) each name of `body` may differ along, op by op (JAX's replication
// check, shard_map's check_rep): an input along the axes its in_spec splits it over; an
// all-reduce or all-gather's result along its input's but its own axes (every member ends with
// the same value); a reduce-scatter's, all-to-all's or permute's along its input's and its own
// (each member ends with its own block); axis_index along its axes; a value made under `where:`
// along the axes it names; full_like's along none (it reads only a shape); any other op's along
// its inputs' (a collective matmul's gathered operand without its axes). Each output must vary
// only along axes its out_spec names: a SpecError at the output's key otherwise.
void CheckReplication(const ProgramSpec& body, const Mesh& mesh) {
  using Axes = std::set<int>;
  std::map<std::string, Axes> varies;
  auto axes_of = [&](const std::vector<std::string>& names) {
    Axes axes;
    for (const std::string& name : names) {
      // An unknown axis is lowering's to refuse, with its key.
      if (const int a = mesh.AxisIndex(name); a >= 0) axes.insert(a);
    }
    return axes;
  };
  for (const ArraySpec& a : body.arrays) {
    Axes axes;
    for (const std::vector<std::string>& dim : a.sharding.dims) {
      const Axes more = axes_of(dim);
      axes.insert(more.begin(), more.end());
    }
    varies[a.name] = axes;
  }
  for (const OpSpec& op : body.ops) {
    const OpDef& def = Op(op.kind);
    const Axes own = axes_of(op.axis_name);
    // What its collective (or a collective matmul's) does to the axes it runs over, from the
    // registry: an all-reduce or all-gather leaves every member the same value along them (a
    // collective matmul's all-gather, its gathered operand); any other kind, and the other ops
    // naming axes (axis_index, a table's block), give each member its own.
    const bool communicates =
        def.stream == OpStream::kCollective || def.stream == OpStream::kComposite;
    const bool evens = communicates && (def.collective == CollectiveKind::kAllReduce ||
                                        def.collective == CollectiveKind::kAllGather);
    Axes result;
    for (size_t k = 0; k < op.in.size(); ++k) {
      Axes in = varies.count(op.in[k]) ? varies.at(op.in[k]) : Axes{};
      const bool gathered = def.stream == OpStream::kComposite && evens &&
                            static_cast<int>(k) == (op.gather == "lhs" ? 0 : 1);
      if (gathered) {
        for (int a : own) in.erase(a);
      }
      result.insert(in.begin(), in.end());
    }
    if (op.kind == OpKind::kFullLike) result.clear();
    if (evens && def.stream == OpStream::kCollective) {
      for (int a : own) result.erase(a);
    } else if (!evens && def.takes_axis_name) {
      result.insert(own.begin(), own.end());
    }
    for (const auto& [axis, index] : op.where) {
      if (const int a = mesh.AxisIndex(axis); a >= 0) result.insert(a);
    }
    for (const std::string& out : op.out) varies[out] = result;
  }
  for (const OutputSpec& o : body.outputs) {
    Axes named;
    for (const std::vector<std::string>& dim : o.spec.dims) {
      const Axes more = axes_of(dim);
      named.insert(more.begin(), more.end());
    }
    for (int a : varies[o.name]) {
      if (named.count(a)) continue;
      const std::string axis = mesh.axes()[static_cast<size_t>(a)].name;
      throw SpecError(o.key, "shard_map: '" + o.name + "' may differ along mesh axis '" + axis +
                                 "', but its out_spec " + FormatPartitionSpec(o.spec) +
                                 " says it is the same on every device along it (JAX's "
                                 "replication check): psum or all_gather it over " +
                                 axis + " in the body, or name " + axis + " in the out_spec");
    }
  }
}

}  // namespace

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
  CheckReplication(body, mesh);
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
  // Copied, not moved: a body may return one value (an input, too) under several outputs.
  for (const OutputSpec& o : body.outputs) results.push_back(outputs.at(o.name));
  return results;
}

}  // namespace shardsim
