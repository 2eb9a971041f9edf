// The numerics check end to end: integer and non-finite data through every collective
// algorithm, the per-value error bounds (deep programs, group sizes), and the reports of
// mismatches.
#include "collectives/numerics_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/executor.h"
#include "collectives/init.h"
#include "collectives/placement.h"
#include "tests/support/make_op.h"
#include "tests/support/specs.h"
#include "topology/routing.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

using test::MakeOp;
using test::P;

ArraySpec Literal(std::string name, Shape shape, DType dtype, std::vector<float> values,
                  PartitionSpec sharding) {
  ArraySpec a;
  a.name = std::move(name);
  a.shape = std::move(shape);
  a.dtype = dtype;
  a.sharding = std::move(sharding);
  a.init.kind = InitSpec::Kind::kValue;
  a.init.values.assign(values.begin(), values.end());
  return a;
}

ArraySpec Normal(std::string name, Shape shape, DType dtype, uint64_t seed,
                 PartitionSpec sharding) {
  ArraySpec a;
  a.name = std::move(name);
  a.shape = std::move(shape);
  a.dtype = dtype;
  a.sharding = std::move(sharding);
  a.init.kind = InitSpec::Kind::kNormal;
  a.init.seed = seed;
  return a;
}

// Runs `program` on a ring of `n` TPU-like chips (mesh axes `axes`) and returns its outputs.
std::map<std::string, Array> RunOnRing(const std::vector<MeshAxis>& axes, int n,
                                       const ProgramSpec& program, bool numerics = true) {
  Simulator sim;
  DeviceSpec dev;
  dev.platform = "TPU";
  Topology topo = BuildTorus({n}, {true}, Bandwidth::GBps(45), Time::Microseconds(1),
                             LinkKind::kIci, dev, "ring");
  std::unique_ptr<Router> router = MakeRouter(topo);
  Network net(sim, topo, *router);
  Mesh mesh(axes, DefaultPlacement(axes, topo));
  CheckProgram(mesh, program);
  ExecutorConfig config;
  config.numerics = numerics;
  Executor ex(sim, net, mesh, program, config);
  ex.Start();
  sim.Run();
  EXPECT_TRUE(ex.finished());
  return ex.Outputs();
}

const char* const kReductionAlgorithms[] = {"ring", "bidirectional_ring", "direct",
                                            "halving_doubling", "tree"};

TEST(NumericsCheckTest, Int32PsumWrapsExactlyOnEveryAlgorithm) {
  // Member 0 holds 2^24 + 2 and 2^30 + 128, the others 1 and 2^30 + 128 (all exact in the
  // float literal). int32 sums: 2^24 + 5 (float32 would round it to 2^24 + 4) and
  // 4 (2^30 + 128) = 2^32 + 512, which wraps to 512 (a float32 store saturated it).
  std::vector<MeshAxis> axes = {{"x", 4}};
  for (const char* algorithm : kReductionAlgorithms) {
    SCOPED_TRACE(algorithm);
    ProgramSpec p;
    p.mesh_axes = axes;
    p.arrays = {Literal("a", {4, 2}, DType::kI32,
                        {16777218, 1073741952, 1, 1073741952, 1, 1073741952, 1, 1073741952},
                        P({{"x"}, {}}))};
    OpSpec sum = MakeOp(OpKind::kPsum, {"a"}, "s", {"x"});
    OpSpec mean = MakeOp(OpKind::kPmean, {"a"}, "m", {"x"});
    OpSpec max = MakeOp(OpKind::kPmax, {"a"}, "hi", {"x"});
    sum.algorithm = mean.algorithm = max.algorithm = algorithm;
    p.ops = {sum, mean, max};
    p.outputs = {{"s", P({}), "outputs.s"}, {"m", P({}), "outputs.m"}, {"hi", P({}), "outputs.hi"}};
    std::map<std::string, Array> out = RunOnRing(axes, 4, p);
    const Array& s = out.at("s");
    ASSERT_EQ(s.dtype(), DType::kI32);
    EXPECT_EQ(s.IntAt(0), 16777221);
    EXPECT_EQ(s.IntAt(1), 512);
    // pmean of i32 is f32 in JAX: the wrapped sum divided by 4.
    const Array& m = out.at("m");
    ASSERT_EQ(m.dtype(), DType::kF32);
    EXPECT_EQ(m.at(0), static_cast<float>(16777221) / 4.0f);
    EXPECT_EQ(m.at(1), 128.0f);
    EXPECT_EQ(out.at("hi").IntAt(0), 16777218);
    NumericsReport r = CheckNumerics(out, Mesh(axes, {0, 1, 2, 3}), p, "");
    EXPECT_TRUE(r.passed) << r.worst_output;
    EXPECT_EQ(r.max_abs_error, 0.0);  // Integers compare exactly (their bounds are 0).
    EXPECT_EQ(r.tolerance, 0.0);
    // Timing-only runs type the values the same way: pmean of i32 is f32.
    std::map<std::string, Array> typed = RunOnRing(axes, 4, p, /*numerics=*/false);
    EXPECT_FALSE(typed.at("m").has_data());
    EXPECT_EQ(typed.at("m").dtype(), DType::kF32);
    EXPECT_EQ(typed.at("s").dtype(), DType::kI32);
  }
}

