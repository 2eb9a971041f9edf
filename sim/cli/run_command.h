// `shardsim run`: simulate a run file.
#pragma once

#include <string>
#include <vector>

namespace shardsim {

// What `shardsim run` was asked.
struct RunCommandOptions {
  std::string file;           // The run file.
  std::string trace_path;     // --trace, or empty.
  std::string trace_devices;  // --trace-devices "0-15,32", or empty (all).
  std::string json_path;      // --json, or empty.
  std::string dump_dir;       // --dump, or empty.
  std::string numerics;       // --numerics auto|on|off, or empty (the file's option).
  std::string timing;         // --timing network|cached, or empty (the run's kind's).
  // --whole-step: a model run simulates every layer (cached timing) instead of composing the
  // step from two short ones.
  bool whole_step = false;
  std::vector<std::string> overrides;  // --set KEY=VALUE.
  bool quiet = false;  // Write the files only (no summary, no warning): compare's traces.
};

// Loads, simulates, prints the summary and writes the requested files. Returns the exit
// code (0 ok, 1 numerics check failed). Throws InputError for bad input.
int RunRunCommand(const RunCommandOptions& options);

}  // namespace shardsim
