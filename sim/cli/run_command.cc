#include "sim/cli/run_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "collectives/compute_model.h"
#include "collectives/executor.h"
#include "collectives/npy.h"
#include "collectives/numerics_check.h"
#include "collectives/placement.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "collectives/sharding.h"
#include "collectives/timing/collective_cost_model.h"
#include "planner/models/logical_rules.h"
#include "planner/models/model_flops.h"
#include "planner/models/serve_step_run.h"
#include "planner/models/train_step_run.h"
#include "planner/models/transformer.h"
#include "planner/partitioned_numerics.h"
#include "planner/partitioner.h"
#include "sim/atomic_file.h"
#include "sim/cli/flags.h"
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

// Threads that price a `--timing cached` run's distinct collectives (RunConfig::jobs): this
// machine's cores, at most 8. The output is the same for any number. (Model runs price theirs
// as the partitioner weighs them, one at a time: they gained nothing from helpers.)
int PricingJobs() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

// One row of the per-op table.
struct OpRow {
  std::string name;
  std::string op;
  Bytes bytes;
  Time start;
  Time end;
  std::string algorithm;
  std::string detail;  // Transfers: "0 -> 5, 2 hops"; partitioned programs: the reason.
  std::string reason;  // Collectives the partitioner inserted: why.
  std::vector<std::string> axis_name;  // Collectives: the mesh axes they run over.
  Time compute;                        // Local ops: one device's compute time.
};

// Device memory of a program run.
struct MemoryReport {
  bool known = false;   // A program ran (transfers: runs hold no buffers).
  Bytes peak;           // The largest per-device peak of live buffers.
  int peak_device = 0;  // Where.
  std::string peak_op;  // The op started or issued when it peaked.
  Bytes capacity;       // HBM per device.
  bool fits = true;     // peak <= capacity.
  Bytes host;           // Most bytes one device held in host memory (move_to_host).
  Time host_transfer;   // Most time one device spent copying to or from host memory.
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
  int simulated_devices = 0;
  MemoryReport memory;
  // A model run: what it ran and its step report.
  std::string model;
  std::string plan;
  std::optional<planner::TrainStepReport> step;
  std::optional<planner::ServeReport> serve;  // A serving run's report instead.
};

// Microseconds with three decimals: one unit down a table column.
std::string Micros(Time t) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f us", t.microseconds());
  return buf;
}

// "4 stages", or with stages of unequal layers "4 stages of 15, 16, 16, 14 layers".
std::string PipelineStages(const planner::TrainStepReport& r) {
  std::string out = std::to_string(r.pipeline_stages) + " stages";
  const std::vector<int64_t>& layers = r.pipeline_layers;
  if (layers.empty() || std::equal(layers.begin() + 1, layers.end(), layers.begin())) return out;
  out += " of";
  for (size_t s = 0; s < layers.size(); ++s) out += (s ? ", " : " ") + std::to_string(layers[s]);
  return out + " layers";
}

std::string Pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

// The user-given quantity most likely to make a run outlast the simulator's time range: the
// slowest compute rate, then HBM bandwidth, op overhead, compute slowdown, link latency and
// link bandwidth overrides; "" if the run file gives none of them (the sizes or times are then
// at fault).
std::string SlowestGivenQuantity(const HardwareSpec& hw) {
  const DeviceOverride& d = hw.device;
  if (!d.flops.empty()) {
    auto slowest =
        std::min_element(d.flops.begin(), d.flops.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    return "hardware.device.flops." + slowest->first;
  }
  if (d.hbm_bandwidth) return "hardware.device.hbm_bandwidth";
  if (d.op_overhead) return "hardware.device.op_overhead";
  if (d.comm_compute_slowdown) return "hardware.device.comm_compute_slowdown";
  if (d.host_bandwidth) return "hardware.device.host_bandwidth";
  if (hw.link.latency) return "hardware.link.latency";
  if (hw.link.bandwidth) return "hardware.link.bandwidth";
  return "";
}

// Rows of cells as text: every column but the last padded to its longest cell plus two
// spaces, so long names never run into the next column.
std::string AlignColumns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const std::vector<std::string>& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c + 1 < row.size(); ++c) width[c] = std::max(width[c], row[c].size() + 2);
  }
  std::string out;
  for (const std::vector<std::string>& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      out += c + 1 < row.size() ? Pad(row[c], width[c]) : row[c];
    }
    out += "\n";
  }
  return out;
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
      network.Start(topo.device_vertex(t.src), topo.device_vertex(t.dst), t.bytes,
                    std::string(t.name), [&sim, &times, i] { times[i].second = sim.Now(); });
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
    report.ops.push_back(OpRow{t.name,
                               "transfer",
                               t.bytes,
                               start,
                               delivered,
                               "direct",
                               std::to_string(t.src) + " -> " + std::to_string(t.dst) + ", " +
                                   std::to_string(hops) + " hops",
                               "",
                               {},
                               {}});
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