TEST(NumericsCheckTest, NanPropagatesThroughPminAndPmaxOnEveryAlgorithm) {
  // XLA's min/max propagate NaN: pmin and pmax of [1, nan, 3, 2] are nan, and of
  // [1, -inf, 3, 2] -inf and 3; the check accepts these non-finite results.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<MeshAxis> axes = {{"x", 4}};
  for (const char* algorithm : kReductionAlgorithms) {
    SCOPED_TRACE(algorithm);
    ProgramSpec p;
    p.mesh_axes = axes;
    p.arrays = {Literal("a", {4, 2}, DType::kF32, {1, 1, nan, -inf, 3, 3, 2, 2}, P({{"x"}, {}}))};
    OpSpec lo = MakeOp(OpKind::kPmin, {"a"}, "lo", {"x"});
    OpSpec hi = MakeOp(OpKind::kPmax, {"a"}, "hi", {"x"});
    lo.algorithm = hi.algorithm = algorithm;
    p.ops = {lo, hi};
    p.outputs = {{"lo", P({}), "outputs.lo"}, {"hi", P({}), "outputs.hi"}};
    std::map<std::string, Array> out = RunOnRing(axes, 4, p);
    EXPECT_TRUE(std::isnan(out.at("lo").at(0)));
    EXPECT_EQ(out.at("lo").at(1), -inf);
    EXPECT_TRUE(std::isnan(out.at("hi").at(0)));
    EXPECT_EQ(out.at("hi").at(1), 3.0f);
    NumericsReport r = CheckNumerics(out, Mesh(axes, {0, 1, 2, 3}), p, "");
    EXPECT_TRUE(r.passed) << r.worst_output;
    EXPECT_EQ(r.max_abs_error, 0.0);
  }
}

TEST(NumericsCheckTest, NonFiniteMismatchesFailWithAClearReport) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::map<std::string, Array> ref = {{"y", Array::FromNumbers(DType::kF32, {3}, {2, inf, 5})}};
  // nan where the reference has 2: fails, names the output, the element and both values;
  // the finite pairs still give a finite max_abs_error (0.25 at element 2).
  std::map<std::string, Array> got = {
      {"y", Array::FromNumbers(DType::kF32, {3}, {nan, inf, 5.25})}};
  NumericsReport r = CompareOutputs(got, ref, std::map<std::string, double>{{"y", 1.0}});
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.worst_output, "y (flat index 0: nan where the reference has 2)");
  EXPECT_EQ(r.max_abs_error, 0.25);
  // -inf where the reference has +inf fails too.
  got = {{"y", Array::FromNumbers(DType::kF32, {3}, {2, -inf, 5})}};
  r = CompareOutputs(got, ref, std::map<std::string, double>{{"y", 1.0}});
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.worst_output, "y (flat index 1: -inf where the reference has inf)");
  EXPECT_TRUE(std::isfinite(r.max_abs_error));
  // Identical non-finite values pass.
  r = CompareOutputs(ref, ref, std::map<std::string, double>{{"y", 0.0}});
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.max_abs_error, 0.0);
  // i32 outputs compare as exact integers: one apart above 2^24 is a failure.
  std::map<std::string, Array> iref = {{"k", Array::FromInts({1}, {16777217})}};
  std::map<std::string, Array> igot = {{"k", Array::FromInts({1}, {16777216})}};
  r = CompareOutputs(igot, iref, std::map<std::string, double>{});
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.max_abs_error, 1.0);
  EXPECT_EQ(r.worst_output, "k (flat index 0: 16777216 where the reference has 16777217)");
}

