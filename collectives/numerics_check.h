// The numerics check: the program evaluated from the ops' definitions (the reference), an
// error bound for every value derived from its own op chain, and the comparison of a
// simulated run's outputs with the reference under those bounds.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// Products per output element of a program's matmuls and einsums, by output name (a name
// bound twice holds its last binding's). As `reordered` below, a negative length marks a
// contraction the reference runs on the same blocks in the same order (a shard_map body's).
using ContractionLengths = std::map<std::string, double>;

// Evaluates the program directly from the ops' definitions (collectives computed from all
// positions' blocks at once, no network), returning the global outputs. The reference that
// every run's numerics are checked against. Positions with bit-identical inputs to an op
// share its result (computed once); outputs are assembled from their first replicas without
// comparing replicas (Executor::Outputs does that for the simulated run).
// `inputs`, when given, are the global input arrays already made (Executor::inputs()), so
// they are not made twice. `bounds`, when given, receives each output's error bound
// (the ErrorBoundModel of numerics_check.cc), derived while evaluating. With `reordered`
// the bounds also hold against a reference that adds each matmul's and einsum's products in
// another order (one that runs them on other shapes, which BLAS blocks differently), as part
// of the contraction of reordered[its output's name] products where that is longer (the
// global contraction a partitioned program splits into local blocks and a psum): every such
// op then counts its float32 accumulation even from exact operands. `lengths`, when given,
// receives each matmul's and einsum's products per output element, by output name.
std::map<std::string, Array> ReferenceOutputs(const Mesh& mesh, const ProgramSpec& program,
                                              const std::string& base_dir,
                                              const std::map<std::string, Array>* inputs = nullptr,
                                              std::map<std::string, double>* bounds = nullptr,
                                              const ContractionLengths* reordered = nullptr,
                                              ContractionLengths* lengths = nullptr);

// The numerics check of a run: simulated outputs against the reference.
struct NumericsReport {
  bool checked = false;      // Whether real data was compared.
  double max_abs_error = 0;  // Over all outputs and elements where both values are finite.
  double tolerance = 0;      // The bound of the worst output.
  bool passed = true;        // Every output within its bound, non-finite values identical.
  // The output with the largest error relative to its bound; when the check fails, followed
  // by what differs: "y (flat index 1: nan where the reference has 2)".
  std::string worst_output;
  int outputs = 0;  // Outputs compared.
  // Outputs whose bound is infinite (the error model found none finite): their finite errors
  // cannot fail the check, only non-finite mismatches can.
  int unbounded = 0;
  // Outputs whose reference holds NaN or inf somewhere (matching non-finite values pass, so a
  // program that makes them everywhere checks nothing there).
  int nonfinite = 0;
};

// Compares outputs, each against its own bound (bounds[name]; 0 when absent): finite pairs
// must differ by at most the bound; non-finite values must be identical (nan matches nan,
// +inf matches +inf), and any other pairing fails. i32 values compare exactly as integers.
NumericsReport CompareOutputs(const std::map<std::string, Array>& simulated,
                              const std::map<std::string, Array>& reference,
                              const std::map<std::string, double>& bounds);

// The whole check: the reference with its per-output bounds, compared with `simulated`.
NumericsReport CheckNumerics(const std::map<std::string, Array>& simulated, const Mesh& mesh,
                             const ProgramSpec& program, const std::string& base_dir,
                             const std::map<std::string, Array>* inputs = nullptr);

// A coarse check for callers without the program (one collective, `shardsim collective`):
// every output's bound is (2 eps(dtype) + (mesh size + 1 + 4 sqrt(reduction_length)) 2^-24)
// * max(1, max|ref|), 0 for i32; comparison as above.
NumericsReport CompareOutputs(const std::map<std::string, Array>& simulated,
                              const std::map<std::string, Array>& reference, int mesh_size,
                              int64_t reduction_length = 1);

// The coarse bounds of CompareOutputs(simulated, reference, mesh_size, reduction_length), by
// output name (i32 outputs have none: they compare exactly).
std::map<std::string, double> CoarseBounds(const std::map<std::string, Array>& reference,
                                           int mesh_size, int64_t reduction_length);

// A bound on the longest contraction of the program's matmuls and einsums, for the coarse
// CompareOutputs: the largest dimension of its input arrays' global shapes.
int64_t LongestReduction(const ProgramSpec& program);

}  // namespace shardsim
