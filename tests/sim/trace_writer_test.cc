#include "sim/trace_writer.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

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

std::vector<json> EventsWithPh(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(TraceWriterTest, RendersValidJsonWithNamedProcessesAndThreads) {
  TraceWriter w;
  w.OnProcess(0, "/device:TPU:0", 0);
  w.OnProcess(1, "/device:TPU:1", 1);
  w.OnThread(0, 5, "ICI \xE2\x86\x92 TPU 1", 5);
  w.OnSlice(Slice(0, 5, "send \"x\"", 1000, 2500));
  json trace = json::parse(w.Render());
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
  TraceWriter w;
  for (int p = 0; p < 4; ++p) {
    w.OnProcess(p, "/device:GPU:" + std::to_string(p), p);
    w.OnThread(p, 1, "link", 1);
    w.OnSlice(Slice(p, 1, "t", 0, 10));
  }
  json trace = json::parse(w.Render());
  std::set<int> pids, tids;
  for (const json& e : trace["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e.contains("tid")) tids.insert(e["tid"].get<int>());
  }
  EXPECT_EQ(tids.size(), 4u);  // Unique across the trace.
  for (int t : tids) EXPECT_FALSE(pids.count(t)) << t;
}

TEST(TraceWriterTest, OverlappingSlicesOnOneTrackAreSpreadOverLanes) {
  // [0,10) and [5,15) overlap without nesting: the second goes to lane "#2".
  // [2,4) nests inside [0,10) and stays on the first lane.
  TraceWriter w;
  w.OnProcess(0, "p", 0);
  w.OnThread(0, 1, "link", 1);
  w.OnSlice(Slice(0, 1, "a", 0, 10));
  w.OnSlice(Slice(0, 1, "b", 5, 15));
  w.OnSlice(Slice(0, 1, "c", 2, 4));
  json trace = json::parse(w.Render());
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

TEST(TraceWriterTest, EmitsNewStyleFlowsAndCounters) {
  TraceWriter w;
  SliceRecord send = Slice(0, 1, "send", 0, 100);
  send.flow_out = 7;
  SliceRecord recv = Slice(1, 2, "recv", 1, 101);
  recv.flow_in = 7;
  w.OnSlice(send);
  w.OnSlice(recv);
  w.OnCounter(CounterRecord{0, "util", Time::Nanoseconds(0), 0.5});
  json trace = json::parse(w.Render());
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
  TraceWriter w;
  SliceRecord s;
  s.start = Time::Picoseconds(1'234'567);  // 1234.567 ns -> 1235 ns = 1.235 us.
  s.end = Time::Picoseconds(2'000'400);    // 2000.4 ns -> 2000 ns.
  s.name = "r";
  w.OnSlice(s);
  std::string text = w.Render();
  EXPECT_NE(text.find("\"ts\":1.235,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"dur\":0.765,"), std::string::npos) << text;
}

TEST(TraceWriterTest, RenderIsDeterministic) {
  auto render = [] {
    TraceWriter w;
    for (int i = 0; i < 50; ++i) w.OnSlice(Slice(i % 3, 1, "s" + std::to_string(i), i, i + 7));
    return w.Render();
  };
  EXPECT_EQ(render(), render());
}

}  // namespace
}  // namespace shardsim
