// Programs run end to end on the simulated network (through Machine and RunProgram): the
// data the transfers carried must equal the reference evaluation, op timings must follow the
// algorithms' closed forms, and bad programs fail before running with the key of the op at
// fault.
#include "collectives/executor.h"

#include <gtest/gtest.h>

#include <memory>

#include "collectives/lowering.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "sim/spec_error.h"
#include "tests/support/make_op.h"
#include "tests/support/specs.h"
#include "topology/switch.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

using test::MakeOp;
using test::P;

ArraySpec MakeArray(std::string name, Shape shape, PartitionSpec sharding,
                    InitSpec::Kind init = InitSpec::Kind::kArange, uint64_t seed = 0) {
  ArraySpec a;
  a.name = std::move(name);
  a.shape = std::move(shape);
  a.sharding = std::move(sharding);
  a.init.kind = init;
  a.init.seed = seed;
  return a;
}

// Runs `program` and checks its outputs against the reference; returns when it ended.
Time RunAndCheck(const Machine& m, const Mesh& mesh, const ProgramSpec& program,
                 bool numerics = true) {
  CheckProgram(mesh, program);
  RunConfig config;
  config.numerics = numerics;
  RunResult result = RunProgram(m, mesh, program, config);
  if (numerics) {
    NumericsReport r = CheckNumerics(result.outputs, mesh, program, "");
    EXPECT_TRUE(r.passed) << "max_abs_error " << r.max_abs_error << " on " << r.worst_output;
    // Integer-valued arange inputs keep every sum exact, whatever the order.
    EXPECT_EQ(r.max_abs_error, 0.0);
  }
  return result.end;
}

// Machines here have no compute model: local ops take no time, so timings are the
// collectives' closed forms.
Topology Torus(std::vector<int> shape, std::vector<bool> wrap) {
  DeviceSpec dev;
  dev.platform = "TPU";
  return BuildTorus(shape, wrap, Bandwidth::GBps(45), Time::Microseconds(1), LinkKind::kIci, dev,
                    "torus");
}

TEST(ExecutorTest, EveryCollectiveMatchesTheReferenceOnA2DMesh) {
  Machine m(Torus({4, 2}, {false, false}), nullptr, 0);
  std::vector<MeshAxis> axes = {{"dp", 4}, {"tp", 2}};
  Mesh mesh = PlaceMesh(m, axes);
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {MakeArray("a", {8, 4}, P({{"dp"}, {"tp"}})), MakeArray("b", {8, 8}, P({{}, {}}))};
  OpSpec rs = MakeOp(OpKind::kPsumScatter, {"b"}, "b_rs", {"dp"});
  rs.tiled = true;
  OpSpec ag = MakeOp(OpKind::kAllGather, {"a"}, "a_ag", {"dp", "tp"});
  ag.tiled = true;
  OpSpec a2a = MakeOp(OpKind::kAllToAll, {"b"}, "b_a2a", {"dp"});
  a2a.split_axis = 1;
  a2a.concat_axis = 0;
  a2a.tiled = true;
  OpSpec perm = MakeOp(OpKind::kPpermute, {"a"}, "a_perm", {"tp", "dp"});
  perm.shift = 1;
  p.ops = {MakeOp(OpKind::kPsum, {"a"}, "a_sum", {"dp"}),
           MakeOp(OpKind::kPmax, {"a"}, "a_max", {"dp", "tp"}),
           rs,
           ag,
           a2a,
           perm,
           MakeOp(OpKind::kPmean, {"a"}, "a_mean", {"tp"})};
  p.outputs = {{"a_sum", P({{}, {"tp"}}), "outputs.a_sum"},
               {"a_max", P({}), "outputs.a_max"},
               {"b_rs", P({{"dp"}}), "outputs.b_rs"},
               {"a_ag", P({}), "outputs.a_ag"},
               {"b_a2a", P({{"dp"}}), "outputs.b_a2a"},
               {"a_perm", P({{"dp"}, {"tp"}}), "outputs.a_perm"},
               {"a_mean", P({{"dp"}}), "outputs.a_mean"}};
  RunAndCheck(m, mesh, p);
}

TEST(ExecutorTest, PsumOnARingTakesTheRingClosedForm) {
  // 8 devices on a ring with wraparound, 8 MiB all-reduce with the ring algorithm:
  // 2 (N-1) steps of (latency + V / (N B)).
  Machine m(Torus({8}, {true}), nullptr, 0);
  std::vector<MeshAxis> axes = {{"r", 8}};
  Mesh mesh = PlaceMesh(m, axes);
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {MakeArray("x", {2 * 1024 * 1024}, P({}))};
  OpSpec op = MakeOp(OpKind::kPsum, {"x"}, "y", {"r"});
  op.algorithm = "ring";
  p.ops = {op};
  p.outputs = {{"y", P({}), "outputs.y"}};
  Time end = RunAndCheck(m, mesh, p, /*numerics=*/false);
  double v = 8.0 * 1024 * 1024;
  double want = 2 * 7 * (1e-6 + v / 8 / 45e9);
  EXPECT_NEAR(end.seconds(), want, want * 0.01);
}

TEST(ExecutorTest, ChainedOpsFeedEachOther) {
  // FSDP: all-gather the weight over dp, then a local matmul; then psum over tp.
  Machine m(Torus({4, 2}, {false, false}), nullptr, 0);
  std::vector<MeshAxis> axes = {{"dp", 4}, {"tp", 2}};
  Mesh mesh = PlaceMesh(m, axes);
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {MakeArray("x", {16, 8}, P({{"dp"}, {"tp"}})),
              MakeArray("w", {8, 4}, P({{"tp", "dp"}}))};
  OpSpec ag = MakeOp(OpKind::kAllGather, {"w"}, "w_tp", {"dp"});
  ag.tiled = true;
  p.ops = {ag, MakeOp(OpKind::kMatmul, {"x", "w_tp"}, "partial"),
           MakeOp(OpKind::kPsum, {"partial"}, "y", {"tp"})};
  p.outputs = {{"y", P({{"dp"}}), "outputs.y"}};
  RunAndCheck(m, mesh, p);
}