// Host bytes a run with real data holds, from the lowered program: on every position the
// most values live at once in program order (SequentialPeakElements), as 4-byte words, twice
// (the simulated run and the reference evaluation each free buffers after their last
// reader), plus the global inputs. It counts the whole run's outputs and temporaries, not
// just its inputs.
Bytes NumericsFootprint(const ProgramSpec& program, const Mesh& mesh,
                        const LoweredProgram& lowered) {
  double elements = static_cast<double>(SequentialPeakElements(lowered));
  elements *= 2.0 * mesh.size();
  for (const ArraySpec& a : program.arrays) elements += static_cast<double>(NumElements(a.shape));
  double bytes = elements * 4;
  return bytes >= 9e18 ? Bytes(int64_t{9'000'000'000'000'000'000})
                       : Bytes(static_cast<int64_t>(bytes));
}

// How a global program becomes the shard_map body that runs (the partitioner's auto or
// explicit mode by default; model runs add remat and prefetching).
using PartitionFn = std::function<planner::PartitionResult(const ProgramSpec&, const Mesh&)>;

// Simulates `file`'s program; a global one is partitioned first, by `partition` when given;
// `donated` inputs are freed after their last reader (model runs' updated state).
std::map<std::string, Array> SimulateProgram(const RunFile& file, const RunCommandOptions& options,
                                             const Machine& machine, Observer* tracer,
                                             RunReport& report,
                                             const PartitionFn& partition = nullptr,
                                             const std::set<std::string>& donated = {}) {
  const ProgramSpec& written = *file.program;
  Mesh mesh = PlaceProgramMesh(machine, written);
  report.placement = DescribePlacement(mesh, machine.topology());
  // A global program (mode: explicit | auto) runs as the shard_map body it partitions into.
  std::optional<planner::PartitionResult> partitioned;
  if (written.mode != ProgramMode::kManual) {
    partitioned =
        partition ? partition(written, mesh) : planner::PartitionOnMachine(written, machine, mesh);
  }
  const ProgramSpec& program = partitioned ? partitioned->program : written;
  LoweredProgram lowered = LowerProgram(mesh, program, file.options.algorithms);
  CheckOutputs(mesh, program, lowered);

  bool cached = options.timing == "cached";
  std::string mode = options.numerics.empty() ? file.options.numerics : options.numerics;
  if (cached && mode == "on") {
    throw InputError("--timing cached runs timing only; use --numerics off or --timing network");
  }
  bool numerics = mode != "off" && !cached;
  if (cached) report.numerics_note = "off (--timing cached): timing only";
  if (numerics && mode == "auto") {
    Bytes footprint = NumericsFootprint(program, mesh, lowered);
    if (footprint > kNumericsBudget) {
      numerics = false;
      report.numerics_note = "off: the run would need about " + FormatBytes(footprint) +
                             " of host memory (the live values of every device, for the run "
                             "and its reference), over the " +
                             FormatBytes(kNumericsBudget) +
                             " budget of --numerics auto (use --numerics on to force)";
    }
  }
  if (!options.dump_dir.empty() && !numerics) {
    throw InputError("--dump " + options.dump_dir + ": needs real data, but numerics are " +
                     (mode == "off" || cached ? "off" : "off for this size (--numerics auto)") +
                     "; use --numerics on");
  }
  RunConfig config;
  config.numerics = numerics;
  config.chunk_size = file.options.chunk_size;
  config.algorithms = file.options.algorithms;
  config.base_dir = std::filesystem::path(file.path).parent_path().string();
  config.timing = cached ? TimingPath::kCached : TimingPath::kNetwork;
  config.jobs = PricingJobs();
  config.observer = tracer;
  config.donated_inputs = donated;
  RunResult result = RunProgram(machine, mesh, program, config, &lowered);
  report.end = result.end;
  report.events = result.events;
  report.simulated_devices = result.simulated_devices;
  for (size_t i = 0; i < result.ops.size(); ++i) {
    const OpTiming& t = result.ops[i];
    const std::string reason = partitioned ? partitioned->reasons.at(i) : "";
    const OpSpec& op = program.ops.at(i);
    report.ops.push_back(OpRow{t.name, t.op, t.bytes, t.start, t.end, t.algorithm, reason, reason,
                               IsCollective(op.kind) ? op.axis_name : std::vector<std::string>{},
                               t.compute});
  }
  report.per_device = result.per_device;
  report.memory = MemoryReport{
      true,        result.peak_memory, result.peak_device,  result.peak_op, result.hbm_capacity,
      result.fits, result.host_peak,   result.host_transfer};
  if (numerics) {
    report.numerics =
        partitioned ? planner::CheckPartitionedNumerics(result.outputs, mesh, written, program,
                                                        config.base_dir, &result.inputs)
                    : CheckNumerics(result.outputs, mesh, program, config.base_dir, &result.inputs);
    char line[200];
    std::snprintf(line, sizeof(line), "%s: max_abs_error %.3g (tolerance %.3g, worst %s)",
                  report.numerics.passed ? "passed" : "FAILED", report.numerics.max_abs_error,
                  report.numerics.tolerance, report.numerics.worst_output.c_str());
    report.numerics_note = line;
    if (report.numerics.nonfinite > 0) {
      std::snprintf(line, sizeof(line),
                    "; %d of %d outputs hold NaN or inf in the reference (matched, not checked)",
                    report.numerics.nonfinite, report.numerics.outputs);
      report.numerics_note += line;
    }
    if (report.numerics.unbounded > 0) {
      std::snprintf(line, sizeof(line),
                    "; %d of %d outputs have no finite error bound (only a non-finite mismatch "
                    "fails them)",
                    report.numerics.unbounded, report.numerics.outputs);
      report.numerics_note += line;
    }
    if (partitioned) {
      if (const std::optional<double> dropped =
              planner::MoeDroppedFraction(written, config.base_dir, &result.inputs)) {
        std::snprintf(line, sizeof(line), "; MoE routing dropped %.2f%% of expert assignments",
                      100 * *dropped);
        report.numerics_note += line;
      }
    }
  } else {
    report.numerics.checked = false;
    if (report.numerics_note.empty()) report.numerics_note = "off (--numerics off): timing only";
  }
  return std::move(result.outputs);
}

