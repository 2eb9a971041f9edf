// Deferring the readers of tail collectives: which collectives are tails, which ops move where,
// what never moves, and where a training step's layers begin their backward.
#include "planner/defer_readers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "planner/grad.h"
#include "tests/support/make_op.h"
#include "topology/build.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

// `kind` on `in` writing `out`: collectives over fsdp, casts to f32.
OpSpec MakeOp(OpKind kind, std::vector<std::string> in, std::string out) {
  const bool collective = kind == OpKind::kPsumScatter || kind == OpKind::kPsum;
  OpSpec op =
      test::MakeOp(kind, std::move(in), std::move(out),
                   collective ? std::vector<std::string>{"fsdp"} : std::vector<std::string>{});
  if (kind == OpKind::kConvert) op.dtype = "f32";
  return op;
}

// A backward as FSDP partitions it: per layer i, the gradient e_i = matmul(x, w_i), its
// reduce-scatter s_i, and its cast c_i (an output). Ops 3i, 3i+1, 3i+2.
ProgramSpec Grads(int layers) {
  ProgramSpec p;
  p.mode = ProgramMode::kManual;
  p.arrays.push_back({"x", {4, 4}, DType::kBF16, {}, {}, ""});
  for (int i = 0; i < layers; ++i) {
    const std::string k = std::to_string(i);
    p.arrays.push_back({"w" + k, {4, 4}, DType::kBF16, {}, {}, ""});
    p.ops.push_back(MakeOp(OpKind::kMatmul, {"x", "w" + k}, "e" + k));
    p.ops.push_back(MakeOp(OpKind::kPsumScatter, {"e" + k}, "s" + k));
    p.ops.push_back(MakeOp(OpKind::kConvert, {"s" + k}, "c" + k));
    p.outputs.push_back({"c" + k, {}, ""});
  }
  return p;
}

TEST(DeferReadersTest, ReduceScattersOfOutputsAreTails) {
  EXPECT_EQ(TailCollectivesOf(Grads(2)), (std::vector<char>{0, 1, 0, 0, 1, 0}));
}

// A segment per layer: each cast moves just past the next layer's reduce-scatter; the last
// layer's stays, as nothing follows it in its phase.
TEST(DeferReadersTest, EachCastMovesPastTheNextLayersReduceScatter) {
  EXPECT_EQ(DeferOrder(Grads(3), {}, {0, 3, 6}), (std::vector<size_t>{0, 1, 3, 4, 2, 6, 7, 5, 8}));
}

// One segment: every cast moves past the last reduce-scatter.
TEST(DeferReadersTest, WithoutSegmentsCastsMovePastTheLastReduceScatter) {
  EXPECT_EQ(DeferOrder(Grads(3), {}, {}), (std::vector<size_t>{0, 1, 3, 4, 6, 7, 2, 5, 8}));
}

// A phase ends the deferral: layer 1's cast stays before the phase at op 6 begins.
TEST(DeferReadersTest, CastsStayInTheirPhase) {
  EXPECT_EQ(DeferOrder(Grads(3), {6}, {0, 3}), (std::vector<size_t>{0, 1, 3, 4, 2, 5, 6, 7, 8}));
}

