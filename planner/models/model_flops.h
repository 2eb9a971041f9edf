// Parameter counts and model FLOPs of a transformer: the figures MFU is defined by.
#pragma once

#include <cstdint>

#include "planner/models/transformer.h"

namespace shardsim::planner {

// The parameters of a decoder-only transformer, by where they sit.
struct ParameterCounts {
  int64_t embedding = 0;  // The token embedding table, vocab x d (a gather, not a matmul).
  int64_t per_layer = 0;  // One dense decoder layer: q, k, v, o projections, the MLP, two norms.
  // One mixture-of-experts layer: attention, router, every expert, the shared experts, norms.
  int64_t per_moe_layer = 0;
  int64_t head = 0;  // The final norm and the unembedding, d x vocab (none when tied).
  // Weights of the matmuls a token runs through: the layers' projections (of a MoE layer the
  // router, its top_k experts and the shared experts: the active parameters) and the
  // unembedding (the logits' matmul, tied to the embedding table or not).
  int64_t matmul = 0;
  int64_t total = 0;  // All of them (every expert).
};

// The parameters of `model`: per dense layer d·H·hd + 2·d·KV·hd (q; k, v) + H·hd·d (o) +
// 3·d·ff (SwiGLU: gate, up, down; 2·d·ff for GELU/ReLU) + 2·d (norms); a MoE layer has d·E
// (router) + E·3·d·ff_e + shared·3·d·ff_e in place of the MLP; head d + d·V (d when tied).
// Llama-2-7B gives 6,738,415,616, the count Meta and Hugging Face report; Mixtral-8x7B
// 46,702,792,704 (46.7B) in all and 12,879,921,152 (12.9B) active matmul weights.
ParameterCounts CountParameters(const TransformerConfig& model);

// Model FLOPs of one training step, PaLM's definition (Chowdhery et al. 2022, Appendix B):
// per token 6·N + 12·L·H·hd·T, N the matmul weights a token runs through
// (CountParameters().matmul: the embedding table, a gather, and the norms excluded; of MoE
// layers the active experts, as MaxText and Megatron count them), T the sequence length: the
// forward's matmuls 2·N and the attention scores and weighted sum 2·2·L·H·hd·T, the backward twice
// the forward. Causality is not discounted and recomputation is not counted, as MFU requires.
double TrainStepModelFlops(const TransformerConfig& model, const TrainConfig& train);

// The weights of `mlp` (every matrix, n_i x n_i+1) and one training step's model FLOPs:
// 6 per weight per example (forward 2, backward 4).
int64_t CountMlpParameters(const MlpModel& mlp);
double MlpTrainStepModelFlops(const MlpModel& mlp, const TrainConfig& train);

}  // namespace shardsim::planner
