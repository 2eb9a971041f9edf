// Transformer training steps as global programs: a model configuration, a batch and a plan's
// logical axis rules give the program (embedding, decoder layers, loss, jax.grad, optimizer
// update) that the partitioner shards and the executor simulates.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
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
  kRelu,    // down(relu(x W_up)) (MaxText's 2023 global_parameter_scale models).
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
  // The logits read the embedding table (its transpose) instead of a separate unembedding
  // (MaxText's 2023 global_parameter_scale models).
  bool tied_embeddings = false;
  // The attention kernel (`attention:`, a shardsim extension): flash (the default: scores on
  // chip); unfused (Megatron-LM before FlashAttention: the B N T S scores, softmax and dropout
  // through HBM); mmha (serving: a decode step's attention reads each kv head's cache once per
  // query head, TensorRT-LLM's masked multi-head attention before its GQA-aware XQA kernel;
  // prefill runs flash).
  std::string attention = "flash";
  // Mixture of experts (SPEC's experts, top_k, capacity_factor, shared_experts,
  // expert_d_ff): 0 experts is a dense model; otherwise every layer from dense_layers on has a
  // router and `experts` MLPs expert_d_ff wide, each token running its top_k, with tokens
  // dropped beyond an expert's capacity (ExpertCapacity), plus one MLP shared_experts x
  // expert_d_ff wide that every token runs (the shared experts). capacity_factor <= 0 (MaxText
  // spells it -1) routes without a capacity: no token is dropped, each expert runs the rows
  // sent to it (planner/models/dropless_moe.h).
  int64_t experts = 0;
  int64_t top_k = 2;              // Experts each token is routed to.
  double capacity_factor = 1.25;  // Expert capacity over an even split; <= 0: dropless.
  // Dropless: each device's receive buffer as a multiple of the rows it routes (MaxText's
  // ragged_buffer_factor; rows past it are dropped); <= 0: the worst case, nothing dropped.
  double ragged_buffer_factor = -1;
  int64_t shared_experts = 0;  // Experts every token goes through.
  int64_t expert_d_ff = 0;     // MLP width of one expert (0: d_ff).
  int64_t dense_layers = 0;    // Leading layers with a dense MLP (DeepSeek-V3's first 3).
  // The weight of the routers' load-balancing loss added to a training step's loss (0: none;
  // Switch Transformer's is 0.01): per MoE layer, experts * sum_e c_e P_e, c_e the mean over
  // tokens of how many of a token's top_k choices are e, P_e the mean router probability of e
  // (the form of Hugging Face's Mixtral, `router_aux_loss_coef`).
  double router_aux_loss = 0;

  bool operator==(const TransformerConfig&) const = default;
};

// Whether decoder layer `layer` of `model` is a mixture of experts.
bool IsMoeLayer(const TransformerConfig& model, int64_t layer);
// The MLP width of one expert: expert_d_ff, or d_ff when it is 0.
int64_t ExpertDff(const TransformerConfig& model);
// The slots each expert holds per routing group of `group_tokens` tokens (one sequence):
// ceil(T top_k capacity_factor / experts), at least 1 (MaxText's and GShard's capacity).
int64_t ExpertCapacity(const TransformerConfig& model, int64_t group_tokens);

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
  // Gradient accumulation: the batch runs as this many microbatches of batch / microbatches
  // sequences, one after another (each its forward, then its backward), their gradients
  // summed and averaged before one update.
  int64_t microbatches = 1;
  // The forward pass and loss only (no grad, no update): what a pipeline stage's forward
  // costs. Needs one microbatch.
  bool forward_only = false;
  // The linear layers' GEMMs (`train.matmul_dtype`; unset: dtype, plain GEMMs). An 8-bit float
  // runs FP8 training as Transformer Engine's hybrid recipe: each weight's dtype copy cast to it
  // where first read (a kernel of its own), activations quantized to it (fused, free),
  // products accumulated into dtype; the backward GEMMs take the cotangent in f8e5m2.
  // Parameters, gradients and optimizer state stay in param_dtype.
  std::optional<DType> matmul_dtype;
  // MaxText's num_vocab_tiling: the logits and the loss computed in this many tiles along the
  // sequence, each tile's logits recomputed in the backward (BuildTrainStep's `head_tiles`), so
  // one tile's logits are live at a time. Must divide seq_len.
  int64_t vocab_tiling = 1;
  // With optimizer none: each gradient may stay an unreduced partial sum over the mesh axes
  // its parameter does not split (OutputSpec::unreduced), as gradients accumulated over a
  // pipeline's microbatches do until the step that updates sums them once. Timing only.
  bool unreduced_gradients = false;
  // A middle pipeline stage's step: the decoder layers alone, no embedding, final norm or head.
  // Each microbatch's activation [batch, length, embed] is an input (`x_in`, from the stage
  // before), as is its output's cotangent (`g_out`, from the stage after); the loss is their
  // dot product, so its gradient is the backward that cotangent starts, and the activation's
  // cotangent `d_x_in` (what the stage sends back) is an output. Transformers only.
  bool layers_only = false;

  bool operator==(const TrainConfig&) const = default;
};

