// A transformer training step written per device (a shard_map body) with FSDP and tensor
// parallelism, built through ProgramBuilder: the workload the timing benchmarks and the
// cached-versus-network tests share.
#pragma once

#include <cstdint>
#include <string>

#include "collectives/ir/program_builder.h"
#include "collectives/program.h"

namespace shardsim::testing {

// Global sizes of the step (Llama-style decoder layers) and the mesh it runs on.
struct TransformerShape {
  int64_t batch = 32;  // Sequences per step (global).
  int64_t seq = 4096;  // Tokens per sequence.
  int64_t d_model = 8192;
  int64_t d_ff = 28672;
  int64_t heads = 64;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int layers = 1;
  int fsdp = 128;  // Mesh axis `fsdp`: batch and weight rows sharded over it.
  int tp = 4;      // Mesh axis `tp`: heads and d_ff sharded over it (Megatron).
  DType dtype = DType::kBF16;
};

// Builds the step: per layer, forward (RMSNorm stand-in, q/k/v projections from FSDP
// all-gathered weights, grouped-query attention as einsums, output projection and its TP psum,
// SwiGLU MLP with its TP psum), then the backward in reverse layer order (weights gathered
// again, activation gradients with their TP psums, weight gradients reduce-scattered over
// fsdp). About 75 ops per layer. Shapes only: meant for timing-only runs.
ProgramSpec BuildTransformerStep(const TransformerShape& shape);

}  // namespace shardsim::testing
