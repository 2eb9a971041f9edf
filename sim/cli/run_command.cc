#include "sim/cli/run_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "collectives/compute_model.h"
#include "collectives/executor.h"
#include "collectives/numerics_check.h"
#include "collectives/npy.h"
#include "collectives/placement.h"
#include "collectives/sharding.h"
#include "sim/atomic_file.h"
#include "sim/cli/run_file.h"
#include "sim/intervals.h"
#include "sim/json_writer.h"
#include "sim/simulator.h"
#include "sim/trace_writer.h"
#include "topology/build.h"
#include "topology/network.h"
#include "topology/routing.h"

namespace shardsim {
namespace {

// Host memory above which `numerics: auto` runs timing only.
constexpr Bytes kNumericsBudget = Bytes::GiB(2);

// One row of the per-op table.
struct OpRow {
  std::string name;
  std::string op;
  Bytes bytes;
  Time start;
  Time end;
  std::string algorithm;
  std::string detail;  // Transfers: "0 -> 5, 2 hops".
};

// What a run reports, whichever kind of run file it was.
struct RunReport {
  std::string file;
  std::string hardware;
  std::string placement;
  int devices = 0;
  Time end;
  uint64_t events = 0;
  double wall_s = 0;
  std::vector<OpRow> ops;
  std::vector<DeviceTiming> per_device;
  NumericsReport numerics;
  std::string numerics_note;
};

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

void CheckTransferDevices(const RunFile& file, const Topology& topo) {
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
}

void SimulateTransfers(const RunFile& file, const Topology& topo, Simulator& sim, Network& network,
                       RunReport& report) {
  // Start and delivery of each transfer, as the network reported them.
  std::vector<std::pair<Time, Time>> times(file.transfers.size());
  for (size_t i = 0; i < file.transfers.size(); ++i) {
    const TransferSpec& t = file.transfers[i];
    sim.ScheduleAt(t.at, [&sim, &network, &topo, &times, &t, i] {
      times[i].first = sim.Now();
      network.Start(topo.device_vertex(t.src), topo.device_vertex(t.dst), t.bytes, t.name,
                    [&sim, &times, i] { times[i].second = sim.Now(); });
    });
  }
  sim.Run();
  std::vector<std::vector<std::pair<Time, Time>>> spans(topo.num_devices());
  for (size_t i = 0; i < file.transfers.size(); ++i) {
    const TransferSpec& t = file.transfers[i];
    auto [start, delivered] = times[i];
    int hops = network.Hops(topo.device_vertex(t.src), topo.device_vertex(t.dst));
    report.end = std::max(report.end, delivered);
    spans[t.src].push_back({start, delivered});
    spans[t.dst].push_back({start, delivered});
    report.ops.push_back(OpRow{t.name, "transfer", t.bytes, start, delivered, "direct",
                               std::to_string(t.src) + " -> " + std::to_string(t.dst) + ", " +
                                   std::to_string(hops) + " hops"});
  }
  for (int d = 0; d < topo.num_devices(); ++d) {
    DeviceTiming dt;
    dt.device = d;
    dt.comm = CoveredTime(spans[d]);
    dt.exposed_comm = dt.comm;
    dt.idle = report.end - dt.comm;
    report.per_device.push_back(dt);
  }
  report.numerics.checked = false;
  report.numerics_note = "not checked (a transfers: run moves no array data)";
}

// Host bytes a run with real data holds: every position's block of every input array
// (4-byte floats), about three times over (the run, the reference, results).
Bytes NumericsFootprint(const ProgramSpec& program, const Mesh& mesh) {
  int64_t elements = 0;
  for (const ArraySpec& a : program.arrays) {
    elements += NumElements(Sharding(mesh, a.sharding, a.shape).LocalShape()) * mesh.size();
  }
  return Bytes(elements * 4 * 3);
}

std::map<std::string, Array> SimulateProgram(const RunFile& file, const RunCommandOptions& options,
                                             const Topology& topo, Simulator& sim, Network& network,
                                             RunReport& report) {
  const ProgramSpec& program = *file.program;
  std::vector<int> devices = program.mesh_devices;
  try {
    if (devices.empty()) devices = DefaultPlacement(program.mesh_axes, topo);
  } catch (const std::invalid_argument& e) {
    throw SpecError("mesh.axes", e.what());
  }
  Mesh mesh(program.mesh_axes, devices);
  try {
    ValidateMeshDevices(mesh, topo);
  } catch (const std::invalid_argument& e) {
    throw SpecError("mesh.devices", e.what());
  }
  report.placement = DescribePlacement(mesh, topo);
  CheckProgram(mesh, program);

  std::string mode = options.numerics.empty() ? file.options.numerics : options.numerics;
  bool numerics = mode != "off";
  if (mode == "auto" && NumericsFootprint(program, mesh) > kNumericsBudget) {
    numerics = false;
    report.numerics_note = "off: the arrays need about " +
                           FormatBytes(NumericsFootprint(program, mesh)) +
                           " of host memory, over the " + FormatBytes(kNumericsBudget) +
                           " budget of --numerics auto (use --numerics on to force)";
  }
  if (!options.dump_dir.empty() && !numerics) {
    throw InputError("--dump " + options.dump_dir + ": needs real data, but numerics are " +
                     (mode == "off" ? "off" : "off for this size (--numerics auto)") +
                     "; use --numerics on");
  }
  RooflineModel compute(RooflineConfig::FromDevice(topo.device_spec()));
  ExecutorConfig config;
  config.numerics = numerics;
  config.compute_model = &compute;
  config.comm_compute_slowdown = topo.device_spec().comm_compute_slowdown;
  config.chunk_size = file.options.chunk_size;
  config.algorithms = file.options.algorithms;
  config.base_dir = std::filesystem::path(file.path).parent_path().string();
  Executor executor(sim, network, mesh, program, config);
  executor.Start();
  sim.Run();
  if (!executor.finished()) {
    throw std::runtime_error("the program deadlocked: some devices never finished");
  }
  report.end = executor.end_time();
  for (const OpTiming& t : executor.op_timings()) {
    report.ops.push_back(OpRow{t.name, t.op, t.bytes, t.start, t.end, t.algorithm, ""});
  }
  report.per_device = executor.DeviceTimings();
  std::map<std::string, Array> outputs = executor.Outputs();
  if (numerics) {
    report.numerics = CheckNumerics(outputs, mesh, program, config.base_dir, &executor.inputs());
    char line[200];
    std::snprintf(line, sizeof(line), "%s: max_abs_error %.3g (tolerance %.3g, worst %s)",
                  report.numerics.passed ? "passed" : "FAILED", report.numerics.max_abs_error,
                  report.numerics.tolerance, report.numerics.worst_output.c_str());
    report.numerics_note = line;
  } else {
    report.numerics.checked = false;
    if (report.numerics_note.empty()) report.numerics_note = "off (--numerics off): timing only";
  }
  return outputs;
}

std::string Summary(const RunReport& r) {
  std::ostringstream out;
  out << "hardware:       " << r.hardware << "\n";
  if (!r.placement.empty()) out << "placement:      " << r.placement << "\n";
  out << "simulated time: " << FormatTime(r.end) << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "events:         %llu in %.3f s wall\n\n",
                static_cast<unsigned long long>(r.events), r.wall_s);
  out << line;
  out << Pad("op", 18) << Pad("kind", 14) << Pad("bytes", 12) << Pad("start", 15) << Pad("end", 15)
      << "algorithm\n";
  for (const OpRow& o : r.ops) {
    out << Pad(o.name, 18) << Pad(o.op, 14) << Pad(FormatBytes(o.bytes), 12)
        << Pad(Micros(o.start), 15) << Pad(Micros(o.end), 15) << o.algorithm
        << (o.detail.empty() ? "" : "  (" + o.detail + ")") << "\n";
  }
  out << "\n"
      << Pad("device", 8) << Pad("compute", 15) << Pad("comm", 15) << Pad("exposed comm", 15)
      << "idle\n";
  // Large machines: the first 8 devices, then the spread.
  size_t shown = std::min<size_t>(r.per_device.size(), 8);
  for (size_t i = 0; i < shown; ++i) {
    const DeviceTiming& d = r.per_device[i];
    out << Pad(std::to_string(d.device), 8) << Pad(Micros(d.compute), 15) << Pad(Micros(d.comm), 15)
        << Pad(Micros(d.exposed_comm), 15) << Micros(d.idle) << "\n";
  }
  if (shown < r.per_device.size()) {
    Time lo = Time::Max(), hi;
    for (const DeviceTiming& d : r.per_device) {
      lo = std::min(lo, d.comm);
      hi = std::max(hi, d.comm);
    }
    out << "... " << r.per_device.size() - shown << " more devices; comm ranges " << Micros(lo)
        << " .. " << Micros(hi) << "\n";
  }
  out << "\nnumerics:       " << r.numerics_note << "\n";
  return out.str();
}

std::string Json(const RunReport& r) {
  std::string j = "{\n  \"file\": ";
  AppendJsonString(j, r.file);
  j += ",\n  \"hardware\": ";
  AppendJsonString(j, r.hardware);
  j += ",\n  \"placement\": ";
  AppendJsonString(j, r.placement);
  j += ",\n  \"simulated_time_s\": ";
  AppendJsonNumber(j, r.end.seconds());
  j += ",\n  \"devices\": " + std::to_string(r.devices);
  j += ",\n  \"events\": " + std::to_string(r.events);
  j += ",\n  \"wall_time_s\": ";
  AppendJsonNumber(j, r.wall_s);
  j += ",\n  \"numerics\": {\"checked\": ";
  j += r.numerics.checked ? "true" : "false";
  j += ", \"max_abs_error\": ";
  AppendJsonNumber(j, r.numerics.max_abs_error);
  j += ", \"tolerance\": ";
  AppendJsonNumber(j, r.numerics.tolerance);
  j += ", \"passed\": ";
  j += r.numerics.passed ? "true" : "false";
  j += ", \"note\": ";
  AppendJsonString(j, r.numerics_note);
  j += "},\n  \"ops\": [";
  for (size_t i = 0; i < r.ops.size(); ++i) {
    const OpRow& o = r.ops[i];
    j += i ? ",\n    " : "\n    ";
    j += "{\"name\": ";
    AppendJsonString(j, o.name);
    j += ", \"op\": ";
    AppendJsonString(j, o.op);
    j += ", \"bytes\": " + std::to_string(o.bytes.count()) + ", \"start_s\": ";
    AppendJsonNumber(j, o.start.seconds());
    j += ", \"end_s\": ";
    AppendJsonNumber(j, o.end.seconds());
    j += ", \"algorithm\": ";
    AppendJsonString(j, o.algorithm);
    j += "}";
  }
  j += "\n  ],\n  \"per_device\": [";
  for (size_t i = 0; i < r.per_device.size(); ++i) {
    const DeviceTiming& d = r.per_device[i];
    j += i ? ",\n    " : "\n    ";
    j += "{\"device\": " + std::to_string(d.device) + ", \"compute_s\": ";
    AppendJsonNumber(j, d.compute.seconds());
    j += ", \"comm_s\": ";
    AppendJsonNumber(j, d.comm.seconds());
    j += ", \"exposed_comm_s\": ";
    AppendJsonNumber(j, d.exposed_comm.seconds());
    j += ", \"idle_s\": ";
    AppendJsonNumber(j, d.idle.seconds());
    j += "}";
  }
  j += "\n  ]\n}\n";
  return j;
}

}  // namespace