// A serving run's numerics: the whole prefill and a decode step at the mean context, each
// partitioned and run with real data on the network and checked against the unsharded step.
// The report's numerics are the worse of the two; its timing stays the composed one.
void CheckServeNumerics(const RunFile& file, const RunCommandOptions& options,
                        const Machine& machine, const ModelRunSpec& run, RunReport& report) {
  const planner::LogicalRules rules = planner::PlanRules(run.plan);
  std::string note;
  NumericsReport worst;
  worst.checked = true;
  planner::ServeConfig mean = *run.serve;
  mean.context = report.serve->mean_context;
  for (const auto& [step, what] : {std::pair{planner::ServeStep::kPrefill, "prefill"},
                                   std::pair{planner::ServeStep::kDecode, "decode"}}) {
    RunFile as_program = file;
    as_program.model.reset();
    try {
      as_program.program = planner::BuildServeStep(
          run.model, step == planner::ServeStep::kPrefill ? *run.serve : mean, step, run.plan.mesh,
          rules);
    } catch (const std::invalid_argument& e) {
      throw SpecError("model", e.what());
    }
    as_program.program->mesh_devices = planner::PlacePlanMesh(machine, run.plan).devices();
    for (const auto& [op, algorithm] : run.plan.algorithms) {
      as_program.options.algorithms[op] = algorithm;
    }
    RunCommandOptions step_options = options;
    step_options.timing = "network";
    step_options.numerics = "on";
    RunReport step_report;
    SimulateProgram(as_program, step_options, machine, nullptr, step_report);
    const NumericsReport& n = step_report.numerics;
    worst.checked = worst.checked && n.checked;
    if (!n.passed) worst.passed = false;
    if (n.max_abs_error >= worst.max_abs_error) {
      worst.max_abs_error = n.max_abs_error;
      worst.tolerance = n.tolerance;
      worst.worst_output = std::string(what) + " " + n.worst_output;
    }
    note += (note.empty() ? "" : "; ") + std::string(what) + " " + step_report.numerics_note;
  }
  report.numerics = worst;
  report.numerics_note = note;
}