// An output whose bound is infinite is counted as unbounded: any finite error passes it (10
// apart here), while a non-finite mismatch still fails it.
TEST(NumericsCheckTest, UnboundedOutputsAreCounted) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::map<std::string, Array> ref = {{"a", Array::FromNumbers(DType::kF32, {1}, {1})},
                                            {"b", Array::FromNumbers(DType::kF32, {1}, {1})}};
  std::map<std::string, Array> got = {{"a", Array::FromNumbers(DType::kF32, {1}, {11})},
                                      {"b", Array::FromNumbers(DType::kF32, {1}, {1})}};
  const std::map<std::string, double> bounds = {{"a", inf}, {"b", 1e-3}};
  NumericsReport r = CompareOutputs(got, ref, bounds);
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.outputs, 2);
  EXPECT_EQ(r.unbounded, 1);
  got["a"] = Array::FromNumbers(DType::kF32, {1}, {std::numeric_limits<double>::quiet_NaN()});
  r = CompareOutputs(got, ref, bounds);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.nonfinite, 0);
  // NaN on both sides passes, and is counted: nothing was checked there.
  r = CompareOutputs(got, got, bounds);
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.nonfinite, 1);
}

TEST(NumericsCheckTest, ReferenceSharesReplicatedResultsExactly) {
  // Every position holds the same a and b, so the reference computes y = a @ b once and
  // copies it where a later op (z) or the assembly reads it; results must equal the
  // simulation's bit for bit (max_abs_error 0), outputs replicated and sharded alike.
  std::vector<MeshAxis> axes = {{"x", 4}};
  ProgramSpec p;
  p.mesh_axes = axes;
  p.arrays = {Normal("a", {8, 16}, DType::kF32, 3, P({})),
              Normal("b", {16, 8}, DType::kF32, 4, P({}))};
  p.ops = {MakeOp(OpKind::kMatmul, {"a", "b"}, "y"), MakeOp(OpKind::kAdd, {"y", "y"}, "z"),
           MakeOp(OpKind::kMatmul, {"y", "z"}, "w")};
  p.outputs = {{"y", P({}), "outputs.y"}, {"z", P({}), "outputs.z"}, {"w", P({}), "outputs.w"}};
  std::map<std::string, Array> out = RunOnRing(axes, 4, p);
  NumericsReport r = CheckNumerics(out, Mesh(axes, {0, 1, 2, 3}), p, "");
  EXPECT_TRUE(r.passed) << r.worst_output;
  EXPECT_EQ(r.max_abs_error, 0.0);
  EXPECT_EQ(out.at("w").shape(), (Shape{8, 8}));
}

// A bf16 residual MLP of `blocks` blocks, each x += (relu(x @ w1 / 8) @ w2 / sqrt(128)), both
// matmuls overlapped allgather_matmuls (bidirectional) over dp, weights sharded by rows.
ProgramSpec DeepMlp(int blocks) {
  ProgramSpec p;
  p.mesh_axes = {{"dp", 4}};
  p.arrays = {Normal("x0", {32, 64}, DType::kBF16, 1000, P({{"dp"}, {}}))};
  std::string x = "x0";
  for (int b = 0; b < blocks; ++b) {
    std::string id = std::to_string(b);
    p.arrays.push_back(Normal("w1_" + id, {64, 128}, DType::kBF16, 2 * b, P({{"dp"}, {}})));
    p.arrays.push_back(Normal("w2_" + id, {128, 64}, DType::kBF16, 2 * b + 1, P({{"dp"}, {}})));
    OpSpec up = MakeOp(OpKind::kAllgatherMatmul, {x, "w1_" + id}, "u" + id, {"dp"});
    up.variant = "bidirectional";
    OpSpec scale_up = MakeOp(OpKind::kMul, {"u" + id}, "us" + id);
    scale_up.scalar = 1.0 / 8;  // 1/sqrt(64): keeps activations O(1).
    OpSpec down = MakeOp(OpKind::kAllgatherMatmul, {"h" + id, "w2_" + id}, "d" + id, {"dp"});
    down.variant = "bidirectional";
    OpSpec scale_down = MakeOp(OpKind::kMul, {"d" + id}, "ds" + id);
    scale_down.scalar = 1.0 / std::sqrt(128.0);
    p.ops.push_back(up);
    p.ops.push_back(scale_up);
    p.ops.push_back(MakeOp(OpKind::kRelu, {"us" + id}, "h" + id));
    p.ops.push_back(down);
    p.ops.push_back(scale_down);
    p.ops.push_back(MakeOp(OpKind::kAdd, {x, "ds" + id}, "x" + std::to_string(b + 1)));
    x = "x" + std::to_string(b + 1);
  }
  p.outputs = {{x, P({{"dp"}, {}}), "outputs." + x}};
  return p;
}

