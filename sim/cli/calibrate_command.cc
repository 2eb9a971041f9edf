#include "sim/cli/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

#include "collectives/mesh.h"
#include "collectives/placement.h"
#include "collectives/runtime/machine.h"
#include "sim/cli/collective_command.h"
#include "sim/cli/nccl_tests_reader.h"
#include "sim/cli/run_file.h"
#include "topology/build.h"
#include "topology/overrides.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

// What a fitted figure is.
enum class FigureKind { kTime, kFraction, kCount };

// One fitted figure: its `hardware.comm` key, its value in SI units (seconds, a fraction or a
// count), its bounds, and where an override takes it.
struct Figure {
  std::string key;
  FigureKind kind = FigureKind::kFraction;
  double value = 0;
  double lo = 0, hi = 0;
  std::function<void(CommOverride&, double)> set;
  bool is_time() const { return kind == FigureKind::kTime; }
};

// Every figure the fit may move, read from `comm`.
std::vector<Figure> AllFigures(const CommSpec& comm, bool multi_node) {
  auto time = [](std::optional<Time> CommOverride::*field) {
    return [field](CommOverride& o, double v) { o.*field = Time::FromSeconds(v); };
  };
  auto fraction = [](std::optional<double> CommOverride::*field) {
    return [field](CommOverride& o, double v) { o.*field = v; };
  };
  constexpr FigureKind kT = FigureKind::kTime, kF = FigureKind::kFraction;
  std::vector<Figure> f;
  f.push_back({"launch_latency", kT, comm.launch_latency.seconds(), 1e-7, 5e-4,
               time(&CommOverride::launch_latency)});
  if (multi_node) {
    f.push_back({"net_latency", kT, comm.net_latency.seconds(), 1e-8, 5e-4,
                 time(&CommOverride::net_latency)});
  }
  for (int p = 0; p < kNumProtocols; ++p) {
    const std::string name = ProtocolName(static_cast<Protocol>(p));
    f.push_back(
        {"protocols." + name + ".step_latency", kT, comm.protocols[p].step_latency.seconds(), 1e-8,
         2e-4,
         [p](CommOverride& o, double v) { o.protocols[p].step_latency = Time::FromSeconds(v); }});
  }
  for (Protocol p : {Protocol::kLL, Protocol::kLL128}) {
    f.push_back({std::string("protocols.") + ProtocolName(p) + ".efficiency", kF,
                 comm.protocol(p).efficiency, 0.01, 1.0, [p](CommOverride& o, double v) {
                   o.protocols[static_cast<int>(p)].efficiency = v;
                 }});
  }
  f.push_back({"nvlink_efficiency", kF, comm.nvlink_efficiency, 0.05, 1.0,
               fraction(&CommOverride::nvlink_efficiency)});
  if (multi_node) {
    f.push_back({"nic_efficiency", kF, comm.nic_efficiency, 0.05, 1.0,
                 fraction(&CommOverride::nic_efficiency)});
    // Rail-aligned ring channels across nodes: 1 to 64.
    f.push_back({"channels", FigureKind::kCount, static_cast<double>(comm.channels), 1, 64,
                 [](CommOverride& o, double v) { o.channels = static_cast<int>(std::lround(v)); }});
  }
  return f;
}

// `figures` with every value inside its bounds (a figure at 0, like a preset's absent
// network latency, starts at 1 us: the search scales values, so it could not leave 0).
std::vector<Figure> Bounded(std::vector<Figure> figures) {
  for (Figure& f : figures) {
    if (f.is_time() && f.value <= 0) f.value = 1e-6;
    f.value = std::clamp(f.value, f.lo, f.hi);
  }
  return figures;
}

// The override that sets every figure.
CommOverride OverrideOf(const std::vector<Figure>& figures) {
  CommOverride o;
  for (const Figure& f : figures) f.set(o, f.value);
  return o;
}

struct Simulated {
  std::vector<std::vector<Time>> times;  // Per run, per point.
  std::vector<std::vector<std::string>> algorithms;
  double sum_squares = 0;  // Of ln(simulated / measured).
  int points = 0;
};

