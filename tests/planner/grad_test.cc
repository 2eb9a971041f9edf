// Reverse mode over global programs (planner/grad.h): every transpose rule against central
// differences, the structure of what is emitted (only needed ops, accumulation, zeros, dtypes,
// shardings, renamed rebindings) and the errors.
#include "planner/grad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "collectives/init.h"
#include "collectives/ir/program_builder.h"
#include "collectives/local_op.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// Every value of a global program (grad ops expanded first), evaluated op by op on whole
// arrays; the sharding ops and device_put pass their input on.
std::map<std::string, Array> Evaluate(const ProgramSpec& program) {
  const ProgramSpec expanded = ExpandGrads(program);
  std::map<std::string, Array> env;
  for (const ArraySpec& a : expanded.arrays) env[a.name] = MakeInitialArray(a, true, "");
  static const Mesh kOnePosition({}, {0});
  for (const OpSpec& op : expanded.ops) {
    std::vector<const Array*> in;
    for (const std::string& name : op.in) in.push_back(&env.at(name));
    std::vector<Array> out;
    if (op.kind == OpKind::kShardingConstraint || op.kind == OpKind::kReshard ||
        op.kind == OpKind::kDevicePut) {
      out.push_back(*in.at(0));
    } else {
      out = ApplyLocalOp(op, in, kOnePosition, 0);
    }
    for (size_t i = 0; i < op.out.size(); ++i) env[op.out[i]] = std::move(out.at(i));
  }
  return env;
}

// Builds a global program on a mesh {d: 2} from literal arrays.
class Program {
 public:
  Program() : b_({{"d", 2}}, {}, ProgramMode::kAuto) {}
  // An input of literal `values` (f32 unless `dtype`), sharded as `spec`.
  std::string In(const std::string& name, Shape shape, std::vector<float> values,
                 DType dtype = DType::kF32, PartitionSpec spec = {}) {
    ArraySpec a;
    a.name = name;
    a.shape = std::move(shape);
    a.dtype = dtype;
    a.init.kind = InitSpec::Kind::kValue;
    a.init.values.assign(values.begin(), values.end());
    a.sharding = std::move(spec);
    return b_.Input(std::move(a));
  }
  // An f32 input of standard normal values (seeded by its name), each mapped through `map`.
  std::string Normal(const std::string& name, Shape shape,
                     const std::function<float(float)>& map = {}) {
    ArraySpec a;
    a.name = name;
    a.shape = shape;
    a.init.kind = InitSpec::Kind::kNormal;
    a.init.seed = std::hash<std::string>{}(name) % 1000;
    std::vector<float> values = MakeInitialArray(a, true, "").values();
    if (map) {
      for (float& v : values) v = map(v);
    }
    return In(name, std::move(shape), std::move(values));
  }
  // An op of `kind` on `in` with attributes set in `attrs`; returns its first output.
  std::string Op(OpKind kind, std::vector<std::string> in, OpSpec attrs = {},
                 std::vector<std::string> out = {}) {
    attrs.kind = kind;
    attrs.in = std::move(in);
    attrs.out = std::move(out);
    return b_.Add(std::move(attrs));
  }
  ProgramBuilder& builder() { return b_; }
  const ProgramSpec& program() const { return b_.program(); }

 private:
  ProgramBuilder b_;
};

OpSpec Attrs(const std::function<void(OpSpec&)>& set) {
  OpSpec op;
  set(op);
  return op;
}

OpSpec WithScalar(double s) {
  return Attrs([&](OpSpec& op) { op.scalar = s; });
}

OpSpec WithSpec(const std::string& spec) {
  return Attrs([&](OpSpec& op) { op.spec = spec; });
}

// |v| pushed to at least `m` (keeps inputs away from kinks and poles).
std::function<float(float)> AwayFromZero(float m) {
  return [m](float v) { return v < 0 ? v - m : v + m; };
}

// The spec splitting dimension `dim` over the mesh axis d (P() for dim -1).
PartitionSpec Over(int dim) {
  PartitionSpec spec;
  if (dim >= 0) {
    spec.dims.resize(static_cast<size_t>(dim) + 1);
    spec.dims[static_cast<size_t>(dim)] = {"d"};
  }
  return spec;
}

// A shard_map region on the mesh {d: 2} reading `in`, each laid out by its entry of `in_specs`
// (dimension split over d, or -1: replicated): `body` writes its ops on the body's arrays (named
// as the inputs) and returns its output, which leaves by `out_spec`. Returns the region's result.
std::string Region(Program& p, const std::vector<std::string>& in, const std::vector<int>& in_specs,
                   const std::function<std::string(ProgramBuilder&)>& body, int out_spec) {
  const std::map<std::string, Array> values = Evaluate(p.program());
  ProgramBuilder b({{"d", 2}});
  for (size_t i = 0; i < in.size(); ++i) {
    const Array& a = values.at(in[i]);
    b.Input(in[i], a.shape(), a.dtype(), Over(in_specs[i]));
  }
  b.Output(body(b), Over(out_spec));
  return p.builder().ShardMap(in, std::move(b).Build()).at(0);
}

// A collective of `kind` over d on `x` with the attributes set in `attrs`.
std::string OverD(ProgramBuilder& b, OpKind kind, const std::string& x, OpSpec attrs = {}) {
  attrs.kind = kind;
  attrs.in = {x};
  attrs.axis_name = {"d"};
  return b.Add(std::move(attrs));
}

