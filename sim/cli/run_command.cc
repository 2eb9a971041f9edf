#include "sim/cli/run_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "sim/atomic_file.h"
#include "sim/cli/run_file.h"
#include "sim/json_writer.h"
#include "sim/simulator.h"
#include "sim/trace_writer.h"
#include "topology/build.h"
#include "topology/network.h"
#include "topology/routing.h"

namespace shardsim {
namespace {

// Per-device busy time: the union of the intervals during which it sends or receives.
std::vector<Time> BusyTimes(int devices, std::vector<std::vector<std::pair<Time, Time>>> spans) {
  std::vector<Time> busy(devices);
  for (int d = 0; d < devices; ++d) {
    auto& s = spans[d];
    std::sort(s.begin(), s.end());
    Time covered_until;
    for (const auto& [a, b] : s) {
      Time start = std::max(a, covered_until);
      if (b > start) busy[d] += b - start;
      covered_until = std::max(covered_until, b);
    }
  }
  return busy;
}

// Microseconds with three decimals: one unit down a table column.
std::string Micros(Time t) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f us", t.microseconds());
  return buf;
}

std::string Pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

int RunRunCommand(const RunCommandOptions& options) {
  auto wall_start = std::chrono::steady_clock::now();
  RunFile file = LoadRunFile(options.file, options.overrides);
  Topology topo;
  try {
    topo = BuildHardware(file.hardware);
    for (size_t i = 0; i < file.transfers.size(); ++i) {
      const TransferSpec& t = file.transfers[i];
      std::string key = "transfers." + std::to_string(i);
      for (auto [value, field] : {std::pair{t.src, "src"}, std::pair{t.dst, "dst"}}) {
        if (value < 0 || value >= topo.num_devices()) {
          throw SpecError(key + "." + field, std::string(field) + " " + std::to_string(value) +
                                                 " is not a device of " + topo.name() + " (0.." +
                                                 std::to_string(topo.num_devices() - 1) + ")");
        }
      }
    }
  } catch (const SpecError& e) {
    throw InputError(file.Locate(e));
  }

  Simulator sim;
  TraceWriter tracer;
  if (!options.trace_path.empty()) sim.AddObserver(&tracer);
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network network(sim, topo, *router);
  std::vector<TransferId> ids(file.transfers.size(), -1);
  for (size_t i = 0; i < file.transfers.size(); ++i) {
    const TransferSpec& t = file.transfers[i];
    sim.ScheduleAt(t.at, [&network, &topo, &ids, &t, i] {
      ids[i] = network.Start(topo.device_vertex(t.src), topo.device_vertex(t.dst), t.bytes, t.name,
                             [] {});
    });
  }
  sim.Run();
  double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  Time end;
  std::vector<std::vector<std::pair<Time, Time>>> spans(topo.num_devices());
  for (size_t i = 0; i < file.transfers.size(); ++i) {
    const TransferTiming& tm = network.timing(ids[i]);
    end = std::max(end, tm.delivered);
    spans[file.transfers[i].src].push_back({tm.start, tm.delivered});
    spans[file.transfers[i].dst].push_back({tm.start, tm.delivered});
  }
  std::vector<Time> busy = BusyTimes(topo.num_devices(), spans);

  // Human summary.
  std::ostringstream out;
  out << "hardware:       " << topo.name() << " (" << topo.num_devices() << " devices, "
      << topo.num_switches() << " switches, " << topo.num_physical_links() << " links)\n";
  out << "simulated time: " << FormatTime(end) << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "events:         %llu in %.3f s wall\n\n",
                static_cast<unsigned long long>(sim.events_dispatched()), wall);
  out << line;
  out << Pad("transfer", 18) << Pad("src", 5) << Pad("dst", 5) << Pad("bytes", 12) << Pad("hops", 6)
      << Pad("start", 14) << Pad("end", 14) << "algbw\n";
  for (size_t i = 0; i < file.transfers.size(); ++i) {
    const TransferSpec& t = file.transfers[i];
    const TransferTiming& tm = network.timing(ids[i]);
    Time took = tm.delivered - tm.start;
    double algbw = took.picoseconds() > 0 ? t.bytes.count() / took.seconds() : 0.0;
    out << Pad(t.name, 18) << Pad(std::to_string(t.src), 5) << Pad(std::to_string(t.dst), 5)
        << Pad(FormatBytes(t.bytes), 12) << Pad(std::to_string(tm.hops), 6)
        << Pad(Micros(tm.start), 14) << Pad(Micros(tm.delivered), 14)
        << FormatBandwidth(Bandwidth::BytesPerSecond(algbw)) << "\n";
  }
  out << "\nnumerics:       not checked (a transfers: run moves no array data)\n";

  // JSON summary, SI base units.
  std::string j = "{\n  \"file\": ";
  AppendJsonString(j, file.path);
  j += ",\n  \"hardware\": ";
  AppendJsonString(j, topo.name());
  j += ",\n  \"simulated_time_s\": ";
  AppendJsonNumber(j, end.seconds());
  j += ",\n  \"devices\": " + std::to_string(topo.num_devices());
  j += ",\n  \"events\": " + std::to_string(sim.events_dispatched());
  j += ",\n  \"wall_time_s\": ";
  AppendJsonNumber(j, wall);
  j += ",\n  \"numerics\": {\"checked\": false, \"max_abs_error\": 0, \"passed\": true}";
  j += ",\n  \"ops\": [";
  for (size_t i = 0; i < file.transfers.size(); ++i) {
    const TransferSpec& t = file.transfers[i];
    const TransferTiming& tm = network.timing(ids[i]);
    j += i ? ",\n    " : "\n    ";
    j += "{\"name\": ";
    AppendJsonString(j, t.name);
    j += ", \"op\": \"transfer\", \"src\": " + std::to_string(t.src) +
         ", \"dst\": " + std::to_string(t.dst) + ", \"bytes\": " + std::to_string(t.bytes.count()) +
         ", \"hops\": " + std::to_string(tm.hops) + ", \"start_s\": ";
    AppendJsonNumber(j, tm.start.seconds());
    j += ", \"end_s\": ";
    AppendJsonNumber(j, tm.delivered.seconds());
    j += ", \"algorithm\": \"direct\"}";
  }
  j += "\n  ],\n  \"per_device\": [";
  for (int d = 0; d < topo.num_devices(); ++d) {
    j += d ? ",\n    " : "\n    ";
    j += "{\"device\": " + std::to_string(d) + ", \"compute_s\": 0, \"comm_s\": ";
    AppendJsonNumber(j, busy[d].seconds());
    j += ", \"exposed_comm_s\": ";
    AppendJsonNumber(j, busy[d].seconds());
    j += ", \"idle_s\": ";
    AppendJsonNumber(j, (end - busy[d]).seconds());
    j += "}";
  }
  j += "\n  ]\n}\n";

  if (!options.trace_path.empty()) tracer.Write(options.trace_path);
  if (!options.json_path.empty()) WriteFileAtomically(options.json_path, j);
  std::cout << out.str();
  return 0;
}

}  // namespace shardsim
