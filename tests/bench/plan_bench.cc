// Plan search speed (Release, `build/tests/bench/plan_bench`), plans simulated per second
// (counter plans_per_s) with --jobs 2 on this 2-core machine:
// - cold: a fresh search, every collective's network simulation made (what `shardsim plan`
//   does): GPT-3 175B on 1024 A100 GPUs (configs/plans/gpt3_175b_a100.yaml's space);
// - warm: the same search again with the collective timings the first one priced and the
//   steps its workers built and expanded (SearchCaches), so the figure is the evaluation of
//   plans alone (partition, schedule, lower, one timeline per class), as in a long search
//   where a worker's builds serve thousands of plans: Llama-3-70B on 2048 v5p chips
//   (configs/plans/llama3_70b_v5p.yaml's space) and, with SHARDSIM_BENCH_SLOW=1 (its cold
//   search takes minutes), on the 8960-chip pod;
// - stored: a fresh search (its own caches and machines, as a new `shardsim plan --cache DIR`
//   process) reading every collective's timing from a store an earlier search filled: the same
//   two spaces.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "planner/models/model_presets.h"
#include "planner/search/plan_search.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

struct Workload {
  std::string preset;
  std::vector<int> shape;
  int nodes = 0;
  std::string model;
  TrainConfig train;
  SearchSpace space;
};

TrainConfig Train(int64_t batch, int64_t seq) {
  TrainConfig t;
  t.batch = batch;
  t.seq_len = seq;
  t.optimizer = Optimizer::kAdam;
  t.dtype = DType::kBF16;
  return t;
}

Workload Llama70bV5p(std::vector<int> shape, int64_t batch, int64_t seq) {
  Workload w{"tpu-v5p", std::move(shape), 0, "llama-3-70b", Train(batch, seq), {}};
  w.space.axes = {"data", "fsdp", "tensor"};
  return w;
}

Workload Gpt3A100() {
  Workload w{"a100-dgx", {}, 128, "gpt3-175b", Train(1536, 2048), {}};
  w.space.axes = {"data", "stage", "tensor"};
  w.space.remat = {RematPolicy::kSelective, RematPolicy::kFull};
  w.space.microbatches = {8, 16, 32, 48, 96};
  return w;
}

SearchOptions Options(const Workload& w) {
  SearchOptions o;
  o.jobs = 2;
  o.confirm = 10;  // As `shardsim plan` confirms its table (--top 10): in the time, not the count.
  o.make_machine = [&w] {
    return std::make_unique<Machine>(BuildPreset(w.preset, w.shape, w.nodes));
  };
  return o;
}

void Report(benchmark::State& state, int64_t plans) {
  state.counters["plans"] = static_cast<double>(plans);
  state.counters["plans_per_s"] =
      benchmark::Counter(static_cast<double>(plans), benchmark::Counter::kIsRate);
}

void BM_PlanSearchCold(benchmark::State& state, Workload w) {
  const TransformerConfig model = FindModelPreset(w.model)->config;
  int64_t plans = 0;
  for (auto _ : state) {
    const SearchResult r = SearchPlans(model, w.train, w.space, Options(w));
    plans += r.simulated;
  }
  Report(state, plans);
}

void BM_PlanSearchWarm(benchmark::State& state, Workload w, bool slow) {
  if (slow && std::getenv("SHARDSIM_BENCH_SLOW") == nullptr) {
    state.SkipWithError("set SHARDSIM_BENCH_SLOW=1 (the cold search first takes minutes)");
    return;
  }
  const TransformerConfig model = FindModelPreset(w.model)->config;
  Machine machine(BuildPreset(w.preset, w.shape, w.nodes));
  SearchCaches caches(machine);
  SearchOptions options = Options(w);
  options.caches = &caches;
  SearchPlans(model, w.train, w.space, options);  // Prices every collective once.
  int64_t plans = 0;
  for (auto _ : state) {
    const SearchResult r = SearchPlans(model, w.train, w.space, options);
    plans += r.simulated;
  }
  Report(state, plans);
}

void BM_PlanSearchStored(benchmark::State& state, Workload w, bool slow) {
  if (slow && std::getenv("SHARDSIM_BENCH_SLOW") == nullptr) {
    state.SkipWithError(
        "set SHARDSIM_BENCH_SLOW=1 (the search that fills the store takes minutes)");
    return;
  }
  const TransformerConfig model = FindModelPreset(w.model)->config;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("shardsim_bench_store_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    const Machine machine(BuildPreset(w.preset, w.shape, w.nodes));
    const TimingStore store(dir.string(), "bench", machine.topology());
    SearchOptions options = Options(w);
    options.store = &store;
    SearchPlans(model, w.train, w.space, options);  // Fills the store.
    int64_t plans = 0;
    for (auto _ : state) {
      const SearchResult r = SearchPlans(model, w.train, w.space, options);
      plans += r.simulated;
    }
    Report(state, plans);
  }
  std::filesystem::remove_all(dir);
}

BENCHMARK_CAPTURE(BM_PlanSearchCold, gpt3_175b_a100_1024, Gpt3A100())
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_PlanSearchWarm, gpt3_175b_a100_1024, Gpt3A100(), false)
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(2);
BENCHMARK_CAPTURE(BM_PlanSearchWarm, llama3_70b_v5p_2048, Llama70bV5p({8, 16, 16}, 512, 8192),
                  false)
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(1);
// Twenty warm searches of the pod's 23 plans: one takes half a second, too short to time.
BENCHMARK_CAPTURE(BM_PlanSearchWarm, llama3_70b_v5p_pod_8960, Llama70bV5p({16, 20, 28}, 2240, 8192),
                  true)
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(20);

BENCHMARK_CAPTURE(BM_PlanSearchStored, llama3_70b_v5p_2048, Llama70bV5p({8, 16, 16}, 512, 8192),
                  false)
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(3);
BENCHMARK_CAPTURE(BM_PlanSearchStored, llama3_70b_v5p_pod_8960,
                  Llama70bV5p({16, 20, 28}, 2240, 8192), true)
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(3);

}  // namespace
}  // namespace shardsim::planner
