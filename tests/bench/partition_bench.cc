// Partitioning speed (Release, `build/tests/bench/partition_bench`): an 80-layer global
// program shaped like a transformer training step (forward projections and MLP, then per
// layer the backward's activation- and weight-gradient einsums and elementwise ops) under
// FSDP x TP in auto mode, partitioned on a TPU v5p 8x8x8 (512 chips). `cold`: a fresh
// collective cost cache each iteration (network simulations of every distinct reshard);
// `warm`: the cache shared across iterations (as a plan search shares it); `bytes`: the rules
// alone, collectives priced by bytes.
#include <benchmark/benchmark.h>

#include "collectives/ir/program_builder.h"
#include "collectives/lowering.h"
#include "collectives/runtime/machine.h"
#include "planner/grad.h"
#include "planner/models/transformer.h"
#include "planner/partitioner.h"
#include "sim/freed_memory.h"
#include "tests/support/specs.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

using test::P;

// One layer: x [B, S, D] batch-split over fsdp; weights [D, F] split (fsdp, tp).
ProgramSpec Step(int layers) {
  const int64_t b = 256, s = 4096, d = 8192, f = 28672;
  ProgramBuilder pb({{"fsdp", 128}, {"tp", 4}}, {}, ProgramMode::kAuto);
  std::string x = pb.Input("x", {b, s, d}, DType::kBF16, P({{"fsdp"}}));
  std::vector<std::string> acts;
  for (int l = 0; l < layers; ++l) {
    const std::string L = std::to_string(l);
    std::string wq = pb.Input("wq" + L, {d, d}, DType::kBF16, P({{"fsdp"}, {"tp"}}));
    std::string wo = pb.Input("wo" + L, {d, d}, DType::kBF16, P({{"tp"}, {"fsdp"}}));
    std::string w1 = pb.Input("w1" + L, {d, f}, DType::kBF16, P({{"fsdp"}, {"tp"}}));
    std::string w3 = pb.Input("w3" + L, {d, f}, DType::kBF16, P({{"fsdp"}, {"tp"}}));
    std::string w2 = pb.Input("w2" + L, {f, d}, DType::kBF16, P({{"tp"}, {"fsdp"}}));
    acts.push_back(x);
    std::string n = pb.Binary(OpKind::kMul, x, x);
    std::string q = pb.Einsum("bsd,dh->bsh", n, wq);
    std::string a = pb.Unary(OpKind::kTanh, q);
    std::string o = pb.Einsum("bsh,hd->bsd", a, wo);
    x = pb.Binary(OpKind::kAdd, x, o);
    std::string n2 = pb.Binary(OpKind::kMul, x, x);
    std::string g = pb.Unary(OpKind::kSilu, pb.Einsum("bsd,df->bsf", n2, w1));
    std::string u = pb.Einsum("bsd,df->bsf", n2, w3);
    std::string h = pb.Binary(OpKind::kMul, g, u);
    x = pb.Binary(OpKind::kAdd, x, pb.Einsum("bsf,fd->bsd", h, w2));
  }
  std::string dy = x;
  for (int l = layers - 1; l >= 0; --l) {
    const std::string L = std::to_string(l);
    // Gradients of the layer's matmuls as einsums: activations' and weights'.
    std::string dh = pb.Einsum("bsd,fd->bsf", dy, "w2" + L);
    std::string dw2 = pb.Einsum("bsf,bsd->fd", dh, dy);
    std::string dg = pb.Binary(OpKind::kMul, dh, dh);
    std::string dx1 = pb.Einsum("bsf,df->bsd", dg, "w1" + L);
    std::string dx3 = pb.Einsum("bsf,df->bsd", dh, "w3" + L);
    std::string dw1 = pb.Einsum("bsd,bsf->df", acts[static_cast<size_t>(l)], dg);
    std::string dw3 = pb.Einsum("bsd,bsf->df", acts[static_cast<size_t>(l)], dh);
    dy = pb.Binary(OpKind::kAdd, dy, pb.Binary(OpKind::kAdd, dx1, dx3));
    std::string da = pb.Einsum("bsd,hd->bsh", dy, "wo" + L);
    std::string dwo = pb.Einsum("bsh,bsd->hd", da, dy);
    std::string dq = pb.Binary(OpKind::kMul, da, da);
    std::string dx = pb.Einsum("bsh,dh->bsd", dq, "wq" + L);
    std::string dwq = pb.Einsum("bsd,bsh->dh", acts[static_cast<size_t>(l)], dq);
    dy = pb.Binary(OpKind::kAdd, dy, dx);
    for (const std::string& w : {dwq, dwo, dw1, dw3, dw2}) {
      pb.Output(w, w == dwo || w == dw2 ? P({{"tp"}, {"fsdp"}}) : P({{"fsdp"}, {"tp"}}));
    }
  }
  pb.Output(dy, P({{"fsdp"}}));
  return std::move(pb).Build();
}