// Ops that read only casts (an accumulation, an update with input arrays) move with them and
// after them; an op the step reads before its outputs stops them.
TEST(DeferReadersTest, ChainsMoveTogetherAndStopAtWhatTheStepReads) {
  ProgramSpec p = Grads(3);
  p.arrays.push_back({"m", {4, 4}, DType::kF32, {}, {}, ""});
  // 9: a = c0 + m (an input array), 10: u = a - c1; the update u is an output.
  p.ops.push_back(MakeOp(OpKind::kAdd, {"c0", "m"}, "a"));
  p.ops.push_back(MakeOp(OpKind::kSub, {"a", "c1"}, "u"));
  p.outputs.push_back({"u", {}, ""});
  EXPECT_EQ(DeferOrder(p, {}, {0, 3, 6}), (std::vector<size_t>{0, 1, 3, 4, 2, 6, 7, 5, 8, 9, 10}));
  // Now layer 1's matmul reads c0: c0 must precede it, and s0 is no tail.
  ProgramSpec q = Grads(3);
  q.ops[3].in = {"c0", "w1"};
  EXPECT_EQ(TailCollectivesOf(q), (std::vector<char>{0, 0, 0, 0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(DeferOrder(q, {}, {0, 3, 6}), (std::vector<size_t>{0, 1, 2, 3, 4, 6, 7, 5, 8}));
}

// A reader that also reads a value the step computes (an activation) does not move: moving it
// would keep that value alive; nor does a name bound twice, nor a collective reading a cast.
TEST(DeferReadersTest, ReadersOfComputedValuesAndReboundNamesStay) {
  ProgramSpec p = Grads(3);
  p.ops[2].in = {"s0", "e1"};  // c0 reads layer 1's unreduced gradient too ...
  p.ops[2].kind = OpKind::kAdd;
  std::swap(p.ops[2], p.ops[3]);  // ... so it follows it: 2 is e1, 3 is c0.
  EXPECT_EQ(TailCollectivesOf(p), (std::vector<char>{0, 0, 0, 0, 1, 0, 0, 1, 0}));
  const std::vector<size_t> order = DeferOrder(p, {}, {0, 2, 6});
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4, 6, 7, 5, 8}));
  ProgramSpec q = Grads(3);
  q.ops[5].out = {"c0"};  // Layer 1's cast rebinds c0.
  q.outputs[1].name = "c0";
  EXPECT_EQ(TailCollectivesOf(q), (std::vector<char>{0, 0, 0, 0, 0, 0, 0, 1, 0}));
  ProgramSpec r = Grads(2);
  r.ops.push_back(MakeOp(OpKind::kPsum, {"c0"}, "t"));  // A collective reads c0.
  r.outputs.push_back({"t", {}, ""});
  EXPECT_EQ(TailCollectivesOf(r), (std::vector<char>{0, 0, 0, 0, 1, 0, 0}));
}

// A layer's backward begins at the first op of the pass reading one of its forward values,
// its output aside (the next layer's backward reads that): here two layers h = tanh(tanh(in)),
// whose backward reads their inner values a0 and a1 (tanh's derivative reads its input).
TEST(DeferReadersTest, LayerBackwardsBeginWhereTheyFirstReadTheirLayer) {
  ProgramSpec p;
  p.mode = ProgramMode::kExplicit;
  p.arrays.push_back({"x", {4}, DType::kF32, {}, {}, ""});
  p.ops.push_back(MakeOp(OpKind::kTanh, {"x"}, "a0"));
  p.ops.push_back(MakeOp(OpKind::kTanh, {"a0"}, "h0"));
  p.ops.push_back(MakeOp(OpKind::kTanh, {"h0"}, "a1"));
  p.ops.push_back(MakeOp(OpKind::kTanh, {"a1"}, "h1"));
  p.ops.push_back(MakeOp(OpKind::kSum, {"h1"}, "loss"));
  OpSpec g;
  g.kind = OpKind::kGrad;
  g.of = "loss";
  g.wrt = {"x"};
  g.out = {"dx"};
  p.ops.push_back(g);
  p.outputs.push_back({"dx", {}, ""});
  std::vector<size_t> passes;
  const ProgramSpec expanded = ExpandGrads(p, &passes);
  ASSERT_EQ(passes.size(), 2u);
  auto first_reader = [&](const std::string& v) {
    for (size_t i = passes[0]; i < passes[1]; ++i) {
      const std::vector<std::string>& in = expanded.ops[i].in;
      if (std::find(in.begin(), in.end(), v) != in.end()) return i;
    }
    return expanded.ops.size();
  };
  ASSERT_LT(first_reader("a1"), first_reader("h0"));
  ASSERT_LT(first_reader("h0"), first_reader("a0"));
  EXPECT_EQ(LayerBackwardStarts(expanded, passes, {{"a0", "h0"}, {"a1", "h1"}}),
            (std::vector<size_t>{first_reader("a1"), first_reader("a0")}));
}

