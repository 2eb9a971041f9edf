// Several disjoint meshes and jax.device_put between them: the union Mesh's positions, axes and
// groups; the messages a device_put plans (boxes, replicas sharing the sending); its transfers
// against closed forms on a switch; its data against the reference; programs on two meshes
// overlapping; and the refusals.
#include "collectives/device_put.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "sim/spec_error.h"
#include "tests/collectives/switch_machine.h"
#include "tests/support/specs.h"

namespace shardsim {
namespace {

using test::P;

TEST(MeshUnionTest, PositionsAxesAndGroupsStayInTheirMesh) {
  const Mesh u = Mesh::Union(
      {Mesh({{"x", 4}}, {0, 1, 2, 3}), Mesh({{"y", 2}, {"z", 2}}, {7, 6, 5, 4})}, {"a", "b"});
  ASSERT_EQ(u.size(), 8);
  ASSERT_EQ(u.axes().size(), 4u);  // x, y, z, then the mesh index.
  EXPECT_EQ(u.axes()[3].name, kMeshPartAxis);
  EXPECT_EQ(u.devices(), (std::vector<int>{0, 1, 2, 3, 7, 6, 5, 4}));
  EXPECT_EQ(u.PartOf(3), 0);
  EXPECT_EQ(u.PartOf(4), 1);
  EXPECT_EQ(u.PartOffset(1), 4);
  EXPECT_EQ(u.PartIndex("b"), 1);
  EXPECT_EQ(u.PartIndex("c"), -1);
  EXPECT_EQ(u.PartOfAxis(0), 0);
  EXPECT_EQ(u.PartOfAxis(2), 1);
  EXPECT_EQ(u.PartOfAxis(3), -1);
  // Position 6 is b's position 2: y = 1, z = 0; a's axis reads 0.
  EXPECT_EQ(u.Coords(6), (std::vector<int>{0, 1, 0, 1}));
  for (int p = 0; p < u.size(); ++p) EXPECT_EQ(u.Position(u.Coords(p)), p);
  EXPECT_EQ(u.Groups({0}), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(u.Groups({2}), (std::vector<std::vector<int>>{{4, 5}, {6, 7}}));
  EXPECT_EQ(u.Groups({2, 1}), (std::vector<std::vector<int>>{{4, 6, 5, 7}}));
  EXPECT_EQ(u.IndexInGroup(5, {2, 1}), 2);
  EXPECT_THROW(u.Groups({0, 1}), std::invalid_argument);  // Two meshes' axes.
  EXPECT_THROW(Mesh::Union({Mesh({{"x", 2}}, {0, 1}), Mesh({{"x", 2}}, {2, 3})}, {"a", "b"}),
               std::invalid_argument);  // An axis name in both.
  EXPECT_THROW(Mesh::Union({Mesh({{"x", 2}}, {0, 1}), Mesh({{"y", 2}}, {1, 2})}, {"a", "b"}),
               std::invalid_argument);  // A device in both.
}

// Rows split 4 ways on a to rows split 2 ways (over y) on b: each b device needs the two source
// blocks its rows span, one message each (b's two replicas over z both receive them).
TEST(DevicePutPlanTest, BoxesAreTheOverlapsOfBlocks) {
  const Mesh a({{"x", 4}}, {0, 1, 2, 3});
  const Mesh b({{"y", 2}, {"z", 2}}, {4, 5, 6, 7});
  const DevicePutPlan plan =
      PlanDevicePut(Sharding(a, P({{"x"}, {}}), {8, 3}), Sharding(b, P({{"y"}, {}}), {8, 3}));
  ASSERT_EQ(plan.messages.size(), 8u);  // 4 destinations x 2 overlapping blocks.
  // Destination 2 (y = 1, z = 0) holds rows 4..7: from sources 2 (rows 4, 5) and 3 (rows 6, 7).
  const DevicePutMessage& m = plan.messages[4];
  EXPECT_EQ(m.to, 2);
  EXPECT_EQ(m.from, 2);
  EXPECT_EQ(m.lo, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(m.hi, (std::vector<int64_t>{6, 3}));
  EXPECT_EQ(m.elements, 6);
}

// A replicated source (every a device holds the whole array) sends each destination's block
// from a different replica in turn, so no device sends twice while another idles.
TEST(DevicePutPlanTest, ReplicasShareTheSending) {
  const Mesh a({{"x", 4}}, {0, 1, 2, 3});
  const Mesh b({{"y", 4}}, {4, 5, 6, 7});
  const DevicePutPlan plan =
      PlanDevicePut(Sharding(a, P({}), {8, 3}), Sharding(b, P({{"y"}, {}}), {8, 3}));
  ASSERT_EQ(plan.messages.size(), 4u);
  for (int q = 0; q < 4; ++q) {
    EXPECT_EQ(plan.messages[q].to, q);
    EXPECT_EQ(plan.messages[q].from, q);
    EXPECT_EQ(plan.messages[q].elements, 6);
  }
}

// An f32 input array `name` of `shape` on mesh `mesh`.
ArraySpec OnMesh(const std::string& name, Shape shape, const std::string& mesh,
                 PartitionSpec sharding = {}, InitSpec init = {}) {
  ArraySpec a;
  a.name = name;
  a.shape = std::move(shape);
  a.mesh = mesh;
  a.sharding = std::move(sharding);
  a.init = init;
  return a;
}

// A shard_map body's device_put of `in` (laid out by `from`) to `out` on `mesh` by `to`.
OpSpec Put(const std::string& in, const std::string& out, const std::string& mesh,
           PartitionSpec from, PartitionSpec to) {
  OpSpec put;
  put.kind = OpKind::kDevicePut;
  put.in = {in};
  put.out = {out};
  put.mesh = mesh;
  put.sharding = std::move(to);
  put.in_sharding = std::move(from);
  return put;
}

// A manual program on meshes a and b moving x [1024, 1024] f32 from `from` on a to `to` on b.
ProgramSpec PutProgram(PartitionSpec from, PartitionSpec to, InitSpec init = {}) {
  ProgramBuilder b({}, {}, ProgramMode::kManual);
  b.Meshes({MeshSpec{"a", {{"x", 4}}, {0, 1, 2, 3}}, MeshSpec{"b", {{"y", 4}}, {4, 5, 6, 7}}});
  b.Input(OnMesh("x", {1024, 1024}, "a", from, init));
  b.Add(Put("x", "y", "b", from, to));
  b.Output("y", to);
  return std::move(b).Build();
}

// `p` run with real data on an 8-device switch: its outputs and inputs, and whether they pass
// the numerics check against the reference (its largest error in `max_abs_error`).
struct DataRun {
  RunResult r;
  NumericsReport check;
};

DataRun RunWithData(const ProgramSpec& p) {
  const Machine machine = SwitchMachine(8);
  const Mesh mesh = PlaceProgramMesh(machine, p);
  RunConfig config;
  config.numerics = true;
  DataRun run{RunProgram(machine, mesh, p, config), {}};
  run.check = CheckNumerics(run.r.outputs, mesh, p, "", &run.r.inputs);
  return run;
}

// Closed forms on the switch (each device has its own 450 GB/s up- and downlink; 1 us of
// latency a route). Tolerance: 2 ps (drains round up to whole picoseconds).
TEST(DevicePutTimingTest, ClosedFormsOnASwitch) {
  const Machine machine = SwitchMachine(8);
  const double block = 256.0 * 1024 * 4;  // A quarter of the rows: 1 MiB.
  RunConfig config;
  // Rows over x to rows over y: four disjoint 1 MiB messages at once, each alone on its links.
  {
    const ProgramSpec p = PutProgram(P({{"x"}, {}}), P({{"y"}, {}}));
    RunResult r = RunProgram(machine, PlaceProgramMesh(machine, p), p, config);
    EXPECT_NEAR(r.end.seconds(), 1e-6 + block / 450e9, 2e-12);
    EXPECT_EQ(r.ops[0].algorithm, "direct");
  }
  // Replicated on a to rows over y: the same four messages, one from each replica.
  {
    const ProgramSpec p = PutProgram(P({}), P({{"y"}, {}}));
    RunResult r = RunProgram(machine, PlaceProgramMesh(machine, p), p, config);
    EXPECT_NEAR(r.end.seconds(), 1e-6 + block / 450e9, 2e-12);
  }
  // Rows over x to replicated on b: every b device needs all four blocks. Each uplink carries
  // four messages and each downlink four, so every message gets a quarter: 1 us + 4 MiB / BW.
  {
    const ProgramSpec p = PutProgram(P({{"x"}, {}}), P({}));
    RunResult r = RunProgram(machine, PlaceProgramMesh(machine, p), p, config);
    EXPECT_NEAR(r.end.seconds(), 1e-6 + 4 * block / 450e9, 2e-12);
    // Memory: a device of b holds the 4 MiB result, a device of a its 1 MiB block only.
    EXPECT_EQ(r.per_device[0].peak_memory, Bytes(static_cast<int64_t>(block)));
    EXPECT_EQ(r.per_device[4].peak_memory, Bytes(static_cast<int64_t>(4 * block)));
  }
}

// Real data: rows over x become columns over y, and the values arrive where the reference puts
// them (the whole array, exactly).
TEST(DevicePutNumericsTest, ValuesArriveWhereTheReferencePutsThem) {
  InitSpec init;
  init.kind = InitSpec::Kind::kArange;
  const DataRun run = RunWithData(PutProgram(P({{"x"}, {}}), P({{}, {"y"}}), init));
  const Array& y = run.r.outputs.at("y");
  ASSERT_EQ(y.shape(), (Shape{1024, 1024}));
  for (int64_t i : {int64_t{0}, int64_t{1023}, int64_t{513 * 1024 + 7}, int64_t{1024 * 1024 - 1}}) {
    EXPECT_EQ(y.at(i), static_cast<float>(i)) << i;
  }
  EXPECT_TRUE(run.check.checked);
  EXPECT_TRUE(run.check.passed);
  EXPECT_EQ(run.check.max_abs_error, 0.0);
}

// Programs on different meshes overlap: a psum on a and a matmul chain on b, independent and on
// disjoint links, end together at the later of their ends alone.
TEST(SeveralMeshesTest, IndependentProgramsOverlap) {
  const Machine machine = SwitchMachine(8);
  auto program = [](bool on_a, bool on_b) {
    ProgramBuilder b({}, {}, ProgramMode::kManual);
    b.Meshes({MeshSpec{"a", {{"x", 4}}, {0, 1, 2, 3}}, MeshSpec{"b", {{"y", 4}}, {4, 5, 6, 7}}});
    b.Input(OnMesh("g", {4096, 1024}, "a"));
    b.Input(OnMesh("w", {2048, 2048}, "b"));
    if (on_a) {
      b.Reduce(OpKind::kPsum, "g", {"x"}, "s");
      b.Output("s", P({}));
    }
    if (on_b) {
      std::string h = "w";
      for (int i = 0; i < 3; ++i) h = b.Matmul(h, "w");
      b.Output(h, P({}));
    }
    return std::move(b).Build();
  };
  RunConfig config;
  auto end = [&](bool on_a, bool on_b) {
    const ProgramSpec p = program(on_a, on_b);
    return RunProgram(machine, PlaceProgramMesh(machine, p), p, config).end;
  };
  const Time a = end(true, false), b = end(false, true), both = end(true, true);
  EXPECT_GT(a, Time());
  EXPECT_GT(b, Time());
  EXPECT_EQ(both, std::max(a, b));
}

// Three meshes: a device_put from a to b while c runs a psum of its own; c's devices take no
// part in the transfer (they would wait for it forever if they did), and the values arrive.
TEST(SeveralMeshesTest, ThreeMeshesRunTheirOwnOps) {
  ProgramBuilder b({}, {}, ProgramMode::kManual);
  b.Meshes({MeshSpec{"a", {{"x", 2}}, {0, 1}}, MeshSpec{"b", {{"y", 2}}, {2, 3}},
            MeshSpec{"c", {{"z", 4}}, {4, 5, 6, 7}}});
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  b.Input(OnMesh("x", {4, 2}, "a", P({{"x"}, {}}), arange));
  b.Input(OnMesh("g", {4, 2}, "c", P({}), arange));
  b.Add(Put("x", "y", "b", P({{"x"}, {}}), P({{}, {"y"}})));
  b.Reduce(OpKind::kPsum, "g", {"z"}, "s");
  b.Output("y", P({{}, {"y"}}));
  b.Output("s", P({}));
  const DataRun run = RunWithData(std::move(b).Build());
  EXPECT_EQ(run.r.outputs.at("y").values(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(run.r.outputs.at("s").at(7), 4 * 7.0f);
  EXPECT_TRUE(run.check.passed);
}

// A device_put reading a value its mesh made under `where:` on some devices only: the others
// send zeros, as every collective reads such a value.
TEST(SeveralMeshesTest, AValueMadeOnSomeDevicesMovesAsZerosElsewhere) {
  InitSpec ones;
  ones.kind = InitSpec::Kind::kOnes;
  ProgramSpec p = PutProgram(P({{"x"}, {}}), P({{"y"}, {}}), ones);
  OpSpec neg;
  neg.kind = OpKind::kNeg;
  neg.in = {"x"};
  neg.out = {"n"};
  neg.mesh = "a";
  neg.where = {{"x", 1}};
  neg.key = "program.0";
  neg.name = "n";
  p.ops.insert(p.ops.begin(), neg);
  p.ops[1].in = {"n"};
  p.ops[1].key = "program.1";
  const DataRun run = RunWithData(p);
  const Array& y = run.r.outputs.at("y");
  EXPECT_EQ(y.at(0), 0.0f);            // Rows 0-255: device 0 did not run neg.
  EXPECT_EQ(y.at(256 * 1024), -1.0f);  // Rows 256-511: device 1 did.
  EXPECT_EQ(y.at(512 * 1024), 0.0f);
}

// A name bound again on another mesh (device_put x to x): each binding lives on its own mesh,
// the run and the reference alike.
TEST(SeveralMeshesTest, ANameBoundAgainOnAnotherMesh) {
  InitSpec arange;
  arange.kind = InitSpec::Kind::kArange;
  ProgramSpec p = PutProgram(P({{"x"}, {}}), P({{}, {"y"}}), arange);
  p.ops[0].out = {"x"};
  OpSpec twice;
  twice.kind = OpKind::kMul;
  twice.in = {"x"};
  twice.scalar = 2.0;
  twice.out = {"z"};
  twice.mesh = "b";
  twice.key = "program.1";
  twice.name = "z";
  p.ops.push_back(twice);
  p.outputs = {OutputSpec{"x", P({{}, {"y"}}), "outputs.x"},
               OutputSpec{"z", P({{}, {"y"}}), "outputs.z"}};
  const DataRun run = RunWithData(p);
  EXPECT_EQ(run.r.outputs.at("z").at(1025), 2 * 1025.0f);
  EXPECT_TRUE(run.check.passed);
  EXPECT_EQ(run.check.max_abs_error, 0.0);
}

// The lowering's refusals, each at its key.
TEST(SeveralMeshesTest, LoweringRefusesOpsAcrossMeshes) {
  const Machine machine = SwitchMachine(8);
  auto refusal = [&](const ProgramSpec& p) -> std::pair<std::string, std::string> {
    try {
      LowerProgram(PlaceProgramMesh(machine, p), p);
    } catch (const SpecError& e) {
      return {e.key(), e.what()};
    }
    return {"", ""};
  };
  // An op reading values of two meshes.
  {
    ProgramSpec p = PutProgram(P({}), P({}));
    OpSpec add;
    add.kind = OpKind::kAdd;
    add.in = {"x", "y"};
    add.out = {"z"};
    add.mesh = "b";
    add.key = "program.1";
    p.ops.push_back(add);
    const auto [key, what] = refusal(p);
    EXPECT_EQ(key, "program.1.in");
    EXPECT_NE(what.find("'x' lives on mesh 'a' but the op runs on mesh 'b'"), std::string::npos)
        << what;
  }
  // A collective over another mesh's axis.
  {
    ProgramSpec p = PutProgram(P({}), P({}));
    OpSpec psum;
    psum.kind = OpKind::kPsum;
    psum.in = {"y"};
    psum.out = {"z"};
    psum.axis_name = {"x"};
    psum.mesh = "b";
    psum.key = "program.1";
    p.ops.push_back(psum);
    const auto [key, what] = refusal(p);
    EXPECT_EQ(key, "program.1");
    EXPECT_NE(what.find("mesh axis 'x' is not an axis of mesh 'b'"), std::string::npos) << what;
  }
  // A device_put with where: (it runs on every device of its two meshes).
  {
    ProgramSpec p = PutProgram(P({}), P({}));
    p.ops[0].where = {{"y", 1}};
    p.ops[0].key = "program.0";
    const auto [key, what] = refusal(p);
    EXPECT_EQ(key, "program.0.where");
    EXPECT_NE(what.find("where: cannot pick"), std::string::npos) << what;
  }
  // A device_put to the mesh its input is on.
  {
    ProgramSpec p = PutProgram(P({}), P({}));
    p.ops[0].mesh = "a";
    p.outputs.clear();
    const auto [key, what] = refusal(p);
    EXPECT_NE(what.find("is on mesh 'a' already"), std::string::npos) << what;
  }
}

// The cached timing path prices the collectives of a program on several meshes, each within
// its mesh: a psum on each of two meshes (disjoint links of the switch, nothing contends) takes
// what the full simulation takes, device by device. A device_put it refuses by name.
TEST(SeveralMeshesTest, TheCachedPathPricesEachMeshAndRefusesDevicePut) {
  const Machine machine = SwitchMachine(8);
  ProgramSpec p = PutProgram(P({{"x"}, {}}), P({{"y"}, {}}));
  // z: half the bytes of x's blocks, a shorter psum.
  p.arrays.push_back(OnMesh("z", {256, 512}, "b"));
  auto psum = [](const std::string& in, const std::string& axis, const std::string& mesh,
                 int index) {
    OpSpec op;
    op.kind = OpKind::kPsum;
    op.in = {in};
    op.out = {in + "_sum"};
    op.axis_name = {axis};
    op.mesh = mesh;
    op.key = "program." + std::to_string(index);
    op.name = op.out[0];
    return op;
  };
  p.ops = {psum("x", "x", "a", 0), psum("z", "y", "b", 1)};
  p.outputs = {OutputSpec{"x_sum", P({{"x"}, {}}), "outputs.x_sum"},
               OutputSpec{"z_sum", P({}), "outputs.z_sum"}};
  const Mesh mesh = PlaceProgramMesh(machine, p);
  RunConfig network;
  RunConfig cached;
  cached.timing = TimingPath::kCached;
  const RunResult full = RunProgram(machine, mesh, p, network);
  const RunResult fast = RunProgram(machine, mesh, p, cached);
  EXPECT_EQ(fast.end, full.end);
  ASSERT_EQ(fast.per_device.size(), 8u);
  for (size_t d = 0; d < 8; ++d) EXPECT_EQ(fast.per_device[d].comm, full.per_device[d].comm) << d;
  EXPECT_NE(full.per_device[0].comm, full.per_device[4].comm);  // Different collectives.
  try {
    RunProgram(machine, mesh, PutProgram(P({{"x"}, {}}), P({{"y"}, {}})), cached);
    FAIL() << "ran";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("runs with --timing network"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardsim
