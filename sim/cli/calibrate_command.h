// `shardsim calibrate`: fits a GPU preset's communication figures to nccl-tests output.
#pragma once

#include <string>
#include <vector>

namespace shardsim {

// What `shardsim calibrate` was asked.
struct CalibrateCommandOptions {
  std::string preset;              // --preset: a GPU preset.
  std::vector<std::string> files;  // nccl-tests outputs.
  int max_simulations = 4000;      // --max-simulations: the fit's budget.
  // --fit: the figures to fit, comma-separated `hardware.comm` keys, or "all". Empty: the
  // latencies and the link efficiencies (the protocols' efficiencies stay NCCL's model's).
  std::string fit;
};

// The `hardware.comm` keys --fit accepts, in the order they are fitted and printed.
std::vector<std::string> CalibrationKeys();

// Reads the files, fits the preset's CommSpec figures (by default launch latency, the
// protocols' step latencies, NVLink efficiency, and when a run spans nodes the network
// latency and NIC efficiency; --fit chooses among those, the LL and LL128 efficiencies and
// the channel count, a whole number moved one at a time at least) by least squares on log time (a
// coordinate search in log space: each figure scaled up and down by a step that halves when nothing
// improves, from 2x down to 0.5%), and prints the fitted figures as a `hardware:` block and the
// error per size before and after. Returns 0. Throws InputError for unreadable files or a preset
// that is not a GPU preset.
int RunCalibrateCommand(const CalibrateCommandOptions& options);

}  // namespace shardsim