// One finite-difference case: `build` declares inputs and forward ops and returns the value y
// the loss reads; the loss is sum(y * probe) for a random probe of y's shape (so every element
// of y gets its own cotangent), differentiated with respect to `wrt`.
struct FdCase {
  std::string name;
  std::function<std::string(Program&)> build;
  std::vector<std::string> wrt;
  double h = 1e-2;  // The step; larger where the function is piecewise constant in f32.
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

// sum(y * probe) over every element, as an einsum.
std::string AddLoss(Program& p, const std::string& y) {
  const Shape shape = Evaluate(p.program()).at(y).shape();
  const std::string letters = std::string("abcdefgh").substr(0, shape.size());
  p.Normal("probe", shape);
  return p.Op(OpKind::kEinsum, {y, "probe"}, WithSpec(letters + "," + letters + "->"), {"loss"});
}

// The loss of `program` (its value "loss") with input `name`'s element j moved by `delta`.
double LossAt(ProgramSpec program, const std::string& name, size_t j, double delta) {
  for (ArraySpec& a : program.arrays) {
    if (a.name == name) a.init.values.at(j) += delta;
  }
  return Evaluate(program).at("loss").at(0);
}

class FiniteDifferenceTest : public testing::TestWithParam<FdCase> {};

// Central differences (L(w + h e_j) - L(w - h e_j)) / 2h of the f32 program against each
// gradient element. With inputs of order 1 and h = 1e-2 the truncation error h^2 |L'''| / 6 is
// below 2e-5 per unit third derivative; the loss is an f32 sum of at most 48 products of order
// 1, whose rounding (~1e-6 absolute) over 2h adds ~1e-4. The norms, curved by 1 / var, take
// h = 3e-3. Measured, |g - fd| / (1 + |fd|) stays below 1e-4 for every single rule, 3e-4
// through f16 (its rounding over 2h = 0.5) and 6e-4 for the grad of a grad (exp's third
// derivative). The tolerance, 2e-3 (1 + |fd|), sits above all of these and far below what a
// wrong rule gives (a missing term, sign, factor or transposition moves elements by O(|g|)).
// Ties and kinks, where central differences mean nothing, are kept out of the data and tested
// on the kernels (grad_ops_test.cc).
TEST_P(FiniteDifferenceTest, GradientMatchesCentralDifferences) {
  const FdCase& c = GetParam();
  Program p;
  const std::string y = c.build(p);
  const std::string loss = AddLoss(p, y);
  std::vector<std::string> outs;
  for (const std::string& w : c.wrt) outs.push_back("g_" + w);
  p.builder().Grad(loss, c.wrt, outs);
  const ProgramSpec program = p.program();
  // The expanded program is a valid global program: it builds again op by op.
  const ProgramSpec expanded = ExpandGrads(program);
  ProgramBuilder again(expanded.mesh_axes, {}, expanded.mode);
  for (const ArraySpec& a : expanded.arrays) again.Input(a);
  for (const OpSpec& op : expanded.ops) EXPECT_NO_THROW(again.Add(op)) << op.name;
  const std::map<std::string, Array> values = Evaluate(program);
  for (size_t i = 0; i < c.wrt.size(); ++i) {
    const Array& w = values.at(c.wrt[i]);
    const Array& g = values.at(outs[i]);
    ASSERT_EQ(g.shape(), w.shape()) << c.wrt[i];
    ASSERT_EQ(g.dtype(), w.dtype()) << c.wrt[i];
    for (int64_t j = 0; j < w.size(); ++j) {
      const double fd = (LossAt(program, c.wrt[i], static_cast<size_t>(j), c.h) -
                         LossAt(program, c.wrt[i], static_cast<size_t>(j), -c.h)) /
                        (2 * c.h);
      EXPECT_NEAR(g.at(j), fd, 2e-3 * (1 + std::fabs(fd))) << c.wrt[i] << " element " << j;
    }
  }
}

// A unary op on a (mapped) normal input.
FdCase UnaryCase(OpKind kind, std::function<float(float)> map = {}) {
  return FdCase{OpKindName(kind),
                [=](Program& p) {
                  return p.Op(kind, {p.Normal("a", {2, 3}, map)});
                },
                {"a"}};
}

std::vector<FdCase> Cases() {
  std::vector<FdCase> cases = {
      {"Add",
       [](Program& p) {
         return p.Op(OpKind::kAdd, {p.Normal("a", {2, 3}), p.Normal("b", {2, 3})});
       },
       {"a", "b"}},
      {"AddScalar",
       [](Program& p) {
         return p.Op(OpKind::kAdd, {p.Normal("a", {2, 3})}, WithScalar(2));
       },
       {"a"}},
      {"Sub",
       [](Program& p) {
         return p.Op(OpKind::kSub, {p.Normal("a", {2, 3}), p.Normal("b", {2, 3})});
       },
       {"a", "b"}},
      {"SubScalar",
       [](Program& p) { return p.Op(OpKind::kSub, {p.Normal("a", {3})}, WithScalar(-1)); },
       {"a"}},
      {"Mul",
       [](Program& p) {
         return p.Op(OpKind::kMul, {p.Normal("a", {2, 3}), p.Normal("b", {2, 3})});
       },
       {"a", "b"}},
      {"MulScalar",
       [](Program& p) {
         return p.Op(OpKind::kMul, {p.Normal("a", {2, 3})}, WithScalar(-1.5));
       },
       {"a"}},
      {"Div",
       [](Program& p) {
         return p.Op(OpKind::kDiv,
                     {p.Normal("a", {2, 3}), p.Normal("b", {2, 3}, AwayFromZero(0.7f))});
       },
       {"a", "b"}},
      {"DivScalar",
       [](Program& p) { return p.Op(OpKind::kDiv, {p.Normal("a", {4})}, WithScalar(0.5)); },
       {"a"}},
      {"Max",
       [](Program& p) {
         const std::string a = p.Normal("a", {2, 3});
         // b = a + an offset of at least 0.2 either way: no ties within h.
         return p.Op(OpKind::kMax,
                     {a, p.Op(OpKind::kAdd, {a, p.Normal("off", {2, 3}, AwayFromZero(0.2f))})});
       },
       {"a", "off"}},
      {"MaxScalar",
       [](Program& p) {
         return p.Op(
             OpKind::kMax,
             {p.Normal("a", {2, 3}, [](float v) { return v < 0.3f ? v - 0.2f : v + 0.2f; })},
             WithScalar(0.3));
       },
       {"a"}},
      {"MulFanOut",  // The same value twice: both cotangents accumulate.
       [](Program& p) {
         const std::string a = p.Normal("a", {2, 3});
         return p.Op(OpKind::kMul, {a, a});
       },
       {"a"}},
      {"BranchesFanOut",
       [](Program& p) {
         const std::string a = p.Normal("a", {2, 3});
         return p.Op(OpKind::kAdd, {p.Op(OpKind::kTanh, {a}), p.Op(OpKind::kExp, {a})});
       },
       {"a"}},
      UnaryCase(OpKind::kRelu, AwayFromZero(0.1f)),
      UnaryCase(OpKind::kGelu),
      UnaryCase(OpKind::kSilu),
      UnaryCase(OpKind::kExp),
      UnaryCase(OpKind::kLog, [](float v) { return std::fabs(v) + 0.5f; }),
      UnaryCase(OpKind::kTanh),
      UnaryCase(OpKind::kNeg),
      UnaryCase(OpKind::kSqrt, [](float v) { return std::fabs(v) + 0.5f; }),
      UnaryCase(OpKind::kRsqrt, [](float v) { return std::fabs(v) + 0.5f; }),
      UnaryCase(OpKind::kSquare),
      UnaryCase(OpKind::kAbs, AwayFromZero(0.1f)),
      UnaryCase(OpKind::kSin),
      UnaryCase(OpKind::kCos),
      // Through f16 and back: linear, so only f16 rounding (2^-11 relative) over 2h = 0.5.
      {"ConvertRoundTrip",
       [](Program& p) {
         OpSpec half, back;
         half.dtype = "f16";
         back.dtype = "f32";
         return p.Op(OpKind::kConvert, {p.Op(OpKind::kConvert, {p.Normal("a", {2, 3})}, half)},
                     back);
       },
       {"a"},
       0.25},
      {"Reshape",
       [](Program& p) {
         return p.Op(OpKind::kReshape, {p.Normal("a", {2, 3})}, Attrs([](OpSpec& op) {
                       op.shape = {3, 1, 2};
                     }));
       },
       {"a"}},
      {"Transpose",
       [](Program& p) {
         return p.Op(OpKind::kTranspose, {p.Normal("a", {2, 3, 4})}, Attrs([](OpSpec& op) {
                       op.axes = {2, 0, -2};
                     }));
       },
       {"a"}},
      {"TransposeReversed",
       [](Program& p) {
         return p.Op(OpKind::kTranspose, {p.Normal("a", {2, 3, 4})});
       },
       {"a"}},
      {"Concatenate",
       [](Program& p) {
         return p.Op(OpKind::kConcatenate,
                     {p.Normal("a", {2, 1}), p.Normal("b", {2, 3}), p.Normal("c", {2, 2})},
                     Attrs([](OpSpec& op) { op.axis = -1; }));
       },
       {"a", "c"}},
      {"SplitWithUnusedPart",
       [](Program& p) {
         OpSpec split;
         split.sections = 3;
         split.axis = 1;
         p.Op(OpKind::kSplit, {p.Normal("a", {2, 6})}, split, {"s0", "s1", "s2"});
         return p.Op(OpKind::kMul, {"s0", "s2"});
       },
       {"a"}},
      {"Slice",
       [](Program& p) {
         return p.Op(OpKind::kSlice, {p.Normal("a", {3, 5})}, Attrs([](OpSpec& op) {
                       op.start = 1;  // Pads 1 before and 2 after.
                       op.size = 2;
                       op.axis = 1;
                     }));
       },
       {"a"}},
      {"Pad",
       [](Program& p) {
         return p.Op(OpKind::kPad, {p.Normal("a", {3, 2})}, Attrs([](OpSpec& op) {
                       op.low = 2;
                       op.high = 1;
                     }));
       },
       {"a"}},
      {"FullLikeIsConstant",
       [](Program& p) {
         const std::string a = p.Normal("a", {3});
         OpSpec fill;
         fill.fill_value = 2;
         return p.Op(OpKind::kMul, {a, p.Op(OpKind::kFullLike, {a}, fill)});
       },
       {"a"}},
      {"Matmul",
       [](Program& p) {
         return p.Op(OpKind::kMatmul, {p.Normal("a", {2, 3}), p.Normal("b", {3, 4})});
       },
       {"a", "b"}},
      {"MatmulBatchedTimesMatrix",
       [](Program& p) {
         return p.Op(OpKind::kMatmul, {p.Normal("a", {2, 2, 3}), p.Normal("b", {3, 2})});
       },
       {"a", "b"}},
      {"MatmulBroadcastBatch",  // a's batch of 1 broadcasts against b's 2.
       [](Program& p) {
         return p.Op(OpKind::kMatmul, {p.Normal("a", {1, 2, 3}), p.Normal("b", {2, 3, 2})});
       },
       {"a", "b"}},
      {"MatmulVectors",
       [](Program& p) {
         const std::string v = p.Op(OpKind::kMatmul, {p.Normal("a", {3}), p.Normal("b", {3, 4})});
         return p.Op(OpKind::kMatmul, {p.Normal("c", {2, 4}), v});
       },
       {"a", "b", "c"}},
      {"Einsum",
       [](Program& p) {
         return p.Op(OpKind::kEinsum, {p.Normal("a", {2, 2, 3}), p.Normal("b", {2, 3, 2})},
                     WithSpec("bij,bjk->bik"));
       },
       {"a", "b"}},
      {"EinsumLoneLetters",  // a's j and b's q are summed away on their own.
       [](Program& p) {
         return p.Op(OpKind::kEinsum, {p.Normal("a", {2, 3, 4}), p.Normal("b", {4, 2, 2})},
                     WithSpec("ijk,kqn->in"));
       },
       {"a", "b"}},
      {"EinsumImplicit",
       [](Program& p) {
         return p.Op(OpKind::kEinsum, {p.Normal("a", {2, 3}), p.Normal("b", {3, 4})},
                     WithSpec("ij, jk"));
       },
       {"a", "b"}},
      {"ShardingConstraintAndReshard",
       [](Program& p) {
         OpSpec constraint;
         constraint.sharding = PartitionSpec{{{"d"}}};
         const std::string t = p.Op(OpKind::kTanh, {p.Normal("a", {4, 3})});
         return p.Op(OpKind::kReshard, {p.Op(OpKind::kShardingConstraint, {t}, constraint)},
                     constraint);
       },
       {"a"}},
      {"AddBroadcastRow",  // b [3] broadcasts over a's rows: its cotangent sums them.
       [](Program& p) {
         return p.Op(OpKind::kAdd, {p.Normal("a", {2, 3}), p.Normal("b", {3})});
       },
       {"a", "b"}},
      {"MulOuterBroadcast",  // [2, 1] * [1, 3]: each side sums over the other's axis.
       [](Program& p) {
         return p.Op(OpKind::kMul, {p.Normal("a", {2, 1}), p.Normal("b", {1, 3})});
       },
       {"a", "b"}},
      {"DivByRank0",
       [](Program& p) {
         return p.Op(OpKind::kDiv, {p.Normal("a", {2, 3}), p.Normal("b", {}, AwayFromZero(0.7f))});
       },
       {"a", "b"}},
      {"SubBroadcastLeading",
       [](Program& p) {
         return p.Op(OpKind::kSub, {p.Normal("a", {4}), p.Normal("b", {2, 3, 4})});
       },
       {"a", "b"}},
      {"MaxBroadcast",  // a = b + off, off away from 0: no ties within h.
       [](Program& p) {
         const std::string b = p.Normal("b", {3});
         const std::string a = p.Op(OpKind::kAdd, {b, p.Normal("off", {2, 3}, AwayFromZero(0.2f))});
         return p.Op(OpKind::kMax, {a, b});
       },
       {"b", "off"}},
      {"BroadcastInDim",
       [](Program& p) {
         return p.Op(OpKind::kBroadcastInDim, {p.Normal("a", {3, 1})}, Attrs([](OpSpec& op) {
                       op.shape = {2, 3, 4};
                       op.broadcast_dimensions = {1, 2};
                     }));
       },
       {"a"}},
      {"SumAxis",
       [](Program& p) {
         return p.Op(OpKind::kSum, {p.Normal("a", {2, 3, 2})},
                     Attrs([](OpSpec& op) { op.axes = {-2}; }));
       },
       {"a"}},
      {"SumKeepdims",
       [](Program& p) {
         return p.Op(OpKind::kSum, {p.Normal("a", {2, 3, 2})}, Attrs([](OpSpec& op) {
                       op.axes = {0, 2};
                       op.keepdims = true;
                     }));
       },
       {"a"}},
      {"SumAll",
       [](Program& p) {
         return p.Op(OpKind::kSum, {p.Normal("a", {2, 3})},
                     Attrs([](OpSpec& op) { op.keepdims = true; }));
       },
       {"a"}},
      {"CumsumLastAxis",
       [](Program& p) {
         return p.Op(OpKind::kCumsum, {p.Normal("a", {2, 4})});
       },
       {"a"}},
      {"CumsumAxis0",
       [](Program& p) {
         return p.Op(OpKind::kCumsum, {p.Normal("a", {3, 2})},
                     Attrs([](OpSpec& op) { op.norm_axis = 0; }));
       },
       {"a"}},
      {"CumsumReverse",
       [](Program& p) {
         return p.Op(OpKind::kCumsum, {p.Normal("a", {2, 4})},
                     Attrs([](OpSpec& op) { op.reverse = true; }));
       },
       {"a"}},
      {"Mean",
       [](Program& p) {
         return p.Op(OpKind::kMean, {p.Normal("a", {2, 3, 2})},
                     Attrs([](OpSpec& op) { op.axes = {1}; }));
       },
       {"a"}},
      {"ReduceMax",  // Distinct values 0.3 apart: no tie within h.
       [](Program& p) {
         const std::string a = p.In("a", {2, 3}, {0.3f, -0.9f, 1.2f, 0.0f, 0.6f, -0.3f});
         return p.Op(OpKind::kReduceMax, {a}, Attrs([](OpSpec& op) { op.axes = {1}; }));
       },
       {"a"}},
      {"ReduceMaxAllKeepdims",
       [](Program& p) {
         const std::string a = p.In("a", {2, 2}, {0.3f, -0.9f, 1.2f, 0.0f});
         return p.Op(OpKind::kReduceMax, {a}, Attrs([](OpSpec& op) { op.keepdims = true; }));
       },
       {"a"}},
      {"Softmax",
       [](Program& p) {
         return p.Op(OpKind::kSoftmax, {p.Normal("a", {2, 4})});
       },
       {"a"}},
      {"SoftmaxAxis0",
       [](Program& p) {
         return p.Op(OpKind::kSoftmax, {p.Normal("a", {3, 2})},
                     Attrs([](OpSpec& op) { op.norm_axis = 0; }));
       },
       {"a"}},
      {"LogSoftmax",
       [](Program& p) {
         return p.Op(OpKind::kLogSoftmax, {p.Normal("a", {2, 4})});
       },
       {"a"}},
      {"RmsNorm",
       [](Program& p) {
         return p.Op(OpKind::kRmsNorm, {p.Normal("x", {2, 4}), p.Normal("s", {4})});
       },
       {"x", "s"},
       3e-3},
      {"RmsNormAxis0Eps",
       [](Program& p) {
         return p.Op(OpKind::kRmsNorm, {p.Normal("x", {3, 2}), p.Normal("s", {3})},
                     Attrs([](OpSpec& op) {
                       op.norm_axis = 0;
                       op.eps = 0.1;
                     }));
       },
       {"x", "s"},
       3e-3},
      {"LayerNorm",
       [](Program& p) {
         return p.Op(OpKind::kLayerNorm, {p.Normal("x", {2, 4}), p.Normal("s", {4})});
       },
       {"x", "s"},
       3e-3},
      {"LayerNormXOnly",
       [](Program& p) {
         return p.Op(OpKind::kLayerNorm, {p.Normal("x", {3, 3}), p.Normal("s", {3})});
       },
       {"x"},
       3e-3},
      {"Take",  // Row 1 taken twice (its cotangents add), -1 counts from the end.
       [](Program& p) {
         const std::string ids = p.In("ids", {2, 2}, {1, 3, -1, 1}, DType::kI32);
         return p.Op(OpKind::kTake, {p.Normal("table", {4, 3}), ids});
       },
       {"table"}},
      {"RaggedDot",  // Groups of 2, 0 and 3 rows of 6: row 5 is past them (no gradient).
       [](Program& p) {
         const std::string sizes = p.In("sizes", {3}, {2, 0, 3}, DType::kI32);
         return p.Op(OpKind::kRaggedDot,
                     {p.Normal("lhs", {6, 3}), p.Normal("rhs", {3, 3, 2}), sizes});
       },
       {"lhs", "rhs"}},
      {"TakeAxis1",
       [](Program& p) {
         const std::string ids = p.In("ids", {3}, {2, 0, 2}, DType::kI32);
         return p.Op(OpKind::kTake, {p.Normal("table", {2, 3, 2}), ids},
                     Attrs([](OpSpec& op) { op.axis = 1; }));
       },
       {"table"}},
      {"RepeatAxis1",  // Column 0 copied twice (its cotangents add), 1 none, 2 past the sum.
       [](Program& p) {
         const std::string repeats = p.In("repeats", {3}, {2, 0, 1}, DType::kI32);
         return p.Op(OpKind::kRepeat, {p.Normal("a", {2, 3}), repeats}, Attrs([](OpSpec& op) {
                       op.axis = 1;
                       op.total_repeat_length = 5;
                     }));
       },
       {"a"}},
      {"CrossEntropy",
       [](Program& p) {
         const std::string labels = p.In("labels", {2, 2}, {0, 3, -1, 2}, DType::kI32);
         return p.Op(OpKind::kCrossEntropy, {p.Normal("logits", {2, 2, 4}), labels});
       },
       {"logits"}},
      {"TopK",  // Distinct values 0.3 apart.
       [](Program& p) {
         const std::string x =
             p.In("x", {2, 4}, {0.3f, -0.9f, 1.2f, 0.0f, 0.6f, -0.3f, 0.9f, -0.6f});
         OpSpec top;
         top.k = 2;
         p.Op(OpKind::kTopK, {x}, top, {"values", "indices"});
         return p.Op(OpKind::kMul, {"values", "values"});
       },
       {"x"}},
      {"AttentionCausalGrouped",  // 4 query heads on 2 kv heads, T = 3 < S = 4.
       [](Program& p) {
         return p.Op(OpKind::kAttention, {p.Normal("q", {1, 3, 4, 2}), p.Normal("k", {1, 4, 2, 2}),
                                          p.Normal("v", {1, 4, 2, 2})});
       },
       {"q", "k", "v"}},
      {"AttentionFull",
       [](Program& p) {
         OpSpec full;
         full.causal = false;
         return p.Op(OpKind::kAttention,
                     {p.Normal("q", {2, 2, 1, 3}), p.Normal("k", {2, 3, 1, 3}),
                      p.Normal("v", {2, 3, 1, 3})},
                     full);
       },
       {"q", "k", "v"}},
      {"Mlp",
       [](Program& p) {
         const std::string h =
             p.Op(OpKind::kGelu,
                  {p.Op(OpKind::kMatmul, {p.Normal("x", {4, 3}), p.Normal("w1", {3, 5})})});
         return p.Op(OpKind::kMatmul, {h, p.Normal("w2", {5, 2})});
       },
       {"w1", "w2", "x"}},
      // shard_map regions (mesh {d: 2}): the body's reverse mode with its collectives'
      // adjoints, replicated inputs' cotangents psummed, replicated outputs' shared.
      {"RegionReplicatedWeight",  // w is read by both devices: its gradient sums both.
       [](Program& p) {
         p.Normal("x", {4, 3});
         p.Normal("w", {3, 2});
         return Region(
             p, {"x", "w"}, {0, -1},
             [](ProgramBuilder& b) { return b.Unary(OpKind::kTanh, b.Matmul("x", "w")); }, 0);
       },
       {"x", "w"}},
      {"RegionPsumReplicatedResult",  // Partial products psummed; the result leaves once.
       [](Program& p) {
         p.Normal("x", {2, 4});
         p.Normal("w", {4, 3});
         return Region(
             p, {"x", "w"}, {1, 0},
             [](ProgramBuilder& b) {
               return b.Unary(OpKind::kTanh, OverD(b, OpKind::kPsum, b.Matmul("x", "w")));
             },
             -1);
       },
       {"x", "w"}},
      {"RegionPmean",
       [](Program& p) {
         p.Normal("x", {4, 3});
         return Region(
             p, {"x"}, {0},
             [](ProgramBuilder& b) {
               return b.Unary(OpKind::kSin, OverD(b, OpKind::kPmean, b.Unary(OpKind::kExp, "x")));
             },
             -1);
       },
       {"x"}},
      {"RegionAllGather",
       [](Program& p) {
         p.Normal("x", {4, 3});
         return Region(
             p, {"x"}, {0},
             [](ProgramBuilder& b) {
               const std::string g = b.AllGather("x", {"d"}, 1, /*tiled=*/true);
               return b.Binary(OpKind::kMul, g, g);
             },
             -1);
       },
       {"x"}},
      {"RegionAllGatherUntiled",
       [](Program& p) {
         p.Normal("x", {4, 3});
         return Region(
             p, {"x"}, {0},
             [](ProgramBuilder& b) {
               return b.Unary(OpKind::kExp, b.AllGather("x", {"d"}, 0, /*tiled=*/false));
             },
             -1);
       },
       {"x"}},
      {"RegionPsumScatter",  // A replicated input reduce-scattered: each copy feeds one block.
       [](Program& p) {
         p.Normal("x", {4, 3});
         p.Normal("v", {4, 3});
         return Region(
             p, {"x", "v"}, {-1, 0},
             [](ProgramBuilder& b) {
               const std::string m = b.Binary(OpKind::kMul, "x", "x");
               return b.Binary(OpKind::kMul, b.PsumScatter(m, {"d"}, 0, /*tiled=*/true), "v");
             },
             0);
       },
       {"x", "v"}},
      {"RegionPsumScatterUntiled",
       [](Program& p) {
         p.Normal("x", {2, 3});
         return Region(
             p, {"x"}, {-1},
             [](ProgramBuilder& b) {
               return b.Unary(OpKind::kSin,
                              b.PsumScatter(b.Unary(OpKind::kExp, "x"), {"d"}, 0, false));
             },
             0);
       },
       {"x"}},
      {"RegionAllToAll",
       [](Program& p) {
         p.Normal("x", {4, 6});
         p.Normal("v", {4, 6});
         return Region(
             p, {"x", "v"}, {0, 1},
             [](ProgramBuilder& b) {
               const std::string t = b.AllToAll("x", {"d"}, 1, 0, /*tiled=*/true);
               return b.Binary(OpKind::kMul, b.Unary(OpKind::kTanh, t), "v");
             },
             1);
       },
       {"x", "v"}},
      {"RegionPpermute",  // The blocks swap devices; each meets the other's v.
       [](Program& p) {
         p.Normal("x", {4, 3});
         p.Normal("v", {4, 3});
         return Region(
             p, {"x", "v"}, {0, 0},
             [](ProgramBuilder& b) {
               return b.Binary(OpKind::kMul, b.Unary(OpKind::kExp, b.Ppermute("x", {"d"}, 1)), "v");
             },
             0);
       },
       {"x", "v"}},
      {"RegionPpermutePairs",  // Device 1's block to device 0; device 1 receives zeros.
       [](Program& p) {
         p.Normal("x", {4, 3});
         return Region(
             p, {"x"}, {0},
             [](ProgramBuilder& b) {
               OpSpec perm;
               perm.perm = {{1, 0}};
               const std::string moved = OverD(b, OpKind::kPpermute, "x", perm);
               return b.Binary(OpKind::kMul, moved, b.Unary(OpKind::kSin, "x"));
             },
             0);
       },
       {"x"}},
      {"RegionMaxScalar",  // max's rule wants a scalar constant: the region takes one in.
       [](Program& p) {
         p.Normal("x", {4, 3}, AwayFromZero(0.5f));
         return Region(
             p, {"x"}, {0},
             [](ProgramBuilder& b) {
               OpSpec max;
               max.kind = OpKind::kMax;
               max.in = {"x"};
               max.scalar = 0.25;
               return b.Binary(OpKind::kMul, b.Add(std::move(max)), "x");
             },
             0);
       },
       {"x"}},
      {"RegionSameCotangentTwice",  // Both inputs take the sum's cotangent: two results.
       [](Program& p) {
         p.Normal("x", {4, 3});
         p.Normal("w", {4, 3});
         return Region(
             p, {"x", "w"}, {0, 0},
             [](ProgramBuilder& b) {
               return b.Unary(OpKind::kTanh, b.Binary(OpKind::kAdd, "x", "w"));
             },
             0);
       },
       {"x", "w"}},
      {"RegionSeedPassedThrough",  // The seed itself is both inputs' cotangent.
       [](Program& p) {
         p.Normal("x", {4, 3});
         p.Normal("w", {4, 3});
         return Region(
             p, {"x", "w"}, {0, 0},
             [](ProgramBuilder& b) { return b.Binary(OpKind::kAdd, "x", "w"); }, 0);
       },
       {"x", "w"}},
      {"RegionRebindsNames",  // m bound twice, the input x rebound: read as single assignment.
       [](Program& p) {
         p.Normal("x", {4, 3});
         return Region(
             p, {"x"}, {0},
             [](ProgramBuilder& b) {
               b.Unary(OpKind::kSin, "x", "m");
               b.Unary(OpKind::kExp, "m", "m");
               b.Binary(OpKind::kMul, "m", "x", "x");
               return b.Unary(OpKind::kTanh, "x", "y");
             },
             0);
       },
       {"x"}},
      {"RegionRaggedAllToAll",  // Device 0 sends a row to each device; device 1 both to 0.
       [](Program& p) {
         p.Normal("x", {4, 3});
         p.Normal("buffer", {8, 3});
         p.In("input_offsets", {4}, {0, 1, 0, 2}, DType::kI32, Over(0));
         p.In("send_sizes", {4}, {1, 1, 2, 0}, DType::kI32, Over(0));
         p.In("output_offsets", {4}, {0, 0, 1, 0}, DType::kI32, Over(0));
         p.In("recv_sizes", {4}, {1, 2, 1, 0}, DType::kI32, Over(0));
         return Region(
             p, {"x", "buffer", "input_offsets", "send_sizes", "output_offsets", "recv_sizes"},
             {0, 0, 0, 0, 0, 0},
             [](ProgramBuilder& b) {
               OpSpec op;
               op.kind = OpKind::kRaggedAllToAll;
               op.in = {b.Unary(OpKind::kExp, "x"), "buffer",    "input_offsets", "send_sizes",
                        "output_offsets",           "recv_sizes"};
               op.axis_name = {"d"};
               return b.Unary(OpKind::kTanh, b.Add(std::move(op)));
             },
             0);
       },
       {"x", "buffer"}},
      {"GradOfGrad",  // The forward part holds a grad: its expansion is differentiated again.
       [](Program& p) {
         const std::string y =
             p.Op(OpKind::kMatmul, {p.Normal("x", {3, 2}), p.Normal("w", {2, 2})});
         const std::string l =
             p.Op(OpKind::kEinsum, {p.Op(OpKind::kExp, {y}), p.Normal("r", {3, 2})},
                  WithSpec("ab,ab->"));
         p.builder().Grad(l, {"w"}, {"dw"});
         return p.Op(OpKind::kMul, {"dw", "dw"});
       },
       {"x"}},
  };
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Rules, FiniteDifferenceTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<FdCase>& info) {
                           return info.param.name;
                         });

