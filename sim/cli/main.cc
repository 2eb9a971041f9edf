// The shardsim command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "sim/cli/run_command.h"
#include "sim/cli/run_file.h"
#include "sim/cli/topo_command.h"
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
  topo_cmd->add_option("--dot", topo.dot_path, "Write the graph as Graphviz to this file");
  topo_cmd->add_option("--json", topo.json_path, "Write the description as JSON to this file");

  shardsim::RunCommandOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "Simulate a run file and print a summary");
  run_cmd->add_option("file", run.file, "The run file (YAML)")->required();
  run_cmd->add_option("--trace", run.trace_path, "Write a Perfetto (Chrome JSON) trace");
  run_cmd->add_option("--json", run.json_path, "Write the summary as JSON");
  run_cmd->add_option("--dump", run.dump_dir, "Write every output array as DIR/NAME.npy");
  run_cmd->add_option("--numerics", run.numerics, "Check numerics: auto, on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  run_cmd->add_option("--set", run.overrides, "Override a run-file key: KEY=VALUE (repeatable)");

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
    if (app.got_subcommand(run_cmd)) return shardsim::RunRunCommand(run);
  } catch (const shardsim::InputError& e) {
    return BadInput(e.what());
  } catch (const shardsim::SpecError& e) {
    return BadInput(std::string(e.what()) + " (key " + e.key() + ")");
  } catch (const shardsim::UnitError& e) {
    return BadInput(e.what());
  } catch (const std::exception& e) {
    return BadInput(e.what());
  }
  return 2;
}
