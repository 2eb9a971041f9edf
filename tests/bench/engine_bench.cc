// Schedule+dispatch throughput of the event engine (the "hold" model of event-set benchmarks):
// `pending` events are in flight; each dispatched event schedules one successor at a
// pseudo-random future time, so the heap stays at `pending` entries.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "sim/simulator.h"

namespace shardsim {
namespace {

// A small xorshift generator: deterministic and cheap next to the engine.
struct XorShift {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t Next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

struct Hold {
  Simulator* sim;
  XorShift* rng;
  int64_t* remaining;
  void operator()() const {
    if (--*remaining <= 0) return;
    Time delay = Time::Picoseconds(static_cast<int64_t>(rng->Next() % 1'000'000));
    sim->Schedule(delay, Hold{sim, rng, remaining});
  }
};

void BM_HoldModel(benchmark::State& state) {
  const int64_t pending = state.range(0);
  const int64_t events_per_iter = 1'000'000;
  for (auto _ : state) {
    Simulator sim;
    XorShift rng;
    int64_t remaining = events_per_iter;
    for (int64_t i = 0; i < pending; ++i) {
      sim.Schedule(Time::Picoseconds(static_cast<int64_t>(rng.Next() % 1'000'000)),
                   Hold{&sim, &rng, &remaining});
    }
    sim.Run();
    benchmark::DoNotOptimize(sim.events_dispatched());
    state.counters["events"] = static_cast<double>(sim.events_dispatched());
  }
  // Each dispatched event is one schedule and one dispatch.
  state.SetItemsProcessed(state.iterations() * (events_per_iter + pending - 1));
}
BENCHMARK(BM_HoldModel)->Arg(16)->Arg(1024)->Arg(65536)->Unit(benchmark::kMillisecond);

// Schedule a burst of events at random times, then dispatch them all.
void BM_ScheduleThenRun(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    Simulator sim;
    XorShift rng;
    int64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      sim.Schedule(Time::Picoseconds(static_cast<int64_t>(rng.Next() % 1'000'000'000)),
                   [&sum] { ++sum; });
    }
    sim.Run();
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ScheduleThenRun)->Arg(1 << 20)->Unit(benchmark::kMillisecond);

// Schedule and cancel: half the events are cancelled before they run.
void BM_ScheduleCancel(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<EventId> ids(n);
  for (auto _ : state) {
    Simulator sim;
    XorShift rng;
    int64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = sim.Schedule(Time::Picoseconds(static_cast<int64_t>(rng.Next() % 1'000'000)),
                            [&sum] { ++sum; });
    }
    for (int64_t i = 0; i < n; i += 2) sim.Cancel(ids[i]);
    sim.Run();
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ScheduleCancel)->Arg(1 << 20)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shardsim
