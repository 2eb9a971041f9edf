// The ops reverse mode emits (grad_ops.h): derivative kernels against double-precision central
// differences of the closed forms, JAX's choices at kinks and ties, the data-movement helpers,
// their costs, and a manual program of them through a simulated run and its numerics check.
#include "collectives/grad_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

Array F32(Shape shape, std::vector<float> v) {
  return Array::FromValues(DType::kF32, std::move(shape), std::move(v));
}

std::vector<float> Values(const Array& a) {
  std::vector<float> v;
  for (int64_t i = 0; i < a.size(); ++i) v.push_back(a.at(i));
  return v;
}

// One derivative kernel and the closed form of its forward op in double.
struct UnaryGradCase {
  OpKind fn;
  std::function<double(double)> f;
  std::vector<float> x;  // Points away from kinks, inside the domain.
};

// unary_grad(g, x) = g f'(x) with f' from central differences of f in double (h = 1e-5: the
// truncation error h^2 |f'''| / 6 and the cancellation 1e-16 / h are both below 1e-9, far under
// the kernel's float32 error of a few ulps, checked at 4e-6 relative).
TEST(UnaryGradTest, MatchesCentralDifferencesOfTheForwardOp) {
  const double c = std::sqrt(2 / std::acos(-1.0));
  const std::vector<float> wide = {-3.5f, -1.2f, -0.3f, 0.25f, 0.9f, 2.7f};
  const std::vector<float> positive = {0.2f, 0.7f, 1.5f, 4.0f};
  const std::vector<UnaryGradCase> cases = {
      {OpKind::kRelu, [](double x) { return std::max(x, 0.0); }, wide},
      {OpKind::kGelu,
       [c](double x) { return 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x))); }, wide},
      {OpKind::kSilu, [](double x) { return x / (1 + std::exp(-x)); }, wide},
      {OpKind::kTanh, [](double x) { return std::tanh(x); }, wide},
      {OpKind::kSqrt, [](double x) { return std::sqrt(x); }, positive},
      {OpKind::kRsqrt, [](double x) { return 1 / std::sqrt(x); }, positive},
      {OpKind::kSquare, [](double x) { return x * x; }, wide},
      {OpKind::kAbs, [](double x) { return std::fabs(x); }, wide},
      {OpKind::kSin, [](double x) { return std::sin(x); }, wide},
      {OpKind::kCos, [](double x) { return std::cos(x); }, wide},
  };
  for (const UnaryGradCase& t : cases) {
    SCOPED_TRACE(OpKindName(t.fn));
    const int64_t n = static_cast<int64_t>(t.x.size());
    std::vector<float> g(t.x.size());
    for (int64_t i = 0; i < n; ++i) g[i] = 0.5f + 0.25f * static_cast<float>(i);
    Array got = UnaryGrad(t.fn, F32({n}, g), F32({n}, t.x));
    for (int64_t i = 0; i < n; ++i) {
      const double h = 1e-5, x = t.x[i];
      const double want = g[i] * (t.f(x + h) - t.f(x - h)) / (2 * h);
      EXPECT_NEAR(got.at(i), want, 4e-6 * std::max(1.0, std::fabs(want))) << "x = " << x;
    }
  }
}

// JAX's derivatives at the kinks are selects: relu'(0) = 0, abs'(0) = 1, and the branch not
// taken contributes nothing even for an infinite cotangent.
TEST(UnaryGradTest, KinksAreJaxSelects) {
  const float inf = std::numeric_limits<float>::infinity();
  Array x = F32({3}, {0.0f, -1.0f, 2.0f});
  Array g = F32({3}, {3.0f, inf, 5.0f});
  EXPECT_EQ(Values(UnaryGrad(OpKind::kRelu, g, x)), (std::vector<float>{0, 0, 5}));
  EXPECT_EQ(Values(UnaryGrad(OpKind::kAbs, g, x)), (std::vector<float>{3, -inf, 5}));
  // bf16 cotangents give bf16 results, rounded.
  Array gb = Array::FromValues(DType::kBF16, {1}, {1.0f});
  Array r = UnaryGrad(OpKind::kSin, gb, F32({1}, {0.1f}));
  EXPECT_EQ(r.dtype(), DType::kBF16);
  EXPECT_EQ(r.at(0), RoundToDType(DType::kBF16, std::cos(0.1f)));
  EXPECT_THROW(UnaryGrad(OpKind::kExp, F32({1}, {1}), F32({1}, {1})), std::invalid_argument);
  EXPECT_THROW(UnaryGrad(OpKind::kTanh, F32({2}, {1, 1}), F32({1}, {1})), std::invalid_argument);
}