Simulated Simulate(const std::string& preset, int per_node, const std::vector<NcclTestsRun>& runs,
                   const CommOverride& comm) {
  Simulated out;
  for (const NcclTestsRun& run : runs) {
    HardwareSpec hw;
    hw.preset = preset;
    hw.nodes = run.ranks / per_node;
    hw.comm = comm;
    Machine machine(BuildHardware(hw));
    std::vector<MeshAxis> axes = {MeshAxis{"x", run.ranks}};
    Mesh mesh(axes, DefaultPlacement(axes, machine.topology()));
    out.times.emplace_back();
    out.algorithms.emplace_back();
    for (const NcclTestsPoint& p : run.points) {
      const int64_t elements = p.size.count() / 4 / run.ranks * run.ranks;
      std::string algorithm;
      Time t = elements == 0
                   ? Time()
                   : SimulateCollectiveSize(machine, mesh, {"x"}, run.op,
                                            std::max<int64_t>(elements, 1), "auto", &algorithm);
      out.times.back().push_back(t);
      out.algorithms.back().push_back(algorithm);
      if (t > Time()) {
        const double e = std::log(t.seconds() / p.time.seconds());
        out.sum_squares += e * e;
        ++out.points;
      }
    }
  }
  return out;
}

std::string FormatFigure(const Figure& f) {
  char text[64];
  if (f.is_time()) {
    std::snprintf(text, sizeof text, "%.3f us", f.value * 1e6);
  } else if (f.kind == FigureKind::kCount) {
    std::snprintf(text, sizeof text, "%ld", std::lround(f.value));
  } else {
    std::snprintf(text, sizeof text, "%.4f", f.value);
  }
  return text;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read the file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The figures --fit names (see CalibrateCommandOptions::fit).
std::vector<Figure> Figures(const CommSpec& comm, bool multi_node, const std::string& fit) {
  std::vector<Figure> all = AllFigures(comm, multi_node);
  if (fit == "all") return all;
  std::vector<std::string> wanted;
  if (fit.empty()) {
    wanted = {"launch_latency",
              "net_latency",
              "protocols.LL.step_latency",
              "protocols.LL128.step_latency",
              "protocols.Simple.step_latency",
              "nvlink_efficiency",
              "nic_efficiency"};
  } else {
    std::stringstream in(fit);
    std::string key;
    while (std::getline(in, key, ',')) {
      const std::vector<std::string> keys = CalibrationKeys();
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
        std::string list;
        for (const std::string& k : keys) list += (list.empty() ? "" : ", ") + k;
        throw InputError("--fit " + fit + ": unknown figure '" + key + "'; expected all or " +
                         list);
      }
      if ((key == "nic_efficiency" || key == "net_latency" || key == "channels") && !multi_node) {
        throw InputError("--fit " + fit + ": " + key + " needs a run spanning two or more nodes");
      }
      wanted.push_back(key);
    }
  }
  std::vector<Figure> out;
  for (const Figure& f : all) {
    if (std::find(wanted.begin(), wanted.end(), f.key) != wanted.end()) out.push_back(f);
  }
  return out;
}

}  // namespace

std::vector<std::string> CalibrationKeys() {
  std::vector<std::string> keys;
  for (const Figure& f : AllFigures(CommSpec(), true)) keys.push_back(f.key);
  return keys;
}

