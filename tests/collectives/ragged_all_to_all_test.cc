// jax.lax.ragged_all_to_all: JAX's docstring example through the reference and through the
// simulated transfers, messages priced at the sizes the index data gives (closed forms on a
// switch), the balanced sizes of timing-only runs, and every refusal with its message.
#include "collectives/ragged_all_to_all.h"

#include <gtest/gtest.h>

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

InitSpec Values(std::vector<float> values) {
  InitSpec init;
  init.kind = InitSpec::Kind::kValue;
  init.values.assign(values.begin(), values.end());
  return init;
}

// The six global inputs of a ragged_all_to_all over axis x of `n` devices: operand rows
// [n * rows, width] (arange), output [n * out_rows, width] (zeros), and the four index
// vectors [n * n] (one slice per peer), given flat, device after device.
struct RaggedCase {
  int n = 2;
  int64_t rows = 3, out_rows = 4, width = 1;
  std::vector<float> operand;  // Empty: arange.
  std::vector<float> input_offsets, send_sizes, output_offsets, recv_sizes;
  std::string algorithm;
};

ProgramSpec RaggedProgram(const RaggedCase& c) {
  ProgramBuilder b({{"x", c.n}});
  InitSpec operand;
  operand.kind = InitSpec::Kind::kArange;
  if (!c.operand.empty()) operand = Values(c.operand);
  b.Input("operand", {c.n * c.rows, c.width}, DType::kF32, P({{"x"}}), operand);
  b.Input("output", {c.n * c.out_rows, c.width}, DType::kF32, P({{"x"}}));
  const int64_t k = static_cast<int64_t>(c.n) * c.n;
  b.Input("input_offsets", {k}, DType::kI32, P({{"x"}}), Values(c.input_offsets));
  b.Input("send_sizes", {k}, DType::kI32, P({{"x"}}), Values(c.send_sizes));
  b.Input("output_offsets", {k}, DType::kI32, P({{"x"}}), Values(c.output_offsets));
  b.Input("recv_sizes", {k}, DType::kI32, P({{"x"}}), Values(c.recv_sizes));
  OpSpec op;
  op.kind = OpKind::kRaggedAllToAll;
  op.in = {"operand", "output", "input_offsets", "send_sizes", "output_offsets", "recv_sizes"};
  op.out = {"y"};
  op.axis_name = {"x"};
  op.algorithm = c.algorithm;
  b.Add(op);
  b.Output("y", P({{"x"}}));
  return std::move(b).Build();
}

// JAX's docstring example (jax.lax.ragged_all_to_all), axis of size 2.
RaggedCase DocstringCase() {
  RaggedCase c;
  c.operand = {1, 2, 2, 3, 4, 0};
  c.input_offsets = {0, 1, 0, 1};
  c.send_sizes = {1, 2, 1, 1};
  c.output_offsets = {0, 0, 1, 2};
  c.recv_sizes = {1, 1, 2, 1};
  return c;
}

std::vector<float> Flat(const Array& a) {
  std::vector<float> v;
  for (int64_t i = 0; i < a.size(); ++i) v.push_back(a.at(i));
  return v;
}

TEST(RaggedAllToAllTest, DocstringExampleThroughTheReference) {
  ProgramSpec program = RaggedProgram(DocstringCase());
  Machine machine = SwitchMachine(2);
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  std::map<std::string, Array> ref = ReferenceOutputs(mesh, program, "");
  // JAX: axis index 0 -> [1, 3, 0, 0], axis index 1 -> [2, 2, 4, 0].
  EXPECT_EQ(Flat(ref.at("y")), (std::vector<float>{1, 3, 0, 0, 2, 2, 4, 0}));
}

TEST(RaggedAllToAllTest, DocstringExampleThroughTheTransfers) {
  ProgramSpec program = RaggedProgram(DocstringCase());
  Machine machine = SwitchMachine(2);
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, program, config);
  EXPECT_EQ(Flat(r.outputs.at("y")), (std::vector<float>{1, 3, 0, 0, 2, 2, 4, 0}));
  EXPECT_EQ(r.ops[0].algorithm, "direct");
  NumericsReport check = CheckNumerics(r.outputs, mesh, program, "", &r.inputs);
  EXPECT_TRUE(check.checked);
  EXPECT_TRUE(check.passed) << check.worst_output;
  EXPECT_EQ(check.max_abs_error, 0.0);
}

