// Throughput of the collective algorithms on their own (no executor): one all-reduce per
// iteration on a fresh Simulator/Network, reporting simulated transfers and engine events
// per second of wall time; with numerics on, also GB/s of member data combined.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/collective.h"
#include "collectives/mesh.h"
#include "collectives/placement.h"
#include "sim/simulator.h"
#include "topology/build.h"
#include "topology/network.h"
#include "topology/routing.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// A machine and the group an all-reduce runs on (members in mesh order, first axis major).
struct Setup {
  Topology topo;
  std::vector<MeshAxis> axes;
  std::vector<int> axis_sizes;
  std::vector<VertexId> members;
};

Setup Make(Topology topo, std::vector<MeshAxis> axes) {
  std::vector<int> devices = DefaultPlacement(axes, topo);
  Setup s{std::move(topo), axes, {}, {}};
  for (const MeshAxis& a : axes) s.axis_sizes.push_back(a.size);
  for (int d : devices) s.members.push_back(s.topo.device_vertex(d));
  return s;
}

// A ring of n TPU v5e-like chips (45 GB/s per direction, 1 us per hop).
Setup Ring(int n) {
  return Make(BuildTorus({n}, {true}, Bandwidth::GBps(45), Time::Microseconds(1), LinkKind::kIci,
                         DeviceSpec{}, "ring"),
              {{"r", n}});
}

// A TPU v5e slice (wraparound on dimensions of length 16).
Setup V5e(int x, int y) {
  HardwareSpec spec;
  spec.preset = "tpu-v5e";
  spec.shape = {x, y};
  return Make(BuildHardware(spec), {{"x", x}, {"y", y}});
}

// One 8-GPU H100 node (NVSwitch).
Setup H100Node() {
  HardwareSpec spec;
  spec.preset = "h100-dgx";
  return Make(BuildHardware(spec), {{"g", 8}});
}

// All-reduce of `bytes` (f32) per member with `algorithm`, numerics off.
void RunAllReduce(benchmark::State& state, const Setup& s, const std::string& algorithm,
                  Bytes bytes) {
  int64_t transfers = 0, events = 0;
  std::string resolved;
  for (auto _ : state) {
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(s.topo);
    Network network(sim, s.topo, *router);
    CollectiveJob job;
    job.kind = CollectiveKind::kAllReduce;
    job.members = s.members;
    job.total = job.block = bytes.count() / 4;
    job.numerics = false;
    job.label = "allreduce";
    int done = 0;
    job.on_member_done = [&done](int) { ++done; };
    auto algo = MakeAlgorithm(algorithm, network, job, s.axis_sizes, &resolved);
    algo->Start();
    sim.Run();
    if (done != job.size()) {
      state.SkipWithError("not every member finished");
      return;
    }
    transfers += network.transfers_started();
    events += static_cast<int64_t>(sim.events_dispatched());
  }
  state.SetLabel(resolved);
  state.counters["transfers_per_s"] =
      benchmark::Counter(static_cast<double>(transfers), benchmark::Counter::kIsRate);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["transfers"] =
      static_cast<double>(transfers) / static_cast<double>(state.iterations());
}

void BM_AllReduceRing64_1MiB(benchmark::State& state) {
  static const Setup s = Ring(64);
  RunAllReduce(state, s, "ring", Bytes::MiB(1));
}
BENCHMARK(BM_AllReduceRing64_1MiB)->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();

void BM_AllReduceRing64_1MiB_Bidir(benchmark::State& state) {
  static const Setup s = Ring(64);
  RunAllReduce(state, s, "bidirectional_ring", Bytes::MiB(1));
}
BENCHMARK(BM_AllReduceRing64_1MiB_Bidir)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

void BM_AllReduceTorus16x16_64MiB(benchmark::State& state) {
  static const Setup s = V5e(16, 16);
  RunAllReduce(state, s, "torus_2d", Bytes::MiB(64));
}
BENCHMARK(BM_AllReduceTorus16x16_64MiB)->Unit(benchmark::kMillisecond)->MinTime(0.2)->UseRealTime();

void BM_AllReduceSwitch8_64MiB(benchmark::State& state) {
  static const Setup s = H100Node();
  RunAllReduce(state, s, "direct", Bytes::MiB(64));
}
BENCHMARK(BM_AllReduceSwitch8_64MiB)->Unit(benchmark::kMicrosecond)->MinTime(0.2)->UseRealTime();

// All-reduce with real data: 8 members, `range(0)` KiB each, fresh inputs every iteration
// (copied outside the timed region). GB/s counts every member's input bytes once.
void RunAllReduceNumerics(benchmark::State& state, const Setup& s, const std::string& algorithm) {
  const int64_t elements = state.range(0) * 1024 / 4;
  const int g = static_cast<int>(s.members.size());
  std::vector<std::vector<float>> pristine(g, std::vector<float>(elements));
  for (int m = 0; m < g; ++m) {
    for (int64_t i = 0; i < elements; ++i) pristine[m][i] = static_cast<float>((i + m) % 13) - 6;
  }
  std::vector<std::vector<float>> in, out;
  int64_t transfers = 0, events = 0;
  std::string resolved;
  for (auto _ : state) {
    state.PauseTiming();
    in = pristine;
    out.assign(g, {});
    state.ResumeTiming();
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(s.topo);
    Network network(sim, s.topo, *router);
    CollectiveJob job;
    job.kind = CollectiveKind::kAllReduce;
    job.members = s.members;
    job.total = job.block = elements;
    job.numerics = true;
    job.in = &in;
    job.out = &out;
    job.label = "allreduce";
    int done = 0;
    job.on_member_done = [&done](int) { ++done; };
    auto algo = MakeAlgorithm(algorithm, network, job, s.axis_sizes, &resolved);
    algo->Start();
    sim.Run();
    if (done != g || static_cast<int64_t>(out[g - 1].size()) != elements) {
      state.SkipWithError("not every member finished");
      return;
    }
    benchmark::DoNotOptimize(out[g - 1].data());
    transfers += network.transfers_started();
    events += static_cast<int64_t>(sim.events_dispatched());
  }
  // Element 0: sum over m of (m % 13) - 6.
  float want = 0;
  for (int m = 0; m < g; ++m) want += static_cast<float>(m % 13) - 6;
  if (out[0][0] != want) state.SkipWithError("wrong sum");
  state.SetLabel(resolved);
  const double iters = static_cast<double>(state.iterations());
  state.counters["transfers_per_s"] =
      benchmark::Counter(static_cast<double>(transfers), benchmark::Counter::kIsRate);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
  state.counters["GBps"] =
      benchmark::Counter(static_cast<double>(g) * static_cast<double>(elements) * 4 * 1e-9 * iters,
                         benchmark::Counter::kIsRate);
}

void BM_AllReduceNumericsRing8(benchmark::State& state) {
  static const Setup s = Ring(8);
  RunAllReduceNumerics(state, s, "ring");
}
BENCHMARK(BM_AllReduceNumericsRing8)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

void BM_AllReduceNumericsSwitch8(benchmark::State& state) {
  static const Setup s = H100Node();
  RunAllReduceNumerics(state, s, "direct");
}
BENCHMARK(BM_AllReduceNumericsSwitch8)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2)
    ->UseRealTime();

}  // namespace
}  // namespace shardsim