TEST(NumericsCheckTest, DeepBf16ResidualMlpWithOverlappedCollectiveMatmulsPasses) {
  // The simulation rounds every partial product of the overlapped loops to bf16, the
  // reference one matmul: the differences grow with depth, and so must the bound. The old
  // mesh-wide bound (two bf16 ulps of max|y|, independent of depth) rejected this correct run.
  ProgramSpec p = DeepMlp(16);
  std::map<std::string, Array> out = RunOnRing(p.mesh_axes, 4, p);
  Mesh mesh(p.mesh_axes, {0, 1, 2, 3});
  NumericsReport r = CheckNumerics(out, mesh, p, "");
  EXPECT_TRUE(r.passed) << "max_abs_error " << r.max_abs_error << " > " << r.tolerance;
  EXPECT_GT(r.max_abs_error, 0.0);  // The loops really differ from one matmul.
  // The bound is meaningful: within 100x of the error it covers, not a blanket pass.
  EXPECT_LT(r.tolerance, 100 * r.max_abs_error);
  // A depth-independent bound does not cover it.
  NumericsReport coarse =
      CompareOutputs(out, ReferenceOutputs(mesh, p, ""), mesh.size(), LongestReduction(p));
  EXPECT_FALSE(coarse.passed) << coarse.max_abs_error << " within " << coarse.tolerance;
}

TEST(NumericsCheckTest, BoundsGrowWithDepth) {
  Mesh mesh({{"dp", 4}}, {0, 1, 2, 3});
  std::map<std::string, double> shallow, deep;
  ReferenceOutputs(mesh, DeepMlp(2), "", nullptr, &shallow);
  ReferenceOutputs(mesh, DeepMlp(16), "", nullptr, &deep);
  EXPECT_GT(deep.at("x16"), shallow.at("x2"));
}

// A contraction of values a reduction left inexact: both sides accumulate its 256 products in
// float32 on different values, so their accumulations round differently too (what the
// lowered program of a tensor-parallel layer's weight gradient does: the partial products
// psum_scattered, gathered again, contracted over the batch). Without that term the bound
// was 1.9e-08 against errors of 2.2e-08 on this program (a correct run failed).
TEST(NumericsCheckTest, ContractionsOfInexactValuesCountTheirOwnAccumulation) {
  ProgramSpec p;
  p.mesh_axes = {{"tp", 4}};
  p.arrays = {Normal("x", {256, 512}, DType::kF32, 0, P({{}, {"tp"}})),
              Normal("w", {512, 128}, DType::kF32, 1, P({{"tp"}, {}})),
              Normal("y", {256, 128}, DType::kF32, 3, P({{"tp"}, {}}))};
  OpSpec scatter = MakeOp(OpKind::kPsumScatter, {"h"}, "h1", {"tp"});
  scatter.tiled = true;
  OpSpec scale = MakeOp(OpKind::kMul, {"d"}, "g");
  scale.scalar = 1.0 / 16384;
  OpSpec gather = MakeOp(OpKind::kAllGather, {"g"}, "gg", {"tp"});
  gather.tiled = true;
  OpSpec contract = MakeOp(OpKind::kEinsum, {"gg", "x"}, "dw");
  contract.spec = "mn,mk->kn";
  p.ops = {MakeOp(OpKind::kMatmul, {"x", "w"}, "h"),
           scatter,
           MakeOp(OpKind::kSub, {"h1", "y"}, "d"),
           scale,
           gather,
           contract};
  p.outputs = {{"dw", P({{"tp"}, {}}), "outputs.dw"}};
  for (const std::string& algorithm : AlgorithmNames()) {
    if (!AlgorithmSupports(algorithm, CollectiveKind::kReduceScatter, 4).empty()) continue;
    SCOPED_TRACE(algorithm);
    p.ops[1].algorithm = algorithm;
    std::map<std::string, Array> out = RunOnRing(p.mesh_axes, 4, p);
    Mesh mesh(p.mesh_axes, {0, 1, 2, 3});
    NumericsReport r = CheckNumerics(out, mesh, p, "");
    EXPECT_TRUE(r.passed) << "max_abs_error " << r.max_abs_error << " > " << r.tolerance;
    EXPECT_LT(r.tolerance, 100 * r.max_abs_error);  // Still a bound, not a blanket pass.
  }
}