// The kinds of the ops ExpandGrads put in place of the grad op (the ops after the first
// `forward` ones).
std::vector<OpKind> EmittedKinds(const ProgramSpec& expanded, size_t forward) {
  std::vector<OpKind> kinds;
  for (size_t i = forward; i < expanded.ops.size(); ++i) kinds.push_back(expanded.ops[i].kind);
  return kinds;
}

// cumsum's gradient is the reverse cumsum of the cotangent, summed as such: beside a large
// term the small ones survive (dx of sum(w * cumsum(x)) with w = [1e8, 1, 1, 1] is [1e8 + 3, 3,
// 2, 1]: f32 rounds the first to 1e8; the total minus the prefix sum gave [1e8, 1, 1, 1]).
TEST(GradStructureTest, CumsumGradientIsTheReverseCumsum) {
  Program p;
  const std::string c = p.Op(OpKind::kCumsum, {p.In("a", {4}, {1, 1, 1, 1})});
  const std::string m = p.Op(OpKind::kMul, {c, p.In("w", {4}, {1e8f, 1, 1, 1})});
  p.Op(OpKind::kSum, {m}, {}, {"loss"});
  p.builder().Grad("loss", {"a"}, {"da"});
  p.builder().Output("da", PartitionSpec{});
  const Array da = Evaluate(ExpandGrads(p.program())).at("da");
  EXPECT_EQ(da.ValueAt(0), 1e8);
  EXPECT_EQ(da.ValueAt(1), 3);
  EXPECT_EQ(da.ValueAt(2), 2);
  EXPECT_EQ(da.ValueAt(3), 1);
}

