// Rematerialization: what each policy recomputes, where the recompute goes, and that the
// recomputed program computes the same gradients, sharded, as the program without it.
#include "planner/remat.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "planner/grad.h"
#include "planner/partitioned_numerics.h"
#include "tests/planner/partition_test_support.h"

namespace shardsim::planner {
namespace {

// One layer under data parallelism over 8: h = x @ w1, a = middle(h) (its values after h),
// y = a @ w2, then loss = sum(y) and its gradients with respect to w1 and w2.
ProgramSpec LayerOf(const std::function<void(ProgramBuilder&)>& middle) {
  ProgramBuilder pb({{"dp", 8}}, {}, ProgramMode::kAuto);
  pb.Input("x", {16, 8}, DType::kF32, P({{"dp"}}), Normal(1));
  pb.Input("w1", {8, 8}, DType::kF32, P({}), Normal(2));
  pb.Input("w2", {8, 8}, DType::kF32, P({}), Normal(3));
  pb.Matmul("x", "w1", "h");
  middle(pb);
  pb.Matmul("a", "w2", "y");
  OpSpec sum;
  sum.kind = OpKind::kSum;
  sum.in = {"y"};
  sum.out = {"loss"};
  pb.Add(std::move(sum));
  pb.Grad("loss", {"w1", "w2"}, {"d_w1", "d_w2"});
  pb.Output("d_w1", P({}));
  pb.Output("d_w2", P({}));
  return std::move(pb).Build();
}

// The layer with a = relu(h). Its values: h, a, y.
ProgramSpec Layer() {
  return LayerOf([](ProgramBuilder& pb) { pb.Unary(OpKind::kRelu, "h", "a"); });
}

struct Remat {
  ProgramSpec program;
  std::vector<size_t> passes;
};

Remat Apply(RematPolicy policy) {
  Remat r;
  r.program = ExpandGrads(Layer(), &r.passes);
  ApplyRemat(r.program, r.passes, {{"h", "a", "y"}}, policy);
  return r;
}

// The outputs of the recompute ops, all in the backward pass, in order; `first` receives the
// index of the first.
std::vector<std::string> Recomputed(const Remat& r, size_t* first) {
  std::vector<std::string> made;
  for (size_t i = 0; i < r.program.ops.size(); ++i) {
    if (!IsRecompute(r.program.ops[i].name)) continue;
    EXPECT_GE(i, r.passes.at(0));
    if (made.empty()) *first = i;
    made.push_back(r.program.ops[i].out.at(0));
  }
  return made;
}

// Whether an op from `from` on reads `name`.
bool ReadFrom(const ProgramSpec& p, size_t from, const std::string& name) {
  for (size_t i = from; i < p.ops.size(); ++i) {
    const std::vector<std::string>& in = p.ops[i].in;
    if (std::find(in.begin(), in.end(), name) != in.end()) return true;
  }
  return false;
}

// Full: the backward reads a (for d_w2) and h (relu's derivative); both are recomputed from
// the layer's inputs just before the first backward op reading either (jax.checkpoint's
// recompute at the start of the layer's backward); y, read by the loss outside the layer, is
// kept. Nothing after the recompute reads the forward's h or a, so they die in the forward.
TEST(RematTest, FullRecomputesTheLayerFromItsInputs) {
  const Remat r = Apply(RematPolicy::kFull);
  size_t first = 0;
  EXPECT_EQ(Recomputed(r, &first), (std::vector<std::string>{"h_rc", "a_rc"}));
  EXPECT_EQ(r.program.ops[first].in, (std::vector<std::string>{"x", "w1"}));
  EXPECT_FALSE(ReadFrom(r.program, first, "h"));
  EXPECT_FALSE(ReadFrom(r.program, first, "a"));
  EXPECT_TRUE(ReadFrom(r.program, first, "a_rc"));
  EXPECT_EQ(r.passes.at(1), r.program.ops.size());
}

// Selective: h, a matmul's output, is kept; a is recomputed from it.
TEST(RematTest, SelectiveKeepsMatmulOutputs) {
  const Remat r = Apply(RematPolicy::kSelective);
  size_t first = 0;
  EXPECT_EQ(Recomputed(r, &first), (std::vector<std::string>{"a_rc"}));
  EXPECT_EQ(r.program.ops[first].in, (std::vector<std::string>{"h"}));
  EXPECT_TRUE(ReadFrom(r.program, first, "h"));
  EXPECT_FALSE(ReadFrom(r.program, first, "a"));
}

TEST(RematTest, NoneChangesNothing) {
  std::vector<size_t> passes;
  const ProgramSpec expanded = ExpandGrads(Layer(), &passes);
  const Remat r = Apply(RematPolicy::kNone);
  EXPECT_EQ(r.program.ops.size(), expanded.ops.size());
  EXPECT_EQ(r.passes, passes);
}

// `r` (the remat of `global`) partitioned and run with data on 8 v5e chips, checked against
// `global` unsharded and without remat.
NumericsReport CheckRun(const Remat& r, const ProgramSpec& global) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  const PartitionResult partitioned = PartitionExpanded(r.program, r.passes);
  RunConfig config;
  config.numerics = true;
  RunResult run = RunProgram(machine, mesh, partitioned.program, config);
  return CheckPartitionedNumerics(run.outputs, mesh, global, partitioned.program, "", &run.inputs);
}

// Partitioned (data parallel over 8) and run with data, each policy's program gives the
// gradients the unsharded program without remat gives.
TEST(RematTest, RecomputedGradientsMatchTheUnshardedOnes) {
  for (RematPolicy policy : {RematPolicy::kSelective, RematPolicy::kFull}) {
    SCOPED_TRACE(RematPolicyName(policy));
    const Remat r = Apply(policy);
    const NumericsReport report = CheckRun(r, Layer());
    EXPECT_TRUE(report.checked);
    EXPECT_TRUE(report.passed) << report.worst_output << " error " << report.max_abs_error;
  }
}

// The layer with a shard_map region for a: in it e = exp(h), a = e * e (whose derivative reads
// e, so grad adds e to the region's outputs as a residual).
ProgramSpec LayerWithRegion() {
  return LayerOf([](ProgramBuilder& pb) {
    ProgramBuilder body({{"dp", 8}}, {}, ProgramMode::kManual);
    body.Input("hb", {16, 8}, DType::kF32, P({{"dp"}}));
    body.Unary(OpKind::kExp, "hb", "e");
    body.Binary(OpKind::kMul, "e", "e", "ab");
    body.Output("ab", P({{"dp"}}));
    pb.ShardMap({"h"}, std::move(body).Build(), {"a"});
  });
}

// Full remat recomputes a shard_map region whole, the residuals grad added to its outputs
// included: the backward region reads the recomputed residual, so the forward's dies in the
// forward (as jax.checkpoint recomputes a shard_map in the layer it wraps). Partitioned and
// run with data, the gradients are the unsharded program's.
TEST(RematTest, FullRecomputesARegionAndItsResiduals) {
  Remat r;
  r.program = ExpandGrads(LayerWithRegion(), &r.passes);
  const OpSpec* region = nullptr;
  for (const OpSpec& op : r.program.ops) {
    if (op.kind == OpKind::kShardMap && op.out.at(0) == "a") region = &op;
  }
  ASSERT_NE(region, nullptr);
  const std::vector<std::string> outputs = region->out;
  ASSERT_EQ(outputs.size(), 2u);  // a and its residual e.
  ApplyRemat(r.program, r.passes, {{"h", "a"}}, RematPolicy::kFull);
  size_t first = 0;
  EXPECT_EQ(Recomputed(r, &first), (std::vector<std::string>{"h_rc", "a_rc"}));
  EXPECT_EQ(r.program.ops[first + 1].out,
            (std::vector<std::string>{"a_rc", outputs[1] + kRematSuffix}));
  EXPECT_FALSE(ReadFrom(r.program, first, outputs[1]));
  EXPECT_TRUE(ReadFrom(r.program, first, outputs[1] + kRematSuffix));
  const NumericsReport report = CheckRun(r, LayerWithRegion());
  EXPECT_TRUE(report.passed) << report.worst_output << " error " << report.max_abs_error;
}

}  // namespace
}  // namespace shardsim::planner
