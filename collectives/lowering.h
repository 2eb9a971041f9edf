// Lowering a program for execution: collective matmuls expanded, every array version named
// by a value id, local shapes inferred and checked.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "collectives/array.h"
#include "collectives/device_put.h"
#include "collectives/ir/op_registry.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// One op of a lowered program: everything a run needs about it, resolved once.
struct LoweredOp {
  // The op: the program's own, or an internal op the lowered program holds (a step of a
  // collective matmul). The program must outlive its lowering, its ops unchanged.
  const OpSpec* spec = nullptr;
  const OpDef* def = nullptr;   // Its registry entry.
  size_t source = 0;            // Index of the run file's op it came from.
  std::vector<int> in_values;   // Value ids it reads.
  std::vector<int> out_values;  // Value ids it writes.
  bool collective = false;      // Runs on the communication engines, not the compute stream.
  // Collectives, axis_index and the internal dynamic ops: the mesh axes of axis_name (indices,
  // in the op's order), their sizes, and the group size (their product).
  std::vector<int> axes;
  std::vector<int> axis_sizes;
  int group_size = 1;
  // Collectives: the algorithm to run ("auto" chooses at launch), after the op's own
  // `algorithm` and the run's defaults; already checked against the op's kind and group.
  std::string algorithm;
  std::vector<int> destination;  // ppermute: per group index, the receiving index or -1.
  // Where it runs: (mesh axis index, coordinate) pairs a position must match; empty: all.
  std::vector<std::pair<int, int>> where;
  // Elementwise ops: the inputs (value ids, distinct) of the output's size whose buffer the
  // output may take over in place (XLA's buffer sharing) when this op is their last reader.
  std::vector<int> reusable_inputs;
  // device_put: the meshes (parts of the union Mesh) it moves from and to; its one group is
  // the source's positions then the destination's; its messages, planned once.
  int from_part = -1;
  int to_part = -1;
  std::shared_ptr<const DevicePutPlan> device_put;
};

// A program ready to run. Values are single-assignment: an array name written twice (allowed
// in run files) becomes two values, so an op always reads the version program order gives it,
// however far the asynchronous streams run ahead.
struct LoweredProgram {
  std::vector<LoweredOp> ops;  // In program order.
  std::vector<Array> values;   // Per value id: local shape and dtype (no data).
  std::vector<std::pair<std::string, int>> inputs;  // `arrays:` name -> value id.
  // Name -> its last value id (views of the program's names: the program outlives this).
  std::unordered_map<std::string_view, int> final_values;
  std::vector<int> output_values;  // Value ids of `outputs:`, in order.
  bool has_where = false;          // Some op runs on a subset of the positions.
  // Per value id: the mesh (part of the union Mesh) it lives on; -1 on a single mesh.
  std::vector<int> value_part;
  // Per value id: whether it lives in host memory (made by move_to_host), taking no HBM.
  std::vector<char> in_host;
  // The ops collective matmuls expand into, which ops' spec point at (held apart so that
  // their addresses stay put as the program grows and moves).
  std::vector<std::unique_ptr<const OpSpec>> internal_ops;
  // The ops of the program it was lowered from, which ops' spec point into: a run checks that
  // it runs the program it was lowered from.
  const OpSpec* program_ops = nullptr;
};

// Whether op `op` runs at mesh position `coords` (the position's coordinates).
bool RunsAt(const LoweredOp& op, const std::vector<int>& coords);
// Whether `op` (its `where` by axis names) runs at mesh position `position`.
bool RunsAt(const OpSpec& op, const Mesh& mesh, int position);

// Lowers `program` on `mesh` (with several meshes, their Mesh::Union in program.meshes' order:
// each op runs on its `mesh:`, where kMeshPartAxis is its index), checking names, shapes, dtypes
// and parameters of every op on the local shapes. Throws SpecError naming the op's key
// ("program.3") or the array's
// ("arrays.x.sharding", "outputs.y").
// `algorithms` are the run's default algorithm per collective (keys: JAX op names or generic
// kinds, as ExecutorConfig::algorithms); an explicit algorithm that cannot run an op (tree for
// all_gather, halving_doubling on 6 devices) is refused here, before anything runs.
LoweredProgram LowerProgram(const Mesh& mesh, const ProgramSpec& program,
                            const std::map<std::string, std::string>& algorithms = {});

// The most elements one position holds at once when the program runs in program order, each
// buffer freed after its last reader (inputs and outputs held throughout): the basis of the
// host-memory estimate of a run with data.
int64_t SequentialPeakElements(const LoweredProgram& lowered);

// Checks the program's out specs against the global shapes of its lowered outputs. Throws
// SpecError ("outputs.y").
void CheckOutputs(const Mesh& mesh, const ProgramSpec& program, const LoweredProgram& lowered);

// Checks a program before it runs: names, shapes, dtypes and parameters of every op, on the
// local shapes of the mesh, and its out specs. Throws SpecError naming the op's key
// ("program.3") or the array's ("arrays.x.sharding", "outputs.y").
void CheckProgram(const Mesh& mesh, const ProgramSpec& program);

// The algorithm an op runs when it names none: the run's default for its JAX name, else for
// its collective kind, else "auto".
std::string DefaultAlgorithm(const OpSpec& op,
                             const std::map<std::string, std::string>& algorithms);

}  // namespace shardsim