int RunCalibrateCommand(const CalibrateCommandOptions& o) {
  if (!IsPreset(o.preset)) {
    throw InputError("--preset " + o.preset +
                     ": unknown preset; GPU presets: a100-dgx, "
                     "h100-dgx, h200-dgx, b200-dgx, gb200-nvl72");
  }
  if (IsTpuPreset(o.preset)) {
    throw InputError("--preset " + o.preset +
                     ": calibrate fits NCCL's figures, which only GPU presets have");
  }
  if (o.files.empty()) throw InputError("calibrate: give one or more nccl-tests output files");
  const Topology one_node = BuildPreset(o.preset);
  const int per_node = one_node.num_devices();
  std::vector<NcclTestsRun> runs;
  bool multi_node = false;
  for (const std::string& path : o.files) {
    NcclTestsRun run = ParseNcclTests(path, ReadWholeFile(path));
    if (run.ranks > per_node && run.ranks % per_node != 0) {
      throw InputError(path + ": " + std::to_string(run.ranks) + " ranks are not whole nodes of " +
                       std::to_string(per_node) + " GPUs (" + o.preset + ")");
    }
    if (run.ranks < 2) throw InputError(path + ": a collective needs two or more ranks");
    if (run.ranks < per_node) {
      throw InputError(path + ": " + std::to_string(run.ranks) + " ranks; calibrate fits whole " +
                       "nodes of " + std::to_string(per_node) + " GPUs (" + o.preset + ")");
    }
    multi_node = multi_node || run.ranks > per_node;
    runs.push_back(std::move(run));
  }
  std::vector<Figure> figures = Bounded(Figures(one_node.comm(), multi_node, o.fit));
  // The preset's own figures, for the "preset" column.
  const std::vector<Figure> initial = Figures(one_node.comm(), multi_node, o.fit);
  auto cost = [&](const std::vector<Figure>& f) {
    return Simulate(o.preset, per_node, runs, OverrideOf(f)).sum_squares;
  };
  int simulations = 1;
  double best = cost(figures);
  const double before = cost(initial);
  // Coordinate search in log space.
  for (double step = std::log(2.0); step > std::log(1.005) && simulations < o.max_simulations;) {
    bool improved = false;
    for (size_t i = 0; i < figures.size() && simulations < o.max_simulations; ++i) {
      for (double direction : {1.0, -1.0}) {
        std::vector<Figure> trial = figures;
        Figure& f = trial[i];
        f.value = std::clamp(f.value * std::exp(direction * step), f.lo, f.hi);
        // A count moves by whole units, at least one.
        if (f.kind == FigureKind::kCount) {
          f.value = std::clamp(direction > 0 ? std::max(std::round(f.value), figures[i].value + 1)
                                             : std::min(std::round(f.value), figures[i].value - 1),
                               f.lo, f.hi);
        }
        if (f.value == figures[i].value) continue;
        const double c = cost(trial);
        ++simulations;
        if (c < best - 1e-12) {
          best = c;
          figures = std::move(trial);
          improved = true;
          break;
        }
      }
    }
    if (!improved) step /= 2;
  }
  Simulated was = Simulate(o.preset, per_node, runs, OverrideOf(initial));
  Simulated now = Simulate(o.preset, per_node, runs, OverrideOf(figures));
  const double n = std::max(1, now.points);
  std::ostringstream out;
  char line[320];
  std::snprintf(line, sizeof line,
                "# shardsim calibrate: %s against %zu nccl-tests file(s), %d sizes\n"
                "# rms error of ln(time): %.4f with the preset's figures, %.4f fitted (%d fits "
                "simulated)\n",
                o.preset.c_str(), runs.size(), now.points, std::sqrt(before / n),
                std::sqrt(best / n), simulations);
  out << line;
  out << "hardware:\n  preset: " << o.preset << "\n  comm:\n";
  for (const Figure& f : figures) {
    if (f.key.rfind("protocols.", 0) == 0) continue;
    out << "    " << f.key << ": " << FormatFigure(f) << "\n";
  }
  // Protocols with a fitted figure, each on one line.
  std::string protocols;
  for (int p = 0; p < kNumProtocols; ++p) {
    const std::string name = ProtocolName(static_cast<Protocol>(p));
    const std::string prefix = "protocols." + name + ".";
    std::string entries;
    for (const Figure& f : figures) {
      if (f.key.rfind(prefix, 0) != 0) continue;
      entries +=
          (entries.empty() ? "" : ", ") + f.key.substr(prefix.size()) + ": " + FormatFigure(f);
    }
    if (!entries.empty()) protocols += "      " + name + ": {" + entries + "}\n";
  }
  if (!protocols.empty()) out << "    protocols:\n" << protocols;
  std::snprintf(line, sizeof line, "# %-24s %-20s %12s %13s %12s %8s %12s %8s  %s\n", "file",
                "test", "size(B)", "measured(us)", "preset(us)", "error", "fitted(us)", "error",
                "algorithm (fitted)");
  out << line;
  for (size_t r = 0; r < runs.size(); ++r) {
    std::string file = runs[r].path.substr(runs[r].path.find_last_of('/') + 1);
    for (size_t i = 0; i < runs[r].points.size(); ++i) {
      const NcclTestsPoint& p = runs[r].points[i];
      const double measured = p.time.microseconds();
      const double a = was.times[r][i].microseconds(), b = now.times[r][i].microseconds();
      std::snprintf(
          line, sizeof line, "# %-24s %-20s %12lld %13.2f %12.2f %+7.1f%% %12.2f %+7.1f%%  %s\n",
          file.c_str(), runs[r].test.c_str(), static_cast<long long>(p.size.count()), measured, a,
          (a / measured - 1) * 100, b, (b / measured - 1) * 100, now.algorithms[r][i].c_str());
      out << line;
    }
  }
  std::cout << out.str();
  return 0;
}

}  // namespace shardsim
