// Applying one local (per-device) op of a program to arrays.
#pragma once

#include <vector>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// Runs local op `op` (not a collective) on `inputs` at mesh `position` and returns its outputs
// (one per name in op.out). Shape-only inputs give shape-only outputs. axis_index reads the
// position. Throws std::invalid_argument for bad shapes or parameters.
std::vector<Array> ApplyLocalOp(const OpSpec& op, const std::vector<const Array*>& inputs,
                                const Mesh& mesh, int position);

}  // namespace shardsim