TEST(MaxGradTest, BalancedTiesBroadcastingAndNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Array g = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  Array a = F32({2, 3}, {5, 1, 2, 0, nan, 7});
  Array b = F32({3}, {1, 1, 3});  // Broadcast over rows.
  EXPECT_EQ(Values(MaxGrad(g, a, b)), (std::vector<float>{1, 1, 0, 0, 0, 6}));
  // The other operand's cotangent: the same op with the operands swapped (ties split evenly).
  Array gb = MaxGrad(g, b, a);
  EXPECT_EQ(gb.shape(), (Shape{2, 3}));
  EXPECT_EQ(Values(gb), (std::vector<float>{0, 1, 3, 4, 0, 0}));
  // A scalar operand.
  EXPECT_EQ(Values(MaxGrad(F32({2}, {1, 1}), F32({2}, {-1, 1}), F32({}, {0}))),
            (std::vector<float>{0, 1}));
  EXPECT_THROW(MaxGrad(F32({3}, {1, 1, 1}), F32({2}, {1, 1}), F32({}, {0})), std::invalid_argument);
}

TEST(BroadcastInDimTest, MapsDimensionsAndRepeats) {
  Array row = F32({3}, {1, 2, 3});
  EXPECT_EQ(Values(BroadcastInDim(row, {2, 3}, {1})), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(Values(BroadcastInDim(row, {3, 2}, {0})), (std::vector<float>{1, 1, 2, 2, 3, 3}));
  // A size-1 input dimension broadcasts in place.
  Array col = F32({2, 1}, {7, 8});
  EXPECT_EQ(Values(BroadcastInDim(col, {2, 3}, {0, 1})), (std::vector<float>{7, 7, 7, 8, 8, 8}));
  EXPECT_EQ(Values(BroadcastInDim(F32({}, {4}), {2, 2}, {})), (std::vector<float>{4, 4, 4, 4}));
  Array big = BroadcastInDim(Array::ShapeOnly(DType::kBF16, {4, 1}), {2, 4, 8}, {1, 2});
  EXPECT_FALSE(big.has_data());
  EXPECT_EQ(big.shape(), (Shape{2, 4, 8}));
  EXPECT_EQ(big.dtype(), DType::kBF16);
  EXPECT_THROW(BroadcastInDim(row, {3, 3}, {1, 0}), std::invalid_argument);  // Not one per dim.
  EXPECT_THROW(BroadcastInDim(col, {2, 3}, {1, 0}), std::invalid_argument);  // Not increasing.
  EXPECT_THROW(BroadcastInDim(row, {2, 4}, {1}), std::invalid_argument);     // 3 vs 4.
}

TEST(PadTest, ZerosAroundOneAxis) {
  Array x = F32({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(Values(Pad(x, 1, 2, 1)), (std::vector<float>{0, 1, 2, 0, 0, 0, 3, 4, 0, 0}));
  EXPECT_EQ(Pad(x, 1, 2, 1).shape(), (Shape{2, 5}));
  EXPECT_EQ(Values(Pad(x, 0, 1, -2)), (std::vector<float>{1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(Pad(Array::ShapeOnly(DType::kI32, {3}), 2, 0, 0).shape(), (Shape{5}));
  EXPECT_THROW(Pad(x, 0, 0, 2), std::invalid_argument);
}

TEST(FullLikeTest, TakesShapeAndDtype) {
  Array f = FullLike(Array::FromValues(DType::kBF16, {2}, {0, 0}), 1.001);
  EXPECT_EQ(f.dtype(), DType::kBF16);
  EXPECT_EQ(Values(f), (std::vector<float>{1.0f, 1.0f}));  // 1.001 rounds to bf16's 1.
  Array i = FullLike(Array::FromInts({2}, {5, 6}), 3);
  EXPECT_EQ(i.IntAt(1), 3);
  EXPECT_FALSE(FullLike(Array::ShapeOnly(DType::kF32, {1 << 20, 1 << 10}), 0).has_data());
}

TEST(GradOpCostTest, DataMovementAndOneFlopPerElement) {
  Array x = Array::ShapeOnly(DType::kF32, {4, 8});
  Array bigger = Array::ShapeOnly(DType::kF32, {2, 4, 8});
  OpSpec op;
  op.kind = OpKind::kFullLike;
  EXPECT_EQ(LocalOpCost(op, {&x}, {&x}).bytes, 128);  // Writes only.
  EXPECT_EQ(LocalOpCost(op, {&x}, {&x}).flops, 0);
  op.kind = OpKind::kBroadcastInDim;
  EXPECT_EQ(LocalOpCost(op, {&x}, {&bigger}).bytes, 128 + 256);
  op.kind = OpKind::kUnaryGrad;
  EXPECT_EQ(LocalOpCost(op, {&x, &x}, {&x}).flops, 32);
  EXPECT_EQ(LocalOpCost(op, {&x, &x}, {&x}).bytes, 3 * 128);
  op.kind = OpKind::kMaxGrad;
  EXPECT_EQ(LocalOpCost(op, {&x, &x, &x}, {&x}).bytes, 4 * 128);
}

// A manual program of every new op, downstream of a psum (whose float32 sums differ from the
// reference's by rounding): the simulation matches the reference within the derived bounds.
TEST(GradOpsProgramTest, RunsAndPassesTheNumericsCheck) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  ProgramBuilder b({{"dp", 4}});
  InitSpec normal;
  normal.kind = InitSpec::Kind::kNormal;
  b.Input("x", {32, 16}, DType::kF32, PartitionSpec{{{"dp"}}}, normal);
  normal.seed = 1;
  b.Input("g", {8, 16}, DType::kF32, PartitionSpec{}, normal);
  const std::string s = b.Reduce(OpKind::kPsum, "x", {"dp"});
  std::vector<std::string> grads;
  for (const char* fn : {"relu", "gelu", "silu", "tanh", "square", "abs", "sin", "cos"}) {
    OpSpec op;
    op.kind = OpKind::kUnaryGrad;
    op.in = {"g", s};
    op.fn = fn;
    grads.push_back(b.Add(op));
  }
  OpSpec max;
  max.kind = OpKind::kMaxGrad;
  max.in = {"g", s, "x"};  // x's blocks differ by position: so do the results.
  b.Output(b.Add(max), PartitionSpec{{{"dp"}}});
  OpSpec full;
  full.kind = OpKind::kFullLike;
  full.in = {s};
  full.fill_value = 2.0;
  grads.push_back(b.Add(full));
  OpSpec pad;
  pad.kind = OpKind::kPad;
  pad.in = {s};
  pad.axis = 1;
  pad.low = 1;
  pad.high = 3;
  const std::string padded = b.Add(pad);
  OpSpec bcast;
  bcast.kind = OpKind::kBroadcastInDim;
  bcast.in = {s};
  bcast.shape = {2, 8, 16};
  bcast.broadcast_dimensions = {1, 2};
  const std::string broadcast = b.Add(bcast);
  for (const std::string& name : grads) b.Output(name, PartitionSpec{});
  b.Output(padded, PartitionSpec{});
  b.Output(broadcast, PartitionSpec{});
  ProgramSpec program = std::move(b).Build();
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, program, config);
  EXPECT_EQ(r.outputs.at(padded).shape(), (Shape{8, 20}));
  EXPECT_EQ(r.outputs.at(broadcast).shape(), (Shape{2, 8, 16}));
  NumericsReport check = CheckNumerics(r.outputs, mesh, program, "", &r.inputs);
  EXPECT_TRUE(check.checked);
  EXPECT_TRUE(check.passed) << check.max_abs_error << " " << check.worst_output;
  // Every bound is finite: each op has its entry in the error model.
  std::map<std::string, double> bounds;
  ReferenceOutputs(mesh, program, "", &r.inputs, &bounds);
  for (const auto& [name, bound] : bounds) EXPECT_TRUE(std::isfinite(bound)) << name;
}

}  // namespace
}  // namespace shardsim
