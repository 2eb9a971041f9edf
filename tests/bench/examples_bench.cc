// End-to-end throughput of the seed examples (configs/examples): each run file is loaded,
// placed and lowered once, then every iteration runs it through RunProgram as `shardsim run`
// does (a fresh simulator and network on the same Machine), with numerics on
// (real data, OpenBLAS sgemm) and off (timing only). BM_Sgemm gives this machine's sgemm rate
// for comparison with the numerics runs' GFLOP/s.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "collectives/local_ops.h"
#include "collectives/lowering.h"
#include "collectives/mesh.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "sim/cli/run_file.h"
#include "topology/build.h"

#ifndef SHARDSIM_SOURCE_DIR
#error "SHARDSIM_SOURCE_DIR must name the source tree"
#endif

namespace shardsim {
namespace {

const char* const kExamples[] = {
    "naive_matmul",
    "fsdp_matmul",
    "fsdp_ppermute_unidirectional",
    "fsdp_ppermute_bidirectional",
    "matmul_psum_scatter",
    "matmul_psum_scatter_overlapped",
    "matmul_psum_scatter_bidirectional",
    "mlp_dp",
    "mlp_tp",
    "mlp_fsdp_tp",
};

// Everything a run needs that does not change between iterations: the machine wired once and
// the program lowered once (lower once, run many times).
struct Loaded {
  RunFile file;
  std::unique_ptr<Machine> machine;
  Mesh mesh;
  LoweredProgram lowered;
  double matmul_flops = 0;  // 2*M*N*K of every matmul/einsum, summed over all devices.
};

std::unique_ptr<Loaded> Load(const std::string& name) {
  std::string path = std::string(SHARDSIM_SOURCE_DIR) + "/configs/examples/" + name + ".yaml";
  RunFile file = LoadRunFile(path);
  auto machine = std::make_unique<Machine>(BuildHardware(file.hardware));
  Mesh mesh = PlaceMesh(*machine, file.program->mesh_axes, file.program->mesh_devices);
  auto l = std::make_unique<Loaded>(
      Loaded{std::move(file), std::move(machine), std::move(mesh), LoweredProgram{}, 0});
  const ProgramSpec& program = *l->file.program;
  l->lowered = LowerProgram(l->mesh, program, l->file.options.algorithms);
  CheckOutputs(l->mesh, program, l->lowered);
  // FLOPs from the lowered program's local shapes (collective matmuls already expanded).
  for (const LoweredOp& op : l->lowered.ops) {
    if (op.collective) continue;
    if (op.spec->kind != OpKind::kMatmul && op.spec->kind != OpKind::kEinsum) continue;
    std::vector<const Array*> ins, outs;
    for (int v : op.in_values) ins.push_back(&l->lowered.values[v]);
    for (int v : op.out_values) outs.push_back(&l->lowered.values[v]);
    l->matmul_flops += LocalOpCost(*op.spec, ins, outs).flops;
  }
  l->matmul_flops *= l->mesh.size();
  return l;
}

void BM_Example(benchmark::State& state, const std::string& name, bool numerics) {
  std::unique_ptr<Loaded> l;
  try {
    l = Load(name);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  const ProgramSpec& program = *l->file.program;
  RunConfig config;
  config.numerics = numerics;
  config.algorithms = l->file.options.algorithms;
  config.chunk_size = l->file.options.chunk_size;
  config.base_dir = std::filesystem::path(l->file.path).parent_path().string();

  int64_t events = 0;
  for (auto _ : state) {
    RunResult r = RunProgram(*l->machine, l->mesh, program, config, &l->lowered);
    benchmark::DoNotOptimize(r.end);
    events += static_cast<int64_t>(r.events);
  }
  const double iters = static_cast<double>(state.iterations());
  // Ops simulated: every lowered op on every device.
  const double ops = static_cast<double>(l->lowered.ops.size()) * l->mesh.size();
  state.counters["ops_per_s"] = benchmark::Counter(ops * iters, benchmark::Counter::kIsRate);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["ops"] = ops;
  if (numerics) {
    // Counter in GFLOP so the rate reads directly as GFLOP/s (per wall second: UseRealTime).
    state.counters["GFLOPs"] =
        benchmark::Counter(l->matmul_flops * 1e-9 * iters, benchmark::Counter::kIsRate);
  }
}

int RegisterExamples() {
  for (const char* name : kExamples) {
    benchmark::RegisterBenchmark((std::string("BM_Example/") + name + "/numerics").c_str(),
                                 [name](benchmark::State& s) { BM_Example(s, name, true); })
        ->Unit(benchmark::kMillisecond)
        ->MinTime(0.2)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("BM_Example/") + name + "/timing").c_str(),
                                 [name](benchmark::State& s) { BM_Example(s, name, false); })
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.2)
        ->UseRealTime();
  }
  return 0;
}
const int kRegistered = RegisterExamples();

// OpenBLAS sgemm, row-major C[M,N] = A[M,K] @ B[K,N], single-threaded as the numerics runs
// call it (local_ops.cc): the ceiling for their GFLOP/s.
void BM_Sgemm(benchmark::State& state) {
  openblas_set_num_threads(1);
  const int m = static_cast<int>(state.range(0));
  const int n = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n),
      c(static_cast<size_t>(m) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
// M x N x K: the naive_matmul shapes (x f32[1024,4096] @ w f32[4096,256]), one step of
// scaling_book_lhs (512x1024 @ 1024x8192) and a square one.
BENCHMARK(BM_Sgemm)
    ->Args({1024, 256, 4096})
    ->Args({512, 8192, 1024})
    ->Args({2048, 2048, 2048})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

}  // namespace
}  // namespace shardsim