// A model run: the step built from the model and plan. Timing-only runs (the default) use
// the cached collective costs on 2 and 3 layers, composed; numerics, traces, dumps and
// --timing network run the whole step's program the way every program runs.
std::map<std::string, Array> SimulateModel(const RunFile& file, const RunCommandOptions& options,
                                           const Machine& machine, Observer* tracer,
                                           RunReport& report) {
  const ModelRunSpec& run = *file.model;
  const double n = static_cast<double>(run.mlp ? planner::CountMlpParameters(*run.mlp)
                                               : planner::CountParameters(run.model).total);
  const auto [scale, suffix] = n >= 1e9   ? std::pair{1e9, "B"}
                               : n >= 1e6 ? std::pair{1e6, "M"}
                                          : std::pair{1e3, "K"};
  char line[256];
  if (run.mlp) {
    std::string sizes;
    for (int64_t s : run.mlp->layer_sizes) sizes += (sizes.empty() ? "" : "-") + std::to_string(s);
    std::snprintf(line, sizeof(line), "mlp %s (%.4g%s parameters)", sizes.c_str(), n / scale,
                  suffix);
  } else {
    std::snprintf(line, sizeof(line), "%s (%.4g%s parameters; %lld layers, d_model %lld)",
                  run.name.c_str(), n / scale, suffix, static_cast<long long>(run.model.layers),
                  static_cast<long long>(run.model.d_model));
  }
  report.model = line;
  report.plan = "mesh " + DescribePlanMesh(run.plan) + "; rules " + DescribeRules(run.plan.rules);
  const std::string mode = options.numerics.empty() ? file.options.numerics : options.numerics;
  // A pipeline's trace is its composed schedule (TrainStepOptions::observer).
  const bool whole = mode == "on" || (tracer && (!run.plan.pipeline || run.serve)) ||
                     !options.dump_dir.empty() || options.timing == "network";
  std::map<std::string, Array> outputs;
  if (run.plan.pipeline && whole) {
    throw InputError(
        "pipeline: runs are timing only (each stage's layers simulated and composed, the "
        "schedule run on their times; --trace writes that schedule); --numerics on, --dump and "
        "--timing network run steps without a pipeline");
  }
  if (options.whole_step && (run.serve || run.plan.pipeline)) {
    throw InputError(
        "--whole-step: training steps without a pipeline compose from short steps; serving and "
        "pipelined runs compose their own way");
  }
  if (run.serve) {
    const bool check = mode == "on";
    if (whole && !(check && !tracer && options.dump_dir.empty() && options.timing.empty())) {
      throw InputError(
          "serve: runs time prefill and decode composed from 2 and 3 layers; --trace, --dump "
          "and --timing network run training steps (--numerics on checks both serving steps)");
    }
    try {
      report.serve = planner::SimulateServe(machine, run.model, *run.serve, run.plan);
    } catch (const std::invalid_argument& e) {
      throw SpecError("model", e.what());
    }
    report.end = report.serve->total;
    report.events = report.serve->events;
    report.numerics.checked = false;
    report.numerics_note =
        "off: serving runs are timing only by default (--numerics on checks the prefill and a "
        "decode step with real data against the unsharded steps)";
    if (check) CheckServeNumerics(file, options, machine, run, report);
    return outputs;
  }
  try {
    if (!whole) {
      planner::TrainStepOptions step_options;
      step_options.compose = !options.whole_step;
      if (run.plan.pipeline) step_options.observer = tracer;
      report.step =
          run.mlp
              ? planner::SimulateMlpTrainStep(machine, *run.mlp, run.train, run.plan, step_options)
              : planner::SimulateTrainStep(machine, run.model, run.train, run.plan, step_options);
      report.end = report.step->step_time;
      report.events = report.step->events;
      report.numerics.checked = false;
      report.numerics_note =
          "off: a model run is timing only by default (--numerics on simulates the whole step "
          "with real data and checks it against the unsharded step)";
      return outputs;
    }
    planner::CheckOffload(machine, run.plan);
    const planner::LogicalRules rules = planner::PlanRules(run.plan);
    RunFile as_program = file;
    as_program.model.reset();
    std::vector<std::vector<std::string>> layers;
    std::vector<std::map<std::string, std::string>> checkpoints;
    std::vector<std::vector<std::string>> head_tiles;
    as_program.program = run.mlp
                             ? planner::BuildMlpTrainStep(*run.mlp, run.train, run.plan.mesh, rules)
                             : planner::BuildTrainStep(run.model, run.train, run.plan.mesh, rules,
                                                       &layers, &checkpoints, &head_tiles);
    const std::vector<std::vector<std::string>> offloaded =
        planner::CheckpointValues(checkpoints, run.plan.offload, "plan.offload");
    const std::vector<std::vector<std::string>> saved =
        planner::CheckpointValues(checkpoints, run.plan.remat_save, "plan.remat.save");
    const int64_t layer_count =
        run.mlp ? static_cast<int64_t>(run.mlp->layer_sizes.size()) - 1 : run.model.layers;
    as_program.program->mesh_devices = planner::PlacePlanMesh(machine, run.plan).devices();
    for (const auto& [op, algorithm] : run.plan.algorithms) {
      as_program.options.algorithms[op] = algorithm;
    }
    RunCommandOptions program_options = options;
    if (program_options.timing.empty()) program_options.timing = "network";
    auto partition = [&](const ProgramSpec& global, const Mesh& mesh) {
      NetworkCollectiveModel network(machine);
      CachedCollectiveModel cache(network);
      return planner::PartitionTrainStep(
          global, layers, run.plan.remat,
          planner::PartitionCosts{&mesh, &cache, machine.compute_model(),
                                  planner::DeviceInBytesPerSecond(machine), &machine},
          planner::PrefetchGroups(layer_count, run.train), nullptr, run.plan.collective_matmul,
          offloaded, head_tiles, saved);
    };
    outputs = SimulateProgram(as_program, program_options, machine, tracer, report, partition,
                              planner::UpdatedInputs(*as_program.program));
    // Bounded dropless buffers may drop copies: MoeDroppedFraction counted them above.
    if (!run.mlp && run.model.experts > 0 && run.model.capacity_factor <= 0 &&
        run.model.ragged_buffer_factor <= 0 && report.numerics.checked) {
      report.numerics_note +=
          "; MoE routing is dropless (capacity_factor <= 0): no expert assignment dropped";
    }
    const Mesh mesh = PlaceMesh(machine, run.plan.mesh, run.plan.devices);
    Time recompute;
    for (const OpRow& op : report.ops) {
      if (planner::IsRecompute(op.name)) recompute += op.compute;
    }
    const planner::StepFigures f =
        planner::FiguresOfRun(report.end, report.per_device, recompute, report.memory.peak,
                              report.events, *as_program.program, mesh);
    report.step = run.mlp
                      ? planner::MakeStepReport(
                            machine, mesh, planner::MlpTrainStepModelFlops(*run.mlp, run.train),
                            static_cast<double>(run.train.batch), run.train.dtype, f, {layer_count})
                      : planner::MakeTrainStepReport(machine, mesh, run.model, run.train, f,
                                                     {run.model.layers});
    report.step->remat = run.plan.remat;
    report.step->remat_save = run.plan.remat_save;
    if (run.mlp) report.step->model_flops_rule = planner::kMlpFlopsRule;
  } catch (const std::invalid_argument& e) {
    throw SpecError("model", e.what());
  }
  return outputs;
}

