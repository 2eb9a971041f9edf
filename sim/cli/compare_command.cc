#include "sim/cli/compare_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "collectives/runtime/machine.h"
#include "planner/models/link_use.h"
#include "planner/models/train_step_run.h"
#include "sim/atomic_file.h"
#include "sim/cli/flags.h"
#include "sim/cli/html_report.h"
#include "sim/cli/run_command.h"
#include "sim/cli/run_file.h"
#include "sim/spec_error.h"
#include "sim/time.h"
#include "sim/units.h"
#include "topology/build.h"

namespace shardsim {
namespace {

// One compared run: its label, file, plan and report.
struct Compared {
  std::string label;  // "A", "B", ...
  std::string file;
  ModelRunSpec run;
  planner::TrainStepReport report;
  std::unique_ptr<Machine> machine;  // Its hardware (the report's links name its topology).
};

// One part of the busiest device's step (compute, one class's exposed communication, or the
// rest: waiting in the pipeline bubble or idle), in each run.
struct Part {
  std::string name;  // "compute", "all_gather over fsdp", "waiting".
  std::vector<Time> time;
};

// The parts of each run's step; they add up to its step time (waiting being the rest).
std::vector<Part> StepParts(const std::vector<Compared>& runs) {
  std::vector<Part> parts;
  Part compute{"compute", {}};
  for (const Compared& c : runs) compute.time.push_back(c.report.compute);
  parts.push_back(compute);
  std::set<std::string> classes;
  for (const Compared& c : runs) {
    for (const auto& [name, t] : c.report.exposed_by_collective) classes.insert(name);
    // A class that moves bytes but hides behind compute in every run: its row shows them.
    for (const auto& [name, n] : c.report.bytes_by_collective) classes.insert(name);
  }
  for (const std::string& name : classes) {
    Part p{name, {}};
    for (const Compared& c : runs) {
      const auto it = c.report.exposed_by_collective.find(name);
      p.time.push_back(it == c.report.exposed_by_collective.end() ? Time() : it->second);
    }
    parts.push_back(p);
  }
  Part waiting{"waiting", {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    Time rest = runs[i].report.step_time;
    for (const Part& p : parts) rest = rest - p.time[i];
    waiting.time.push_back(rest);
  }
  parts.push_back(waiting);
  return parts;
}

std::string Percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100 * x);
  return buf;
}

// The exposed part of `name` in `c` with its bytes per device: "1.2 s (8 GiB)".
std::string ExposedCell(const Compared& c, const std::string& name) {
  const auto t = c.report.exposed_by_collective.find(name);
  const auto b = c.report.bytes_by_collective.find(name);
  std::string cell = t == c.report.exposed_by_collective.end() ? "-" : FormatTime(t->second);
  if (b != c.report.bytes_by_collective.end()) {
    cell += " (inputs " + FormatBytes(b->second) + ")";
  }
  return cell;
}

// The bytes of `name` per device per step in `c`, as words.
std::string BytesWords(const Compared& c, const std::string& name) {
  const auto b = c.report.bytes_by_collective.find(name);
  return b == c.report.bytes_by_collective.end() ? "none" : FormatBytes(b->second);
}

// One sentence on part `p` between the slower run `slow` and the fastest `fast`; `d` is
// slow's time there less fast's.
std::string Reason(const Part& p, const Compared& slow, const Compared& fast, Time d) {
  const bool more = d > Time();
  const std::string amount = FormatTime(more ? d : Time() - d);
  std::string s;
  if (p.name == "compute") {
    s = slow.label + " computes " + amount + (more ? " more" : " less");
    const Time dr = slow.report.recompute - fast.report.recompute;
    if (dr != Time()) {
      const std::string slow_remat = planner::RematText(slow.report.remat, slow.report.remat_save);
      const std::string fast_remat = planner::RematText(fast.report.remat, fast.report.remat_save);
      const std::string policies = slow_remat == fast_remat
                                       ? "remat " + slow_remat + " in both"
                                       : "remat " + slow_remat + " against " + fast_remat;
      s += "; recomputation (" + policies + ") accounts for " +
           FormatTime(dr > Time() ? dr : Time() - dr) + (dr > Time() ? " more" : " less");
    }
    return s + ".";
  }
  if (p.name == "waiting") {
    s = slow.label + " waits " + amount + (more ? " more" : " less") +
        " with neither compute nor exposed communication";
    if (slow.report.bubble != fast.report.bubble) {
      s += " (pipeline bubble " + FormatTime(slow.report.bubble) + " against " +
           FormatTime(fast.report.bubble) + ")";
    }
    return s + ".";
  }
  return slow.label + " spends " + amount + (more ? " more" : " less") + " in exposed " + p.name +
         " (its inputs per device and step: " + slow.label + " " + BytesWords(slow, p.name) + ", " +
         fast.label + " " + BytesWords(fast, p.name) + ").";
}

}  // namespace

