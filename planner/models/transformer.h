// Transformer training steps as global programs: a model configuration, a batch and a plan's
// logical axis rules give the program (embedding, decoder layers, loss, jax.grad, optimizer
// update) that the partitioner shards and the executor simulates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "planner/models/logical_rules.h"

namespace shardsim::planner {

// The MLP of a decoder layer.
enum class MlpKind {
  kSwiGlu,  // down(silu(x W_gate) * (x W_up)) (Llama).
  kGelu,    // down(gelu(x W_up)) (GPT-3, Megatron).
};

// The normalization of a decoder layer.
enum class NormKind { kRms, kLayer };

// A decoder-only transformer (SPEC's `kind: transformer` map).
struct TransformerConfig {
  int64_t layers = 1;    // Decoder layers.
  int64_t d_model = 64;  // Model width.
  int64_t heads = 8;     // Query heads.
  int64_t kv_heads = 8;  // Key/value heads (grouped-query attention when fewer).
  int64_t head_dim = 8;  // Width of one head.
  int64_t d_ff = 128;    // MLP width.
  int64_t vocab = 128;   // Vocabulary.
  MlpKind mlp = MlpKind::kSwiGlu;
  NormKind norm = NormKind::kRms;
};

// The parameter update after the gradients.
enum class Optimizer {
  kNone,  // Gradients only: the step's outputs are the loss and every parameter's gradient.
  kSgd,   // w - lr g.
  kAdam,  // Adam's first step (t = 1): moments from zero, bias-corrected (optax.adam).
};

// One training step's batch and numerics.
struct TrainConfig {
  int64_t batch = 8;                // Sequences per step (global).
  int64_t seq_len = 16;             // Tokens per sequence.
  DType dtype = DType::kF32;        // Compute: activations and the parameters' copies.
  DType param_dtype = DType::kF32;  // Parameters, gradients and optimizer state.
  Optimizer optimizer = Optimizer::kNone;
  double learning_rate = 1e-3;  // sgd and adam.
};

// The global program (mode auto) of one training step of `model` on `train`'s batch over a
// mesh of `axes`, every array sharded by `rules` (logical dimensions as MaxText names them:
// tokens [batch, length]; embed [vocab, embed]; wq [embed, heads, head_dim], wk and wv
// [embed, kv_heads, head_dim], wo [heads, head_dim, embed]; w_gate and w_up [embed, mlp],
// w_down [mlp, embed]; norm scales [embed]; unembed [embed, vocab]). When `length` is split
// (sequence parallelism) the residual stream is constrained to [batch, length, -] at each
// block's entry, so the norms and residual adds run on the sequence shard. Values are named
// as the configs/jit transformer examples name them (x0, n0a, q0, ..., loss; gradients d_<p>;
// updated parameters <p>_new and Adam moments m_<p>, v_<p>). With a param_dtype other than
// dtype (mixed precision: f32 master weights, bf16 compute) every parameter is converted to
// dtype once, up front, as its sharded block (<p>_c; the FSDP gathers then move dtype), and the
// gradients, taken through the converts, are in param_dtype. Token ids and labels are arange
// (valid ids when batch x seq_len <= vocab; timing never reads them); parameters are normal
// with seeds in declaration order, norm scales ones. Throws std::invalid_argument for a
// configuration that does not fit together (heads not a multiple of kv_heads, sizes < 1).
ProgramSpec BuildTrainStep(const TransformerConfig& model, const TrainConfig& train,
                           const std::vector<MeshAxis>& axes, const LogicalRules& rules);

}  // namespace shardsim::planner