// Four members, several slices per peer with padding between them and rows kept from
// `output` (ones): the simulated transfers give what JAX's definition gives, row for row.
TEST(RaggedAllToAllTest, SeveralSlicesPerPeerMatchTheReference) {
  RaggedCase c;
  c.n = 4;
  c.rows = 8;
  c.out_rows = 9;
  c.width = 3;
  // Member m sends peer j (m + j) % 3 rows from operand row 2 j, to receiver rows placed by
  // the sender: receiver j takes member m's slice at row 2 m (rows 2m, 2m + 1 at most), so
  // slices of different senders never overlap.
  for (int m = 0; m < c.n; ++m) {
    for (int j = 0; j < c.n; ++j) {
      c.input_offsets.push_back(static_cast<float>(2 * j));
      c.send_sizes.push_back(static_cast<float>((m + j) % 3));
      c.output_offsets.push_back(static_cast<float>(2 * m));
    }
  }
  for (int j = 0; j < c.n; ++j) {
    for (int m = 0; m < c.n; ++m) c.recv_sizes.push_back(static_cast<float>((m + j) % 3));
  }
  ProgramSpec program = RaggedProgram(c);
  program.arrays[1].init.kind = InitSpec::Kind::kOnes;
  Machine machine = SwitchMachine(4);
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, program, config);
  std::map<std::string, Array> ref = ReferenceOutputs(mesh, program, "");
  EXPECT_EQ(Flat(r.outputs.at("y")), Flat(ref.at("y")));
  // Spot check by hand: receiver 1 (rows 9..17 of y) gets member 0's 1 row (operand row 2 of
  // device 0 = elements 6, 7, 8) at its row 0, and keeps output's ones at row 8.
  const std::vector<float> y = Flat(r.outputs.at("y"));
  EXPECT_EQ(y[9 * 3 + 0], 6);
  EXPECT_EQ(y[9 * 3 + 2], 8);
  EXPECT_EQ(y[17 * 3 + 1], 1);
}

// Timing from the index data, on the switch: a message of S bytes alone takes 2 hops x 500 ns
// + S / 450 GB/s. Member 0 sends 100 rows of 1024 f32 (409,600 B) to member 2 and member 1
// sends 50 (204,800 B) to member 2: the two share member 2's downlink max-min fairly, so the
// last byte arrives when the 614,400 B have crossed it. Tolerance: 2 ps (drains round up to
// whole picoseconds).
TEST(RaggedAllToAllTest, MessagesHaveTheSizesTheIndexDataGives) {
  RaggedCase c;
  c.n = 4;
  c.rows = 100;
  c.out_rows = 150;
  c.width = 1024;
  c.input_offsets.assign(16, 0);
  c.send_sizes.assign(16, 0);
  c.output_offsets.assign(16, 0);
  c.recv_sizes.assign(16, 0);
  c.send_sizes[0 * 4 + 2] = 100;
  c.send_sizes[1 * 4 + 2] = 50;
  c.output_offsets[1 * 4 + 2] = 100;
  c.recv_sizes[2 * 4 + 0] = 100;
  c.recv_sizes[2 * 4 + 1] = 50;
  ProgramSpec program = RaggedProgram(c);
  Machine machine = SwitchMachine(4);
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, program, config);
  const double expected = 1e-6 + 614400.0 / 450e9;
  EXPECT_NEAR(r.end.seconds(), expected, 2e-12);
  // Alone, member 0's message takes 1 us + 409,600 B / 450 GB/s.
  c.send_sizes[1 * 4 + 2] = 0;
  c.recv_sizes[2 * 4 + 1] = 0;
  RunResult alone = RunProgram(machine, mesh, RaggedProgram(c), config);
  EXPECT_NEAR(alone.end.seconds(), 1e-6 + 409600.0 / 450e9, 2e-12);
}