// y = x [64, 512] @ w [512, 64] of f32 normals. `permuted`: x's columns and w's rows both
// permuted (k -> 7k mod 512), so each output adds the same 512 products in another order,
// whatever the BLAS; `tp` > 1: the contraction split over tp devices, local partial products
// (y_partial) and a psum.
ProgramSpec Contraction(bool permuted, int tp = 1) {
  ProgramSpec p;
  p.mesh_axes = {{"tp", tp}};
  const PartitionSpec x_spec = tp > 1 ? P({{}, {"tp"}}) : P({});
  const PartitionSpec w_spec = tp > 1 ? P({{"tp"}, {}}) : P({});
  p.arrays = {Normal("x", {64, 512}, DType::kF32, 5, x_spec),
              Normal("w", {512, 64}, DType::kF32, 6, w_spec)};
  if (permuted) {
    const std::vector<float> x = MakeInitialArray(p.arrays[0], true, "").values();
    const std::vector<float> w = MakeInitialArray(p.arrays[1], true, "").values();
    std::vector<float> xp(x.size()), wp(w.size());
    for (int64_t k = 0; k < 512; ++k) {
      const int64_t from = 7 * k % 512;
      for (int64_t i = 0; i < 64; ++i) {
        xp[i * 512 + k] = x[i * 512 + from];
        wp[k * 64 + i] = w[from * 64 + i];
      }
    }
    p.arrays = {Literal("x", {64, 512}, DType::kF32, xp, x_spec),
                Literal("w", {512, 64}, DType::kF32, wp, w_spec)};
  }
  p.ops = {MakeOp(OpKind::kMatmul, {"x", "w"}, tp > 1 ? "y_partial" : "y")};
  if (tp > 1) p.ops.push_back(MakeOp(OpKind::kPsum, {"y_partial"}, "y", {"tp"}));
  p.outputs = {{"y", P({}), "outputs.y"}};
  return p;
}

// A matmul of exact operands is exact against a reference that adds its products in the same
// order, but not against one that adds them in another: the partitioned check's reference,
// the global program on whole arrays (shapes a BLAS blocks differently from a device's block),
// and there a longer contraction this one is a block of. Taken as exact, the bound was 0 and a
// reordered contraction failed (the FSDP transformer on OpenBLAS's Haswell sgemm kernels).
// With `reordered` the bound counts it: it covers the contraction with its products
// permuted, and the global one against its blocks and their psum, within 100x of the error.
TEST(NumericsCheckTest, ContractionsOfExactValuesCountAnotherSummationOrder) {
  const Mesh one({{"tp", 1}}, {0});
  const std::map<std::string, Array> whole = ReferenceOutputs(one, Contraction(false), "");
  std::map<std::string, double> same_order, bounds;
  ReferenceOutputs(one, Contraction(false), "", nullptr, &same_order);
  EXPECT_EQ(same_order.at("y"), 0.0);
  const ContractionLengths own;  // Each contraction reordered over its own length.
  ReferenceOutputs(one, Contraction(false), "", nullptr, &bounds, &own);
  NumericsReport r = CompareOutputs(ReferenceOutputs(one, Contraction(true), ""), whole, bounds);
  EXPECT_GT(r.max_abs_error, 0.0);  // The two orders really differ.
  EXPECT_TRUE(r.passed) << r.max_abs_error << " > " << r.tolerance;
  EXPECT_LT(r.tolerance, 100 * r.max_abs_error);

  // The contraction split over 4 devices: blocks of 128 products, their partial sums psummed,
  // against the global contraction of 512 added in one pass.
  const Mesh four({{"tp", 4}}, {0, 1, 2, 3});
  ContractionLengths global;
  ReferenceOutputs(one, Contraction(false), "", nullptr, nullptr, nullptr, &global);
  EXPECT_EQ(global.at("y"), 512.0);
  global["y_partial"] = global.at("y");
  std::map<std::string, double> split_bounds, block_only;
  const std::map<std::string, Array> split =
      ReferenceOutputs(four, Contraction(false, 4), "", nullptr, &split_bounds, &global);
  ReferenceOutputs(four, Contraction(false, 4), "", nullptr, &block_only, &own);
  EXPECT_GT(split_bounds.at("y"), block_only.at("y"));  // The reference's longer pass counts.
  r = CompareOutputs(split, whole, split_bounds);
  EXPECT_GT(r.max_abs_error, 0.0);
  EXPECT_TRUE(r.passed) << r.max_abs_error << " > " << r.tolerance;
  EXPECT_LT(r.tolerance, 100 * r.max_abs_error);
}

