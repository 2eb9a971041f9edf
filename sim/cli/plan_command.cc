#include "sim/cli/plan_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/slowest_member_model.h"
#include "collectives/timing/timing_store.h"
#include "planner/models/model_flops.h"
#include "planner/models/train_step_run.h"
#include "planner/search/plan_search.h"
#include "sim/atomic_file.h"
#include "sim/cli/flags.h"
#include "sim/cli/html_report.h"
#include "sim/cli/mpi_world.h"
#include "sim/cli/run_file.h"
#include "sim/cli/timing_cache.h"
#include "sim/fnv_hash.h"
#include "sim/spec_error.h"
#include "sim/time.h"
#include "sim/units.h"
#include "topology/build.h"

namespace shardsim {
namespace {

using Json = nlohmann::ordered_json;
using planner::PlanOutcome;
using planner::PlanResult;

// The plan as SPEC's --out lines give it.
Json PlanJson(const planner::PlanCandidate& c) {
  Json plan;
  Json mesh = Json::object();
  for (const MeshAxis& a : c.plan.mesh) mesh[a.name] = a.size;
  plan["mesh"] = mesh;
  Json rules = Json::object();
  for (const auto& [dim, axes] : c.plan.rules) {
    if (axes.size() == 1) {
      rules[dim] = axes[0];
    } else {
      rules[dim] = axes;
    }
  }
  plan["rules"] = rules;
  if (c.plan.remat == planner::RematPolicy::kCustom) {
    plan["remat"] = {{"save", c.plan.remat_save}};  // As a run file writes it.
  } else {
    plan["remat"] = planner::RematPolicyName(c.plan.remat);
  }
  if (!c.plan.offload.empty()) plan["offload"] = c.plan.offload;
  if (!c.plan.torus_order.empty()) plan["torus_order"] = c.plan.torus_order;
  plan["microbatches"] = c.microbatches;
  if (c.plan.pipeline) {
    plan["pipeline"] = {
        {"axis", c.plan.pipeline->axis},
        {"schedule", std::string(planner::PipelineScheduleName(c.plan.pipeline->schedule))},
        {"virtual_stages", c.plan.pipeline->virtual_stages}};
    if (c.plan.pipeline->first_stage_layers > 0) {
      plan["pipeline"]["first_stage_layers"] = c.plan.pipeline->first_stage_layers;
    }
    if (c.plan.pipeline->last_stage_layers > 0) {
      plan["pipeline"]["last_stage_layers"] = c.plan.pipeline->last_stage_layers;
    }
  }
  if (c.plan.collective_matmul != planner::CollectiveMatmulMode::kOff) {
    plan["collective_matmul"] = planner::CollectiveMatmulModeName(c.plan.collective_matmul);
  }
  if (!c.plan.algorithms.empty()) plan["algorithms"] = c.plan.algorithms;
  return plan;
}

// One evaluated plan as a JSON object (a line of --out, an entry of --json). The *_ps and
// *_bytes fields are exact, so a resumed search reads back the very outcome.
Json ResultJson(const PlanResult& r) {
  Json j;
  j["plan"] = PlanJson(r.candidate);
  j["key"] = r.key;
  const PlanOutcome& o = r.outcome;
  if (!o.refused.empty()) {
    j["refused"] = o.refused;
    return j;
  }
  j["step_time_s"] = o.step_time.seconds();
  if (o.ttft > Time() || o.tpot > Time()) {
    j["ttft_s"] = o.ttft.seconds();
    j["tpot_s"] = o.tpot.seconds();
  }
  j["mfu"] = o.mfu;
  j["tokens_per_s_per_device"] = o.tokens_per_s_per_device;
  j["peak_bytes"] = o.peak.count();
  j["capacity_bytes"] = o.capacity.count();
  j["fits"] = o.fits;
  j["schedule"] = planner::StepOverlapName(o.overlap);
  j["dominant"] = o.dominant;
  j["compute_s"] = o.compute.seconds();
  j["exposed_comm_s"] = o.exposed_comm.seconds();
  j["bubble_s"] = o.bubble.seconds();
  j["recompute_s"] = o.recompute.seconds();
  j["ps"] = {{"step_time", o.step_time.picoseconds()},
             {"ttft", o.ttft.picoseconds()},
             {"tpot", o.tpot.picoseconds()},
             {"compute", o.compute.picoseconds()},
             {"exposed_comm", o.exposed_comm.picoseconds()},
             {"bubble", o.bubble.picoseconds()},
             {"recompute", o.recompute.picoseconds()}};
  return j;
}

// The outcome a --out line records; throws InputError naming the line when it is not one.
PlanOutcome OutcomeOfJson(const Json& j, const std::string& where) {
  PlanOutcome o;
  try {
    if (j.contains("refused")) {
      o.refused = j.at("refused").get<std::string>();
      return o;
    }
    const Json& ps = j.at("ps");
    o.step_time = Time::Picoseconds(ps.at("step_time").get<int64_t>());
    o.ttft = Time::Picoseconds(ps.at("ttft").get<int64_t>());
    o.tpot = Time::Picoseconds(ps.at("tpot").get<int64_t>());
    o.compute = Time::Picoseconds(ps.at("compute").get<int64_t>());
    o.exposed_comm = Time::Picoseconds(ps.at("exposed_comm").get<int64_t>());
    o.bubble = Time::Picoseconds(ps.at("bubble").get<int64_t>());
    o.recompute = Time::Picoseconds(ps.at("recompute").get<int64_t>());
    o.mfu = j.at("mfu").get<double>();
    o.tokens_per_s_per_device = j.at("tokens_per_s_per_device").get<double>();
    o.peak = Bytes(j.at("peak_bytes").get<int64_t>());
    o.capacity = Bytes(j.at("capacity_bytes").get<int64_t>());
    o.fits = j.at("fits").get<bool>();
    const std::string schedule = j.value("schedule", std::string("prefetch"));
    const std::optional<planner::StepOverlap> overlap = planner::StepOverlapNamed(schedule);
    if (!overlap) throw InputError(where + ": unknown schedule \"" + schedule + "\"");
    o.overlap = *overlap;
    o.dominant = j.at("dominant").get<std::string>();
  } catch (const Json::exception& e) {
    throw InputError(where + ": not a result line of shardsim plan: " + e.what());
  }
  return o;
}

// Reads an earlier search's --out file: outcomes by key. A last line cut short by an
// interruption is dropped (and, with `truncate`, cut from the file, so appending continues
// cleanly).
std::map<std::string, PlanOutcome> ReadResumeFile(const std::string& path, bool truncate) {
  std::map<std::string, PlanOutcome> known;
  std::ifstream in(path, std::ios::binary);
  if (!in) return known;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (truncate && complete < text.size()) std::filesystem::resize_file(path, complete);
  size_t start = 0;
  int line = 0;
  while (start < complete) {
    const size_t end = text.find('\n', start);
    ++line;
    const std::string where = path + ":" + std::to_string(line);
    Json j;
    try {
      j = Json::parse(text.substr(start, end - start));
    } catch (const Json::exception& e) {
      throw InputError(where + ": not JSON: " + e.what());
    }
    if (!j.contains("key") || !j.at("key").is_string()) {
      throw InputError(where + ": not a result line of shardsim plan (no \"key\")");
    }
    known[j.at("key").get<std::string>()] = OutcomeOfJson(j, where);
    start = end + 1;
  }
  return known;
}

// The file process `rank` of an MPI search streams its outcomes to while it searches: the
// --out path + ".part<rank>". Rank 0 merges them into --out, in one process's order, when
// every process is done, and removes them; a search that resumes reads them too.
std::string PartPath(const std::string& out_path, int rank) {
  return out_path + ".part" + std::to_string(rank);
}

// The part files beside `out_path` (left by MPI processes of this or an interrupted search),
// by name.
std::vector<std::string> PartFiles(const std::string& out_path) {
  namespace fs = std::filesystem;
  const fs::path out(out_path);
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  const std::string prefix = out.filename().string() + ".part";
  std::vector<std::string> parts;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size() &&
        name.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
      parts.push_back((dir / name).string());
    }
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

// "data=8,fsdp=64,tensor=4".
std::string MeshText(const std::vector<MeshAxis>& mesh) {
  std::string text;
  for (const MeshAxis& a : mesh) {
    text += (text.empty() ? "" : ",") + a.name + "=" + std::to_string(a.size);
  }
  return text.empty() ? "(one device)" : text;
}

// The plan's mesh, then " [torus 0,2,1]" when a torus order places it.
std::string MeshText(const planner::StepPlan& plan) {
  std::string text = MeshText(plan.mesh);
  if (plan.torus_order.empty()) return text;
  text += " [torus ";
  for (size_t i = 0; i < plan.torus_order.size(); ++i) {
    text += (i ? "," : "") + std::to_string(plan.torus_order[i]);
  }
  return text + "]";
}

// The rules, or "axis roles" when they are DefaultRules' for the mesh.
std::string RulesText(const planner::StepPlan& plan) {
  std::map<std::string, std::vector<std::string>> defaults;
  try {
    defaults = planner::DefaultRules(plan.mesh);
  } catch (const std::invalid_argument&) {
  }
  return defaults == plan.rules ? "axis roles" : DescribeRules(plan.rules);
}

// Pads `text` to `width` columns (UTF-8 aware enough for our ASCII tables).
std::string Pad(const std::string& text, size_t width) {
  return text.size() >= width ? text + " " : text + std::string(width - text.size(), ' ');
}

// The progress bar on stderr (a terminal only): settled / total, rate, best, ETA.
void ShowProgress(const planner::SearchProgress& p) {
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.done) / p.elapsed_s : 0;
  const double eta = rate > 0 ? static_cast<double>(p.total - p.done) / rate : 0;
  constexpr int kWidth = 30;
  const int filled =
      p.total > 0 ? static_cast<int>(kWidth * static_cast<double>(p.done) / p.total) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r[%s] %lld/%lld plans, %.1f/s, best %s, ETA %.0f s   ", bar.c_str(),
               static_cast<long long>(p.done), static_cast<long long>(p.total), rate,
               p.best ? FormatTime(*p.best).c_str() : "-", eta);
  std::fflush(stderr);
}

