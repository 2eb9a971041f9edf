// The timing path for search (Release, `build/tests/bench/timing_bench`): wall time to simulate
// a transformer training step's timing, and the elementwise chain on the 8960-chip pod.
// Counters: simulated_us (the step time found), devices_simulated (timeline classes), and for
// the step the full network simulation's time of the same program (full_us, measured once)
// so the cached path's error is visible beside its speed.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "collectives/ir/program_builder.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "collectives/timing/collective_cost_model.h"
#include "tests/support/transformer_step.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

// Llama-3-70B-shaped layers on TPU v5p 8x8x8 (512 chips), FSDP 128 x TP 4, 256 sequences of
// 4096 tokens (2 per device), bf16.
testing::TransformerShape Llama70BOn512(int layers) {
  testing::TransformerShape s;
  s.batch = 256;
  s.seq = 4096;
  s.layers = layers;
  s.fsdp = 128;
  s.tp = 4;
  return s;
}

// `warm`: the collective cache is shared across iterations (as a search shares it across
// plans); otherwise each iteration starts cold: lowering, a fresh cache, and the run.
void BM_TransformerStep(benchmark::State& state, int layers, TimingPath path, bool warm) {
  Machine machine(BuildPreset("tpu-v5p", {8, 8, 8}));
  ProgramSpec program = testing::BuildTransformerStep(Llama70BOn512(layers));
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  NetworkCollectiveModel network_model(machine);
  CachedCollectiveModel cache(network_model);
  RunConfig config;
  config.timing = path;
  if (warm) config.collective_model = &cache;
  RunResult r;
  for (auto _ : state) {
    LoweredProgram lowered = LowerProgram(mesh, program);
    r = RunProgram(machine, mesh, program, config, &lowered);
  }
  state.counters["ops"] = static_cast<double>(program.ops.size());
  state.counters["simulated_us"] = r.end.microseconds();
  state.counters["devices_simulated"] = r.simulated_devices;
  state.counters["events"] = static_cast<double>(r.events);
  if (warm) {
    state.counters["collective_sims"] = static_cast<double>(network_model.simulations());
    state.counters["translated"] = static_cast<double>(network_model.translated());
  }
  if (path == TimingPath::kCached && layers <= 2) {
    RunResult full = RunProgram(machine, mesh, program, RunConfig{});
    state.counters["full_us"] = full.end.microseconds();
    state.counters["error_pct"] =
        100.0 * std::fabs(r.end.seconds() - full.end.seconds()) / full.end.seconds();
  }
}

// 1,000 elementwise adds on every chip of a TPU v5p pod (16x20x28 = 8960 chips).
void BM_ElementwiseOnPod(benchmark::State& state, TimingPath path) {
  Machine machine(BuildPreset("tpu-v5p", {16, 20, 28}));
  ProgramBuilder b({{"x", 16}, {"y", 20}, {"z", 28}});
  std::string v =
      b.Input("a", {16 * 1024, 20 * 1024, 28}, DType::kBF16, PartitionSpec{{{"x"}, {"y"}, {"z"}}});
  for (int i = 0; i < 1000; ++i) v = b.Binary(OpKind::kAdd, v, v);
  b.Output(v, PartitionSpec{{{"x"}, {"y"}, {"z"}}});
  ProgramSpec program = std::move(b).Build();
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.timing = path;
  RunResult r;
  for (auto _ : state) {
    LoweredProgram lowered = LowerProgram(mesh, program);
    r = RunProgram(machine, mesh, program, config, &lowered);
  }
  state.counters["simulated_us"] = r.end.microseconds();
  state.counters["devices_simulated"] = r.simulated_devices;
}

BENCHMARK_CAPTURE(BM_TransformerStep, layer1_cached, 1, TimingPath::kCached, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer1_cached_warm, 1, TimingPath::kCached, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer2_cached, 2, TimingPath::kCached, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer80_cached, 80, TimingPath::kCached, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer80_cached_warm, 80, TimingPath::kCached, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer1_network, 1, TimingPath::kNetwork, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
// The full network simulation of the 80-layer step, for comparison: it takes minutes, so it
// is registered only when SHARDSIM_BENCH_SLOW is set.
const bool kSlowRegistered = [] {
  if (std::getenv("SHARDSIM_BENCH_SLOW") == nullptr) return false;
  benchmark::RegisterBenchmark(
      "BM_TransformerStep/layer80_network",
      [](benchmark::State& s) { BM_TransformerStep(s, 80, TimingPath::kNetwork, false); })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  return true;
}();
BENCHMARK_CAPTURE(BM_ElementwiseOnPod, cached, TimingPath::kCached)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ElementwiseOnPod, network, TimingPath::kNetwork)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
}  // namespace shardsim
