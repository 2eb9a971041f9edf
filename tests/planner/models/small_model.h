// The small transformer and training configuration the model-step tests simulate.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "planner/models/transformer.h"

namespace shardsim::test {

// `layers` layers, d 256, 8 heads of 32 with 2 kv heads, SwiGLU ff 512, vocabulary 512.
inline planner::TransformerConfig SmallTransformer(int64_t layers) {
  planner::TransformerConfig m;
  m.layers = layers;
  m.d_model = 256;
  m.heads = 8;
  m.kv_heads = 2;
  m.head_dim = 32;
  m.d_ff = 512;
  m.vocab = 512;
  return m;
}

// 16 sequences of 128 tokens, bf16 compute on f32 parameters, Adam.
inline planner::TrainConfig SmallTrain() {
  planner::TrainConfig t;
  t.batch = 16;
  t.seq_len = 128;
  t.dtype = DType::kBF16;
  t.param_dtype = DType::kF32;
  t.optimizer = planner::Optimizer::kAdam;
  return t;
}

// MaxText's FSDP x TP rules over mesh axes fsdp and tensor.
inline std::map<std::string, std::vector<std::string>> FsdpTensorRules() {
  return {{"batch", {"fsdp"}},      {"embed", {"fsdp"}}, {"heads", {"tensor"}},
          {"kv_heads", {"tensor"}}, {"mlp", {"tensor"}}, {"vocab", {"tensor"}}};
}

}  // namespace shardsim::test
