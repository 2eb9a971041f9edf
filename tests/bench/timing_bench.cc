// The timing path for search (Release, `build/tests/bench/timing_bench`): wall time to simulate
// a transformer training step's timing, the elementwise chain on the 8960-chip pod, and the
// network simulation a cold plan search pays for one data-axis all-reduce on the pod.
// Counters: simulated_us (the step time found), devices_simulated (timeline classes), and for
// the step the full network simulation's time of the same program (full_us, measured once)
// so the cached path's error is visible beside its speed (the full simulation is chaotic on
// this step: BM_TransformerStepEnsemble compares against an ensemble of them).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

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
// plans); otherwise each iteration starts cold: lowering, a fresh cache, and the run, its
// distinct collectives priced on `jobs` threads.
void BM_TransformerStep(benchmark::State& state, int layers, TimingPath path, bool warm,
                        int jobs = 1) {
  Machine machine(BuildPreset("tpu-v5p", {8, 8, 8}));
  ProgramSpec program = testing::BuildTransformerStep(Llama70BOn512(layers));
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  NetworkCollectiveModel network_model(machine);
  CachedCollectiveModel cache(network_model);
  RunConfig config;
  config.timing = path;
  config.jobs = jobs;
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

// The full simulation of this step is chaotic: a link latency a few picoseconds longer (1e-6
// relative) moves the step time by up to 2%, while the cached path moves by nanoseconds. So the
// cached path is compared with the ensemble of full simulations with latency + 0..9 ps: their
// mean (full_mean_us), range (full_min_us, full_max_us), and the cached path's error against
// the mean (error_pct) and the default latency (error_default_pct).
void BM_TransformerStepEnsemble(benchmark::State& state, int layers) {
  ProgramSpec program = testing::BuildTransformerStep(Llama70BOn512(layers));
  std::vector<double> full;
  double cached = 0;
  for (auto _ : state) {
    full.clear();
    for (int ps = 0; ps < 10; ++ps) {
      HardwareSpec spec;
      spec.preset = "tpu-v5p";
      spec.shape = {8, 8, 8};
      Machine base(BuildHardware(spec));
      spec.link.latency = base.topology().links().front().latency + Time::Picoseconds(ps);
      Machine machine(BuildHardware(spec));
      Mesh mesh = PlaceMesh(machine, program.mesh_axes);
      full.push_back(RunProgram(machine, mesh, program, RunConfig{}).end.seconds());
      if (ps == 0) {
        RunConfig config;
        config.timing = TimingPath::kCached;
        cached = RunProgram(machine, mesh, program, config).end.seconds();
      }
    }
  }
  double mean = 0;
  for (double f : full) mean += f / static_cast<double>(full.size());
  state.counters["cached_us"] = cached * 1e6;
  state.counters["full_mean_us"] = mean * 1e6;
  state.counters["full_min_us"] = *std::min_element(full.begin(), full.end()) * 1e6;
  state.counters["full_max_us"] = *std::max_element(full.begin(), full.end()) * 1e6;
  state.counters["error_pct"] = 100.0 * (cached - mean) / mean;
  state.counters["error_default_pct"] = 100.0 * (cached - full[0]) / full[0];
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

// One cold collective of the pod's plan search: the gradient all-reduce (bf16, 262,144 elements
// a member) over data = 280 of data 280 x fsdp 8 x tensor 4, placed as the search places it:
// 32 rings of 280 chips strided over all three torus dimensions, no translation mapping them
// onto each other, so all 8960 chips are simulated (558 ring steps each). Counters: the
// simulated time and the transfers a second of wall time.
void BM_DataAxisAllReduceOnPod(benchmark::State& state) {
  Machine machine(BuildPreset("tpu-v5p", {16, 20, 28}));
  Mesh mesh = PlaceMesh(machine, {{"data", 280}, {"fsdp", 8}, {"tensor", 4}});
  CollectiveRequest request;
  request.kind = CollectiveKind::kAllReduce;
  request.dtype = DType::kBF16;
  request.elements = 262144;
  request.axes = {0};
  Time simulated;
  for (auto _ : state) {
    NetworkCollectiveModel model(machine, /*translate_groups=*/true);
    simulated = model.Estimate(mesh, request)->longest();
  }
  state.counters["simulated_us"] = simulated.microseconds();
  // Each of the 8960 members sends 2 x 279 chunks.
  state.counters["transfers_per_s"] = benchmark::Counter(
      8960.0 * 2 * 279 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_TransformerStep, layer1_cached, 1, TimingPath::kCached, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer1_cached_jobs2, 1, TimingPath::kCached, false, 2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TransformerStep, layer1_cached_warm, 1, TimingPath::kCached, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer2_cached, 2, TimingPath::kCached, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer80_cached, 80, TimingPath::kCached, false)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer80_cached_jobs2, 80, TimingPath::kCached, false, 2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TransformerStep, layer80_cached_warm, 80, TimingPath::kCached, true)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TransformerStep, layer1_network, 1, TimingPath::kNetwork, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);
// The full network simulation of the 80-layer step, for comparison, and the ensembles of full
// simulations of 1, 2 and 8 layers: they take minutes, so they are registered only when
// SHARDSIM_BENCH_SLOW is set.
const bool kSlowRegistered = [] {
  if (std::getenv("SHARDSIM_BENCH_SLOW") == nullptr) return false;
  benchmark::RegisterBenchmark(
      "BM_TransformerStep/layer80_network",
      [](benchmark::State& s) { BM_TransformerStep(s, 80, TimingPath::kNetwork, false); })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  for (int layers : {1, 2, 8}) {
    benchmark::RegisterBenchmark(
        ("BM_TransformerStepEnsemble/layer" + std::to_string(layers)).c_str(),
        [layers](benchmark::State& s) { BM_TransformerStepEnsemble(s, layers); })
        ->Unit(benchmark::kSecond)
        ->Iterations(1);
  }
  return true;
}();
BENCHMARK_CAPTURE(BM_ElementwiseOnPod, cached, TimingPath::kCached)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DataAxisAllReduceOnPod)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_ElementwiseOnPod, network, TimingPath::kNetwork)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
}  // namespace shardsim
