#include "planner/models/model_flops.h"

namespace shardsim::planner {

ParameterCounts CountParameters(const TransformerConfig& model) {
  const int64_t d = model.d_model, hd = model.head_dim;
  const int64_t attention = d * model.heads * hd * 2 + d * model.kv_heads * hd * 2;
  const int64_t matrices = model.mlp == MlpKind::kSwiGlu ? 3 : 2;  // An MLP's weight matrices.
  const int64_t mlp = matrices * d * model.d_ff;
  const int64_t moe_layers = model.experts > 0 ? model.layers - model.dense_layers : 0;
  const int64_t dense_layers = model.layers - moe_layers;
  ParameterCounts c;
  c.embedding = model.vocab * d;
  c.per_layer = attention + mlp + 2 * d;
  c.head = d + (model.tied_embeddings ? 0 : d * model.vocab);
  c.matmul = dense_layers * (attention + mlp) + d * model.vocab;
  c.total = c.embedding + dense_layers * c.per_layer + c.head;
  if (moe_layers > 0) {
    // Router d x E; each expert an MLP expert_d_ff wide; the shared experts one MLP.
    const int64_t expert = matrices * d * ExpertDff(model);
    const int64_t router = d * model.experts;
    const int64_t shared = model.shared_experts * expert;
    c.per_moe_layer = attention + router + model.experts * expert + shared + 2 * d;
    c.matmul += moe_layers * (attention + router + model.top_k * expert + shared);
    c.total += moe_layers * c.per_moe_layer;
  }
  return c;
}

double TrainStepModelFlops(const TransformerConfig& model, const TrainConfig& train) {
  const double tokens = static_cast<double>(train.batch) * static_cast<double>(train.seq_len);
  const double n = static_cast<double>(CountParameters(model).matmul);
  const double attention = 12.0 * static_cast<double>(model.layers) *
                           static_cast<double>(model.heads) * static_cast<double>(model.head_dim) *
                           static_cast<double>(train.seq_len);
  return tokens * (6.0 * n + attention);
}

int64_t CountMlpParameters(const MlpModel& mlp) {
  int64_t n = 0;
  for (size_t i = 0; i + 1 < mlp.layer_sizes.size(); ++i) {
    n += mlp.layer_sizes[i] * mlp.layer_sizes[i + 1];
  }
  return n;
}

double MlpTrainStepModelFlops(const MlpModel& mlp, const TrainConfig& train) {
  return 6.0 * static_cast<double>(CountMlpParameters(mlp)) * static_cast<double>(train.batch);
}

}  // namespace shardsim::planner