// psum of f32 normals over `axes` of a 16 x 4 mesh; returns the bound of its output.
double PsumBound(const std::vector<std::string>& axes, std::map<std::string, Array>* ref,
                 std::map<std::string, double>* bounds, ProgramSpec* program) {
  ProgramSpec& p = *program;
  p.mesh_axes = {{"a", 16}, {"b", 4}};
  p.arrays = {Normal("x", {64, 256}, DType::kF32, 7, P({{"a", "b"}, {}}))};
  p.ops = {MakeOp(OpKind::kPsum, {"x"}, "y", axes)};
  p.outputs = {{"y", P({{"a", "b"}, {}}), "outputs.y"}};
  std::vector<int> devices(64);
  for (int i = 0; i < 64; ++i) devices[i] = i;
  *ref = ReferenceOutputs(Mesh(p.mesh_axes, devices), p, "", nullptr, bounds);
  return bounds->at("y");
}

TEST(NumericsCheckTest, ReductionBoundsCountTheGroupNotTheMesh) {
  ProgramSpec small_p, large_p;
  std::map<std::string, Array> small_ref, large_ref;
  std::map<std::string, double> small_b, large_b;
  double small = PsumBound({"b"}, &small_ref, &small_b, &small_p);       // Groups of 4.
  double large = PsumBound({"a", "b"}, &large_ref, &large_b, &large_p);  // One group of 64.
  EXPECT_GT(small, 0.0);
  EXPECT_LT(small, large);
  // Against the old bound, which counted all 64 devices whatever the group.
  NumericsReport old = CompareOutputs(small_ref, small_ref, 64, 1);
  EXPECT_LT(small, old.tolerance);
  // A result off by 3 bounds at one element fails (and one off by half a bound passes):
  // the bound is what the check enforces, element by element.
  for (double factor : {3.0, 0.5}) {
    std::vector<float> words = small_ref.at("y").values();
    words[17] += static_cast<float>(factor * small);
    std::map<std::string, Array> got = {
        {"y", Array::FromValues(DType::kF32, small_ref.at("y").shape(), words)}};
    NumericsReport r = CompareOutputs(got, small_ref, small_b);
    EXPECT_EQ(r.passed, factor < 1) << factor;
  }
}

// A division by an inexact value that may be zero has no finite bound; the statistical cap
// must not turn that into a bound of zero, nor may ops downstream make it finite again.
TEST(NumericsCheckTest, UnboundedErrorsStayUnbounded) {
  ProgramSpec p;
  p.mesh_axes = {{"x", 4}};
  p.arrays = {Literal("a", {4, 2}, DType::kF32, {0, 1, 0, 2, 0, 3, 0, 4}, P({{"x"}, {}}))};
  OpSpec div = MakeOp(OpKind::kDiv, {"s", "s"}, "y");
  OpSpec add = MakeOp(OpKind::kAdd, {"y"}, "z");
  add.scalar = 1.0;
  p.ops = {MakeOp(OpKind::kPsum, {"a"}, "s", {"x"}), div, add};  // s = [0, 10]: inexact, min 0.
  p.outputs = {{"s", P({}), "outputs.s"}, {"y", P({}), "outputs.y"}, {"z", P({}), "outputs.z"}};
  std::map<std::string, double> bounds;
  ReferenceOutputs(Mesh(p.mesh_axes, {0, 1, 2, 3}), p, "", nullptr, &bounds);
  EXPECT_GT(bounds.at("s"), 0.0);
  EXPECT_EQ(bounds.at("y"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(bounds.at("z"), std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace shardsim
