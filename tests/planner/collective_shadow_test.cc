// Filling collectives' shadows: which ops move beside a collective its next ops wait for, what
// stays, and what the move buys on a TPU slice.
#include "planner/collective_shadow.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "tests/support/make_op.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

// `kind` on `in` writing `out`, collectives over fsdp (gathers and scatters tiled).
OpSpec MakeOp(OpKind kind, std::vector<std::string> in, std::string out) {
  const bool collective = Op(kind).stream == OpStream::kCollective;
  OpSpec op =
      test::MakeOp(kind, std::move(in), std::move(out),
                   collective ? std::vector<std::string>{"fsdp"} : std::vector<std::string>{});
  op.tiled = kind == OpKind::kAllGather || kind == OpKind::kPsumScatter;
  if (kind == OpKind::kConvert) op.dtype = "bf16";
  return op;
}

// A layer's backward in miniature: a weight's gradient d = x w0 (nothing below needs it), then
// the activation gradient's chain t = x w1, s = t + y (P), its all-gather g (C), and the
// product g t (R: it reads what the step computed, so C is no tail collective). Ops 0 to 4; d
// and the product are the outputs.
ProgramSpec Backward() {
  ProgramSpec p;
  p.mode = ProgramMode::kManual;
  p.mesh_axes = {{"fsdp", 8}};
  for (const char* name : {"x", "w0", "w1", "y"}) {
    p.arrays.push_back({name, {1024, 1024}, DType::kBF16, {}, {}, ""});
  }
  p.ops.push_back(MakeOp(OpKind::kMatmul, {"x", "w0"}, "d"));
  p.ops.push_back(MakeOp(OpKind::kMatmul, {"x", "w1"}, "t"));
  p.ops.push_back(MakeOp(OpKind::kAdd, {"t", "y"}, "s"));
  p.ops.push_back(MakeOp(OpKind::kAllGather, {"s"}, "g"));
  p.ops.push_back(MakeOp(OpKind::kMatmul, {"g", "t"}, "o"));
  p.outputs.push_back({"d", {}, ""});
  p.outputs.push_back({"o", PartitionSpec{}, ""});
  return p;
}

// The gradient's product, which P does not need, moves to just before R.
TEST(CollectiveShadowTest, IndependentProductsMoveBesideTheGather) {
  EXPECT_EQ(ShadowOrder(Backward(), {}), (std::vector<size_t>{1, 2, 3, 0, 4}));
}

// What P needs stays: here s reads d too.
TEST(CollectiveShadowTest, WhatTheCollectiveNeedsStays) {
  ProgramSpec p = Backward();
  p.ops[2].in = {"t", "d"};
  EXPECT_EQ(ShadowOrder(p, {}), (std::vector<size_t>{0, 1, 2, 3, 4}));
}

// A reduce-scatter of the moved product placed after P (a tail collective) follows it, so the
// gather is issued first; an op reading the product before R that does not move (a host copy
// keeps its place) keeps it.
TEST(CollectiveShadowTest, AProductsCollectiveFollowsItAndReadersBeforeTheReaderHoldIt) {
  ProgramSpec p = Backward();
  p.ops.insert(p.ops.begin() + 3, MakeOp(OpKind::kPsumScatter, {"d"}, "ds"));
  p.outputs[0].name = "ds";
  // 0 d, 1 t, 2 s (P), 3 ds, 4 g (C), 5 o (R).
  EXPECT_EQ(ShadowOrder(p, {}), (std::vector<size_t>{1, 2, 4, 0, 3, 5}));
  ProgramSpec q = Backward();
  q.ops.insert(q.ops.begin() + 3, MakeOp(OpKind::kMoveToHost, {"d"}, "e"));  // 3: d's copy.
  q.outputs.push_back({"e", {}, ""});
  EXPECT_EQ(ShadowOrder(q, {}), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

// Nothing moves across a segment (another layer): with R in a segment that begins after P, the
// gather is left alone; with one that begins after the product, the product stays.
TEST(CollectiveShadowTest, NothingMovesAcrossSegments) {
  EXPECT_EQ(ShadowOrder(Backward(), {3}), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(ShadowOrder(Backward(), {1}), (std::vector<size_t>{0, 1, 2, 3, 4}));
}

// A weight's cast and gather (prefetched weight ops) never move.
TEST(CollectiveShadowTest, WeightCollectivesStay) {
  ProgramSpec p = Backward();
  p.ops[0] = MakeOp(OpKind::kConvert, {"w0"}, "d");
  p.ops.insert(p.ops.begin() + 1, MakeOp(OpKind::kAllGather, {"d"}, "dg"));
  p.outputs[0].name = "dg";
  EXPECT_EQ(ShadowOrder(p, {}), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

// What the move buys, on 8 TPU v5e chips: the gradient's product (2 x 1024^3 FLOPs, 12.8 us
// at 85% of 197 TFLOP/s, and the 1 us op overhead) runs beside the 16 MiB all-gather of s (2
// MiB a chip) instead of before it, so the gather is exposed by as much less (within the
// links' latency around it: 1 us).
TEST(CollectiveShadowTest, TheMovedProductHidesUnderTheGather) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const ProgramSpec p = Backward();
  const std::vector<size_t> order = ShadowOrder(p, {});
  ProgramSpec moved = p;
  for (size_t k = 0; k < order.size(); ++k) moved.ops[k] = p.ops[order[k]];
  const Mesh mesh = PlaceProgramMesh(machine, p);
  RunConfig config;
  const RunResult in_order = RunProgram(machine, mesh, p, config);
  const RunResult shadowed = RunProgram(machine, mesh, moved, config);
  double gather = 0, product = 0;
  for (const OpTiming& op : in_order.ops) {
    if (op.op == "all_gather") gather = (op.end - op.start).seconds();
    if (op.name == p.ops[0].name) product = op.compute.seconds();
  }
  EXPECT_NEAR(product, 2.0 * 1024 * 1024 * 1024 / (0.85 * 197e12) + 1e-6, 0.01 * product);
  ASSERT_GT(gather, product);  // The gather outlasts the product: it hides all of it.
  const double exposed_in_order = in_order.per_device[0].exposed_comm.seconds();
  const double exposed_moved = shadowed.per_device[0].exposed_comm.seconds();
  EXPECT_NEAR(exposed_in_order, gather, 1e-6);
  EXPECT_NEAR(exposed_moved, gather - product, 1e-6);
  EXPECT_NEAR((in_order.end - shadowed.end).seconds(), product, 1e-6);
}

}  // namespace
}  // namespace shardsim::planner
