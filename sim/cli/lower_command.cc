#include "sim/cli/lower_command.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <iostream>

#include "collectives/runtime/machine.h"
#include "planner/partitioner.h"
#include "sim/atomic_file.h"
#include "sim/cli/program_writer.h"
#include "sim/cli/run_file.h"
#include "topology/build.h"

namespace shardsim {

void RunLowerCommand(const LowerCommandOptions& options) {
  RunFile file = LoadRunFile(options.file, options.overrides);
  if (!file.program) {
    throw InputError(options.file + ": lower needs a program:, not transfers:");
  }
  const ProgramSpec& program = *file.program;
  planner::PartitionResult lowered;
  try {
    Machine machine(BuildHardware(file.hardware));
    Mesh mesh = PlaceProgramMesh(machine, program);
    lowered = planner::PartitionOnMachine(program, machine, mesh);
  } catch (const SpecError& e) {
    throw InputError(file.Locate(e));
  }
  std::vector<std::string> comments;
  for (size_t i = 0; i < lowered.program.ops.size(); ++i) {
    const std::string& reason = lowered.reasons[i];
    comments.push_back(lowered.types[i] + (reason.empty() ? "" : "  inserted: " + reason));
  }
  // Hardware and options as written (the source's own YAML, re-emitted).
  YAML::Node source = YAML::LoadFile(options.file);
  YAML::Node head;
  head["hardware"] = source["hardware"];
  if (source["options"]) head["options"] = source["options"];
  YAML::Emitter emitter;
  emitter << head;
  const std::string dir = std::filesystem::path(options.file).parent_path().string();
  std::string text = "# " + options.file + " (mode: " + ProgramModeName(program.mode) +
                     ") partitioned by shardsim lower: the shard_map body it runs as.\n" +
                     emitter.c_str() + "\n" + ProgramYaml(lowered.program, comments, dir);
  if (options.out_path.empty()) {
    std::cout << text;
  } else {
    WriteFileAtomically(options.out_path, text);
  }
}

}  // namespace shardsim