// Without data (timing only) every pair moves min(N, M) / G rows: exactly the tiled
// all_to_all of those blocks, on the network and on the cached path alike.
TEST(RaggedAllToAllTest, TimingOnlyRunsAssumeBalancedRouting) {
  RaggedCase c = DocstringCase();
  c.n = 4;
  c.rows = 4096;
  c.out_rows = 6000;  // min(4096, 6000) / 4 = 1024 rows per pair.
  c.width = 256;
  c.input_offsets = c.send_sizes = c.output_offsets = c.recv_sizes = std::vector<float>(16, 0);
  c.operand.clear();
  EXPECT_EQ(BalancedRaggedRows({4096, 256}, {6000, 256}, 4), 1024);
  ProgramSpec ragged = RaggedProgram(c);
  ProgramBuilder b({{"x", 4}});
  b.Input("a", {4 * 4096, 256}, DType::kF32, P({{"x"}}));  // 4 blocks of 1024 rows each.
  b.Output(b.AllToAll("a", {"x"}, 0, 0, /*tiled=*/true), P({{"x"}}));
  ProgramSpec plain = std::move(b).Build();
  Machine machine = SwitchMachine(4);
  Mesh mesh = PlaceMesh(machine, ragged.mesh_axes);
  RunConfig network;
  RunConfig cached;
  cached.timing = TimingPath::kCached;
  const Time balanced = RunProgram(machine, mesh, plain, network).end;
  EXPECT_EQ(RunProgram(machine, mesh, ragged, network).end, balanced);
  EXPECT_EQ(RunProgram(machine, mesh, ragged, cached).end, balanced);
}

// The refusals, each naming the op's key.
std::string Refusal(const RaggedCase& c, bool numerics) {
  ProgramSpec program = RaggedProgram(c);
  Machine machine = SwitchMachine(c.n);
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = numerics;
  try {
    RunProgram(machine, mesh, program, config);
  } catch (const SpecError& e) {
    return e.key() + ": " + e.what();
  }
  return "";
}

TEST(RaggedAllToAllTest, RefusesWhatJaxDoesNotDefine) {
  RaggedCase c = DocstringCase();
  c.recv_sizes = {1, 1, 1, 1};
  EXPECT_EQ(Refusal(c, true),
            "program.0: ragged_all_to_all: member 0's slice 1 (to member 1) sends 2 rows, but "
            "member 1's recv_sizes expects 1");
  c = DocstringCase();
  c.input_offsets = {0, 2, 0, 1};
  EXPECT_EQ(Refusal(c, true),
            "program.0: ragged_all_to_all: member 0's slice 1 (to member 1) reads operand rows "
            "[2, 4) of 3");
  c = DocstringCase();
  c.output_offsets = {0, 3, 1, 2};
  EXPECT_EQ(Refusal(c, true),
            "program.0: ragged_all_to_all: member 0's slice 1 (to member 1) writes output rows "
            "[3, 5) of 4 on member 1");
  // Member 1 would receive rows [0, 2) from member 0 and [1, 2) from itself: which lands last
  // decides row 1 (the executors disagreed).
  c = DocstringCase();
  c.output_offsets = {0, 0, 1, 1};
  EXPECT_EQ(Refusal(c, true),
            "program.0: ragged_all_to_all: two slices write rows [1, 2) of member 1's output "
            "(output_offsets overlap)");
  c = DocstringCase();
  c.send_sizes = {1, -2, 1, 1};
  EXPECT_EQ(Refusal(c, true),
            "program.0: ragged_all_to_all: member 0's slice 1 (to member 1) has send_sizes -2 < 0");
  c = DocstringCase();
  c.algorithm = "ring";
  EXPECT_EQ(Refusal(c, false),
            "program.0.algorithm: ragged_all_to_all runs only as direct (one message of its own "
            "size per pair of members), got 'ring'");
}

TEST(RaggedAllToAllTest, TypeRule) {
  Array operand = Array::ShapeOnly(DType::kF32, {6, 4});
  Array output = Array::ShapeOnly(DType::kF32, {8, 4});
  Array index = Array::ShapeOnly(DType::kI32, {4});
  EXPECT_EQ(RaggedAllToAllShape({&operand, &output, &index, &index, &index, &index}, 2),
            (Shape{8, 4}));
  auto message = [](std::vector<const Array*> in, int g) {
    try {
      RaggedAllToAllShape(in, g);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({&operand, &output, &index, &index, &index, &index}, 3),
            "the 4 slices of input_offsets do not divide among the 3 members of the group");
  Array narrow = Array::ShapeOnly(DType::kF32, {8, 2});
  EXPECT_EQ(message({&operand, &narrow, &index, &index, &index, &index}, 2),
            "operand f32[6,4] and output f32[8,2] must have one dtype and equal shapes after "
            "the leading axis");
  Array floats = Array::ShapeOnly(DType::kF32, {4});
  EXPECT_EQ(message({&operand, &output, &index, &floats, &index, &index}, 2),
            "send_sizes must be i32[K] like input_offsets (K slices), got f32[4] beside i32[4]");
}

}  // namespace
}  // namespace shardsim