// The lines every model run's summary starts with: hardware, placement, model and plan.
void ModelRunHeader(std::ostringstream& out, const RunReport& r) {
  out << "hardware:       " << r.hardware << "\n";
  if (!r.placement.empty()) out << "placement:      " << r.placement << "\n";
  out << "model:          " << r.model << "\n";
  out << "plan:           " << r.plan << "\n";
}

std::string ModelSummary(const RunReport& r) {
  const planner::TrainStepReport& s = *r.step;
  std::ostringstream out;
  char line[512];
  ModelRunHeader(out, r);
  if (s.simulated_layers.size() == 2 && !s.simulated_dense_first.empty()) {
    std::snprintf(line, sizeof(line),
                  "simulated:      %lld and %lld layers, and %lld with the first dense, composed "
                  "(expert layers are identical, as are dense ones; every figure affine in "
                  "their counts)\n",
                  static_cast<long long>(s.simulated_layers[0]),
                  static_cast<long long>(s.simulated_layers[1]),
                  static_cast<long long>(s.simulated_dense_first[0]));
  } else if (s.simulated_layers.size() == 2) {
    std::snprintf(line, sizeof(line),
                  "simulated:      %lld and %lld layers, composed (layers are identical; every "
                  "figure affine in their count)\n",
                  static_cast<long long>(s.simulated_layers[0]),
                  static_cast<long long>(s.simulated_layers[1]));
  } else {
    std::snprintf(line, sizeof(line), "simulated:      the whole step (%lld layers)\n",
                  static_cast<long long>(s.simulated_layers.at(0)));
  }
  out << line;
  std::snprintf(line, sizeof(line), "events:         %llu in %.3f s wall\n\n",
                static_cast<unsigned long long>(r.events), r.wall_s);
  out << line;
  out << "simulated time: " << FormatTime(s.step_time) << " (one training step)\n";
  std::snprintf(line, sizeof(line), "tokens/s:       %.6g (%.6g per device, %d devices)\n",
                s.tokens_per_s, s.tokens_per_s_per_device, s.devices);
  out << line;
  std::snprintf(line, sizeof(line),
                "MFU:            %.2f%% (model FLOPs %.4g per step: %s; peak %.4g TFLOP/s per "
                "device)\n",
                100 * s.mfu, s.model_flops, s.model_flops_rule.c_str(), s.peak_flops / 1e12);
  out << line;
  out << "breakdown:      compute " << FormatTime(s.compute) << ", communication "
      << FormatTime(s.comm) << " (exposed " << FormatTime(s.exposed_comm) << "), bubble "
      << FormatTime(s.bubble)
      << (s.pipeline_stages > 1 ? " (" + PipelineStages(s) + ")" : std::string(" (no pipeline)"))
      << ", recompute " << FormatTime(s.recompute)
      << " (remat: " << planner::RematText(s.remat, s.remat_save) << ")\n";
  if (!s.exposed_by_collective.empty()) {
    // Largest first.
    std::vector<std::pair<Time, std::string>> by;
    for (const auto& [name, t] : s.exposed_by_collective) by.push_back({t, name});
    std::sort(by.begin(), by.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    out << "exposed by:     ";
    for (size_t i = 0; i < by.size(); ++i) {
      out << (i ? ", " : "") << by[i].second << " " << FormatTime(by[i].first);
    }
    out << "\n";
  }
  const planner::StepMemory& m = s.memory;
  out << "memory/device:  params " << FormatBytes(m.params) << ", grads " << FormatBytes(m.grads)
      << ", optimizer " << FormatBytes(m.optimizer) << ", activations and temporaries "
      << FormatBytes(m.activations) << "; peak " << FormatBytes(m.peak) << " of "
      << FormatBytes(m.capacity) << " HBM: " << (m.fits ? "fits" : "DOES NOT FIT") << "\n";
  if (s.overlap != planner::StepOverlap::kFull) {
    // The scheduler kept the step within HBM by overlapping less (TrainStepOptions::within_memory).
    out << "schedule:       " << planner::StepOverlapName(s.overlap)
        << (s.overlap == planner::StepOverlap::kNoPrefetch
                ? ": each weight's collective issued where its layer reads it"
                : ": every collective where the partitioner put it");
    if (s.overlapped_peak > Bytes(0)) {
      out << " (prefetching them a layer ahead peaks at " << FormatBytes(s.overlapped_peak)
          << ", over the HBM)";
    }
    out << "\n";
  }
  if (!s.pipeline_peaks.empty()) {
    // Each stage's peak: the first holds the embedding, the last the head, the others neither.
    out << "stage peaks:    ";
    for (size_t i = 0; i < s.pipeline_peaks.size(); ++i) {
      out << (i ? ", " : "") << FormatBytes(s.pipeline_peaks[i]);
    }
    out << "\n";
  }
  if (m.host > Bytes(0)) {
    out << "host offload:   " << FormatBytes(m.host) << " in host memory at most, copies "
        << FormatTime(s.host_transfer) << " on the host link (beside compute)\n";
  }
  out << "\nnumerics:       " << r.numerics_note << "\n";
  return out.str();
}

std::string ServeSummary(const RunReport& r) {
  const planner::ServeReport& s = *r.serve;
  std::ostringstream out;
  char line[512];
  ModelRunHeader(out, r);
  auto how = [](const std::vector<int64_t>& layers) {
    return layers.size() == 2 ? "composed from " + std::to_string(layers[0]) + " and " +
                                    std::to_string(layers[1]) + " layers"
                              : std::string("whole");
  };
  const std::string both =
      s.prefill_layers == s.simulated_layers
          ? "prefill and decode, each " + how(s.simulated_layers)
          : "prefill " + how(s.prefill_layers) + ", decode " + how(s.simulated_layers);
  std::snprintf(line, sizeof(line),
                "simulated:      %s\n"
                "events:         %llu in %.3f s wall\n\n",
                both.c_str(), static_cast<unsigned long long>(r.events), r.wall_s);
  out << line;
  out << "TTFT:           " << FormatTime(s.ttft) << " (the prefill step)\n";
  out << "TPOT:           " << FormatTime(s.tpot) << " (one decode step at context "
      << s.mean_context << ", the mean over the generation)\n";
  out << "simulated time: " << FormatTime(s.total) << " (TTFT + (decode_len - 1) x TPOT)\n";
  std::snprintf(line, sizeof(line), "tokens/s:       %.6g output (%.6g per device, %d devices)\n",
                s.tokens_per_s, s.tokens_per_s_per_device, s.devices);
  out << line;
  out << "decode step:    compute " << FormatTime(s.decode_compute) << ", exposed communication "
      << FormatTime(s.decode_exposed_comm) << "\n";
  const planner::ServeMemory& m = s.memory;
  out << "memory/device:  params " << FormatBytes(m.params) << ", KV cache "
      << FormatBytes(m.kv_cache) << ", activations and temporaries " << FormatBytes(m.activations)
      << "; peak " << FormatBytes(m.peak) << " of " << FormatBytes(m.capacity)
      << " HBM: " << (m.fits ? "fits" : "DOES NOT FIT") << "\n";
  out << "\nnumerics:       " << r.numerics_note << "\n";
  return out.str();
}

std::string Summary(const RunReport& r) {
  if (r.step) return ModelSummary(r);
  if (r.serve) return ServeSummary(r);
  std::ostringstream out;
  out << "hardware:       " << r.hardware << "\n";
  if (!r.placement.empty()) out << "placement:      " << r.placement << "\n";
  out << "simulated time: " << FormatTime(r.end) << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "events:         %llu in %.3f s wall\n\n",
                static_cast<unsigned long long>(r.events), r.wall_s);
  out << line;
  std::vector<std::vector<std::string>> ops = {
      {"op", "kind", "bytes", "start", "end", "algorithm"}};
  for (const OpRow& o : r.ops) {
    ops.push_back({o.name, o.op, FormatBytes(o.bytes), Micros(o.start), Micros(o.end),
                   o.algorithm + (o.detail.empty() ? "" : "  (" + o.detail + ")")});
  }
  out << AlignColumns(ops) << "\n";
  std::vector<std::vector<std::string>> devices = {
      {"device", "compute", "comm", "exposed comm", "idle"}};
  // Large machines: the first 8 devices, then the spread.
  size_t shown = std::min<size_t>(r.per_device.size(), 8);
  for (size_t i = 0; i < shown; ++i) {
    const DeviceTiming& d = r.per_device[i];
    devices.push_back({std::to_string(d.device), Micros(d.compute), Micros(d.comm),
                       Micros(d.exposed_comm), Micros(d.idle)});
  }
  out << AlignColumns(devices);
  if (shown < r.per_device.size()) {
    Time lo = Time::Max(), hi;
    for (const DeviceTiming& d : r.per_device) {
      lo = std::min(lo, d.comm);
      hi = std::max(hi, d.comm);
    }
    out << "... " << r.per_device.size() - shown << " more devices; comm ranges " << Micros(lo)
        << " .. " << Micros(hi) << "\n";
  }
  if (r.memory.known) {
    out << "\nmemory:         peak " << FormatBytes(r.memory.peak) << " per device (device "
        << r.memory.peak_device << ", at " << r.memory.peak_op << ") of "
        << FormatBytes(r.memory.capacity) << " HBM: " << (r.memory.fits ? "fits" : "DOES NOT FIT")
        << "\n";
    if (r.memory.host > Bytes(0)) {
      out << "host memory:    " << FormatBytes(r.memory.host) << " per device at most, copies "
          << FormatTime(r.memory.host_transfer) << " on the host link (beside compute)\n";
    }
  }
  out << "\nnumerics:       " << r.numerics_note << "\n";
  return out.str();
}