// x @ w and sum(y * r): with respect to w only, the seed, d_y (one einsum, r needs none) and
// dw (one einsum, no dx).
TEST(GradStructureTest, EmitsOnlyTheOpsTheGradientsNeed) {
  Program p;
  const std::string y = p.Op(OpKind::kMatmul, {p.Normal("x", {4, 3}), p.Normal("w", {3, 2})});
  p.Op(OpKind::kEinsum, {y, p.Normal("r", {4, 2})}, WithSpec("ab,ab->"), {"loss"});
  p.builder().Grad("loss", {"w"}, {"dw"});
  const ProgramSpec expanded = ExpandGrads(p.program());
  EXPECT_EQ(EmittedKinds(expanded, 2),
            (std::vector<OpKind>{OpKind::kFullLike, OpKind::kEinsum, OpKind::kEinsum}));
  EXPECT_EQ(expanded.ops[3].spec, ",ab->ab");        // d_y = 1 * r.
  EXPECT_EQ(expanded.ops.back().spec, "mn,mk->kn");  // dw = x^T d_y.
  EXPECT_EQ(expanded.ops.back().out, (std::vector<std::string>{"dw"}));
  EXPECT_EQ(expanded.ops.back().key, "program.2");  // Emitted ops blame the grad op.
  for (const OpSpec& op : expanded.ops) EXPECT_NE(op.kind, OpKind::kGrad);
}

