// Reverse-mode differentiation of global programs: the `grad` op (jax.grad) expanded into
// ordinary global ops before partitioning, so the backward pass is sharded, costed and traced
// like any other part of the program.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/program.h"

namespace shardsim::planner {

// The global program `program` with every grad op replaced by the ops computing its gradients:
// reverse mode over the ops before it, seeded with 1 for the scalar `of`, through the ops on a
// path from some wrt value to `of` only, cotangents of a value read several times accumulated
// with add (JAX's transpose rules, one per op family; a wrt value off every path gets zeros, as
// JAX; a shard_map region transposes to a backward region of its body's adjoint, reading the
// residuals the forward region is made to save). Shapes and dtypes come from the kernels on
// shape-only arrays. Emitted values are named
// after the values they are cotangents of ("d_h", "d_h_2"); each gradient takes its grad op's
// output name. Where the program rebinds a name, earlier versions are renamed apart first (an
// array rebound later is read through a free reshape alias), so every emitted op reads the
// version it means. Programs without grad ops come back unchanged. Throws SpecError keyed at
// the grad op ("program.4.of": not a scalar; "program.4.wrt.1": an integer value; "program.4":
// an op on the path without a derivative rule, a manual program) or at a forward op whose
// shapes do not fit. When `pass_starts` is given it receives, per grad op in order, the
// index in the result of the first op of its backward pass and of the first op after it.
ProgramSpec ExpandGrads(const ProgramSpec& program, std::vector<size_t>* pass_starts = nullptr);

// Per op of a program of `n` ops, the index of the backward pass it is in (ExpandGrads's
// `pass_starts`: [start, end) op indices per pass), or -1 outside every pass.
std::vector<int> PassOfOps(size_t n, const std::vector<size_t>& pass_starts);

}  // namespace shardsim::planner
