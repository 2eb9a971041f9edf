// The numerics check: the program evaluated from the ops' definitions (the reference) and the
// comparison of a simulated run's outputs with it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// Evaluates the program directly from the ops' definitions (collectives computed from all
// positions' blocks at once, no network), returning the global outputs. The reference that
// every run's numerics are checked against.
// `inputs`, when given, are the global input arrays already made (Executor::inputs()), so
// they are not made twice.
std::map<std::string, Array> ReferenceOutputs(const Mesh& mesh, const ProgramSpec& program,
                                              const std::string& base_dir,
                                              const std::map<std::string, Array>* inputs = nullptr);

// The numerics check of a run: simulated outputs against the reference.
struct NumericsReport {
  bool checked = false;      // Whether real data was compared.
  double max_abs_error = 0;  // Over all outputs and elements.
  double tolerance = 0;      // The largest error allowed for the worst output.
  bool passed = true;        // Every output within its tolerance.
  std::string worst_output;  // The output with the largest error relative to its tolerance.
};

// Compares outputs. Tolerance per output, with scale = max(1, max|ref|):
//   (2 eps(dtype) + (mesh size + 1 + 4 sqrt(reduction_length)) 2^-24) * scale.
// The simulated collectives add in float32 in their algorithm's order and round to the dtype
// once, the reference adds in double in member order and rounds once (two ulps of the dtype,
// plus one float32 rounding per device); collective matmuls split each dot product of length
// K into partial sums added in another order than one sgemm, whose float32 error grows like
// sqrt(K) for random data (`reduction_length` is the longest contraction, K). i32 outputs must
// match exactly (tolerance 0.5).
NumericsReport CompareOutputs(const std::map<std::string, Array>& simulated,
                              const std::map<std::string, Array>& reference, int mesh_size,
                              int64_t reduction_length = 1);

// A bound on the longest contraction of the program's matmuls and einsums, for
// CompareOutputs: the largest dimension of its input arrays' global shapes.
int64_t LongestReduction(const ProgramSpec& program);

}  // namespace shardsim