// "full", or "full, offload decoder_layer_input+query_proj" with host offload; a custom policy
// with what it saves.
std::string RematText(const planner::StepPlan& plan) {
  std::string text = planner::RematText(plan.remat, plan.remat_save);
  for (size_t i = 0; i < plan.offload.size(); ++i) {
    text += (i ? "+" : ", offload ") + plan.offload[i];
  }
  return text;
}

// "1f1b", or "interleaved x2" with virtual stages, then ", first 3, last 2" with the first and
// last stages' layers given.
std::string ScheduleText(const planner::PipelinePlan& p) {
  std::string text(planner::PipelineScheduleName(p.schedule));
  if (p.virtual_stages > 1) text += " x" + std::to_string(p.virtual_stages);
  if (p.first_stage_layers > 0) text += ", first " + std::to_string(p.first_stage_layers);
  if (p.last_stage_layers > 0) text += ", last " + std::to_string(p.last_stage_layers);
  return text;
}

// "; all_reduce ring; all_gather direct": the plan's algorithms ("" for none: auto).
std::string AlgorithmsText(const planner::StepPlan& plan) {
  std::string text;
  for (const auto& [op, algorithm] : plan.algorithms) text += "; " + op + " " + algorithm;
  return text;
}

// "data=8,fsdp=64,tensor=4; remat selective; microbatches 1 (1f1b)".
std::string PlanLine(const planner::PlanCandidate& c) {
  std::string text = MeshText(c.plan) + "; rules " + RulesText(c.plan) + "; remat " +
                     RematText(c.plan) + "; microbatches " + std::to_string(c.microbatches);
  if (c.plan.pipeline) text += " (" + ScheduleText(*c.plan.pipeline) + ")";
  if (c.plan.collective_matmul != planner::CollectiveMatmulMode::kOff) {
    text += std::string("; collective matmul ") +
            planner::CollectiveMatmulModeName(c.plan.collective_matmul);
  }
  return text + AlgorithmsText(c.plan);
}

