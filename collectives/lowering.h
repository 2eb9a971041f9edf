// Lowering a program for execution: collective matmuls expanded, every array version named
// by a value id, local shapes inferred and checked.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// One op of a lowered program.
struct LoweredOp {
  OpSpec spec;                  // The op (a primitive or an internal op).
  size_t source = 0;            // Index of the run file's op it came from.
  std::vector<int> in_values;   // Value ids it reads.
  std::vector<int> out_values;  // Value ids it writes.
  bool collective = false;      // Runs on the communication engines, not the compute stream.
};

// A program ready to run. Values are single-assignment: an array name written twice (allowed
// in run files) becomes two values, so an op always reads the version program order gives it,
// however far the asynchronous streams run ahead.
struct LoweredProgram {
  std::vector<LoweredOp> ops;  // In program order.
  std::vector<Array> values;   // Per value id: local shape and dtype (no data).
  std::vector<std::pair<std::string, int>> inputs;  // `arrays:` name -> value id.
  std::map<std::string, int> final_values;          // Name -> its last value id.
};

// Lowers `program` on `mesh`, checking names, shapes, dtypes and parameters of every op on
// the local shapes. Throws SpecError naming the op's key ("program.3") or the array's
// ("arrays.x.sharding", "outputs.y").
LoweredProgram LowerProgram(const Mesh& mesh, const ProgramSpec& program);

}  // namespace shardsim