TEST(ExecutorTest, BadProgramsFailBeforeRunningWithTheOpKey) {
  std::vector<MeshAxis> axes = {{"dp", 4}, {"tp", 2}};
  Mesh mesh(axes, {0, 1, 2, 3, 4, 5, 6, 7});
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {MakeArray("x", {6, 8}, P({{}, {"tp"}}))};
  OpSpec rs = MakeOp(OpKind::kPsumScatter, {"x"}, "y", {"dp"});
  rs.tiled = true;  // 6 rows do not split over 4 devices.
  p.ops = {rs};
  p.outputs = {{"y", P({{"dp"}}), "outputs.y"}};
  try {
    CheckProgram(mesh, p);
    FAIL() << "expected SpecError";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), rs.key);
    EXPECT_NE(std::string(e.what()).find("psum_scatter"), std::string::npos) << e.what();
  }
  p.ops = {MakeOp(OpKind::kPsum, {"x"}, "y", {"sp"})};  // Unknown axis.
  EXPECT_THROW(CheckProgram(mesh, p), SpecError);
  p.ops = {MakeOp(OpKind::kPsum, {"z"}, "y", {"dp"})};  // Unknown input.
  EXPECT_THROW(CheckProgram(mesh, p), SpecError);
}

TEST(ExecutorTest, ReplicaMismatchInAnOutputIsReported) {
  // psum over dp leaves values that differ along tp; an out spec replicating tp is wrong.
  Machine m(Torus({4, 2}, {false, false}), nullptr, 0);
  std::vector<MeshAxis> axes = {{"dp", 4}, {"tp", 2}};
  Mesh mesh = PlaceMesh(m, axes);
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {MakeArray("x", {4, 8}, P({{"dp"}, {"tp"}}))};
  p.ops = {MakeOp(OpKind::kPsum, {"x"}, "y", {"dp"})};
  p.outputs = {{"y", P({}), "outputs.y"}};
  RunConfig config;
  config.numerics = true;
  try {
    RunProgram(m, mesh, p, config);
    FAIL() << "expected SpecError";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "outputs.y");
    EXPECT_NE(std::string(e.what()).find("'tp'"), std::string::npos) << e.what();
  }
}

TEST(ExecutorTest, SwitchGroupsUseDirectAndTheSwitchClosedForm) {
  DeviceSpec dev;
  dev.platform = "GPU";
  Machine m(
      BuildSwitch(8, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink, dev, "sw"),
      nullptr, 0);
  std::vector<MeshAxis> axes = {{"g", 8}};
  Mesh mesh = PlaceMesh(m, axes);
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {MakeArray("x", {8 * 1024 * 1024}, P({{"g"}}))};
  OpSpec ag = MakeOp(OpKind::kAllGather, {"x"}, "y", {"g"});
  ag.tiled = true;
  p.ops = {ag};
  p.outputs = {{"y", P({}), "outputs.y"}};
  CheckProgram(mesh, p);
  RunResult r = RunProgram(m, mesh, p, RunConfig{});
  EXPECT_EQ(r.ops[0].algorithm, "direct");
  // (N-1)/N * V / W plus two hops of latency, V = 32 MiB gathered.
  double v = 32.0 * 1024 * 1024;
  double want = 7.0 / 8 * v / 450e9 + 1e-6;
  EXPECT_NEAR(r.end.seconds(), want, want * 0.01);
}

}  // namespace
}  // namespace shardsim

namespace shardsim {
namespace {

TEST(ExecutorTest, TreeChunkingPipelinesLargeMessages) {
  // Tree all-reduce of 8 MiB on 8 GPUs of a switch: one segment takes 2 * depth full-buffer
  // hops; 16 segments of 512 KiB overlap the levels, so the time falls towards the bandwidth
  // term. Both runs carry real data and must stay exact.
  auto run = [](Bytes chunk) {
    DeviceSpec dev;
    dev.platform = "GPU";
    Machine m(
        BuildSwitch(8, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink, dev, "sw"),
        nullptr, 0);
    std::vector<MeshAxis> axes = {{"g", 8}};
    Mesh mesh = PlaceMesh(m, axes);
    ProgramSpec p;
    p.mesh_axes = axes;
    p.arrays = {MakeArray("x", {2 * 1024 * 1024}, P({}))};
    OpSpec op = MakeOp(OpKind::kPsum, {"x"}, "y", {"g"});
    op.algorithm = "tree";
    p.ops = {op};
    p.outputs = {{"y", P({}), "outputs.y"}};
    RunConfig config;
    config.numerics = true;
    config.chunk_size = chunk;
    RunResult result = RunProgram(m, mesh, p, config);
    NumericsReport r = CheckNumerics(result.outputs, mesh, p, "");
    EXPECT_EQ(r.max_abs_error, 0.0);
    return result.end;
  };
  Time whole = run(Bytes::MiB(8));
  Time pipelined = run(Bytes::KiB(512));
  EXPECT_LT(pipelined.seconds(), 0.7 * whole.seconds())
      << "pipelined " << pipelined.seconds() << " s, whole " << whole.seconds() << " s";
}

}  // namespace
}  // namespace shardsim