// A model run's "model" and "plan" fields, and `number` appending a numeric field.
std::function<void(const char*, double)> AppendModelJson(std::string& j, const RunReport& r) {
  j += ",\n  \"model\": ";
  AppendJsonString(j, r.model);
  j += ",\n  \"plan\": ";
  AppendJsonString(j, r.plan);
  return [&j](const char* key, double value) {
    j += ",\n  \"" + std::string(key) + "\": ";
    AppendJsonNumber(j, value);
  };
}

// A training step's fields (SPEC "Models, training and serving steps").
void AppendStepJson(std::string& j, const RunReport& r) {
  const planner::TrainStepReport& s = *r.step;
  const auto number = AppendModelJson(j, r);
  // `"name": [a, b, ...]`, left out when empty unless `always`.
  auto ints = [&j](const char* name, const std::vector<int64_t>& values, bool always) {
    if (values.empty() && !always) return;
    j += std::string(",\n  \"") + name + "\": [";
    for (size_t i = 0; i < values.size(); ++i) j += (i ? ", " : "") + std::to_string(values[i]);
    j += "]";
  };
  number("step_time_s", s.step_time.seconds());
  number("tokens_per_s", s.tokens_per_s);
  number("tokens_per_s_per_device", s.tokens_per_s_per_device);
  number("mfu", s.mfu);
  number("model_flops", s.model_flops);
  number("peak_flops_per_device", s.peak_flops);
  number("compute_s", s.compute.seconds());
  number("comm_s", s.comm.seconds());
  number("exposed_comm_s", s.exposed_comm.seconds());
  number("bubble_s", s.bubble.seconds());
  ints("pipeline_layers", s.pipeline_layers, false);
  std::vector<int64_t> peaks;
  for (Bytes b : s.pipeline_peaks) peaks.push_back(b.count());
  ints("pipeline_peak_bytes", peaks, false);
  number("recompute_s", s.recompute.seconds());
  j += ",\n  \"exposed_comm_by_collective_s\": {";
  bool first = true;
  for (const auto& [name, t] : s.exposed_by_collective) {
    j += first ? "" : ", ";
    first = false;
    AppendJsonString(j, name);
    j += ": ";
    AppendJsonNumber(j, t.seconds());
  }
  j += "}";
  j += ",\n  \"remat\": ";
  AppendJsonString(j, planner::RematPolicyName(s.remat));
  if (s.remat == planner::RematPolicy::kCustom) {
    j += ",\n  \"remat_save\": ";
    AppendJsonStrings(j, s.remat_save);
  }
  const planner::StepMemory& m = s.memory;
  j += ",\n  \"step_memory\": {\"params\": " + std::to_string(m.params.count()) +
       ", \"grads\": " + std::to_string(m.grads.count()) +
       ", \"optimizer\": " + std::to_string(m.optimizer.count()) +
       ", \"activations\": " + std::to_string(m.activations.count()) +
       ", \"peak\": " + std::to_string(m.peak.count()) +
       ", \"capacity\": " + std::to_string(m.capacity.count()) +
       (m.host > Bytes(0) ? ", \"host\": " + std::to_string(m.host.count()) : std::string()) + "}";
  if (m.host > Bytes(0)) number("host_transfer_s", s.host_transfer.seconds());
  j += ",\n  \"fits\": ";
  j += m.fits ? "true" : "false";
  j += ",\n  \"schedule\": ";
  AppendJsonString(j, planner::StepOverlapName(s.overlap));
  if (s.overlapped_peak > Bytes(0)) {
    j += ",\n  \"prefetching_peak\": " + std::to_string(s.overlapped_peak.count());
  }
  ints("simulated_layers", s.simulated_layers, true);
  ints("simulated_dense_first", s.simulated_dense_first, false);
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
  if (r.step) AppendStepJson(j, r);
  if (r.serve) {
    const planner::ServeReport& s = *r.serve;
    const auto number = AppendModelJson(j, r);
    number("ttft_s", s.ttft.seconds());
    number("tpot_s", s.tpot.seconds());
    j += ",\n  \"mean_context\": " + std::to_string(s.mean_context);
    number("generation_s", s.total.seconds());
    number("tokens_per_s", s.tokens_per_s);
    number("tokens_per_s_per_device", s.tokens_per_s_per_device);
    j += ",\n  \"kv_cache_bytes\": " + std::to_string(s.memory.kv_cache.count());
    const planner::ServeMemory& m = s.memory;
    j += ",\n  \"step_memory\": {\"params\": " + std::to_string(m.params.count()) +
         ", \"kv_cache\": " + std::to_string(m.kv_cache.count()) +
         ", \"activations\": " + std::to_string(m.activations.count()) +
         ", \"peak\": " + std::to_string(m.peak.count()) +
         ", \"capacity\": " + std::to_string(m.capacity.count()) + "}";
    j += ",\n  \"fits\": ";
    j += m.fits ? "true" : "false";
  }
  if (r.memory.known) {
    j += ",\n  \"simulated_devices\": " + std::to_string(r.simulated_devices);
    j += ",\n  \"memory\": {\"peak_bytes\": " + std::to_string(r.memory.peak.count()) +
         ", \"peak_device\": " + std::to_string(r.memory.peak_device) + ", \"peak_op\": ";
    AppendJsonString(j, r.memory.peak_op);
    j += ", \"capacity_bytes\": " + std::to_string(r.memory.capacity.count());
    if (r.memory.host > Bytes(0)) {
      j += ", \"host_bytes\": " + std::to_string(r.memory.host.count()) + ", \"host_transfer_s\": ";
      AppendJsonNumber(j, r.memory.host_transfer.seconds());
    }
    j += "}";
    j += ",\n  \"fits\": ";
    j += r.memory.fits ? "true" : "false";
  }
  j += ",\n  \"numerics\": {\"checked\": ";
  j += r.numerics.checked ? "true" : "false";
  j += ", \"max_abs_error\": ";
  AppendJsonNumber(j, r.numerics.max_abs_error);
  j += ", \"tolerance\": ";
  AppendJsonNumber(j, r.numerics.tolerance);
  j += ", \"passed\": ";
  j += r.numerics.passed ? "true" : "false";
  if (r.numerics.checked) {
    j += ", \"outputs\": " + std::to_string(r.numerics.outputs) +
         ", \"unbounded_outputs\": " + std::to_string(r.numerics.unbounded) +
         ", \"nonfinite_outputs\": " + std::to_string(r.numerics.nonfinite);
  }
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
    if (!o.axis_name.empty()) {
      j += ", \"axis_name\": ";
      AppendJsonStrings(j, o.axis_name);
    }
    if (!o.reason.empty()) {
      j += ", \"reason\": ";
      AppendJsonString(j, o.reason);
    }
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
    if (r.memory.known) j += ", \"peak_bytes\": " + std::to_string(d.peak_memory.count());
    j += "}";
  }
  j += "\n  ]\n}\n";
  return j;
}

}  // namespace