TEST(GradStructureTest, FanOutAccumulatesWithAdd) {
  Program p;
  const std::string a = p.Normal("a", {3});
  const std::string y = p.Op(OpKind::kAdd, {p.Op(OpKind::kSin, {a}), p.Op(OpKind::kCos, {a})});
  p.Op(OpKind::kEinsum, {y, p.Normal("r", {3})}, WithSpec("a,a->"), {"loss"});
  p.builder().Grad("loss", {"a"}, {"da"});
  const ProgramSpec expanded = ExpandGrads(p.program());
  const OpSpec& last = expanded.ops.back();
  EXPECT_EQ(last.kind, OpKind::kAdd);
  EXPECT_EQ(last.out, (std::vector<std::string>{"da"}));
  const std::map<std::string, Array> v = Evaluate(p.program());
  for (int64_t i = 0; i < 3; ++i) {
    const double x = v.at("a").at(i), r = v.at("r").at(i);
    EXPECT_NEAR(v.at("da").at(i), r * (std::cos(x) - std::sin(x)), 1e-6);
  }
}

// As jax.grad: a value off every path to `of` gets zeros; a value named twice gets its gradient
// twice; `of` itself gets ones.
TEST(GradStructureTest, UnusedWrtGetsZerosRepeatsAndOfItself) {
  Program p;
  const std::string a = p.Normal("a", {3});
  p.Normal("z", {2, 2});
  p.Op(OpKind::kEinsum, {a, a}, WithSpec("i,i->"), {"loss"});
  p.builder().Grad("loss", {"z", "a", "a", "loss"}, {"dz", "da", "da2", "dloss"});
  const std::map<std::string, Array> v = Evaluate(p.program());
  ASSERT_EQ(v.at("dz").shape(), (Shape{2, 2}));
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(v.at("dz").at(i), 0.0f);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(v.at("da").at(i), 2 * v.at("a").at(i));
    EXPECT_EQ(v.at("da2").at(i), v.at("da").at(i));
  }
  EXPECT_EQ(v.at("dloss").at(0), 1.0f);
  const ProgramSpec expanded = ExpandGrads(p.program());
  int zeros = 0;
  for (const OpSpec& op : expanded.ops) {
    if (op.kind == OpKind::kFullLike && op.fill_value == 0.0) ++zeros;
  }
  EXPECT_EQ(zeros, 1);
}

