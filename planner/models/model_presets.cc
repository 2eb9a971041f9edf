#include "planner/models/model_presets.h"

namespace shardsim::planner {
namespace {

// A dense decoder with head_dim = d_model / heads (every preset below but those that say).
TransformerConfig Dense(int64_t layers, int64_t d, int64_t heads, int64_t kv_heads, int64_t ff,
                        int64_t vocab, MlpKind mlp, NormKind norm) {
  TransformerConfig c;
  c.layers = layers;
  c.d_model = d;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = d / heads;
  c.d_ff = ff;
  c.vocab = vocab;
  c.mlp = mlp;
  c.norm = norm;
  return c;
}

TransformerConfig Llama(int64_t layers, int64_t d, int64_t heads, int64_t kv_heads, int64_t ff,
                        int64_t vocab) {
  return Dense(layers, d, heads, kv_heads, ff, vocab, MlpKind::kSwiGlu, NormKind::kRms);
}

TransformerConfig Gpt(int64_t layers, int64_t d, int64_t heads, int64_t ff) {
  // Megatron pads GPT's 50257-token vocabulary to 51200 (a multiple of 128 x TP).
  return Dense(layers, d, heads, heads, ff, 51200, MlpKind::kGelu, NormKind::kLayer);
}

// MaxText's 2023 global_parameter_scale models (its default decoder: RMSNorm, multi-head
// attention with head_dim 256 whatever d is, ReLU MLP, vocabulary 32768, tied embeddings).
TransformerConfig MaxText(int64_t layers, int64_t d, int64_t heads, int64_t ff) {
  TransformerConfig c = Dense(layers, d, heads, heads, ff, 32768, MlpKind::kRelu, NormKind::kRms);
  c.head_dim = 256;
  c.tied_embeddings = true;
  return c;
}

TransformerConfig Mixtral() {
  TransformerConfig c = Llama(32, 4096, 32, 8, 14336, 32000);
  c.experts = 8;
  c.top_k = 2;
  c.expert_d_ff = 14336;
  return c;
}

// DeepSeek-V3 (DeepSeek-AI 2024, Table/Section 4.2 and the Hugging Face config): 61 layers, the
// first 3 dense (ff 18432), the rest 256 routed experts of ff 2048 (top 8) plus 1 shared,
// d 7168, vocabulary 129280. Its multi-head latent attention (MLA: 128 heads of q/k 192, v
// 128, low-rank q and kv, a 576-element cache per token and layer) is approximated by
// standard grouped-query attention: 128 heads of 128 on 2 kv heads. Against MLA: parameters
// in all 674.2B vs the report's 671B (+0.5%), active 39.8B vs 37B (+7.5%: the projections are
// full rank), attention scores and sums 80% of MLA's FLOPs (head dim 128 vs 192 for q.k), the
// KV cache 512 elements per token and layer vs 576 (-11%). The multi-token prediction module
// and the auxiliary-loss-free balancing are left out; token dropping at the capacity factor
// stands in for its dropless routing.
TransformerConfig DeepSeekV3() {
  TransformerConfig c = Llama(61, 7168, 128, 2, 18432, 129280);
  c.head_dim = 128;
  c.experts = 256;
  c.top_k = 8;
  c.expert_d_ff = 2048;
  c.shared_experts = 1;
  c.dense_layers = 3;
  return c;
}

std::vector<ModelPreset> MakePresets() {
  const std::string korthikanti =
      "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer "
      "Models', Table 3";
  const std::string maxtext =
      "MaxText's 2023 global_parameter_scale models (AI-Hypercomputer/maxtext "
      "MaxText/configs/models, used by its configs/tpu/v5p, v5e and v4 READMEs)";
  return {
      {"llama-2-7b", Llama(32, 4096, 32, 32, 11008, 32000),
       "Touvron et al. 2023, 'Llama 2', Table 1; meta-llama/Llama-2-7b-hf config.json"},
      {"llama-2-13b", Llama(40, 5120, 40, 40, 13824, 32000),
       "Touvron et al. 2023, 'Llama 2', Table 1; meta-llama/Llama-2-13b-hf config.json"},
      {"llama-2-70b", Llama(80, 8192, 64, 8, 28672, 32000),
       "Touvron et al. 2023, 'Llama 2', Table 1; meta-llama/Llama-2-70b-hf config.json"},
      {"llama-3-8b", Llama(32, 4096, 32, 8, 14336, 128256),
       "Meta Llama 3 model card; meta-llama/Meta-Llama-3-8B config.json"},
      {"llama-3-70b", Llama(80, 8192, 64, 8, 28672, 128256),
       "Meta Llama 3 model card; meta-llama/Meta-Llama-3-70B config.json"},
      {"llama-3.1-405b", Llama(126, 16384, 128, 8, 53248, 128256),
       "Llama Team 2024, 'The Llama 3 Herd of Models', Table 3"},
      {"gpt3-175b", Gpt(96, 12288, 96, 49152),
       "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1; vocabulary "
       "padded to 51200 as Megatron-LM does"},
      {"megatron-22b", Gpt(48, 6144, 64, 24576), korthikanti},
      {"megatron-175b", Gpt(96, 12288, 96, 49152), korthikanti},
      {"megatron-530b", Gpt(105, 20480, 128, 81920), korthikanti},
      {"megatron-1t", Gpt(128, 25600, 160, 102400), korthikanti},
      {"maxtext-16b", MaxText(32, 5120, 32, 32768), maxtext},
      {"maxtext-22b", MaxText(48, 6144, 24, 24576), maxtext},
      {"maxtext-32b", MaxText(32, 10240, 32, 32768), maxtext},
      {"maxtext-64b", MaxText(64, 10240, 32, 32768), maxtext},
      {"maxtext-128b", MaxText(64, 10240, 64, 65536), maxtext},
      {"mixtral-8x7b", Mixtral(),
       "Jiang et al. 2024, 'Mixtral of Experts', Table 1; mistralai/Mixtral-8x7B-v0.1 "
       "config.json"},
      {"deepseek-v3", DeepSeekV3(),
       "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', Section 4.2; "
       "deepseek-ai/DeepSeek-V3 config.json (MLA approximated by grouped-query attention)"},
  };
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset> presets = MakePresets();
  return presets;
}

const ModelPreset* FindModelPreset(std::string_view name) {
  for (const ModelPreset& p : ModelPresets()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace shardsim::planner