int RunRunCommand(const RunCommandOptions& options) {
  auto wall_start = std::chrono::steady_clock::now();
  CheckDistinctOutputs({{"--trace", options.trace_path},
                        {"--json", options.json_path},
                        {"--dump", options.dump_dir}});
  if (!options.trace_devices.empty() && options.trace_path.empty()) {
    throw InputError("--trace-devices needs --trace");
  }
  RunFile file = LoadRunFile(options.file, options.overrides);
  RunReport report;
  report.file = file.path;
  // The trace streams to a temporary file while the simulation runs.
  std::unique_ptr<StagedFile> trace_file;
  std::unique_ptr<TraceWriter> tracer;
  if (!options.trace_path.empty()) {
    trace_file = std::make_unique<StagedFile>(options.trace_path);
    tracer = std::make_unique<TraceWriter>(trace_file->stream());
  }
  Observer* observer = tracer.get();
  std::map<std::string, Array> outputs;
  try {
    Machine machine(BuildHardware(file.hardware));
    const Topology& topo = machine.topology();
    report.hardware = topo.name() + " (" + std::to_string(topo.num_devices()) + " devices, " +
                      std::to_string(topo.num_switches()) + " switches, " +
                      std::to_string(topo.num_physical_links()) + " links)";
    report.devices = topo.num_devices();
    if (tracer && !options.trace_devices.empty() && file.model && file.model->plan.pipeline) {
      throw InputError(
          "--trace-devices: a pipeline's trace has a process per stage, not per device (its "
          "composed schedule); leave the flag out");
    }
    if (tracer && !options.trace_devices.empty()) {
      // Devices' pids are their indices; switches (pids after the devices) are left out.
      std::vector<bool> keep(topo.num_devices());
      for (int64_t d :
           ParseIndexListFlag("--trace-devices", options.trace_devices, topo.num_devices())) {
        keep[d] = true;
      }
      tracer->KeepOnlyProcesses(std::move(keep));
    }
    if (file.model) {
      outputs = SimulateModel(file, options, machine, observer, report);
    } else if (file.program) {
      outputs = SimulateProgram(file, options, machine, observer, report);
    } else {
      if (options.timing == "cached") {
        throw InputError("--timing cached applies to programs, not to a transfers: run");
      }
      CheckTransferDevices(file, topo);
      Simulator sim;
      if (observer) sim.AddObserver(observer);
      Network network(sim, topo, machine.router());
      SimulateTransfers(file, topo, sim, network, report);
      report.events = sim.events_dispatched();
    }
  } catch (const SpecError& e) {
    throw InputError(file.Locate(e));
  } catch (const TimeRangeError& e) {
    // The input's numbers are absurd for each other (e.g. a huge matmul at 100 FLOP/s).
    std::string key = SlowestGivenQuantity(file.hardware);
    std::string what = std::string(e.what()) +
                       ": the run's sizes are too large for the hardware's rates and latencies";
    throw InputError(file.Locate(SpecError(key, what)));
  }
  report.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  // Every output file is written all or nothing: the trace, the summary and the dumps.
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<StagedFile*> staged;
  if (tracer) {
    tracer->Finish();
    staged.push_back(trace_file.get());
  }
  if (!options.json_path.empty()) files.emplace_back(options.json_path, Json(report));
  if (!options.dump_dir.empty()) {
    CreateOutputFolder("--dump", options.dump_dir);
    for (const auto& [name, array] : outputs) {
      files.emplace_back((std::filesystem::path(options.dump_dir) / (name + ".npy")).string(),
                         EncodeNpy(array));
    }
  }
  WriteOutputFiles(files, staged);
  if (!options.quiet) std::cout << Summary(report);
  if (!options.quiet && report.memory.known && !report.memory.fits) {
    std::cerr << "warning: device " << report.memory.peak_device << " needs "
              << FormatBytes(report.memory.peak) << " at op " << report.memory.peak_op
              << ", over its " << FormatBytes(report.memory.capacity)
              << " of HBM: this program does not fit\n";
  }
  return report.numerics.passed ? 0 : 1;
}

}  // namespace shardsim
