// Observers of a simulation: what the engine and models report, and who listens.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/time.h"

namespace shardsim {

// One named argument of a trace slice; `value` is shown verbatim.
struct TraceArg {
  std::string key;    // Argument name.
  std::string value;  // Argument value, already formatted.
};

// A completed activity on one track: [start, end) on thread `tid` of process `pid`.
struct SliceRecord {
  int32_t pid = 0;             // Process (a device or switch).
  int32_t tid = 0;             // Track within the process.
  std::string name;            // What ran.
  std::string category;        // Kind of activity ("transfer", "link", "compute").
  Time start;                  // When it began.
  Time end;                    // When it ended (>= start).
  std::vector<TraceArg> args;  // Extra details shown in the UI.
  uint64_t flow_out = 0;       // Nonzero: a flow arrow starts at this slice.
  uint64_t flow_in = 0;        // Nonzero: a flow arrow ends at this slice.
};

// A sample of a counter track of process `pid`, holding from `time` until the next sample.
struct CounterRecord {
  int32_t pid = 0;   // Process that owns the counter.
  std::string name;  // Counter name (one track per name and process).
  Time time;         // When the value takes effect.
  double value = 0;  // New value.
};

// Receives the activity a simulation reports. All methods default to doing nothing.
class Observer {
 public:
  virtual ~Observer() = default;
  // A process (track group) was declared; `sort_index` orders processes in the UI.
  virtual void OnProcess(int32_t pid, const std::string& name, int32_t sort_index) {}
  // A thread (track) of a process was declared.
  virtual void OnThread(int32_t pid, int32_t tid, const std::string& name, int32_t sort_index) {}
  // A slice completed.
  virtual void OnSlice(const SliceRecord& slice) {}
  // A counter changed.
  virtual void OnCounter(const CounterRecord& counter) {}
  // The engine dispatched an event at `now` (only if WantsEvents() is true).
  virtual void OnEvent(Time now) {}
  // Whether OnEvent should be called for every dispatched event (costly).
  virtual bool WantsEvents() const { return false; }
  // The run ended at `now`.
  virtual void OnRunEnd(Time now) {}
};

}  // namespace shardsim
