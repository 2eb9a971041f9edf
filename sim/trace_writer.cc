#include "sim/trace_writer.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <tuple>

#include "sim/json_writer.h"

namespace shardsim {
namespace {

// First output thread id; process ids stay below it.
constexpr int32_t kFirstTid = 1'000'000;

// Buffered text handed to the stream at once.
constexpr size_t kFlushBytes = size_t{1} << 20;

// Picoseconds rounded to the nearest nanosecond.
int64_t ToNs(Time t) {
  int64_t ps = t.picoseconds();
  return (ps >= 0 ? ps + 500 : ps - 500) / 1000;
}

// Appends nanoseconds as microseconds with exactly three decimals.
void AppendMicros(std::string& out, int64_t ns) {
  char buf[48];
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  std::snprintf(buf, sizeof(buf), "%" PRId64 ".%03" PRId64, ns / 1000, ns % 1000);
  out += buf;
}

}  // namespace

TraceWriter::TraceWriter(std::ostream& out) : out_(out), next_tid_(kFirstTid) {}

void TraceWriter::KeepOnlyProcesses(std::vector<bool> keep) {
  keep_ = std::move(keep);
  filtered_ = true;
}

bool TraceWriter::Kept(int32_t pid) const {
  return !filtered_ || (pid >= 0 && static_cast<size_t>(pid) < keep_.size() && keep_[pid]);
}

void TraceWriter::OnProcess(int32_t pid, const std::string& name, int32_t sort_index) {
  if (Kept(pid)) processes_[pid] = Process{name, sort_index};
}

void TraceWriter::OnThread(int32_t pid, int32_t tid, const std::string& name, int32_t sort_index) {
  if (Kept(pid)) threads_[{pid, tid}] = Thread{name, sort_index, true};
}

void TraceWriter::BeginEvent() {
  if (!started_) {
    buffer_ += "{\"traceEvents\":[\n";
    started_ = true;
  } else {
    buffer_ += ",\n";
  }
}

void TraceWriter::MaybeFlush() {
  if (buffer_.size() < kFlushBytes) return;
  out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  buffer_.clear();
}

int32_t TraceWriter::Place(const TrackKey& track, int64_t start, int64_t end) {
  std::vector<Lane>& lanes = lanes_[track];
  for (Lane& lane : lanes) {
    if (start < lane.barrier) continue;
    std::vector<Root>& roots = lane.roots;
    // First root that starts after `start`: it and all later ones must fit inside the slice.
    auto after = std::upper_bound(roots.begin(), roots.end(), start,
                                  [](int64_t s, const Root& r) { return s < r.start; });
    if (after != roots.end() && roots.back().end > end) continue;
    bool same = false;
    if (after != roots.begin()) {
      const Root& before = *(after - 1);
      if (before.start == start) {
        // Written earlier at the same timestamp, so Perfetto opens it first: only an equal
        // slice nests inside it without extending beyond it or splitting its children.
        if (before.end != end) continue;
        same = true;
      } else if (before.end > start) {
        continue;
      }
    }
    if (!same) {
      roots.erase(after, roots.end());
      roots.push_back(Root{start, end});
      if (roots.size() > 2 * kMaxRoots) {
        for (size_t i = 0; i < kMaxRoots; ++i) {
          // A zero-length root blocks its own instant too (a slice starting there would
          // tie with it).
          lane.barrier = std::max(lane.barrier, roots[i].end + (roots[i].start == roots[i].end));
        }
        roots.erase(roots.begin(), roots.begin() + kMaxRoots);
      }
    }
    return lane.out_tid;
  }
  Lane& lane = lanes.emplace_back();
  lane.out_tid = next_tid_++;
  lane.roots.push_back(Root{start, end});
  return lane.out_tid;
}

void TraceWriter::OnSlice(const SliceRecord& s) {
  if (finished_ || !Kept(s.pid)) return;
  int64_t start_ns = ToNs(s.start);
  int64_t end_ns = std::max(start_ns, ToNs(s.end));
  int32_t tid = Place({s.pid, s.tid}, start_ns, end_ns);
  BeginEvent();
  std::string& out = buffer_;
  out += "{\"ph\":\"X\",\"pid\":" + std::to_string(s.pid) + ",\"tid\":" + std::to_string(tid) +
         ",\"ts\":";
  AppendMicros(out, start_ns);
  out += ",\"dur\":";
  AppendMicros(out, end_ns - start_ns);
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
  ++slices_written_;
  MaybeFlush();
}

void TraceWriter::OnCounter(const CounterRecord& c) {
  if (finished_ || !Kept(c.pid)) return;
  BeginEvent();
  buffer_ += "{\"ph\":\"C\",\"pid\":" + std::to_string(c.pid) + ",\"ts\":";
  AppendMicros(buffer_, ToNs(c.time));
  buffer_ += ",\"name\":";
  AppendJsonString(buffer_, c.name);
  buffer_ += ",\"args\":{\"value\":";
  AppendJsonNumber(buffer_, c.value);
  buffer_ += "}}";
  MaybeFlush();
}

void TraceWriter::Finish() {
  if (finished_) return;
  finished_ = true;
  std::string& out = buffer_;
  for (const auto& [pid, p] : processes_) {
    BeginEvent();
    out += "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
           ",\"name\":\"process_name\",\"args\":{\"name\":";
    AppendJsonString(out, p.name);
    out += "}},\n{\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
           ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" +
           std::to_string(p.sort_index) + "}}";
  }
  // Tracks with slices that were never declared get a default name.
  for (const auto& [track, lanes] : lanes_) {
    if (!threads_.count(track)) {
      threads_[track] = Thread{"track " + std::to_string(track.second), track.second, false};
    }
  }
  // Tracks of a process in their declared order (sort index, then tid), the lanes of a
  // track adjacent: the sort index is the rank in that order.
  std::vector<std::pair<TrackKey, const Thread*>> ordered;
  for (const auto& [track, t] : threads_) ordered.emplace_back(track, &t);
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.first, a.second->sort_index) <
           std::tie(b.first.first, b.second->sort_index);
  });
  int32_t rank = 0;
  for (const auto& [track, t] : ordered) {
    std::vector<Lane>& lanes = lanes_[track];
    if (lanes.empty()) lanes.emplace_back().out_tid = next_tid_++;
    for (size_t lane = 0; lane < lanes.size(); ++lane) {
      std::string pid = std::to_string(track.first);
      std::string tid = std::to_string(lanes[lane].out_tid);
      std::string name = lane == 0 ? t->name : t->name + " #" + std::to_string(lane + 1);
      BeginEvent();
      out += "{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + tid +
             ",\"name\":\"thread_name\",\"args\":{\"name\":";
      AppendJsonString(out, name);
      out += "}},\n{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + tid +
             ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(rank++) +
             "}}";
      MaybeFlush();
    }
  }
  if (!started_) {
    out += "{\"traceEvents\":[";
    started_ = true;
  }
  out += "\n]}\n";
  out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  buffer_.clear();
  out_.flush();
}

}  // namespace shardsim
