#include "planner/models/model_flops.h"

namespace shardsim::planner {

ParameterCounts CountParameters(const TransformerConfig& model) {
  const int64_t d = model.d_model, hd = model.head_dim;
  const int64_t attention = d * model.heads * hd * 2 + d * model.kv_heads * hd * 2;
  const int64_t mlp = (model.mlp == MlpKind::kSwiGlu ? 3 : 2) * d * model.d_ff;
  ParameterCounts c;
  c.embedding = model.vocab * d;
  c.per_layer = attention + mlp + 2 * d;
  c.head = d + (model.tied_embeddings ? 0 : d * model.vocab);
  c.matmul = model.layers * (attention + mlp) + d * model.vocab;
  c.total = c.embedding + model.layers * c.per_layer + c.head;
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
