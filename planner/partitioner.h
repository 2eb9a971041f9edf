// The SPMD partitioner: a global program (mode: explicit | auto) becomes the per-device
// shard_map body (mode: manual) the executor runs, with the collectives its shardings need.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/compute_model.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "planner/partition_analysis.h"
#include "planner/partition_choices.h"

namespace shardsim::planner {

// What auto mode prices candidate layouts with (and whether the result describes its ops).
// Without a collective model it counts the bytes each device sends at 1 byte per picosecond
// (a stand-in for tests of the rules alone).
struct PartitionCosts {
  const Mesh* mesh = nullptr;                  // The placed mesh (with the model).
  CollectiveCostModel* collectives = nullptr;  // Prices inserted collectives.
  const ComputeModel* compute = nullptr;       // Prices local ops (null: free).
  // The most bytes per second any device's links can bring into it (0: unknown). With it, a
  // candidate whose lower bound (compute plus, per reshard step, the bytes a device must
  // receive at that rate) is no better than the best candidate priced so far is not priced by
  // the collective model: the choice is the same, without simulating collectives that could
  // not win (FSDP's embedding on thousands of devices offers gathers of gigabytes).
  double device_in_bytes_per_second = 0;
  // The machine (null: unknown): collective matmuls' auto mode times both ways on it.
  const Machine* machine = nullptr;
  // Whether the result says why each op was inserted and what type it makes (reasons and
  // types, for tables); false leaves both empty strings (a plan search reads neither).
  bool describe = true;
};

// The most bytes per second the links into any one device carry together (for
// PartitionCosts::device_in_bytes_per_second).
double DeviceInBytesPerSecond(const Machine& machine);

// The partitioned program.
struct PartitionResult {
  ProgramSpec program;               // mode: manual, same arrays, outputs and op names.
  std::vector<std::string> reasons;  // Per op of `program`: why it was inserted ("" if not).
  // Per op of `program`: its first result's global type ("f32[1024@dp,4096]").
  std::vector<std::string> types;
  // Per op of `program`, when not empty: its index when the list was made (KeepOrigin), moved
  // with it by Reorder, so that RestoreOrder can put the ops back.
  std::vector<size_t> origin;
};

// Puts `result`'s ops in `order` (its new op k is the old op order[k]), their reasons, types
// and origins with them (reasons and types made as long as the ops): what the scheduling
// passes (prefetch, deferred readers) apply. Throws std::logic_error ("internal error: ...")
// unless `order` is a permutation of the ops.
void Reorder(PartitionResult& result, const std::vector<size_t>& order);

// Numbers `result`'s ops in their present order (PartitionResult::origin).
void KeepOrigin(PartitionResult& result);

// Puts `result`'s ops back in the order KeepOrigin numbered (Reorder by the inverse of the
// order their origins now list) and drops the numbers.
void RestoreOrder(PartitionResult& result);

// Partitions `global`. Explicit mode follows each op's rule and refuses (SpecError at the op's
// key, naming the operands' types and the fix) what JAX refuses; auto mode propagates the
// output shardings and sharding constraints backwards as hints and picks, op by op, the
// candidate layout whose reshards, local compute and later reshard to the hint cost least.
// Throws SpecError for programs it cannot partition.
PartitionResult Partition(const ProgramSpec& global, const PartitionCosts& costs = {});

// Partitions a global program whose grad ops ExpandGrads expanded already (and that a pass
// like ApplyRemat may have rewritten since), each backward pass's [start, end) op indices in
// `pass_starts` as ExpandGrads reports them: reshards are reused only within a pass.
// `sizes`, when given, are the mesh's axes (the same names, in the same order) at the sizes
// to partition for, where `expanded` was built for other sizes (a search's plans share one
// expanded step); null: expanded.mesh_axes. `choices`, when given (auto mode), are reused and
// added to. `analysis`, when given, is read if it serves `expanded` and else made anew.
PartitionResult PartitionExpanded(const ProgramSpec& expanded, std::vector<size_t> pass_starts,
                                  const PartitionCosts& costs = {},
                                  const std::vector<MeshAxis>* sizes = nullptr,
                                  PartitionChoices* choices = nullptr,
                                  PartitionAnalysis* analysis = nullptr);

// Partitions `global` for `mesh` on `machine`, pricing collectives by the network simulation
// (cached across the candidates) and local ops by the machine's compute model.
PartitionResult PartitionOnMachine(const ProgramSpec& global, const Machine& machine,
                                   const Mesh& mesh);

}  // namespace shardsim::planner