// Cotangents take their primal's dtype: a bf16 weight read through a convert gets a bf16
// gradient, converted back by the convert's rule.
TEST(GradStructureTest, CotangentsFollowThePrimalDtype) {
  Program p;
  const std::string w = p.In("w", {2, 2}, {1, 2, 3, 4}, DType::kBF16);
  OpSpec up;
  up.dtype = "f32";
  const std::string y =
      p.Op(OpKind::kMatmul, {p.Normal("x", {3, 2}), p.Op(OpKind::kConvert, {w}, up)});
  p.Op(OpKind::kEinsum, {y, y}, WithSpec("ab,ab->"), {"loss"});
  p.builder().Grad("loss", {"w"}, {"dw"});
  const ProgramSpec expanded = ExpandGrads(p.program());
  const OpSpec& last = expanded.ops.back();
  EXPECT_EQ(last.kind, OpKind::kConvert);
  EXPECT_EQ(last.dtype, "bf16");
  EXPECT_EQ(Evaluate(p.program()).at("dw").dtype(), DType::kBF16);
}

// The backward pass of a sharding constraint constrains the cotangent the same way.
TEST(GradStructureTest, ShardingConstraintsCarryIntoTheBackwardPass) {
  Program p;
  OpSpec constraint;
  constraint.sharding = PartitionSpec{{{"d"}, {}}};
  const std::string h = p.Op(OpKind::kShardingConstraint, {p.Normal("a", {4, 2})}, constraint);
  p.Op(OpKind::kEinsum, {h, p.Normal("r", {4, 2})}, WithSpec("ab,ab->"), {"loss"});
  p.builder().Grad("loss", {"a"}, {"da"});
  const ProgramSpec expanded = ExpandGrads(p.program());
  const OpSpec& last = expanded.ops.back();
  EXPECT_EQ(last.kind, OpKind::kShardingConstraint);
  EXPECT_EQ(last.sharding, constraint.sharding);
  EXPECT_EQ(last.out, (std::vector<std::string>{"da"}));
}

