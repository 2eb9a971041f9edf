// An observer that writes what a simulation reports as a Chrome/Perfetto JSON trace.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sim/observer.h"

namespace shardsim {

// Collects processes, tracks, slices, flows and counters, and renders them as Chrome JSON
// trace events that ui.perfetto.dev opens:
// - "M" metadata names and orders processes and threads;
// - "X" complete events, timestamps in microseconds with nanosecond precision (times are
//   rounded to whole nanoseconds first, so durations and nesting are exact);
// - flows in the new style: `bind_id` with `flow_out` on the sending slice and `flow_in` on
//   the receiving one;
// - "C" counters.
// Slices on one reported track that overlap without nesting (two transfers sharing a link)
// are spread over extra lanes ("name #2", ...), so every emitted track nests strictly.
class TraceWriter : public Observer {
 public:
  void OnProcess(int32_t pid, const std::string& name, int32_t sort_index) override;
  void OnThread(int32_t pid, int32_t tid, const std::string& name, int32_t sort_index) override;
  void OnSlice(const SliceRecord& slice) override;
  void OnCounter(const CounterRecord& counter) override;

  // Renders the whole trace as JSON text; deterministic for the same reports.
  std::string Render() const;
  // Renders and writes atomically to `path`.
  void Write(const std::string& path) const;

  // Number of slices collected.
  size_t slice_count() const { return slices_.size(); }

 private:
  struct Process {
    std::string name;
    int32_t sort_index = 0;
  };
  struct Thread {
    std::string name;
    int32_t sort_index = 0;
  };
  std::map<int32_t, Process> processes_;
  std::map<std::pair<int32_t, int32_t>, Thread> threads_;
  std::vector<SliceRecord> slices_;
  std::vector<CounterRecord> counters_;
};

}  // namespace shardsim