// An MLP classifier (SPEC's `kind: mlp` map): layer_sizes [inputs, hidden..., classes], the
// activation between layers (relu or gelu), softmax cross-entropy on the last layer.
struct MlpModel {
  std::vector<int64_t> layer_sizes;
  MlpKind activation = MlpKind::kRelu;
};

// One serving workload (SPEC's `serve:`).
struct ServeConfig {
  int64_t batch = 1;              // Sequences served together.
  int64_t prompt_len = 16;        // Prompt tokens per sequence (the prefill).
  int64_t decode_len = 16;        // Tokens generated per sequence after the first.
  int64_t context = 16;           // A decode step's cache positions (keys and values attended).
  DType dtype = DType::kBF16;     // Weights and activations.
  DType kv_dtype = DType::kBF16;  // The KV cache.
  // The linear layers' GEMMs (q, k, v, o and the MLPs', experts' included): their weights are
  // stored in it and their activations converted to it, the products accumulated into dtype
  // (preferred_element_type), as FP8 serving (TensorRT-LLM's FP8 quantization) runs them.
  // The embedding, router, norms and logits stay in dtype. Equal to dtype: plain GEMMs.
  DType matmul_dtype = DType::kBF16;
};

// Which serving step.
enum class ServeStep {
  kPrefill,  // The prompt's forward: the KV cache and the last position's logits (TTFT).
  kDecode,   // One token per sequence against a `context`-long cache (TPOT).
};

// A decode step's input holding layer `layer`'s cached keys ("k_cache<l>") or values
// ("v_cache<l>"), and whether an array is one of them.
std::string KvCacheName(bool keys, int64_t layer);
bool IsKvCache(const std::string& name);
// Whether `name` is an input of a TrainConfig::layers_only step that the stages beside it send
// (the activation `x_in`, the cotangent `g_out`, per microbatch): the batch, not state.
bool IsStageBoundary(const std::string& name);

// The global program (mode auto) of one serving step of `model` on `serve`'s batch, sharded by
// `rules` as BuildTrainStep shards (the cache [batch, length, kv_heads, head_dim]): tokens
// [batch, prompt_len or 1], parameters in dtype, for decode the cache k_cache<l>, v_cache<l>
// of each layer as inputs; outputs the logits of the last position [batch, 1, vocab] and each
// layer's new keys and values (k<l>, v<l>: the prompt's cache, or the token's entries). A
// decode step's token attends to the `context` cached positions (its own key and value are
// returned to be written into the cache, as in-place updates do, not attended: one position
// in `context`). Throws std::invalid_argument as BuildTrainStep does.
ProgramSpec BuildServeStep(const TransformerConfig& model, const ServeConfig& serve, ServeStep step,
                           const std::vector<MeshAxis>& axes, const LogicalRules& rules,
                           std::vector<std::vector<std::string>>* layer_values = nullptr);