// A rebound name: wrt names the binding current at the grad op, backward ops read the versions
// they mean, and outputs keep reading the last binding.
TEST(GradStructureTest, RebindingsAreRenamedApart) {
  Program p;
  const std::string x = p.Normal("x", {3});
  p.Op(OpKind::kTanh, {x}, {}, {"h"});
  p.Op(OpKind::kMul, {"h"}, WithScalar(2), {"x"});  // x rebound: 2 tanh(x).
  p.Op(OpKind::kMul, {"x", "x"}, {}, {"h"});        // h rebound: 4 tanh(x)^2.
  p.Op(OpKind::kEinsum, {"h", p.Normal("r", {3})}, WithSpec("a,a->"), {"loss"});
  p.builder().Grad("loss", {"x"}, {"dx"});
  p.builder().Output("h", {});
  p.builder().Output("dx", {});
  const ProgramSpec expanded = ExpandGrads(p.program());
  EXPECT_EQ(expanded.ops.front().kind, OpKind::kReshape);  // The array x's alias.
  EXPECT_EQ(expanded.ops.front().in, (std::vector<std::string>{"x"}));
  ProgramBuilder again(expanded.mesh_axes, {}, expanded.mode);
  for (const ArraySpec& a : expanded.arrays) again.Input(a);
  for (const OpSpec& op : expanded.ops) again.Add(op);
  for (const OutputSpec& o : expanded.outputs) EXPECT_NO_THROW(again.Output(o.name, o.spec));
  const std::map<std::string, Array> v = Evaluate(p.program());
  // The gradient with respect to the rebound x (2 tanh of the array): d(x^2 . r) = 2 x r.
  for (int64_t i = 0; i < 3; ++i) {
    const double x2 = 2 * std::tanh(static_cast<double>(v.at("x_2").at(i)));
    EXPECT_NEAR(v.at("dx").at(i), 2 * x2 * v.at("r").at(i), 1e-5);
    EXPECT_NEAR(v.at("h").at(i), x2 * x2, 1e-5);
  }
}