int RunCompareCommand(const CompareCommandOptions& options) {
  if (options.files.size() < 2) throw InputError("compare needs two or more run files");
  CheckDistinctOutputs({{"--json", options.json_path},
                        {"--report", options.report_path},
                        {"--trace-dir", options.trace_dir}});
  std::vector<Compared> runs;
  for (size_t i = 0; i < options.files.size(); ++i) {
    RunFile file = LoadRunFile(options.files[i], options.overrides);
    if (!file.model || file.model->serve || file.model->mlp) {
      throw InputError(options.files[i] +
                       ": compare takes model run files of transformer training steps (model: "
                       "and train:)");
    }
    Compared c;
    c.label =
        std::string(1, static_cast<char>('A' + i % 26)) + (i >= 26 ? std::to_string(i / 26) : "");
    c.file = options.files[i];
    c.run = *file.model;
    try {
      c.machine = std::make_unique<Machine>(BuildHardware(file.hardware));
      c.report = planner::SimulateTrainStep(*c.machine, c.run.model, c.run.train, c.run.plan);
    } catch (const SpecError& e) {
      throw InputError(file.Locate(e));
    } catch (const std::invalid_argument& e) {
      throw InputError(file.Locate(SpecError("model", e.what())));
    }
    runs.push_back(std::move(c));
  }
  const std::vector<Part> parts = StepParts(runs);

  // The table: a row per figure, a column per run.
  std::vector<std::vector<std::string>> rows;
  auto row = [&](const std::string& name, auto cell) {
    std::vector<std::string> r = {name};
    for (const Compared& c : runs) r.push_back(cell(c));
    rows.push_back(std::move(r));
  };
  row("", [](const Compared& c) {
    return c.label + ": " + std::filesystem::path(c.file).filename().string();
  });
  row("model", [](const Compared& c) { return c.run.name; });
  row("mesh", [](const Compared& c) { return DescribePlanMesh(c.run.plan); });
  row("rules", [](const Compared& c) { return DescribeRules(c.run.plan.rules); });
  row("remat", [](const Compared& c) {
    return planner::RematText(c.run.plan.remat, c.run.plan.remat_save);
  });
  bool offload = false;  // Rows of host offload only where some run offloads.
  for (const Compared& c : runs) offload = offload || !c.run.plan.offload.empty();
  if (offload) {
    row("offload", [](const Compared& c) {
      std::string names;
      for (const std::string& n : c.run.plan.offload) names += (names.empty() ? "" : "+") + n;
      return names.empty() ? std::string("none") : names;
    });
  }
  row("microbatches", [](const Compared& c) { return std::to_string(c.run.train.microbatches); });
  row("step time", [](const Compared& c) { return FormatTime(c.report.step_time); });
  row("MFU", [](const Compared& c) { return Percent(c.report.mfu); });
  row("tokens/s/device", [](const Compared& c) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", c.report.tokens_per_s_per_device);
    return std::string(buf);
  });
  row("compute", [](const Compared& c) { return FormatTime(c.report.compute); });
  row("  recompute", [](const Compared& c) { return FormatTime(c.report.recompute); });
  row("communication", [](const Compared& c) { return FormatTime(c.report.comm); });
  row("exposed comm", [](const Compared& c) { return FormatTime(c.report.exposed_comm); });
  for (const Part& p : parts) {
    if (p.name == "compute" || p.name == "waiting") continue;
    row("  " + p.name, [&](const Compared& c) { return ExposedCell(c, p.name); });
  }
  row("bubble", [](const Compared& c) { return FormatTime(c.report.bubble); });
  row("params", [](const Compared& c) { return FormatBytes(c.report.memory.params); });
  row("grads", [](const Compared& c) { return FormatBytes(c.report.memory.grads); });
  row("optimizer", [](const Compared& c) { return FormatBytes(c.report.memory.optimizer); });
  row("activations", [](const Compared& c) { return FormatBytes(c.report.memory.activations); });
  if (offload) {
    row("host memory", [](const Compared& c) { return FormatBytes(c.report.memory.host); });
    row("  host copies", [](const Compared& c) { return FormatTime(c.report.host_transfer); });
  }
  row("peak / HBM", [](const Compared& c) {
    return FormatBytes(c.report.memory.peak) + " / " + FormatBytes(c.report.memory.capacity);
  });
  row("fits", [](const Compared& c) { return std::string(c.report.memory.fits ? "yes" : "no"); });
  row("schedule",
      [](const Compared& c) { return std::string(planner::StepOverlapName(c.report.overlap)); });
  std::vector<size_t> width(runs.size() + 1, 0);
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size() + 2);
  }
  std::ostringstream s;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c] + (c + 1 < r.size() ? std::string(width[c] - r[c].size(), ' ') : "");
    }
    s << line << "\n";
  }

  // The reasons: each run against the fastest, by the parts of their steps.
  size_t best = 0;
  for (size_t i = 1; i < runs.size(); ++i) {
    if (runs[i].report.step_time < runs[best].report.step_time) best = i;
  }
  const Compared& fast = runs[best];
  nlohmann::ordered_json reasons = nlohmann::ordered_json::array();
  std::vector<std::string> sentences;  // For --report.
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i == best) continue;
    const Compared& slow = runs[i];
    const Time gap = slow.report.step_time - fast.report.step_time;
    const std::string why = "why " + fast.label + " is faster than " + slow.label + " by " +
                            FormatTime(gap) +
                            " (the parts of the busiest device's step, which add up to it):";
    s << "\n" << why << "\n";
    sentences.push_back(why);
    std::vector<std::pair<Time, const Part*>> diffs;
    for (const Part& p : parts) diffs.push_back({p.time[i] - p.time[best], &p});
    std::stable_sort(diffs.begin(), diffs.end(), [](const auto& a, const auto& b) {
      return std::llabs(a.first.picoseconds()) > std::llabs(b.first.picoseconds());
    });
    int shown = 0;
    for (const auto& [d, p] : diffs) {
      // Parts under 1% of the larger step are noise beside the rest.
      if (shown == 5 || std::llabs(d.picoseconds()) * 100 < slow.report.step_time.picoseconds()) {
        continue;
      }
      const std::string sentence = Reason(*p, slow, fast, d);
      s << "- " << sentence << "\n";
      sentences.push_back(sentence);
      reasons.push_back({{"slower", slow.label},
                         {"faster", fast.label},
                         {"part", p->name},
                         {"difference_s", d.seconds()},
                         {"text", sentence}});
      ++shown;
    }
    // Where the bytes went: each run's busiest group of links.
    auto busiest = [](const Compared& c) -> std::string {
      const std::vector<planner::LinkGroupUse> groups =
          planner::LinkGroups(c.report, c.machine->topology());
      if (groups.empty()) return c.label + ": no per-link figures";
      const planner::LinkGroupUse* top = &groups.front();
      for (const planner::LinkGroupUse& g : groups) {
        if (g.busiest > top->busiest) top = &g;
      }
      char buf[256];
      std::snprintf(buf, sizeof(buf), "%s's %s at %.1f%% (%.1f%% on average over %d links)",
                    c.label.c_str(), top->name.c_str(), 100 * top->busiest, 100 * top->mean,
                    top->links);
      return buf;
    };
    const std::string links =
        "The busiest links over the step: " + busiest(slow) + "; " + busiest(fast) + ".";
    s << "- " << links << "\n";
    sentences.push_back(links);
    if (!slow.report.memory.fits) {
      s << "- " << slow.label << " does not fit: it peaks at "
        << FormatBytes(slow.report.memory.peak) << " of "
        << FormatBytes(slow.report.memory.capacity) << " HBM.\n";
    }
  }
  if (!fast.report.memory.fits) {
    s << "\nnote: " << fast.label << ", the fastest, does not fit: it peaks at "
      << FormatBytes(fast.report.memory.peak) << " of " << FormatBytes(fast.report.memory.capacity)
      << " HBM.\n";
  }
  if (!options.trace_dir.empty()) {
    // Each run's whole step with every transfer on the network, as `run --trace` writes it.
    CreateOutputFolder("--trace-dir", options.trace_dir);
    for (const Compared& c : runs) {
      RunCommandOptions trace;
      trace.file = c.file;
      trace.overrides = options.overrides;
      trace.trace_path = (std::filesystem::path(options.trace_dir) / (c.label + ".json")).string();
      trace.quiet = true;
      RunRunCommand(trace);
      s << "trace of " << c.label << ": " << trace.trace_path << "\n";
    }
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (!options.report_path.empty()) {
    std::vector<ReportedStep> steps;
    std::vector<const Topology*> topologies;
    for (const Compared& c : runs) {
      steps.push_back({c.label, DescribePlanMesh(c.run.plan), c.report});
      topologies.push_back(&c.machine->topology());
    }
    files.emplace_back(options.report_path,
                       CompareReportHtml("shardsim compare", rows, steps, topologies, sentences));
  }
  if (!options.json_path.empty()) {
    nlohmann::ordered_json j;
    j["runs"] = nlohmann::ordered_json::array();
    for (const Compared& c : runs) {
      nlohmann::ordered_json r;
      r["label"] = c.label;
      r["file"] = c.file;
      r["step_time_s"] = c.report.step_time.seconds();
      r["mfu"] = c.report.mfu;
      r["tokens_per_s_per_device"] = c.report.tokens_per_s_per_device;
      r["compute_s"] = c.report.compute.seconds();
      r["recompute_s"] = c.report.recompute.seconds();
      r["exposed_comm_s"] = c.report.exposed_comm.seconds();
      nlohmann::ordered_json by = nlohmann::ordered_json::object();
      for (const auto& [name, t] : c.report.exposed_by_collective) by[name] = t.seconds();
      r["exposed_comm_by_collective_s"] = by;
      nlohmann::ordered_json bytes = nlohmann::ordered_json::object();
      for (const auto& [name, b] : c.report.bytes_by_collective) bytes[name] = b.count();
      r["collective_bytes_per_device"] = bytes;
      r["bubble_s"] = c.report.bubble.seconds();
      // The parts of the busiest device's step (compute, exposed communication by class, and
      // waiting): they add up to step_time_s.
      nlohmann::ordered_json step_parts = nlohmann::ordered_json::object();
      const size_t i = static_cast<size_t>(&c - runs.data());
      for (const Part& p : parts) step_parts[p.name] = p.time[i].seconds();
      r["step_parts_s"] = step_parts;
      nlohmann::ordered_json step_parts_ps = nlohmann::ordered_json::object();
      for (const Part& p : parts) step_parts_ps[p.name] = p.time[i].picoseconds();
      r["step_parts_ps"] = step_parts_ps;
      r["step_time_ps"] = c.report.step_time.picoseconds();
      r["memory"] = {{"params", c.report.memory.params.count()},
                     {"grads", c.report.memory.grads.count()},
                     {"optimizer", c.report.memory.optimizer.count()},
                     {"activations", c.report.memory.activations.count()},
                     {"peak", c.report.memory.peak.count()},
                     {"capacity", c.report.memory.capacity.count()}};
      r["fits"] = c.report.memory.fits;
      j["runs"].push_back(r);
    }
    j["fastest"] = fast.label;
    j["reasons"] = reasons;
    files.emplace_back(options.json_path, j.dump(2) + "\n");
  }
  WriteOutputFiles(files, {});
  std::cout << s.str();
  return 0;
}

}  // namespace shardsim