// How collectives are priced: by the network model with a fresh cache per iteration (cold),
// one shared across iterations as a search shares it (warm; both with the lower bound that
// skips candidates that cannot win, as PartitionOnMachine sets it), or by bytes (no model).
enum class Pricing { kCold, kWarm, kBytes };

// Partitions `program` (grad expanded first) each iteration, priced as `pricing` says, and
// lowers the result for the executor when `lower`; counts ops and inserted collectives.
void PartitionEach(benchmark::State& state, Pricing pricing, const Machine& machine,
                   const ProgramSpec& program, bool lower) {
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  size_t lowered_ops = 0, inserted = 0;
  for (auto _ : state) {
    planner::PartitionResult r =
        pricing == Pricing::kCold ? planner::PartitionOnMachine(program, machine, mesh)
        : pricing == Pricing::kWarm
            ? planner::Partition(program, {&mesh, &cache, machine.compute_model(),
                                           planner::DeviceInBytesPerSecond(machine), &machine})
            : planner::Partition(program);
    if (lower) benchmark::DoNotOptimize(LowerProgram(mesh, r.program));
    lowered_ops = r.program.ops.size();
    inserted = 0;
    for (const std::string& reason : r.reasons) inserted += !reason.empty();
  }
  state.counters["global_ops"] = static_cast<double>(planner::ExpandGrads(program).ops.size());
  state.counters["lowered_ops"] = static_cast<double>(lowered_ops);
  state.counters["inserted"] = static_cast<double>(inserted);
}

void BM_Partition(benchmark::State& state, Pricing pricing) {
  Machine machine(BuildPreset("tpu-v5p", {8, 8, 8}));
  PartitionEach(state, pricing, machine, Step(80), /*lower=*/false);
}

// The target workload: a Llama-2-70B-shaped training step (80 layers, d 8192, 64 heads
// on 8 kv heads of 128, SwiGLU 28672, vocabulary 32000; batch 256 x 4096, bf16 compute on
// f32 parameters, Adam) built by the model builder under FSDP 128 x TP 4 rules (MaxText's),
// then expanded (grad), partitioned in auto mode and lowered for the executor, on 512 v5p
// chips.
void BM_TrainStep(benchmark::State& state, Pricing pricing, int layers = 80) {
  Machine machine(BuildPreset("tpu-v5p", {8, 8, 8}));
  planner::TransformerConfig model;
  model.layers = layers;
  model.d_model = 8192;
  model.heads = 64;
  model.kv_heads = 8;
  model.head_dim = 128;
  model.d_ff = 28672;
  model.vocab = 32000;
  planner::TrainConfig train;
  train.batch = 256;
  train.seq_len = 4096;
  train.dtype = DType::kBF16;
  train.param_dtype = DType::kF32;
  train.optimizer = planner::Optimizer::kAdam;
  const std::vector<MeshAxis> axes = {{"fsdp", 128}, {"tp", 4}};
  const planner::LogicalRules rules({{"batch", {"fsdp"}},
                                     {"embed", {"fsdp"}},
                                     {"heads", {"tp"}},
                                     {"kv_heads", {"tp"}},
                                     {"mlp", {"tp"}},
                                     {"vocab", {"tp"}}},
                                    axes);
  PartitionEach(state, pricing, machine, planner::BuildTrainStep(model, train, axes, rules),
                /*lower=*/true);
}

BENCHMARK_CAPTURE(BM_TrainStep, llama70b_cold, Pricing::kCold)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep, llama70b_warm, Pricing::kWarm)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep, llama70b_bytes, Pricing::kBytes)->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(BM_Partition, layer80_cold, Pricing::kCold)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Partition, layer80_warm, Pricing::kWarm)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Partition, layer80_bytes, Pricing::kBytes)->Unit(benchmark::kMillisecond);

// Whole steps in the memory configuration of `shardsim run`, which partitions whole steps
// (--numerics on, --timing network): freed memory kept for reuse (KeepFreedMemory) instead of
// the allocator's default decay, which faults a 15,000-op program's op lists in again each
// time. Registered last: the setting lasts for the rest of the process.
void BM_TrainStepKeptMemory(benchmark::State& state, Pricing pricing) {
  KeepFreedMemory();
  BM_TrainStep(state, pricing);
}
BENCHMARK_CAPTURE(BM_TrainStepKeptMemory, llama70b_warm, Pricing::kWarm)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStepKeptMemory, llama70b_bytes, Pricing::kBytes)
    ->Unit(benchmark::kMillisecond);
// The size, a global program of about 10,000 ops: the same step with 53 layers (10,080
// ops after grad; the 80-layer step, with its casts and Adam's updates, has 15,183).
void BM_TrainStep53KeptMemory(benchmark::State& state, Pricing pricing) {
  KeepFreedMemory();
  BM_TrainStep(state, pricing, 53);
}
BENCHMARK_CAPTURE(BM_TrainStep53KeptMemory, llama70b_warm, Pricing::kWarm)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TrainStep53KeptMemory, llama70b_bytes, Pricing::kBytes)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shardsim
