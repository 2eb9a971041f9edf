// `shardsim plan`: search sharding plans for the best simulated step (SPEC "Searching plans").
#pragma once

#include <string>
#include <vector>

namespace shardsim {

// What `shardsim plan` was asked.
struct PlanCommandOptions {
  std::string file;                    // The plan search file.
  int jobs = 1;                        // --jobs: worker threads.
  int64_t budget = 0;                  // --budget: candidates considered (0: all).
  std::string time_limit;              // --time-limit, e.g. "60s" (empty: none).
  int top = 10;                        // --top: rows of the ranked table.
  std::string out_path;                // --out: one JSON line per evaluated plan (resumable).
  std::string json_path;               // --json: the ranked list.
  std::string report_path;             // --report: an HTML page.
  bool mpi = false;                    // --mpi: spread evaluations over the MPI processes.
  std::string cache_dir;               // --cache: collective timings kept across runs.
  std::vector<std::string> overrides;  // --set KEY=VALUE.
};

// Loads the file, searches, prints the ranked table, writes the requested files. Returns the
// exit code (0). Throws InputError for bad input.
int RunPlanCommand(const PlanCommandOptions& options);

}  // namespace shardsim
