// `shardsim compare`: several model runs side by side, and why the fastest wins (SPEC
// "Comparing plans").
#pragma once

#include <string>
#include <vector>

namespace shardsim {

// What `shardsim compare` was asked.
struct CompareCommandOptions {
  std::vector<std::string> files;      // Model run files (training steps), two or more.
  std::string json_path;               // --json: each run's figures and the reasons.
  std::string report_path;             // --report: an HTML page.
  std::string trace_dir;               // --trace-dir: each run's Perfetto trace, DIR/LABEL.json.
  std::vector<std::string> overrides;  // --set KEY=VALUE, applied to every file.
};

// Simulates each file's step as `shardsim run` does (timing only), prints the side-by-side
// table and the reasons, writes --json. Returns 0. Throws InputError for bad input.
int RunCompareCommand(const CompareCommandOptions& options);

}  // namespace shardsim