int RunRunCommand(const RunCommandOptions& options) {
  auto wall_start = std::chrono::steady_clock::now();
  RunFile file = LoadRunFile(options.file, options.overrides);
  RunReport report;
  report.file = file.path;
  Simulator sim;
  TraceWriter tracer;
  if (!options.trace_path.empty()) sim.AddObserver(&tracer);
  std::map<std::string, Array> outputs;
  try {
    Topology topo = BuildHardware(file.hardware);
    report.hardware = topo.name() + " (" + std::to_string(topo.num_devices()) + " devices, " +
                      std::to_string(topo.num_switches()) + " switches, " +
                      std::to_string(topo.num_physical_links()) + " links)";
    report.devices = topo.num_devices();
    std::unique_ptr<Router> router = MakeRouter(topo);
    Network network(sim, topo, *router);
    if (file.program) {
      outputs = SimulateProgram(file, options, topo, sim, network, report);
    } else {
      CheckTransferDevices(file, topo);
      SimulateTransfers(file, topo, sim, network, report);
    }
  } catch (const SpecError& e) {
    throw InputError(file.Locate(e));
  }
  report.events = sim.events_dispatched();
  report.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  // Every output file is written all or nothing: the trace, the summary and the dumps.
  std::vector<std::pair<std::string, std::string>> files;
  if (!options.trace_path.empty()) files.emplace_back(options.trace_path, tracer.Render());
  if (!options.json_path.empty()) files.emplace_back(options.json_path, Json(report));
  if (!options.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.dump_dir, ec);
    if (ec || !std::filesystem::is_directory(options.dump_dir)) {
      throw InputError("--dump " + options.dump_dir + ": cannot create the folder" +
                       (ec ? ": " + ec.message() : ""));
    }
    for (const auto& [name, array] : outputs) {
      files.emplace_back((std::filesystem::path(options.dump_dir) / (name + ".npy")).string(),
                         EncodeNpy(array));
    }
  }
  WriteOutputFiles(files);
  std::cout << Summary(report);
  return report.numerics.passed ? 0 : 1;
}

}  // namespace shardsim
