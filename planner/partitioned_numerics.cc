#include "planner/partitioned_numerics.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collectives/moe_route.h"
#include "collectives/shard_map.h"
#include "planner/grad.h"
#include "planner/models/dropless_moe.h"

namespace shardsim::planner {

std::map<std::string, Array> GlobalReference(const ProgramSpec& global, const std::string& base_dir,
                                             const std::map<std::string, Array>* inputs,
                                             ContractionLengths* lengths) {
  // The same program as a shard_map body on a one-device mesh: whole arrays everywhere.
  ProgramSpec whole = ExpandGrads(global);
  whole.mode = ProgramMode::kManual;
  whole.mesh_axes = {MeshAxis{"whole", 1}};
  whole.mesh_devices.clear();
  whole.meshes.clear();  // One device: a device_put between meshes passes the value on.
  for (ArraySpec& a : whole.arrays) a.sharding = PartitionSpec{};
  for (OutputSpec& o : whole.outputs) o.spec = PartitionSpec{};
  return ReferenceOutputs(Mesh(whole.mesh_axes, {0}), whole, base_dir, inputs, nullptr, nullptr,
                          lengths);
}

NumericsReport CheckPartitionedNumerics(const std::map<std::string, Array>& simulated,
                                        const Mesh& mesh, const ProgramSpec& global,
                                        const ProgramSpec& lowered, const std::string& base_dir,
                                        const std::map<std::string, Array>* inputs) {
  for (const OutputSpec& o : global.outputs) {
    if (o.unreduced) {
      throw std::logic_error("internal error: output " + o.name +
                             " is unreduced: timing only, it has no global value to check");
    }
  }
  // The reference runs the global program's contractions on whole arrays: other shapes, so
  // other summation orders, and a split contraction in one pass rather than as local partial
  // sums and a psum. The lowered program's bounds count both (ErrorBoundModel).
  ContractionLengths lengths;
  std::map<std::string, Array> reference = GlobalReference(global, base_dir, inputs, &lengths);
  // A shard_map body's contractions run on the same blocks in the reference (which runs the
  // body on its mesh): not reordered.
  for (const OpSpec& op : lowered.ops) {
    if ((op.kind == OpKind::kMatmul || op.kind == OpKind::kEinsum) && FromShardMapBody(op)) {
      lengths[op.out.at(0)] = -1;
    }
  }
  std::map<std::string, double> bounds;
  ReferenceOutputs(mesh, lowered, base_dir, inputs, &bounds, &lengths);
  std::map<std::string, double> coarse =
      CoarseBounds(reference, mesh.size(), LongestReduction(global));
  for (const auto& [name, bound] : coarse) bounds[name] += bound;
  return CompareOutputs(simulated, reference, bounds);
}

std::optional<double> MoeDroppedFraction(const ProgramSpec& global, const std::string& base_dir,
                                         const std::map<std::string, Array>* inputs) {
  ProgramSpec routed = global;
  std::vector<std::pair<std::string, std::string>> routes;  // (mask, the choices it routed).
  std::vector<std::pair<std::string, std::string>> counts;  // (drops counted, the choices).
  for (const OpSpec& op : global.ops) {
    if (op.kind == OpKind::kMoeRoute) {
      routes.emplace_back(op.out.at(0), op.in.at(0));
    } else if (op.kind == OpKind::kShardMap && op.out.size() >= 2 &&
               op.out[1].rfind(kDroppedCopiesName, 0) == 0) {
      // A bounded dropless region: its second output, and its choices (DroplessMoeBody; grad
      // may add outputs after them, its saved residuals, and inputs after its own).
      counts.emplace_back(op.out[1], op.in.at(1));
    } else {
      continue;
    }
    const auto& [count, choices] = op.kind == OpKind::kMoeRoute ? routes.back() : counts.back();
    for (const std::string& name : {count, choices}) {
      routed.outputs.push_back(OutputSpec{name, PartitionSpec{}, ""});
    }
  }
  if (routes.empty() && counts.empty()) return std::nullopt;
  const std::map<std::string, Array> values = GlobalReference(routed, base_dir, inputs);
  double dropped = 0, assignments = 0;
  for (const auto& [mask, choices] : routes) {
    const Shape& shape = values.at(choices).shape();
    const double n = static_cast<double>(NumElements(shape));
    dropped += DroppedFraction(values.at(mask), shape) * n;
    assignments += n;
  }
  for (const auto& [count, choices] : counts) {
    const Array& per_device = values.at(count);
    for (int64_t i = 0; i < per_device.size(); ++i) dropped += per_device.ValueAt(i);
    assignments += static_cast<double>(NumElements(values.at(choices).shape()));
  }
  return dropped / assignments;
}

}  // namespace shardsim::planner
