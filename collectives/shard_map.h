// jax.shard_map inside a global program (OpKind::kShardMap): a shard_map body run on every
// device of the mesh with the blocks of the op's inputs, its outputs assembled by their out
// specs. The op's shape rule and its reference kernel on whole arrays.
#pragma once

#include <vector>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// The run-file key of a region's body, and so the part of its ops' keys that says where they
// come from: "<region key>.body.<key>" (ProgramBuilder::ShardMap makes them so, and a run
// file's entries under the key are so named), which the partitioned program keeps.
inline constexpr char kShardMapBody[] = "body";
// Whether `op` of a partitioned program is one of a shard_map body's, inlined.
bool FromShardMapBody(const OpSpec& op);

// The mesh a shard_map body runs on: its axes over positions 0..n-1 (a body's results do not
// depend on where its devices sit).
Mesh ShardMapMesh(const ProgramSpec& body);

// The results of shard_map `op` on global `inputs`: input i stands for op.body's array i (same
// shape and dtype, else std::invalid_argument; an array typed_by_input takes the input's), laid
// out by that array's sharding (its in_spec); each body output, assembled by its out spec, is a
// result. Shape-only inputs give shape-only results (the body lowered on its mesh: a SpecError at
// the body op's key if it does not check); inputs with data give the body's outputs evaluated as
// every run's reference evaluates a shard_map body (ReferenceOutputs), so a global program's
// reference runs its regions on the mesh they name.
std::vector<Array> ShardMapResults(const OpSpec& op, const std::vector<const Array*>& inputs);

}  // namespace shardsim
