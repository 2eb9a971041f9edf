// Throughput of the transfer model: transfers (and engine events) per second of wall time.
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>

#include "sim/simulator.h"
#include "topology/network.h"
#include "topology/routing.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// A ring pattern like a ring all-gather: every device sends a chunk to its right neighbour,
// and sends the next chunk when the previous one from its left neighbour arrived; `steps`
// rounds. One flow per link at a time: the fast path without rebalancing.
void BM_RingSteps(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int steps = 64;
  Topology topo = BuildTorus({n}, {true}, Bandwidth::GBps(45), Time::Microseconds(1),
                             LinkKind::kIci, DeviceSpec{}, "ring");
  int64_t transfers = 0, events = 0;
  for (auto _ : state) {
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(topo);
    Network net(sim, topo, *router);
    std::vector<int> received(n, 0);
    std::function<void(int, int)> send = [&](int d, int step) {
      int right = (d + 1) % n;
      net.Start(topo.device_vertex(d), topo.device_vertex(right), Bytes::KiB(16), "chunk",
                [&, right, step] {
                  if (step + 1 < steps) send(right, step + 1);
                });
    };
    for (int d = 0; d < n; ++d) send(d, 0);
    sim.Run();
    transfers += net.transfers_started();
    events += static_cast<int64_t>(sim.events_dispatched());
  }
  state.counters["transfers_per_s"] =
      benchmark::Counter(static_cast<double>(transfers), benchmark::Counter::kIsRate);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_RingSteps)->Arg(64)->Arg(4096)->Unit(benchmark::kMillisecond);

// Every device of `topo` sends `bytes` to every other at once, so flows share links and every
// arrival and departure rebalances a large component.
void RunAllToAll(benchmark::State& state, const Topology& topo, Bytes bytes) {
  const int n = topo.num_devices();
  int64_t transfers = 0, events = 0;
  for (auto _ : state) {
    Simulator sim;
    std::unique_ptr<Router> router = MakeRouter(topo);
    Network net(sim, topo, *router);
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        if (a != b) net.Start(topo.device_vertex(a), topo.device_vertex(b), bytes, "a2a", [] {});
      }
    }
    sim.Run();
    transfers += net.transfers_started();
    events += static_cast<int64_t>(sim.events_dispatched());
  }
  state.counters["transfers_per_s"] =
      benchmark::Counter(static_cast<double>(transfers), benchmark::Counter::kIsRate);
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}

// All-to-all on a k x k torus with wraparound, 64 KiB per pair.
void BM_AllToAllTorus(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  RunAllToAll(state,
              BuildTorus({k, k}, {true, true}, Bandwidth::GBps(45), Time::Microseconds(1),
                         LinkKind::kIci, DeviceSpec{}, "torus"),
              Bytes::KiB(64));
}
BENCHMARK(BM_AllToAllTorus)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond);

// All-to-all on a k x k torus without wraparound (a 2D mesh of lines), 4 KiB per pair: routes
// are long, links carry hundreds of flows (24: 576 devices, 331k flows, the transfers of
// configs/scale/line_torus24_alltoall.yaml), and removing a flow from its links was linear in
// their flow counts before it became O(1).
void BM_AllToAllLineTorus(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  RunAllToAll(state,
              BuildTorus({k, k}, {false, false}, Bandwidth::GBps(45), Time::Microseconds(1),
                         LinkKind::kIci, DeviceSpec{}, "line-torus"),
              Bytes::KiB(4));
}
BENCHMARK(BM_AllToAllLineTorus)->Arg(12)->Arg(24)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shardsim
