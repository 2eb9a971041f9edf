// The numerics check of a partitioned program: the sharded run against the unsharded global
// program evaluated on whole arrays.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/numerics_check.h"
#include "collectives/program.h"

namespace shardsim::planner {

// Evaluates `global` on whole arrays (one device, layout ops as identities): the reference a
// partitioned run must reproduce. `inputs`: the global inputs already made, if any. `lengths`,
// when given, receives the products per output element of each matmul and einsum.
std::map<std::string, Array> GlobalReference(const ProgramSpec& global, const std::string& base_dir,
                                             const std::map<std::string, Array>* inputs = nullptr,
                                             ContractionLengths* lengths = nullptr);

// Compares `simulated` (the run of `lowered` on `mesh`) with GlobalReference(global). Each
// output's tolerance is the bound the lowered program's own op chain gives (the sharded
// reductions' reordering, and each contraction's against the global one's summation order on
// whole arrays: ErrorBoundModel) plus the coarse bound of a reordered contraction
// of the global program's longest dimension (CoarseBounds): partitioning splits each
// contraction into local partial sums and a cross-device sum, which rounds differently from
// one contraction on whole arrays.
NumericsReport CheckPartitionedNumerics(const std::map<std::string, Array>& simulated,
                                        const Mesh& mesh, const ProgramSpec& global,
                                        const ProgramSpec& lowered, const std::string& base_dir,
                                        const std::map<std::string, Array>* inputs = nullptr);

// The share of expert assignments the moe_route ops of `global` drop on real data (GShard's
// dropped tokens: over every routed op, 1 - masks' ones / (groups x tokens x k)), and its
// bounded dropless regions (their copies dropped, counted by the regions: DroplessMoeBody),
// from the unsharded program evaluated as GlobalReference does; nullopt when it has neither.
std::optional<double> MoeDroppedFraction(const ProgramSpec& global, const std::string& base_dir,
                                         const std::map<std::string, Array>* inputs = nullptr);

}  // namespace shardsim::planner
