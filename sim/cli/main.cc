// The shardsim command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>

#include "sim/cli/calibrate_command.h"
#include "sim/cli/collective_command.h"
#include "sim/cli/compare_command.h"
#include "sim/cli/lower_command.h"
#include "sim/cli/plan_command.h"
#include "sim/cli/run_command.h"
#include "sim/cli/run_file.h"
#include "sim/cli/show_sharding_command.h"
#include "sim/cli/topo_command.h"
#include "sim/freed_memory.h"
#include "sim/spec_error.h"
#include "sim/units.h"

namespace {

// Prints a one-line error and returns the bad-input exit code.
int BadInput(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "error: %s\n", line.c_str());
  return 2;
}

// Prints a one-line internal error (a broken invariant of shardsim, not the user's input)
// and returns its exit code.
int InternalError(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "internal error: %s\n", line.c_str());
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "shardsim: a discrete-event simulator of multi-device collectives and sharding cost"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardsim 0.1.0");

  shardsim::TopoCommandOptions topo;
  CLI::App* topo_cmd =
      app.add_subcommand("topo", "Describe a topology: devices, links, diameter, bisection");
  topo_cmd->add_option("target", topo.target, "A preset (tpu-v5p, h100-dgx, ...) or a YAML file")
      ->required();
  topo_cmd->add_option("--shape", topo.shape, "Chips per torus dimension, e.g. 4x4x4");
  topo_cmd->add_option("--nodes", topo.nodes, "Nodes of a multi-node GPU preset");
  topo_cmd->add_option("--slices", topo.slices, "Slices of a TPU preset joined by DCN");
  topo_cmd->add_option("--dot", topo.dot_path, "Write the graph as Graphviz to this file");
  topo_cmd->add_option("--json", topo.json_path, "Write the description as JSON to this file");

  shardsim::RunCommandOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Simulate a run file and print a summary");
  run_cmd->add_option("file", run.file, "The run file (YAML)")->required();
  run_cmd->add_option("--trace", run.trace_path, "Write a Perfetto (Chrome JSON) trace");
  run_cmd->add_option("--trace-devices", run.trace_devices,
                      "Trace only these devices, e.g. 0-15,32 (switches are left out)");
  run_cmd->add_option("--json", run.json_path, "Write the summary as JSON");
  run_cmd->add_option("--dump", run.dump_dir, "Write every output array as DIR/NAME.npy");
  run_cmd->add_option("--numerics", run.numerics, "Check numerics: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  run_cmd
      ->add_option("--timing", run.timing,
                   "How collectives are timed: network (simulate every transfer; the default "
                   "for programs) or cached (a memoized per-collective cost, one device per "
                   "timeline class; timing only; the default for model runs, whose step is "
                   "composed from 2 and 3 simulated layers)")
      ->check(CLI::IsMember({"network", "cached"}));
  run_cmd->add_flag("--whole-step", run.whole_step,
                    "Model runs: simulate every layer (cached timing) instead of composing the "
                    "step from short steps of 2 and 3 layers (a check of the composition)");
  run_cmd->add_option("--set", run.overrides, "Override a run-file key: KEY=VALUE (repeatable)");

  shardsim::CollectiveCommandOptions coll;
  CLI::App* coll_cmd = app.add_subcommand(
      "collective", "Sweep one collective over message sizes (a table like nccl-tests)");
  coll_cmd->add_option("--hardware", coll.hardware, "A preset: tpu-v5e, h100-dgx, ...")->required();
  coll_cmd->add_option("--shape", coll.shape, "Chips per torus dimension, e.g. 4x4");
  coll_cmd->add_option("--nodes", coll.nodes, "Nodes of a multi-node GPU preset");
  coll_cmd->add_option("--mesh", coll.mesh, "Mesh axes, e.g. dp=4,tp=2")->required();
  coll_cmd->add_option("--op", coll.op, shardsim::CollectiveOpChoices())->required();
  coll_cmd->add_option("--axis", coll.axis, "Mesh axis or axes, e.g. dp or dp,tp")->required();
  coll_cmd->add_option("--sizes", coll.sizes, "MIN:MAX[:FACTOR] or one size (default 1KiB:1GiB)");
  coll_cmd->add_option("--algorithm", coll.algorithm, shardsim::AlgorithmChoices());
  coll_cmd->add_option("--csv", coll.csv_path, "Also write the table as CSV");
  coll_cmd->add_option("--numerics", coll.numerics, "Check the data too: on or off (default)")
      ->check(CLI::IsMember({"on", "off"}));

  shardsim::CalibrateCommandOptions calibrate;
  CLI::App* calibrate_cmd = app.add_subcommand(
      "calibrate",
      "Fit a GPU preset's communication figures to nccl-tests output (prints a hardware: block)");
  calibrate_cmd->add_option("--preset", calibrate.preset, "A GPU preset: a100-dgx, h100-dgx, ...")
      ->required();
  calibrate_cmd
      ->add_option("files", calibrate.files,
                   "Text output of all_reduce_perf, all_gather_perf, reduce_scatter_perf or "
                   "alltoall_perf")
      ->required();
  calibrate_cmd->add_option("--max-simulations", calibrate.max_simulations,
                            "Budget of the fit (default 4000)");
  calibrate_cmd->add_option("--fit", calibrate.fit,
                            "Figures to fit: all, or comma-separated hardware.comm keys (default: "
                            "the latencies and the NVLink/NIC efficiencies)");

  shardsim::ShowShardingOptions show;
  CLI::App* show_cmd = app.add_subcommand(
      "show-sharding", "Print an array's sharded type and which devices hold which block");
  show_cmd->add_option("--mesh", show.mesh, "Mesh axes, e.g. dp=4,tp=2")->required();
  show_cmd->add_option("--shape", show.shape, "Global shape, e.g. 1024x4096")->required();
  show_cmd->add_option("--spec", show.spec, "PartitionSpec, e.g. \"P('dp', None)\"")->required();
  show_cmd->add_option("--dtype", show.dtype,
                       shardsim::ShowShardingDTypeChoices() + " (default f32)");
  show_cmd->add_option("--hardware", show.hardware, "Place the mesh on a preset's devices");
  show_cmd->add_option("--hw-shape", show.hw_shape, "The preset's torus shape, e.g. 4x2");

  shardsim::LowerCommandOptions lower;
  CLI::App* lower_cmd = app.add_subcommand(
      "lower", "Partition a mode: explicit|auto program into its shard_map body (a run file)");
  lower_cmd->add_option("file", lower.file, "The run file (YAML)")->required();
  lower_cmd->add_option("-o,--out", lower.out_path, "Write the lowered run file here");
  lower_cmd->add_option("--set", lower.overrides,
                        "Override a run-file key: KEY=VALUE (repeatable)");

  shardsim::PlanCommandOptions plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "Search sharding plans of a model for the best simulated step (a ranked table)");
  plan_cmd->add_option("file", plan.file, "The plan search file (YAML: model, train, plan, search)")
      ->required();
  plan_cmd->add_option("--jobs", plan.jobs, "Worker threads (results equal for any number)");
  plan_cmd->add_option("--budget", plan.budget, "Consider only the first N candidates");
  plan_cmd->add_option("--time-limit", plan.time_limit,
                       "Start no new evaluation after this long, e.g. 60s");
  plan_cmd->add_option("--top", plan.top,
                       "Rows of the ranked table (default 10), each confirmed with run's "
                       "settled composition");
  plan_cmd->add_option("--out", plan.out_path,
                       "Append one JSON line per evaluated plan; a rerun resumes from it");
  plan_cmd->add_option("--json", plan.json_path, "Write the ranked plans as JSON");
  plan_cmd->add_option("--report", plan.report_path,
                       "Write a self-contained HTML report (charts as inline SVG)");
  plan_cmd->add_flag("--mpi", plan.mpi,
                     "Spread evaluations over the processes of mpirun -n P (Open MPI)");
  plan_cmd->add_option("--cache", plan.cache_dir,
                       "Keep the collectives' network simulations in this directory and reuse "
                       "them in later runs of this build on the same hardware");
  plan_cmd->add_option("--set", plan.overrides, "Override a file key: KEY=VALUE (repeatable)");

  shardsim::CompareCommandOptions compare;
  CLI::App* compare_cmd = app.add_subcommand(
      "compare", "Run several model run files side by side and explain why the fastest wins");
  compare_cmd->add_option("files", compare.files, "Model run files (two or more)")->required();
  compare_cmd->add_option("--json", compare.json_path, "Write the figures and reasons as JSON");
  compare_cmd->add_option("--report", compare.report_path,
                          "Write a self-contained HTML report (charts as inline SVG)");
  compare_cmd->add_option("--trace-dir", compare.trace_dir,
                          "Write each run's Perfetto trace as DIR/A.json, DIR/B.json, ... (as run "
                          "--trace: the whole step on the network, slow for large models; a "
                          "pipeline's composed schedule)");
  compare_cmd->add_option("--set", compare.overrides,
                          "Override a key in every file: KEY=VALUE (repeatable)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return BadInput(std::string(e.what()) + " (see shardsim --help)");
  }

  try {
    if (app.got_subcommand(topo_cmd)) {
      shardsim::RunTopoCommand(topo);
      return 0;
    }
    if (app.got_subcommand(run_cmd)) {
      shardsim::KeepFreedMemory();
      return shardsim::RunRunCommand(run);
    }
    if (app.got_subcommand(coll_cmd)) return shardsim::RunCollectiveCommand(coll);
    if (app.got_subcommand(calibrate_cmd)) return shardsim::RunCalibrateCommand(calibrate);
    if (app.got_subcommand(plan_cmd)) return shardsim::RunPlanCommand(plan);
    if (app.got_subcommand(compare_cmd)) return shardsim::RunCompareCommand(compare);
    if (app.got_subcommand(lower_cmd)) {
      shardsim::RunLowerCommand(lower);
      return 0;
    }
    if (app.got_subcommand(show_cmd)) {
      shardsim::RunShowShardingCommand(show);
      return 0;
    }
  } catch (const shardsim::InputError& e) {
    return BadInput(e.what());
  } catch (const shardsim::SpecError& e) {
    return BadInput(std::string(e.what()) + " (key " + e.key() + ")");
  } catch (const shardsim::UnitError& e) {
    return BadInput(e.what());
  } catch (const shardsim::TimeRangeError& e) {
    return BadInput(e.what());
  } catch (const std::invalid_argument& e) {
    // A model refusing a value the edge did not check: the input's fault, not a broken
    // invariant (invalid_argument is a logic_error, so it is caught first).
    return BadInput(e.what());
  } catch (const std::logic_error& e) {
    return InternalError(e.what());
  } catch (const std::overflow_error& e) {
    return InternalError(e.what());
  } catch (const std::range_error& e) {
    return InternalError(e.what());
  } catch (const std::underflow_error& e) {
    return InternalError(e.what());
  } catch (const std::bad_alloc&) {
    return InternalError("out of memory");
  } catch (const std::exception& e) {
    // Files that cannot be read or written, and other failures of the environment.
    return BadInput(e.what());
  }
  return 2;
}
