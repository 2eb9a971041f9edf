// Simulated serving: the prefill (time to first token) and decode steps (time per output
// token) of a transformer under a plan, the KV cache's bytes, and whether it all fits.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/runtime/machine.h"
#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"
#include "sim/time.h"
#include "sim/units.h"

namespace shardsim::planner {

// Memory per device of a serving workload.
struct ServeMemory {
  Bytes params;       // Weights, in the serving dtype, as the plan shards them.
  Bytes kv_cache;     // Keys and values of every layer for prompt_len + decode_len positions.
  Bytes activations;  // The largest step's peak beyond weights and cache.
  Bytes peak;         // The larger of the prefill's peak and the decode's at full context.
  Bytes capacity;     // HBM per device.
  bool fits = true;   // peak <= capacity.
};

// SPEC's serving outputs.
struct ServeReport {
  Time ttft;                 // The prefill step: prompt in, first token's logits out.
  Time tpot;                 // One decode step at the mean context, prompt + decode_len / 2.
  int64_t mean_context = 0;  // That context.
  Time total;                // ttft + (decode_len - 1) tpot: the whole generation.
  double tokens_per_s = 0;   // Output tokens: batch x decode_len / total.
  double tokens_per_s_per_device = 0;
  int devices = 0;
  Time decode_compute;       // The decode step's busiest device: compute,
  Time decode_exposed_comm;  // and communication not hidden under it.
  ServeMemory memory;
  uint64_t events = 0;  // Events dispatched (all simulations).
  // The decode step's simulated layer counts (the pair composed from, or the whole count).
  std::vector<int64_t> simulated_layers;
  std::vector<int64_t> prefill_layers;  // Likewise for the prefill.
};

// Simulates `serve` on `model` under `plan` (its mesh, rules and algorithms; remat does not
// apply) on `machine`: the prefill and a decode step at the mean context, each composed from
// 2 and 3 simulated layers like a training step (options.compose off: every layer). The KV
// cache bytes come from the decode step's cache arrays at full context (prompt_len +
// decode_len), sharded by the rules; the decode peak at full context is its peak at the mean
// context plus the cache it adds (inputs held throughout). Throws as SimulateTrainStep.
ServeReport SimulateServe(const Machine& machine, const TransformerConfig& model,
                          const ServeConfig& serve, const StepPlan& plan,
                          const TrainStepOptions& options = {});

}  // namespace shardsim::planner
