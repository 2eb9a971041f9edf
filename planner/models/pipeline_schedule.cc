#include "planner/models/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardsim::planner {
namespace {

// One task: a microbatch's forward or backward through one chunk.
struct Task {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;  // Model chunk on its stage (virtual stage chunk * stages + stage).
};

// Megatron's interleaved order (schedules.py, forward_backward_pipelining_with_interleaving):
// the k-th forward (backward) of a stage runs chunk (k / p) % v (backward: v - 1 minus that)
// of microbatch (k / (p v)) p + k % p; a stage first runs (p - s - 1) 2 + (v - 1) p forwards,
// then one forward and one backward alternately, then the remaining backwards.
std::vector<Task> InterleavedOrder(int p, int m, int v, int s) {
  const int total = m * v;
  auto chunk_task = [&](int k, bool forward) {
    const int chunk = (k / p) % v;
    return Task{forward, (k / (p * v)) * p + k % p, forward ? chunk : v - 1 - chunk};
  };
  const int warmup = std::min((p - s - 1) * 2 + (v - 1) * p, total);
  std::vector<Task> order;
  int f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back(chunk_task(f, true));
  while (f < total) {
    order.push_back(chunk_task(f++, true));
    order.push_back(chunk_task(b++, false));
  }
  while (b < total) order.push_back(chunk_task(b++, false));
  return order;
}

std::vector<Task> Order(PipelineSchedule schedule, int p, int m, int v, int s) {
  std::vector<Task> order;
  switch (schedule) {
    case PipelineSchedule::kGpipe:
      for (int i = 0; i < m; ++i) order.push_back({true, i, 0});
      for (int i = m - 1; i >= 0; --i) order.push_back({false, i, 0});
      break;
    case PipelineSchedule::kOneFOneB: {
      const int warmup = std::min(p - s - 1, m);
      int f = 0, b = 0;
      for (; f < warmup; ++f) order.push_back({true, f, 0});
      while (f < m) {
        order.push_back({true, f++, 0});
        order.push_back({false, b++, 0});
      }
      while (b < m) order.push_back({false, b++, 0});
      break;
    }
    case PipelineSchedule::kInterleaved:
      order = InterleavedOrder(p, m, v, s);
      break;
  }
  return order;
}

}  // namespace

std::string_view PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  return "1f1b";
}

PipelineTimeline SimulatePipeline(int stages, int microbatches, int virtual_stages,
                                  PipelineSchedule schedule, const PipelineTaskTimes& times) {
  return SimulatePipeline(stages, microbatches, virtual_stages, schedule,
                          std::vector<PipelineTaskTimes>(
                              static_cast<size_t>(std::max(stages * virtual_stages, 0)), times));
}

PipelineTimeline SimulatePipeline(int stages, int microbatches, int virtual_stages,
                                  PipelineSchedule schedule,
                                  const std::vector<PipelineTaskTimes>& per_virtual_stage) {
  const int p = stages, m = microbatches, v = virtual_stages;
  if (p < 1 || m < 1 || v < 1) {
    throw std::invalid_argument("pipeline stages, microbatches and virtual stages must be >= 1");
  }
  if (schedule == PipelineSchedule::kInterleaved && m % p != 0) {
    throw std::invalid_argument("the interleaved schedule needs microbatches (" +
                                std::to_string(m) + ") to be a multiple of the stages (" +
                                std::to_string(p) + ")");
  }
  if (schedule != PipelineSchedule::kInterleaved && v != 1) {
    throw std::invalid_argument("virtual_stages > 1 needs the interleaved schedule");
  }
  const int virtual_count = p * v;
  if (per_virtual_stage.size() != static_cast<size_t>(virtual_count)) {
    throw std::invalid_argument("pipeline: one task time per virtual stage");
  }
  // When each (microbatch, virtual stage)'s forward and backward finished (-1: not yet).
  std::vector<std::vector<int64_t>> fwd_done(m, std::vector<int64_t>(virtual_count, -1));
  std::vector<std::vector<int64_t>> bwd_done(m, std::vector<int64_t>(virtual_count, -1));
  std::vector<std::vector<Task>> orders;
  for (int s = 0; s < p; ++s) orders.push_back(Order(schedule, p, m, v, s));
  std::vector<size_t> next(p, 0);
  std::vector<int64_t> free_at(p, 0);
  PipelineTimeline t;
  t.busy.assign(p, Time());
  t.in_flight.assign(p, 0);
  t.runs.resize(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) t.runs[static_cast<size_t>(s)].reserve(orders[s].size());
  std::vector<int> holding(p, 0);

  // Each pass runs every stage's next task whose input is ready; stages wait on each other,
  // so a pass without progress means the orders deadlock (a broken schedule).
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < orders[s].size()) {
        const Task& task = orders[s][next[s]];
        const int vs = task.chunk * p + s;
        const PipelineTaskTimes& times = per_virtual_stage[static_cast<size_t>(vs)];
        const int64_t send = times.send.picoseconds();
        int64_t ready = 0;
        if (task.forward) {
          if (vs > 0) {
            const int64_t prev = fwd_done[task.microbatch][vs - 1];
            if (prev < 0) break;
            ready = prev + send;
          }
        } else {
          const int64_t own = fwd_done[task.microbatch][vs];
          if (own < 0) break;
          ready = own;
          if (vs + 1 < virtual_count) {
            const int64_t after = bwd_done[task.microbatch][vs + 1];
            if (after < 0) break;
            ready = std::max(ready, after + send);
          }
        }
        const Time duration = task.forward ? times.forward : times.backward;
        const int64_t start = std::max(free_at[s], ready);
        free_at[s] = start + duration.picoseconds();
        (task.forward ? fwd_done : bwd_done)[task.microbatch][vs] = free_at[s];
        t.runs[static_cast<size_t>(s)].push_back({task.microbatch, task.chunk, task.forward,
                                                  Time::Picoseconds(start),
                                                  Time::Picoseconds(free_at[s])});
        t.busy[s] += duration;
        holding[s] += task.forward ? 1 : -1;
        t.in_flight[s] = std::max(t.in_flight[s], holding[s]);
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (next[s] != orders[s].size()) {
      throw std::logic_error("internal error: the " + std::string(PipelineScheduleName(schedule)) +
                             " schedule deadlocked");
    }
    t.end = std::max(t.end, Time::Picoseconds(free_at[s]));
  }
  for (int s = 0; s < p; ++s) t.bubble = std::max(t.bubble, t.end - t.busy[s]);
  return t;
}

}  // namespace shardsim::planner
