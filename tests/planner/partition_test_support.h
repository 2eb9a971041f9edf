// What the partitioner tests share: building blocks for global programs, the collectives a
// lowered program holds, and its numerics against the unsharded program, on a TPU v5e 4x2.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/runtime/run_program.h"
#include "planner/partitioned_numerics.h"
#include "planner/partitioner.h"
#include "tests/support/specs.h"
#include "topology/presets.h"

namespace shardsim::planner {

using test::Normal;
using test::P;

// A collective the partitioner inserted: kind, axes, and bytes of its input on one device.
struct Inserted {
  OpKind kind;
  std::vector<std::string> axes;
  int64_t bytes;
  bool operator==(const Inserted&) const = default;
};

inline std::ostream& operator<<(std::ostream& os, const Inserted& c) {
  os << OpKindName(c.kind) << " over";
  for (const std::string& a : c.axes) os << " " << a;
  return os << " (" << c.bytes << " B)";
}

// The collectives of `lowered`, with per-device input bytes from the global shapes and the
// lowered types (the comment types hold global shapes and shardings).
inline std::vector<Inserted> Collectives(const ProgramSpec& global,
                                         const PartitionResult& lowered) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  Mesh mesh = PlaceMesh(machine, lowered.program.mesh_axes);
  RunResult r = RunProgram(machine, mesh, lowered.program, RunConfig{});
  std::vector<Inserted> out;
  for (size_t i = 0; i < lowered.program.ops.size(); ++i) {
    const OpSpec& op = lowered.program.ops[i];
    if (!IsCollective(op.kind)) continue;
    out.push_back({op.kind, op.axis_name, r.ops[i].bytes.count()});
  }
  return out;
}

// Runs `lowered` (a partitioning of `global`) on `mesh` of `machine` with numerics and checks
// it against the unsharded program.
inline void ExpectNumericsPass(const ProgramSpec& global, const PartitionResult& lowered,
                               const Machine& machine, const Mesh& mesh, bool finite = true) {
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, lowered.program, config);
  NumericsReport report =
      CheckPartitionedNumerics(r.outputs, mesh, global, lowered.program, "", &r.inputs);
  EXPECT_TRUE(report.checked);
  EXPECT_TRUE(report.passed) << report.worst_output << " error " << report.max_abs_error
                             << " tolerance " << report.tolerance;
  // NaN on both sides would compare equal: the outputs must be finite to mean anything
  // (`finite` false: the program makes NaN on purpose).
  for (const auto& [name, a] : r.outputs) {
    if (!finite) break;
    if (!a.has_data()) continue;
    for (int64_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(std::isfinite(a.ValueAt(i))) << name << " element " << i;
    }
  }
}

// Runs `global` partitioned on a TPU v5e 4x2 with numerics and checks it against the
// unsharded program.
inline void ExpectNumericsPass(const ProgramSpec& global, bool finite = true) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  ExpectNumericsPass(global, PartitionOnMachine(global, machine, mesh), machine, mesh, finite);
}

}  // namespace shardsim::planner
