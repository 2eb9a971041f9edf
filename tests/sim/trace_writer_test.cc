#include "sim/trace_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

namespace shardsim {
namespace {

using nlohmann::json;

SliceRecord Slice(int32_t pid, int32_t tid, std::string name, int64_t start_ns, int64_t end_ns) {
  SliceRecord s;
  s.pid = pid;
  s.tid = tid;
  s.name = std::move(name);
  s.start = Time::Nanoseconds(start_ns);
  s.end = Time::Nanoseconds(end_ns);
  return s;
}

// Feeds a writer through `report` and returns the finished trace text.
template <typename F>
std::string Render(F report) {
  std::ostringstream out;
  TraceWriter w(out);
  report(w);
  w.Finish();
  return out.str();
}

std::vector<json> EventsWithPh(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

// Imports the X events as Perfetto's JSON importer does (per thread, ordered by timestamp
// and then by place in the file; a slice nests inside every slice still open) and counts
// children that end after their parent.
int ChildrenBeyondParent(const json& trace) {
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> by_tid;
  for (const json& e : EventsWithPh(trace, "X")) {
    int64_t ts = std::llround(e["ts"].get<double>() * 1000);
    int64_t dur = std::llround(e["dur"].get<double>() * 1000);
    by_tid[e["tid"].get<int>()].push_back({ts, ts + dur});
  }
  int bad = 0;
  for (auto& [tid, slices] : by_tid) {
    std::stable_sort(slices.begin(), slices.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<int64_t> open;
    for (const auto& [start, end] : slices) {
      while (!open.empty() && open.back() <= start) open.pop_back();
      if (!open.empty() && end > open.back()) ++bad;
      open.push_back(end);
    }
  }
  return bad;
}

// Number of distinct output threads of the X events.
size_t Lanes(const json& trace) {
  std::set<int> tids;
  for (const json& e : EventsWithPh(trace, "X")) tids.insert(e["tid"].get<int>());
  return tids.size();
}

TEST(TraceWriterTest, RendersValidJsonWithNamedProcessesAndThreads) {
  std::string text = Render([&](TraceWriter& w) {
    w.OnProcess(0, "/device:TPU:0", 0);
    w.OnProcess(1, "/device:TPU:1", 1);
    w.OnThread(0, 5, "ICI \xE2\x86\x92 TPU 1", 5);
    w.OnSlice(Slice(0, 5, "send \"x\"", 1000, 2500));
  });
  json trace = json::parse(text);
  std::map<std::string, int> names;
  for (const json& e : EventsWithPh(trace, "M")) {
    if (e["name"] == "process_name") names[e["args"]["name"]] = e["pid"];
  }
  EXPECT_EQ(names["/device:TPU:0"], 0);
  EXPECT_EQ(names["/device:TPU:1"], 1);
  std::vector<json> x = EventsWithPh(trace, "X");
  ASSERT_EQ(x.size(), 1u);
  EXPECT_EQ(x[0]["name"], "send \"x\"");
  EXPECT_DOUBLE_EQ(x[0]["ts"].get<double>(), 1.0);  // Microseconds.
  EXPECT_DOUBLE_EQ(x[0]["dur"].get<double>(), 1.5);
  EXPECT_FALSE(trace.contains("displayTimeUnit"));
}

TEST(TraceWriterTest, ThreadIdsNeverEqualAProcessId) {
  // Perfetto v20 merges a thread whose tid equals another process's pid into that process's
  // main thread; the writer renumbers tids above every pid.
  std::string text = Render([&](TraceWriter& w) {
    for (int p = 0; p < 4; ++p) {
      w.OnProcess(p, "/device:GPU:" + std::to_string(p), p);
      w.OnThread(p, 1, "link", 1);
      w.OnSlice(Slice(p, 1, "t", 0, 10));
    }
  });
  json trace = json::parse(text);
  std::set<int> pids, tids;
  for (const json& e : trace["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e.contains("tid")) tids.insert(e["tid"].get<int>());
  }
  EXPECT_EQ(tids.size(), 4u);  // Unique across the trace.
  for (int t : tids) EXPECT_FALSE(pids.count(t)) << t;
}

TEST(TraceWriterTest, OverlappingSlicesOnOneTrackAreSpreadOverLanes) {
  // Reported when they end: [2,4) first, then [0,10), which encloses it, then [5,15), which
  // overlaps [0,10) without nesting and goes to lane "#2".
  std::string text = Render([&](TraceWriter& w) {
    w.OnProcess(0, "p", 0);
    w.OnThread(0, 1, "link", 1);
    w.OnSlice(Slice(0, 1, "c", 2, 4));
    w.OnSlice(Slice(0, 1, "a", 0, 10));
    w.OnSlice(Slice(0, 1, "b", 5, 15));
  });
  json trace = json::parse(text);
  std::map<std::string, int> tid_of;
  for (const json& e : EventsWithPh(trace, "X")) tid_of[e["name"]] = e["tid"];
  EXPECT_EQ(tid_of["a"], tid_of["c"]);
  EXPECT_NE(tid_of["a"], tid_of["b"]);
  std::map<int, std::string> thread_names;
  for (const json& e : EventsWithPh(trace, "M")) {
    if (e["name"] == "thread_name") thread_names[e["tid"]] = e["args"]["name"];
  }
  EXPECT_EQ(thread_names[tid_of["a"]], "link");
  EXPECT_EQ(thread_names[tid_of["b"]], "link #2");
}

TEST(TraceWriterTest, LongerSliceStartingWithAShorterOneIsNotItsChild) {
  // Both start at 0; the shorter one ends (and is reported, and written) first. Perfetto
  // would open it first and nest the longer one inside it, beyond its end: the longer one
  // goes to another lane.
  std::string text = Render([&](TraceWriter& w) {
    w.OnSlice(Slice(0, 1, "short", 0, 5));
    w.OnSlice(Slice(0, 1, "long", 0, 10));
    w.OnSlice(Slice(0, 1, "same", 0, 10));  // Equal to "long": nests inside it.
  });
  json trace = json::parse(text);
  EXPECT_EQ(ChildrenBeyondParent(trace), 0);
  EXPECT_EQ(Lanes(trace), 2u);
}

TEST(TraceWriterTest, RandomSlicesReportedWhenTheyEndNestStrictly) {
  // Slices on three tracks, reported in order of their end as the models do, some with
  // equal starts, ends or both.
  std::mt19937 rng(7);
  std::vector<SliceRecord> slices;
  for (int i = 0; i < 3000; ++i) {
    int64_t start = rng() % 2000;
    int64_t len = (rng() % 4 == 0) ? 0 : rng() % 300;
    slices.push_back(Slice(rng() % 2, rng() % 2, "s" + std::to_string(i), start, start + len));
  }
  std::stable_sort(slices.begin(), slices.end(),
                   [](const SliceRecord& a, const SliceRecord& b) { return a.end < b.end; });
  std::string text = Render([&](TraceWriter& w) {
    for (const SliceRecord& s : slices) w.OnSlice(s);
  });
  json trace = json::parse(text);
  EXPECT_EQ(EventsWithPh(trace, "X").size(), slices.size());
  EXPECT_EQ(ChildrenBeyondParent(trace), 0);
}

TEST(TraceWriterTest, OutOfOrderReportsStillNestStrictly) {
  std::mt19937 rng(11);
  std::string text = Render([&](TraceWriter& w) {
    for (int i = 0; i < 2000; ++i) {
      int64_t start = rng() % 500;
      w.OnSlice(Slice(0, 1, "s", start, start + rng() % 100));
    }
  });
  EXPECT_EQ(ChildrenBeyondParent(json::parse(text)), 0);
}

TEST(TraceWriterTest, ASliceEnclosingForgottenSlicesGoesToAnotherLane) {
  // A lane remembers its last kMaxRoots top-level slices: a long slice starting before
  // thousands of short ones on its track ends on lane #2 instead of enclosing them.
  int n = 10 * static_cast<int>(TraceWriter::kMaxRoots);
  std::string text = Render([&](TraceWriter& w) {
    for (int i = 0; i < n; ++i) w.OnSlice(Slice(0, 1, "short", 10 * i + 1, 10 * i + 5));
    w.OnSlice(Slice(0, 1, "recent", 10 * n - 20, 10 * n));  // Encloses the last two.
    w.OnSlice(Slice(0, 1, "long", 0, 10 * n + 10));
  });
  json trace = json::parse(text);
  EXPECT_EQ(ChildrenBeyondParent(trace), 0);
  std::map<std::string, int> tid_of;
  for (const json& e : EventsWithPh(trace, "X")) tid_of[e["name"]] = e["tid"];
  EXPECT_EQ(tid_of["recent"], tid_of["short"]);
  EXPECT_NE(tid_of["long"], tid_of["short"]);
  EXPECT_EQ(Lanes(trace), 2u);
}

TEST(TraceWriterTest, KeepsOnlyTheChosenProcesses) {
  std::ostringstream out;
  TraceWriter w(out);
  w.KeepOnlyProcesses({true, false, true});
  for (int p = 0; p < 4; ++p) {
    w.OnProcess(p, "p" + std::to_string(p), p);
    w.OnThread(p, 1, "link", 1);
    w.OnSlice(Slice(p, 1, "s", 0, 10));
    w.OnCounter(CounterRecord{p, "util", Time::Nanoseconds(0), 1.0});
  }
  w.Finish();
  json trace = json::parse(out.str());
  std::set<int> pids;
  for (const json& e : trace["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 2}));
}

TEST(TraceWriterTest, AnEmptyTraceIsValidJson) {
  json trace = json::parse(Render([](TraceWriter&) {}));
  EXPECT_TRUE(trace["traceEvents"].empty());
}

TEST(TraceWriterTest, EmitsNewStyleFlowsAndCounters) {
  std::string text = Render([&](TraceWriter& w) {
    SliceRecord send = Slice(0, 1, "send", 0, 100);
    send.flow_out = 7;
    SliceRecord recv = Slice(1, 2, "recv", 1, 101);
    recv.flow_in = 7;
    w.OnSlice(send);
    w.OnSlice(recv);
    w.OnCounter(CounterRecord{0, "util", Time::Nanoseconds(0), 0.5});
  });
  json trace = json::parse(text);
  std::vector<json> x = EventsWithPh(trace, "X");
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x[0]["bind_id"], x[1]["bind_id"]);
  EXPECT_TRUE(x[0]["flow_out"].get<bool>());
  EXPECT_TRUE(x[1]["flow_in"].get<bool>());
  std::vector<json> c = EventsWithPh(trace, "C");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_DOUBLE_EQ(c[0]["args"]["value"].get<double>(), 0.5);
}

TEST(TraceWriterTest, TimesAreRoundedToNanosecondsWithThreeDecimals) {
  std::string text = Render([&](TraceWriter& w) {
    SliceRecord s;
    s.start = Time::Picoseconds(1'234'567);  // 1234.567 ns -> 1235 ns = 1.235 us.
    s.end = Time::Picoseconds(2'000'400);    // 2000.4 ns -> 2000 ns.
    s.name = "r";
    w.OnSlice(s);
  });
  EXPECT_NE(text.find("\"ts\":1.235,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"dur\":0.765,"), std::string::npos) << text;
}

TEST(TraceWriterTest, RenderIsDeterministic) {
  auto render = [] {
    std::string text = Render([&](TraceWriter& w) {
      for (int i = 0; i < 50; ++i) w.OnSlice(Slice(i % 3, 1, "s" + std::to_string(i), i, i + 7));
    });
    return text;
  };
  EXPECT_EQ(render(), render());
}

}  // namespace
}  // namespace shardsim