// Through a device_put between two meshes the cotangent goes back by a device_put of its own,
// `like` the primal (its mesh and layout, which the partitioner reads); rebuilt, it runs on the
// primal's mesh and the gradient lives on its parameter's. Values pass through unchanged (the
// loss sum(w * r) on mesh b of w moved from a: its gradient is r, exactly).
TEST(GradStructureTest, DevicePutSendsTheCotangentBackToThePrimalsMesh) {
  ProgramBuilder b({}, {}, ProgramMode::kAuto);
  b.Meshes({MeshSpec{"a", {{"x", 2}}, {0, 1}}, MeshSpec{"b", {{"y", 2}}, {2, 3}}});
  auto input = [&](const std::string& name, const std::string& mesh, std::vector<float> v) {
    ArraySpec a;
    a.name = name;
    a.shape = {4};
    a.mesh = mesh;
    a.init.kind = InitSpec::Kind::kValue;
    a.init.values.assign(v.begin(), v.end());
    b.Input(std::move(a));
  };
  input("w", "a", {1, 2, 3, 4});
  input("r", "b", {0.5, -1, 2, 0.25});
  OpSpec put;
  put.kind = OpKind::kDevicePut;
  put.in = {"w"};
  put.out = {"w_b"};
  put.mesh = "b";
  b.Add(put);
  OpSpec loss;
  loss.kind = OpKind::kEinsum;
  loss.in = {"w_b", "r"};
  loss.spec = "i,i->";
  loss.out = {"loss"};
  b.Add(loss);
  b.Grad("loss", {"w"}, {"dw"});
  const ProgramSpec expanded = ExpandGrads(b.program());
  const auto back = std::find_if(expanded.ops.begin(), expanded.ops.end(), [](const OpSpec& op) {
    return op.kind == OpKind::kDevicePut && !op.like.empty();
  });
  ASSERT_NE(back, expanded.ops.end());
  EXPECT_EQ(back->like, "w");
  ProgramBuilder again({}, {}, ProgramMode::kAuto);
  again.Meshes(expanded.meshes);
  for (const ArraySpec& a : expanded.arrays) again.Input(a);
  for (const OpSpec& op : expanded.ops) again.Add(op);
  for (const OpSpec& op : again.program().ops) {
    if (op.kind == OpKind::kDevicePut && !op.like.empty()) {
      EXPECT_EQ(op.mesh, "a");
    }
    if (std::find(op.out.begin(), op.out.end(), "dw") != op.out.end()) {
      EXPECT_EQ(op.mesh, "a");
    }
  }
  const std::map<std::string, Array> values = Evaluate(b.program());
  EXPECT_EQ(values.at("dw").values(), values.at("r").values());
}

TEST(GradStructureTest, ProgramsWithoutGradComeBackUnchanged) {
  Program p;
  p.Op(OpKind::kTanh, {p.Normal("a", {3})}, {}, {"a"});
  const ProgramSpec expanded = ExpandGrads(p.program());
  ASSERT_EQ(expanded.ops.size(), 1u);
  EXPECT_EQ(expanded.ops[0].out, (std::vector<std::string>{"a"}));
}

// The key and message ExpandGrads refuses `program` with.
std::pair<std::string, std::string> ExpandError(const ProgramSpec& program) {
  try {
    ExpandGrads(program);
  } catch (const SpecError& e) {
    return {e.key(), e.what()};
  }
  return {"", ""};
}

TEST(GradErrorTest, OfMustBeAFloatScalar) {
  Program p;
  const std::string y = p.Op(OpKind::kTanh, {p.Normal("a", {2, 2})});
  p.builder().Grad(y, {"a"});
  EXPECT_EQ(ExpandError(p.program()),
            (std::pair<std::string, std::string>{
                "program.1.of",
                "grad needs a float scalar of: (jax.grad's output), but 'v0' is f32[2,2]"}));
}

TEST(GradErrorTest, WrtMustBeFloat) {
  Program p;
  const std::string a = p.Normal("a", {2});
  p.In("n", {2}, {1, 2}, DType::kI32);
  p.Op(OpKind::kEinsum, {a, a}, WithSpec("i,i->"), {"loss"});
  p.builder().Grad("loss", {"a", "n"});
  EXPECT_EQ(ExpandError(p.program()).first, "program.1.wrt.1");
  EXPECT_NE(ExpandError(p.program()).second.find("'n' is i32[2]"), std::string::npos);
}

TEST(GradErrorTest, AnOpWithoutARuleOnThePathIsNamed) {
  Program p;
  OpSpec call;
  call.shape = {2};
  call.dtype = "f32";
  call.name = "kernel";
  const std::string k = p.Op(OpKind::kCustomCall, {p.Normal("a", {2})}, call);
  p.Op(OpKind::kEinsum, {k, k}, WithSpec("i,i->"), {"loss"});
  p.builder().Grad("loss", {"a"});
  EXPECT_EQ(ExpandError(p.program()),
            (std::pair<std::string, std::string>{
                "program.2",
                "grad: custom_call 'kernel' (program.0) lies on the path to 'loss' but has no "
                "derivative rule"}));
}

// The derivative ops have no rules of their own: a second derivative through unary_grad is
// refused, naming it.
TEST(GradErrorTest, SecondDerivativeThroughUnaryGradIsRefused) {
  Program p;
  const std::string a = p.Normal("a", {2});
  p.Op(OpKind::kEinsum, {p.Op(OpKind::kSin, {a}), a}, WithSpec("i,i->"), {"loss"});
  p.builder().Grad("loss", {"a"}, {"da"});
  p.Op(OpKind::kEinsum, {"da", "da"}, WithSpec("i,i->"), {"loss2"});
  p.builder().Grad("loss2", {"a"});
  const auto [key, message] = ExpandError(p.program());
  EXPECT_EQ(key, "program.4");
  EXPECT_NE(message.find("unary_grad"), std::string::npos) << message;
  EXPECT_NE(message.find("has no derivative rule"), std::string::npos) << message;
}

// A grad may not appear in a shard_map body: the builder refuses it, and so does ExpandGrads
// for a hand-made manual program.
TEST(GradErrorTest, ManualProgramsRefuseGrad) {
  ProgramBuilder manual({{"d", 2}});
  manual.Input("a", {2}, DType::kF32, {});
  try {
    manual.Grad("a", {"a"});
    ADD_FAILURE() << "built";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "program.0.op");
  }
  Program p;
  p.builder().Grad(p.Normal("a", {}), {"a"});
  ProgramSpec program = p.program();
  program.mode = ProgramMode::kManual;
  EXPECT_EQ(ExpandError(program).first, "program.0.op");
}

TEST(GradErrorTest, BuilderNamesUndefinedValuesAndCounts) {
  auto refusal = [&](OpSpec op) -> std::pair<std::string, std::string> {
    op.kind = OpKind::kGrad;
    try {
      Program q;
      q.Normal("a", {});
      q.builder().Add(op);
    } catch (const SpecError& e) {
      return {e.key(), e.what()};
    }
    return {"", ""};
  };
  OpSpec op;
  op.of = "loss";
  op.wrt = {"a"};
  EXPECT_EQ(refusal(op),
            (std::pair<std::string, std::string>{"program.0.of", "'loss' is not defined"}));
  op.of = "a";
  op.wrt = {"a", "b"};
  EXPECT_EQ(refusal(op),
            (std::pair<std::string, std::string>{"program.0.wrt", "'b' is not defined"}));
  op.wrt = {};
  EXPECT_EQ(refusal(op), (std::pair<std::string, std::string>{"program.0.wrt", "grad needs wrt"}));
  op.wrt = {"a"};
  op.out = {"g", "h"};
  EXPECT_EQ(refusal(op),
            (std::pair<std::string, std::string>{
                "program.0.out", "grad makes one output per wrt entry (1), got 2 names"}));
}

}  // namespace
}  // namespace shardsim::planner
