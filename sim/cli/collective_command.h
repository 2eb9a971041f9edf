// `shardsim collective`: sweep one collective over message sizes, like nccl-tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "collectives/mesh.h"
#include "collectives/runtime/machine.h"
#include "sim/time.h"

namespace shardsim {

// What `shardsim collective` was asked.
struct CollectiveCommandOptions {
  std::string hardware;      // --hardware PRESET
  std::string shape;         // --shape 4x4, or empty
  std::optional<int> nodes;  // --nodes, if given.
  std::string mesh;          // --mesh dp=4,tp=2
  std::string op;            // --op: a collective of the op registry (CollectiveOpChoices()).
  std::string axis;          // --axis dp[,tp]
  std::string sizes = "1KiB:1GiB";  // --sizes
  std::string algorithm = "auto";   // --algorithm
  std::string csv_path;             // --csv
  std::string numerics = "off";     // --numerics on|off
};

// Runs the sweep and prints one row per size: size, count, time, algbw, busbw (nccl-tests'
// bus bandwidth factors). Returns 1 if a --numerics on check failed, else 0. Throws
// InputError for bad input.
int RunCollectiveCommand(const CollectiveCommandOptions& options);

// Simulates collective `kind` over `group_axes` of `mesh` on `elements` float32 elements in
// nccl-tests' convention (see the sweep), numerics off; `resolved` receives the algorithm that
// ran. Throws as RunProgram does.
Time SimulateCollectiveSize(const Machine& machine, const Mesh& mesh,
                            const std::vector<std::string>& group_axes, OpKind kind,
                            int64_t elements, const std::string& algorithm, std::string* resolved);

// The values --op takes, from the op registry: "psum, pmean, ... or ppermute".
std::string CollectiveOpChoices();
// The values --algorithm takes, from the algorithm registry: "ring, ..., auto".
std::string AlgorithmChoices();

// nccl-tests' busbw factor for an op over n devices: 2(n-1)/n for all-reduce, (n-1)/n for
// all-gather, reduce-scatter and all-to-all, 1 for a permute.
double BusBandwidthFactor(const std::string& op, int n);

}  // namespace shardsim
