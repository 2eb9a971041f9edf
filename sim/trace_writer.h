// An observer that streams what a simulation reports as a Chrome/Perfetto JSON trace.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "sim/observer.h"

namespace shardsim {

// Streams processes, tracks, slices, flows and counters to an output stream as Chrome JSON
// trace events that ui.perfetto.dev opens:
// - "X" complete events, written when reported; timestamps in microseconds with nanosecond
//   precision (times are rounded to whole nanoseconds first, so durations and nesting are
//   exact);
// - flows in the new style: `bind_id` with `flow_out` on the sending slice and `flow_in` on
//   the receiving one;
// - "C" counters, written when reported;
// - "M" metadata naming and ordering processes and threads, written by Finish().
// Memory stays bounded by per-track state, not by the number of slices.
//
// Lanes: Perfetto's JSON importer orders events by timestamp and, at equal timestamps, by
// their place in the file, and nests a slice inside every slice still open on its track. A
// slice that would overlap a slice of its track without nesting, or start together with a
// slice written before it that it does not equal, goes to an extra lane ("name #2", ...).
// Each lane keeps a stack of its top-level slices (disjoint, by start): a new slice either
// starts after the top one ends, or encloses the top ones that start after it (it is written
// later but starts earlier, so Perfetto makes it their parent), or equals the top one.
// A lane remembers at least its last kMaxRoots top-level slices (at most twice as many); a
// slice starting before the end of an older, forgotten one goes to another lane. Since slices are
// reported when they end, a slice usually arrives after the slices it encloses and nests over them.
class TraceWriter : public Observer {
 public:
  // Top-level slices a lane remembers (see the class comment).
  static constexpr size_t kMaxRoots = 64;

  // Streams to `out`, which must outlive the writer; nothing is written until the first
  // report.
  explicit TraceWriter(std::ostream& out);

  // Keeps only the processes whose pid is below keep.size() with keep[pid] set; the others'
  // slices, counters and names are dropped (a flow arrow to a dropped process has no end).
  void KeepOnlyProcesses(std::vector<bool> keep);

  // Remembers a process's name for the metadata.
  void OnProcess(int32_t pid, const std::string& name, int32_t sort_index) override;
  // Remembers a track's name for the metadata.
  void OnThread(int32_t pid, int32_t tid, const std::string& name, int32_t sort_index) override;
  // Places the slice on a lane of its track and writes it.
  void OnSlice(const SliceRecord& slice) override;
  // Writes the counter sample.
  void OnCounter(const CounterRecord& counter) override;

  // Writes the metadata, closes the JSON document and flushes the stream (whose owner checks
  // it for errors); deterministic for the same reports. Reports after it are ignored.
  void Finish();

  // Number of slices written.
  size_t slice_count() const { return slices_written_; }

 private:
  struct Process {
    std::string name;
    int32_t sort_index = 0;
  };
  struct Thread {
    std::string name;
    int32_t sort_index = 0;
    bool declared = false;
  };
  // A top-level slice of a lane, in nanoseconds.
  struct Root {
    int64_t start;
    int64_t end;
  };
  struct Lane {
    std::vector<Root> roots;      // Disjoint, ordered by start.
    int64_t barrier = INT64_MIN;  // End of the latest forgotten root.
    int32_t out_tid = 0;
  };
  using TrackKey = std::pair<int32_t, int32_t>;

  bool Kept(int32_t pid) const;
  // Places [start, end) on a lane of `track`; returns the lane's output thread id.
  int32_t Place(const TrackKey& track, int64_t start, int64_t end);
  // Starts a new event: a separator unless it is the first.
  void BeginEvent();
  // Hands the buffered text to the stream when it is large.
  void MaybeFlush();

  std::ostream& out_;
  std::string buffer_;
  bool started_ = false;
  bool finished_ = false;
  bool filtered_ = false;
  std::vector<bool> keep_;
  size_t slices_written_ = 0;
  int32_t next_tid_;
  std::map<int32_t, Process> processes_;
  std::map<TrackKey, Thread> threads_;
  std::map<TrackKey, std::vector<Lane>> lanes_;
};

}  // namespace shardsim
