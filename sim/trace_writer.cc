#include "sim/trace_writer.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <numeric>

#include "sim/atomic_file.h"
#include "sim/json_writer.h"

namespace shardsim {
namespace {

// First output thread id; process ids stay below it.
constexpr int32_t kFirstTid = 1'000'000;

// Picoseconds rounded to the nearest nanosecond.
int64_t ToNs(Time t) {
  int64_t ps = t.picoseconds();
  return (ps >= 0 ? ps + 500 : ps - 500) / 1000;
}

// Appends nanoseconds as microseconds with exactly three decimals.
void AppendMicros(std::string& out, int64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%" PRId64 ".%03" PRId64, ns / 1000, ns % 1000);
  out += buf;
}

}  // namespace

void TraceWriter::OnProcess(int32_t pid, const std::string& name, int32_t sort_index) {
  processes_[pid] = Process{name, sort_index};
}

void TraceWriter::OnThread(int32_t pid, int32_t tid, const std::string& name, int32_t sort_index) {
  threads_[{pid, tid}] = Thread{name, sort_index};
}

void TraceWriter::OnSlice(const SliceRecord& slice) { slices_.push_back(slice); }

void TraceWriter::OnCounter(const CounterRecord& counter) { counters_.push_back(counter); }

std::string TraceWriter::Render() const {
  // Assign lanes: per reported track, slices sorted by (start, longest first) go to the first
  // lane where they either start after everything open has ended or fit inside the innermost
  // open slice.
  struct Placed {
    int64_t start_ns;
    int64_t end_ns;
    int32_t lane;
  };
  std::vector<Placed> placed(slices_.size());
  std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> by_track;
  for (size_t i = 0; i < slices_.size(); ++i) {
    placed[i].start_ns = ToNs(slices_[i].start);
    placed[i].end_ns = std::max(placed[i].start_ns, ToNs(slices_[i].end));
    by_track[{slices_[i].pid, slices_[i].tid}].push_back(i);
  }
  std::map<std::pair<int32_t, int32_t>, int32_t> lanes_of_track;
  for (auto& [track, idx] : by_track) {
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      if (placed[a].start_ns != placed[b].start_ns) return placed[a].start_ns < placed[b].start_ns;
      return placed[a].end_ns > placed[b].end_ns;
    });
    std::vector<std::vector<int64_t>> open;  // Per lane: stack of open end times.
    for (size_t i : idx) {
      int32_t lane = 0;
      for (;; ++lane) {
        if (lane == static_cast<int32_t>(open.size())) open.emplace_back();
        std::vector<int64_t>& stack = open[lane];
        while (!stack.empty() && stack.back() <= placed[i].start_ns) stack.pop_back();
        if (stack.empty() || placed[i].end_ns <= stack.back()) {
          stack.push_back(placed[i].end_ns);
          break;
        }
      }
      placed[i].lane = lane;
    }
    lanes_of_track[track] = static_cast<int32_t>(open.size());
  }
  // Output thread ids: each (pid, tid, lane) gets a distinct id, lanes of a track adjacent.
  // Output thread ids are unique across the trace and above every pid: Perfetto (v20) gives
  // each process a main thread whose tid equals its pid, and a track of another process
  // with that tid would be merged into it.
  std::map<std::tuple<int32_t, int32_t, int32_t>, int32_t> out_tid;
  int32_t next_tid = kFirstTid;
  std::map<std::pair<int32_t, int32_t>, Thread> threads = threads_;
  for (const auto& [track, lanes] : lanes_of_track) {
    if (!threads.count(track))
      threads[track] = Thread{"track " + std::to_string(track.second), track.second};
  }
  std::string out;
  out.reserve(256 + slices_.size() * 200 + counters_.size() * 120);
  out += "{\"traceEvents\":[\n";
  bool first = true;
  auto begin_event = [&]() {
    if (!first) out += ",\n";
    first = false;
  };
  for (const auto& [pid, p] : processes_) {
    begin_event();
    out += "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
           ",\"name\":\"process_name\",\"args\":{\"name\":";
    AppendJsonString(out, p.name);
    out += "}},\n{\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
           ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" +
           std::to_string(p.sort_index) + "}}";
  }
  // Tracks of a process in their declared order (sort index, then tid).
  std::vector<std::pair<std::pair<int32_t, int32_t>, Thread>> ordered(threads.begin(),
                                                                      threads.end());
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    if (a.first.first != b.first.first) return a.first.first < b.first.first;
    return a.second.sort_index < b.second.sort_index;
  });
  for (const auto& [track, t] : ordered) {
    int32_t lanes = std::max(1, lanes_of_track.count(track) ? lanes_of_track[track] : 1);
    for (int32_t lane = 0; lane < lanes; ++lane) {
      int32_t tid = next_tid++;
      out_tid[{track.first, track.second, lane}] = tid;
      std::string name = lane == 0 ? t.name : t.name + " #" + std::to_string(lane + 1);
      begin_event();
      out += "{\"ph\":\"M\",\"pid\":" + std::to_string(track.first) +
             ",\"tid\":" + std::to_string(tid) + ",\"name\":\"thread_name\",\"args\":{\"name\":";
      AppendJsonString(out, name);
      out += "}},\n{\"ph\":\"M\",\"pid\":" + std::to_string(track.first) +
             ",\"tid\":" + std::to_string(tid) +
             ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(tid) +
             "}}";
    }
  }
  for (size_t i = 0; i < slices_.size(); ++i) {
    const SliceRecord& s = slices_[i];
    begin_event();
    out += "{\"ph\":\"X\",\"pid\":" + std::to_string(s.pid) +
           ",\"tid\":" + std::to_string(out_tid[{s.pid, s.tid, placed[i].lane}]) + ",\"ts\":";
    AppendMicros(out, placed[i].start_ns);
    out += ",\"dur\":";
    AppendMicros(out, placed[i].end_ns - placed[i].start_ns);
    out += ",\"name\":";
    AppendJsonString(out, s.name);
    if (!s.category.empty()) {
      out += ",\"cat\":";
      AppendJsonString(out, s.category);
    }
    if (s.flow_out || s.flow_in) {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "0x%" PRIx64, s.flow_out ? s.flow_out : s.flow_in);
      out += ",\"bind_id\":\"";
      out += buf;
      out += s.flow_out ? "\",\"flow_out\":true" : "\",\"flow_in\":true";
    }
    if (!s.args.empty()) {
      out += ",\"args\":{";
      for (size_t a = 0; a < s.args.size(); ++a) {
        if (a) out += ",";
        AppendJsonString(out, s.args[a].key);
        out += ":";
        AppendJsonString(out, s.args[a].value);
      }
      out += "}";
    }
    out += "}";
  }
  for (const CounterRecord& c : counters_) {
    begin_event();
    out += "{\"ph\":\"C\",\"pid\":" + std::to_string(c.pid) + ",\"ts\":";
    AppendMicros(out, ToNs(c.time));
    out += ",\"name\":";
    AppendJsonString(out, c.name);
    out += ",\"args\":{\"value\":";
    AppendJsonNumber(out, c.value);
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

void TraceWriter::Write(const std::string& path) const { WriteFileAtomically(path, Render()); }

}  // namespace shardsim