// The --report page: the best `top` plans' reports (resumed ones simulated again), the best
// one simulated again for its per-link figures (the search keeps none); the collectives read
// from `store` (null: none) where it has them.
std::string PlanReport(const RunFile& file, const PlanSearchSpec& spec,
                       const std::vector<std::string>& summary, const planner::SearchResult& result,
                       int top, const TimingStore* store) {
  Machine machine(BuildHardware(file.hardware));
  // A search's caches, of which only the collective timings (behind the store) serve here.
  planner::SearchCaches caches(machine, store);
  SlowestMemberCollectiveModel collectives(caches.cache());
  const std::string title = "shardsim plan: " + spec.name + " on " + machine.topology().name();
  if (spec.space.serve) {
    // Serving steps are cheap to simulate again: each top plan's whole report.
    planner::TrainStepOptions options;
    options.collective_model = &collectives;
    std::vector<ReportedServe> plans;
    for (size_t k = 0; k < result.ranked.size() && k < static_cast<size_t>(top); ++k) {
      const PlanResult& r = result.results[result.ranked[k]];
      const std::string line = MeshText(r.candidate.plan) + "; rules " +
                               RulesText(r.candidate.plan) + AlgorithmsText(r.candidate.plan);
      plans.push_back({std::to_string(k + 1), line, spec.space.serve->decode_len,
                       planner::SimulateServe(machine, spec.model, *spec.space.serve,
                                              r.candidate.plan, options)});
    }
    return ServePlanReportHtml(title, summary, result, plans);
  }
  std::vector<ReportedStep> steps;
  for (size_t k = 0; k < result.ranked.size() && k < static_cast<size_t>(top); ++k) {
    const PlanResult& r = result.results[result.ranked[k]];
    ReportedStep step{std::to_string(k + 1), PlanLine(r.candidate), {}};
    if (k == 0 || !r.report) {
      planner::EvaluatePlan(machine, spec.model, spec.train, r.candidate, spec.space.memory_limit,
                            collectives, &step.report, /*settle=*/true);
    } else {
      step.report = *r.report;
    }
    steps.push_back(std::move(step));
  }
  return PlanReportHtml(title, summary, result, steps, machine.topology());
}

}  // namespace