// The global program (mode auto) of one training step of `model` on `train`'s batch over a
// mesh of `axes`, every array sharded by `rules` (logical dimensions as MaxText names them:
// tokens [batch, length]; embed [vocab, embed]; wq [embed, heads, head_dim], wk and wv
// [embed, kv_heads, head_dim], wo [heads, head_dim, embed]; w_gate and w_up [embed, mlp],
// w_down [mlp, embed]; norm scales [embed]; unembed [embed, vocab], none when tied: the logits
// then contract embed's embed dimension). With sequence
// parallelism (`length` split) the norms and residual adds run on the sequence shard. Values are
// named as the configs/jit transformer examples name them (x0, n0a, q0, ..., loss; gradients d_<p>;
// updated parameters <p>_new and Adam moments m_<p>, v_<p>). With microbatches each has its
// token ids and labels (tokens_mb<i>, labels_mb<i>), forward values suffixed _mb<i>, and its
// own grad; the gradients accumulate (acc_<p>_mb<i>) and d_<p> is their mean, loss the mean
// of the microbatches' losses. With a param_dtype other than
// dtype (mixed precision: f32 master weights, bf16 compute) each microbatch converts every
// parameter to dtype where it first reads it, as its sharded block (<p>_c<sfx>; the FSDP
// gathers then move dtype), and the gradients, taken through the converts, are in param_dtype.
// The residual stream is constrained to [batch, length, -] at each block's entry and before
// the final norm (MaxText's activation constraints), so data and FSDP shard the activations by
// sequence and gather the weights. Token ids and labels are arange
// (valid ids when batch x seq_len <= vocab; timing never reads them); parameters are normal
// with seeds in declaration order, norm scales ones. Throws std::invalid_argument for a
// configuration that does not fit together (heads not a multiple of kv_heads, sizes < 1,
// microbatches not dividing the batch, experts > 0), and SpecError "plan.rules" naming the
// parameter whose dimension the rules split into blocks that do not divide it.
// The global program of one training step of `mlp` on `train`'s batch (seq_len unused: one
// example per batch row), sharded by `rules`: features x [batch, inputs] and labels [batch]
// split as `batch`; weights w<i> [n_i, n_i+1] as [embed, mlp] for even i and [mlp, embed] for
// odd i, the last one's output dimension (the classes) as `vocab`; each layer's input constrained
// to [batch, -]; then grad and the optimizer as BuildTrainStep (microbatches and mixed precision
// too). Throws std::invalid_argument for fewer than two sizes, a size < 1, or an activation other
// than relu or gelu.
ProgramSpec BuildMlpTrainStep(const MlpModel& mlp, const TrainConfig& train,
                              const std::vector<MeshAxis>& axes, const LogicalRules& rules);

// When `layer_values` is given it receives, per microbatch and decoder layer, the names of the
// values that layer's forward makes (the segments planner::ApplyRemat checkpoints);
// `layer_checkpoints`, per the same layers, those of them MaxText names (planner::
// CheckpointNames(): "query_proj" -> the layer's q).
// `head_tiles`, with train.vocab_tiling > 1, per microbatch and tile the values of the tile's
// logits and loss (segments planner::ApplyRemat recomputes fully whatever the plan's remat).
ProgramSpec BuildTrainStep(
    const TransformerConfig& model, const TrainConfig& train, const std::vector<MeshAxis>& axes,
    const LogicalRules& rules, std::vector<std::vector<std::string>>* layer_values = nullptr,
    std::vector<std::map<std::string, std::string>>* layer_checkpoints = nullptr,
    std::vector<std::vector<std::string>>* head_tiles = nullptr);

// The runs of a step's weight collectives (planner::PrefetchWeightCollectives): each layer's
// forward and backward in each microbatch, 2 x microbatches x `layers` (a transformer's decoder
// layers, an MLP's weight layers).
int PrefetchGroups(int64_t layers, const TrainConfig& train);

}  // namespace shardsim::planner