// What the move buys, on 8 TPU v5e chips (FSDP 8): three layers' gradients, each a product of
// 51 us (2 x 1024 x 8192 x 512 FLOPs at 85% of 197 TFLOP/s) reduce-scattered (1 MiB of bf16, a
// few times faster) and cast. In program order each cast holds the compute stream until its
// reduce-scatter ends, so all three are exposed; deferred, each runs beside the next layer's
// product and only the last is exposed. Exposed time is measured by the executor; the
// reduce-scatters' own times come from the run (1% and a microsecond: the links' latency
// around them).
TEST(DeferReadersTest, DeferredCastsLeaveOnlyTheLastReduceScatterExposed) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  ProgramSpec p;
  p.mode = ProgramMode::kManual;
  p.mesh_axes = {{"fsdp", 8}};
  p.arrays.push_back({"x", {1024, 8192}, DType::kBF16, {}, {}, ""});
  for (int i = 0; i < 3; ++i) {
    const std::string k = std::to_string(i);
    p.arrays.push_back({"w" + k, {8192, 512}, DType::kBF16, {}, {}, ""});
    p.ops.push_back(MakeOp(OpKind::kMatmul, {"x", "w" + k}, "e" + k));
    OpSpec rs = MakeOp(OpKind::kPsumScatter, {"e" + k}, "s" + k);
    rs.tiled = true;
    p.ops.push_back(rs);
    p.ops.push_back(MakeOp(OpKind::kConvert, {"s" + k}, "c" + k));
    p.outputs.push_back({"c" + k, PartitionSpec{{{"fsdp"}}}, ""});
  }
  ProgramSpec deferred = p;
  const std::vector<size_t> order = DeferOrder(p, {}, {0, 3, 6});
  ASSERT_EQ(order, (std::vector<size_t>{0, 1, 3, 4, 2, 6, 7, 5, 8}));
  for (size_t k = 0; k < order.size(); ++k) deferred.ops[k] = p.ops[order[k]];
  const Mesh mesh = PlaceProgramMesh(machine, p);
  RunConfig config;
  const RunResult in_order = RunProgram(machine, mesh, p, config);
  const RunResult moved = RunProgram(machine, mesh, deferred, config);
  auto scatters = [](const RunResult& r) {
    std::vector<double> t;
    for (const OpTiming& op : r.ops) {
      if (op.op == "psum_scatter") t.push_back((op.end - op.start).seconds());
    }
    return t;
  };
  const std::vector<double> a = scatters(in_order), b = scatters(moved);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  const double product = in_order.ops[0].compute.seconds();
  // The roofline and the preset's 1 us op overhead.
  EXPECT_NEAR(product, 2.0 * 1024 * 8192 * 512 / (0.85 * 197e12) + 1e-6, 0.01 * product);
  EXPECT_LT(a[0], product);  // Compute-bound: each reduce-scatter fits beside a product.
  const double exposed_in_order = in_order.per_device[0].exposed_comm.seconds();
  const double exposed_moved = moved.per_device[0].exposed_comm.seconds();
  EXPECT_NEAR(exposed_in_order, a[0] + a[1] + a[2], 0.01 * exposed_in_order + 1e-6);
  // Layer 1's cast (its 1 us of op overhead) runs beside the last reduce-scatter.
  EXPECT_NEAR(exposed_moved, b[2] - 1e-6, 0.01 * exposed_moved + 1e-6);
  EXPECT_NEAR((in_order.end - moved.end).seconds(), exposed_in_order - exposed_moved, 1e-6);
}

}  // namespace
}  // namespace shardsim::planner