int RunPlanCommand(const PlanCommandOptions& options) {
  CheckDistinctOutputs({{"--out", options.out_path},
                        {"--json", options.json_path},
                        {"--report", options.report_path}});
  if (options.jobs < 1) throw InputError("--jobs must be at least 1");
  if (options.top < 1) throw InputError("--top must be at least 1");
  if (options.budget < 0) throw InputError("--budget must be at least 0");
  double time_limit_s = 0;
  if (!options.time_limit.empty()) {
    try {
      time_limit_s = ParseTime(options.time_limit).seconds();
    } catch (const UnitError& e) {
      throw InputError("--time-limit " + options.time_limit + ": " + e.what());
    }
    if (time_limit_s <= 0) throw InputError("--time-limit must be positive");
  }
  RunFile file = LoadRunFile(options.file, options.overrides, /*plan_search=*/true);
  const PlanSearchSpec& spec = *file.search;
  if (!spec.offload_key.empty()) {
    try {
      planner::CheckHostLink(BuildHardware(file.hardware).device_spec(), spec.offload_key);
    } catch (const SpecError& e) {
      throw InputError(file.Locate(e));
    }
  }
  // --mpi: every process searches its share of the families; rank 0 merges and reports.
  std::unique_ptr<MpiWorld> world;
  if (options.mpi) world = std::make_unique<MpiWorld>();
  const bool root = !world || world->rank() == 0;
  const bool spread = world && world->size() > 1;
  planner::SearchOptions search;
  std::unique_ptr<TimingStore> store;
  if (!options.cache_dir.empty()) {
    store = OpenTimingStore(options.cache_dir, BuildHardware(file.hardware));
    search.store = store.get();
  }
  search.jobs = options.jobs;
  search.budget = options.budget;
  search.time_limit_s = time_limit_s;
  search.make_machine = [&] { return std::make_unique<Machine>(BuildHardware(file.hardware)); };
  // The plans shown are confirmed (settled composition); spread processes leave it to the
  // merging search on rank 0.
  search.confirm = spread ? 0 : options.top;
  if (world) {
    search.process_rank = world->rank();
    search.process_count = world->size();
  }
  std::map<std::string, PlanOutcome> in_file;  // What --out held before this search.
  if (!options.out_path.empty()) {
    in_file = ReadResumeFile(options.out_path, root);
    search.known = in_file;
    // What MPI processes streamed beside it (this search's or an interrupted one's); each
    // process cuts a torn last line from its own part only.
    const std::string own = PartPath(options.out_path, world ? world->rank() : -1);
    for (const std::string& part : PartFiles(options.out_path)) {
      search.known.merge(ReadResumeFile(part, spread && part == own));
    }
  }
  // One write and a flush per line: an interrupted search leaves whole lines (and at most one
  // cut short, which the next run drops).
  auto write_line = [](std::ofstream& file, const PlanResult& r) {
    file << ResultJson(r).dump() << '\n';
    file.flush();
  };
  std::ofstream out, part;
  auto append = [&](const PlanResult& r) {
    if (!in_file.count(r.key)) write_line(out, r);
  };
  if (!options.out_path.empty() && root) {
    out.open(options.out_path, std::ios::app | std::ios::binary);
    if (!out) throw InputError("--out " + options.out_path + ": cannot open for appending");
    if (!spread) search.on_result = append;
  }
  if (!options.out_path.empty() && spread) {
    // Each process streams what it simulates to its part file as it goes.
    const std::string path = PartPath(options.out_path, world->rank());
    part.open(path, std::ios::app | std::ios::binary);
    if (!part) throw InputError("--out " + path + ": cannot open for appending");
    search.on_result = [&](const PlanResult& r) {
      if (!r.resumed) write_line(part, r);
    };
  }
  const bool terminal = root && isatty(fileno(stderr));
  if (terminal) search.on_progress = ShowProgress;
  planner::SearchResult result;
  std::string hardware;
  int64_t simulated = 0;  // Over every process.
  try {
    std::unique_ptr<Machine> machine = search.make_machine();
    const Topology& topo = machine->topology();
    hardware = topo.name() + " (" + std::to_string(topo.num_devices()) + " devices, " +
               FormatBytes(machine->hbm_capacity()) + " HBM each)";
    result = planner::SearchPlans(spec.model, spec.train, spec.space, search);
    simulated = result.simulated;
    if (spread) {
      // Each process's new outcomes, as --out lines, to rank 0; it searches again with all of
      // them known and nothing simulated, which orders, skips and ranks as one process would.
      std::string lines = "{\"simulated\": " + std::to_string(result.simulated) + "}\n";
      for (const PlanResult& r : result.results) {
        if (!r.resumed) lines += ResultJson(r).dump() + "\n";
      }
      const std::vector<std::string> parts = world->Gather(lines);
      if (!root) return 0;
      simulated = 0;
      for (size_t p = 0; p < parts.size(); ++p) {
        std::istringstream in(parts[p]);
        for (std::string line; std::getline(in, line);) {
          const Json j = Json::parse(line);
          if (j.contains("simulated")) {
            simulated += j.at("simulated").get<int64_t>();
          } else {
            search.known[j.at("key").get<std::string>()] =
                OutcomeOfJson(j, "process " + std::to_string(p));
          }
        }
      }
      const double wall = result.wall_s;
      search.simulate = false;
      search.confirm = options.top;
      search.process_rank = 0;
      search.process_count = 1;
      search.on_progress = nullptr;
      search.on_result = out.is_open() ? std::function<void(const PlanResult&)>(append) : nullptr;
      result = planner::SearchPlans(spec.model, spec.train, spec.space, search);
      result.wall_s = wall;
    }
    // --out now holds every outcome, in one process's order: the parts are merged.
    if (out.is_open()) {
      out.close();
      part.close();
      for (const std::string& p : PartFiles(options.out_path)) std::filesystem::remove(p);
    }
  } catch (const SpecError& e) {
    if (spread) {
      std::fprintf(stderr, "error: %s\n", file.Locate(e).c_str());
      world->Abort(2);
    }
    throw InputError(file.Locate(e));
  } catch (const std::invalid_argument& e) {
    if (spread) {
      std::fprintf(stderr, "error: %s\n", e.what());
      world->Abort(2);
    }
    throw InputError(file.Locate(SpecError("plan", e.what())));
  }
  if (terminal) std::fprintf(stderr, "\n");
  const int processes = world ? world->size() : 1;

  int64_t pruned = 0;
  std::string pruned_text;
  for (const auto& [reason, n] : result.pruned) {
    pruned += n;
    pruned_text += (pruned_text.empty() ? "" : ", ") + std::to_string(n) + " " + reason;
  }
  const double n = static_cast<double>(planner::CountParameters(spec.model).total);
  char line[512];
  std::vector<std::string> summary;
  summary.push_back("hardware:       " + hardware);
  if (spec.space.serve) {
    std::snprintf(line, sizeof(line),
                  "%s (%.4gB parameters), serving batch %lld, prompt %lld, %lld tokens out",
                  spec.name.c_str(), n / 1e9, static_cast<long long>(spec.space.serve->batch),
                  static_cast<long long>(spec.space.serve->prompt_len),
                  static_cast<long long>(spec.space.serve->decode_len));
  } else {
    std::snprintf(line, sizeof(line), "%s (%.4gB parameters), batch %lld x %lld tokens",
                  spec.name.c_str(), n / 1e9, static_cast<long long>(spec.train.batch),
                  static_cast<long long>(spec.train.seq_len));
  }
  summary.push_back(std::string("model:          ") + line);
  summary.push_back(
      "candidates:     " + std::to_string(result.candidates) + " (" + std::to_string(pruned) +
      " pruned" + (pruned_text.empty() ? "" : ": " + pruned_text) + "; " +
      std::to_string(result.dominated) +
      " dominated: the same mesh and rules fit with less remat, less offload or fewer accumulation "
      "steps" +
      (result.beyond_budget ? "; " + std::to_string(result.beyond_budget) + " beyond the budget"
                            : "") +
      ")");
  std::snprintf(
      line, sizeof(line),
      "%lld simulated, %lld resumed in %.2f s wall (%.1f plans/s, %d job%s%s); %zu fit, %lld "
      "over %g%% of HBM, %lld refused",
      static_cast<long long>(simulated),
      static_cast<long long>(result.results.size()) - static_cast<long long>(simulated),
      result.wall_s, result.wall_s > 0 ? static_cast<double>(simulated) / result.wall_s : 0.0,
      options.jobs, options.jobs == 1 ? "" : "s",
      processes > 1 ? (" in each of " + std::to_string(processes) + " processes").c_str() : "",
      result.ranked.size(), static_cast<long long>(result.not_fitting),
      spec.space.memory_limit * 100, static_cast<long long>(result.refused));
  summary.push_back(std::string("evaluated:      ") + line);
  if (result.refused > 0) {
    // Why plans were refused: the commonest reasons, each with its count (the rest in --out).
    std::map<std::string, int64_t> reasons;
    for (const PlanResult& r : result.results) {
      if (!r.outcome.refused.empty()) ++reasons[r.outcome.refused];
    }
    std::vector<std::pair<int64_t, std::string>> by_count;
    for (const auto& [reason, n] : reasons) by_count.push_back({-n, reason});
    std::sort(by_count.begin(), by_count.end());
    constexpr size_t kShown = 3;
    for (size_t i = 0; i < by_count.size() && i < kShown; ++i) {
      summary.push_back(std::string(i == 0 ? "refused:        " : "                ") +
                        std::to_string(-by_count[i].first) + " x " + by_count[i].second);
    }
    if (by_count.size() > kShown) {
      summary.push_back("                and " + std::to_string(by_count.size() - kShown) +
                        " other reasons (each plan's in --out)");
    }
  }
  summary.push_back(std::string("objective:      ") +
                    planner::SearchObjectiveName(spec.space.objective) +
                    (spec.space.serve ? "; prefill and a decode step at the mean context" : "") +
                    "; each step screened composed from 2 and 3 simulated layers, the best " +
                    std::to_string(options.top) +
                    " confirmed composed from layers where the step has settled (as shardsim "
                    "run composes; " +
                    std::to_string(result.confirmed) +
                    " simulated again), every collective's members ending with its slowest "
                    "(shardsim run times them apart: within a fraction of a percent on "
                    "symmetric meshes)");
  std::ostringstream s;
  for (const std::string& l : summary) s << l << "\n";
  s << "\n";
  const bool serving = spec.space.serve.has_value();
  const std::vector<std::string> headers =
      serving
          ? std::vector<std::string>{"rank",       "mesh",      "rules",      "TTFT",        "TPOT",
                                     "generation", "tok/s/dev", "peak / HBM", "dominated by"}
          : std::vector<std::string>{"rank",       "mesh",        "rules", "remat",
                                     "mb",         "step time",   "MFU",   "tok/s/dev",
                                     "peak / HBM", "dominated by"};
  std::vector<std::vector<std::string>> rows;
  for (size_t k = 0; k < result.ranked.size() && k < static_cast<size_t>(options.top); ++k) {
    const PlanResult& r = result.results[result.ranked[k]];
    const PlanOutcome& o = r.outcome;
    char mfu[32], tok[32];
    std::snprintf(mfu, sizeof(mfu), "%.1f%%", 100 * o.mfu);
    std::snprintf(tok, sizeof(tok), "%.0f", o.tokens_per_s_per_device);
    std::string mesh = MeshText(r.candidate.plan);
    if (r.candidate.plan.pipeline) mesh += " (" + ScheduleText(*r.candidate.plan.pipeline) + ")";
    if (r.candidate.plan.collective_matmul != planner::CollectiveMatmulMode::kOff) {
      mesh += std::string(" (cm ") +
              planner::CollectiveMatmulModeName(r.candidate.plan.collective_matmul) + ")";
    }
    for (const auto& [op, algorithm] : r.candidate.plan.algorithms) {
      mesh += " (" + op + " " + algorithm + ")";
    }
    if (serving) {
      rows.push_back({std::to_string(k + 1), mesh, RulesText(r.candidate.plan), FormatTime(o.ttft),
                      FormatTime(o.tpot), FormatTime(o.step_time), tok,
                      FormatBytes(o.peak) + " / " + FormatBytes(o.capacity), o.dominant});
      continue;
    }
    rows.push_back({std::to_string(k + 1), mesh, RulesText(r.candidate.plan),
                    RematText(r.candidate.plan), std::to_string(r.candidate.microbatches),
                    FormatTime(o.step_time), mfu, tok,
                    FormatBytes(o.peak) + " / " + FormatBytes(o.capacity), o.dominant});
  }
  if (rows.empty()) {
    if (result.results.empty()) {
      s << "no plan evaluated: " << result.beyond_budget
        << " candidates beyond the budget or time limit\n";
    } else {
      s << "no plan fits: " << result.not_fitting << " evaluated plans exceed the memory limit, "
        << result.refused << " refused\n";
    }
  } else {
    std::vector<size_t> width(headers.size());
    for (size_t c = 0; c < headers.size(); ++c) width[c] = headers[c].size() + 2;
    for (const auto& row : rows) {
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size() + 2);
    }
    std::vector<std::vector<std::string>> lines = {headers};
    lines.insert(lines.end(), rows.begin(), rows.end());
    for (const auto& row : lines) {
      std::string text;
      for (size_t c = 0; c < row.size(); ++c) text += Pad(row[c], width[c]);
      while (!text.empty() && text.back() == ' ') text.pop_back();
      s << text << "\n";
    }
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (!options.report_path.empty()) {
    files.emplace_back(options.report_path,
                       PlanReport(file, spec, summary, result, options.top, store.get()));
  }
  if (!options.json_path.empty()) {
    Json ranked = Json::array();
    for (size_t i : result.ranked) ranked.push_back(ResultJson(result.results[i]));
    files.emplace_back(options.json_path, ranked.dump(2) + "\n");
  }
  WriteOutputFiles(files, {});
  std::cout << s.str();
  return 0;
}

}  // namespace shardsim
