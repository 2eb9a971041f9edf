// SPEC's elementwise ops beyond the first five (silu, log, sqrt, rsqrt, square, abs, sin, cos),
// convert (jax.lax.convert_element_type) and custom_call (an opaque kernel priced by the FLOPs
// and bytes it states), on values with closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "collectives/ir/program_builder.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

Array F32(std::vector<float> v) {
  Shape shape = {static_cast<int64_t>(v.size())};
  return Array::FromValues(DType::kF32, shape, std::move(v));
}

// f32 results within 2 ulps of the closed form (libm's float functions are faithful).
void ExpectValues(const Array& got, std::vector<double> want) {
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got.at(static_cast<int64_t>(i)), want[i],
                2.4e-7 * std::max(1.0, std::fabs(want[i])))
        << "element " << i;
  }
}

TEST(ElementwiseTest, ClosedForms) {
  const double e = std::exp(1.0), pi = std::acos(-1.0);
  ExpectValues(Unary(OpKind::kSilu, F32({0, 1, -1})), {0, 1 / (1 + std::exp(-1.0)), -1 / (1 + e)});
  ExpectValues(Unary(OpKind::kLog, F32({1, static_cast<float>(e)})), {0, 1});
  ExpectValues(Unary(OpKind::kSqrt, F32({4, 2})), {2, std::sqrt(2.0)});
  ExpectValues(Unary(OpKind::kRsqrt, F32({4, 0.25})), {0.5, 2});
  ExpectValues(Unary(OpKind::kSquare, F32({-3, 1.5})), {9, 2.25});
  ExpectValues(Unary(OpKind::kAbs, F32({-2.5, 2.5, 0})), {2.5, 2.5, 0});
  ExpectValues(Unary(OpKind::kSin, F32({0, static_cast<float>(pi / 2)})), {0, 1});
  ExpectValues(Unary(OpKind::kCos, F32({0, static_cast<float>(pi)})), {1, -1});
  EXPECT_TRUE(std::isnan(Unary(OpKind::kLog, F32({-1})).at(0)));
}

TEST(ElementwiseTest, Int32SquareAndAbsWrapOthersPromote) {
  const int32_t min = std::numeric_limits<int32_t>::min();
  Array x = Array::FromInts({3}, {65536, -7, min});
  Array sq = Unary(OpKind::kSquare, x);
  ASSERT_EQ(sq.dtype(), DType::kI32);
  EXPECT_EQ(sq.IntAt(0), 0);  // 2^32 wraps to 0.
  EXPECT_EQ(sq.IntAt(1), 49);
  Array ab = Unary(OpKind::kAbs, x);
  EXPECT_EQ(ab.IntAt(1), 7);
  EXPECT_EQ(ab.IntAt(2), min);  // abs(INT_MIN) wraps to itself, as XLA's.
  EXPECT_EQ(Unary(OpKind::kSqrt, x).dtype(), DType::kF32);
}

TEST(ConvertTest, FloatToIntTruncatesAndSaturates) {
  Array got = ConvertElementType(F32({2.7f, -2.7f, 1e10f, -1e10f, std::nanf("")}), DType::kI32);
  ASSERT_EQ(got.dtype(), DType::kI32);
  EXPECT_EQ(got.IntAt(0), 2);
  EXPECT_EQ(got.IntAt(1), -2);
  EXPECT_EQ(got.IntAt(2), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(got.IntAt(3), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(got.IntAt(4), 0);
}

TEST(ConvertTest, RoundsToNarrowerTypes) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
  Array bf = ConvertElementType(F32({1.00390625f, 1.01171875f}), DType::kBF16);
  EXPECT_EQ(bf.dtype(), DType::kBF16);
  EXPECT_EQ(bf.at(0), 1.0f);
  EXPECT_EQ(bf.at(1), 1.015625f);
  // 2^24 + 1 is not a float32: it rounds to 2^24.
  Array f = ConvertElementType(Array::FromInts({1}, {16777217}), DType::kF32);
  EXPECT_EQ(f.at(0), 16777216.0f);
}

// custom_call costs what it states on the roofline, and a program of the new ops passes its
// numerics check end to end (simulated against the reference, with their error bounds).
TEST(CustomCallTest, PricedByItsStatedCostAndZeros) {
  Machine machine(BuildPreset("tpu-v5e", {2, 1}));
  ProgramBuilder b({{"dp", 2}});
  InitSpec normal;
  normal.kind = InitSpec::Kind::kNormal;
  b.Input("x", {64, 128}, DType::kF32, PartitionSpec{{{"dp"}}}, normal);
  OpSpec call;
  call.kind = OpKind::kCustomCall;
  call.in = {"x"};
  call.out = {"k"};
  call.shape = {32, 16};
  call.dtype = "bf16";
  call.flops = 1e12;
  call.bytes = 1e9;
  b.Add(call);
  std::string y = b.Unary(OpKind::kSilu, b.Unary(OpKind::kSquare, "x"));
  OpSpec cast;
  cast.kind = OpKind::kConvert;
  cast.in = {y};
  cast.out = {"yb"};
  cast.dtype = "bf16";
  b.Add(cast);
  b.Output("yb", PartitionSpec{{{"dp"}}});
  b.Output("k", PartitionSpec{{{"dp"}}});
  ProgramSpec program = std::move(b).Build();
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = true;
  RunResult r = RunProgram(machine, mesh, program, config);
  Time want = machine.compute_model()->OpTime(OpKind::kCustomCall, OpCost{1e12, 1e9}, DType::kBF16);
  EXPECT_EQ(r.ops[0].end - r.ops[0].start, want);
  EXPECT_EQ(r.outputs.at("k").dtype(), DType::kBF16);
  EXPECT_EQ(r.outputs.at("k").shape(), (Shape{64, 16}));
  for (int64_t i = 0; i < r.outputs.at("k").size(); ++i) EXPECT_EQ(r.outputs.at("k").at(i), 0);
  NumericsReport check = CheckNumerics(r.outputs, mesh, program, "", &r.inputs);
  EXPECT_TRUE(check.passed) << check.max_abs_error << " " << check.worst_output;
}

}  // namespace
}  // namespace shardsim
