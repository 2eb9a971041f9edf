// Forming a program's global outputs from the local blocks every mesh position holds.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/partition_spec.h"
#include "collectives/program.h"

namespace shardsim {

// The global shape of an output whose local block has shape `local` under out spec `spec`.
Shape GlobalShapeOf(const Shape& local, const PartitionSpec& spec, const Mesh& mesh);

// Assembles each of `program.outputs` from env[position][name] by its out spec (pass the env
// with std::move when it is no longer needed: the blocks then move instead of being copied).
// Throws SpecError ("outputs.NAME") when replicas differ along a mesh axis the spec does not
// name. On a union of meshes, output i is assembled from the positions of mesh
// output_parts[i] alone (env needs no entry elsewhere).
std::map<std::string, Array> AssembleOutputs(const Mesh& mesh, const ProgramSpec& program,
                                             std::vector<std::map<std::string, Array>> env,
                                             const std::vector<int>& output_parts = {});

}  // namespace shardsim
