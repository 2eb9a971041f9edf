// The sharding rules of the array ops (reductions, softmax, norms, take, repeat, cross_entropy,
// top_k, attention) and of their derivative ops: each case partitions a global program (often with
// its grad) in auto mode on a 4x2 mesh {X: 4, Y: 2}, checks the sharded run against the
// unsharded program, and where stated the collectives inserted, derived by hand beside the
// case from the shapes and shardings.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "planner/partitioner.h"
#include "sim/spec_error.h"
#include "tests/planner/partition_test_support.h"

namespace shardsim::planner {
namespace {

// Builds global programs on {X: 4, Y: 2}.
class Global {
 public:
  explicit Global(ProgramMode mode = ProgramMode::kAuto) : b_({{"X", 4}, {"Y", 2}}, {}, mode) {}
  // An f32 input of normal values, seeded by its name.
  std::string In(const std::string& name, Shape shape, PartitionSpec spec) {
    return b_.Input(name, std::move(shape), DType::kF32, std::move(spec),
                    Normal(std::hash<std::string>{}(name) % 1000));
  }
  // An i32 input of ids i * 7 mod n (every id in [0, n), in no particular order).
  std::string Ids(const std::string& name, Shape shape, PartitionSpec spec, int n) {
    ArraySpec a;
    a.name = name;
    a.shape = std::move(shape);
    a.dtype = DType::kI32;
    a.sharding = std::move(spec);
    a.init.kind = InitSpec::Kind::kValue;
    int64_t count = 1;
    for (int64_t d : a.shape) count *= d;
    for (int64_t i = 0; i < count; ++i) a.init.values.push_back(static_cast<double>(i * 7 % n));
    return b_.Input(std::move(a));
  }
  // An op of `kind` on `in`, with attributes set by `set`; its first output.
  std::string Op(OpKind kind, std::vector<std::string> in,
                 const std::function<void(OpSpec&)>& set = {}, std::vector<std::string> out = {}) {
    OpSpec op;
    if (set) set(op);
    op.kind = kind;
    op.in = std::move(in);
    op.out = std::move(out);
    return b_.Add(std::move(op));
  }
  // sum(y * y): a scalar loss reading every element of y.
  std::string SquareLoss(const std::string& y) {
    return Op(OpKind::kSum, {Op(OpKind::kSquare, {y})}, {}, {"loss"});
  }
  ProgramBuilder& b() { return b_; }
  ProgramSpec Build() && { return std::move(b_).Build(); }

 private:
  ProgramBuilder b_;
};

std::function<void(OpSpec&)> Axes(std::vector<int64_t> axes, bool keepdims = false) {
  return [=](OpSpec& op) {
    op.axes = axes;
    op.keepdims = keepdims;
  };
}

std::function<void(OpSpec&)> NormAxis(int64_t axis) {
  return [=](OpSpec& op) { op.norm_axis = axis; };
}

struct RuleCase {
  std::string name;
  std::function<ProgramSpec()> build;
  // The collectives inserted, in any order; nullopt: numerics only.
  std::optional<std::vector<Inserted>> collectives;
  bool finite = true;  // Its outputs are finite (false: NaN on purpose).
};

void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.name; }

std::vector<Inserted> Sorted(std::vector<Inserted> v) {
  std::sort(v.begin(), v.end(), [](const Inserted& a, const Inserted& b) {
    return std::tie(a.kind, a.axes, a.bytes) < std::tie(b.kind, b.axes, b.bytes);
  });
  return v;
}

std::vector<RuleCase> Cases() {
  return {
      // A narrowing convert of partial sums: x [16@X, 8@Y] summed over dim 0 is a [8@Y] partial
      // over X; rounded to f8e4m3 the parts would be summed in one byte, so the f32 [4] is
      // psummed first (16 B, not 4) and converted after. A widening convert (to f32 from bf16)
      // would keep it partial; this one may not.
      {"NarrowingConvertSumsPartialSumsFirst",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.Op(OpKind::kSum, {"x"}, Axes({0}), {"s"});
         g.Op(OpKind::kConvert, {"s"}, [](OpSpec& op) { op.dtype = "f8e4m3"; }, {"c"});
         g.b().Output("c", P({{"Y"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X"}, 16}}},
      // x [16@X, 8@Y] summed over dim 0: each device sums its 4 rows, a [8@Y] partial over X;
      // out P('Y') psums the local [4] f32 (16 B) over X.
      {"SumOverASplitDimensionPsums",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.Op(OpKind::kSum, {"x"}, Axes({0}), {"s"});
         g.b().Output("s", P({{"Y"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X"}, 16}}},
      // mean over every dimension, keepdims: local means of [4, 4] blocks, each 8 times its
      // share, scaled by 1/8 (a local mul) and psummed over X and Y: 4 B.
      {"MeanOverEverySplitRescalesAndPsums",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.Op(OpKind::kMean, {"x"}, Axes({}, true), {"m"});
         g.b().Output("m", P({}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X", "Y"}, 4}}},
      // max over dim 1 (split over Y): local maxima of [4, 4] blocks, then pmax over Y of [4]:
      // 16 B.
      {"MaxOverASplitDimensionTakesPmax",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.Op(OpKind::kReduceMax, {"x"}, Axes({1}), {"m"});
         g.b().Output("m", P({{"X"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPmax, {"Y"}, 16}}},
      // softmax along dim 1 (split over Y): the rows are gathered, [4, 4] f32 = 64 B in; the
      // result keeps dim 0 over X as out P('X') asks.
      {"SoftmaxGathersItsAxis",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.Op(OpKind::kSoftmax, {"x"}, NormAxis(-1), {"y"});
         g.b().Output("y", P({{"X"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kAllGather, {"Y"}, 64}}},
      {"LogSoftmaxGrad",
       [] {
         Global g;
         g.In("x", {8, 6, 8}, P({{"X"}, {}, {"Y"}}));
         g.SquareLoss(g.Op(OpKind::kLogSoftmax, {"x"}, NormAxis(1)));
         g.b().Grad("loss", {"x"}, {"dx"});
         g.b().Output("dx", P({{"X"}, {}, {"Y"}}));
         return std::move(g).Build();
       },
       std::nullopt},
      // Data-parallel cross-entropy: logits [16@X, 8] from x [16@X, 4] @ w [4, 8]. The loss is
      // each device's mean over its 4 rows, scaled by 1/4 and psummed over X at the output (4
      // B); its cotangent seed needs no psum (full_like reads only the shape); dw = x^T dlogits
      // contracts the split batch: a [4, 8] partial over X psummed at the output (128 B).
      {"CrossEntropyDataParallelGrad",
       [] {
         Global g;
         g.In("x", {16, 4}, P({{"X"}}));
         g.In("w", {4, 8}, P({}));
         g.Ids("labels", {16}, P({{"X"}}), 8);
         g.Op(OpKind::kCrossEntropy, {g.b().Matmul("x", "w"), "labels"}, {}, {"loss"});
         g.b().Grad("loss", {"w"}, {"dw"});
         g.b().Output("loss", P({}));
         g.b().Output("dw", P({}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X"}, 4}, {OpKind::kPsum, {"X"}, 128}}},
      // rms_norm of x [16@X, 8] with scale [8@Y]: the scale is gathered over Y ([4] f32, 16
      // B), in the forward and again in the backward (dx reads it; autodiff saved the sharded
      // scale, not the gathered copy). The loss psums over X (4 B). dscale, g * xhat summed over
      // the split rows, is a [8]
      // partial over X; out P('Y') slices it over Y locally, then psums the [4] over X (16
      // B); dx stays [16@X, 8].
      {"RmsNormGradSumsTheScaleOverTheBatch",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}}));
         g.In("scale", {8}, P({{"Y"}}));
         g.SquareLoss(g.Op(OpKind::kRmsNorm, {"x", "scale"}, NormAxis(-1)));
         g.b().Grad("loss", {"x", "scale"}, {"dx", "dscale"});
         g.b().Output("loss", P({}));
         g.b().Output("dx", P({{"X"}}));
         g.b().Output("dscale", P({{"Y"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kAllGather, {"Y"}, 16},
                             {OpKind::kAllGather, {"Y"}, 16},
                             {OpKind::kPsum, {"X"}, 4},
                             {OpKind::kPsum, {"X"}, 16}}},
      {"LayerNormGradOverASplitAxis",
       [] {
         Global g;
         g.In("x", {4, 6, 8}, P({{"X"}, {}, {"Y"}}));
         g.In("scale", {8}, P({}));
         g.SquareLoss(g.Op(OpKind::kLayerNorm, {"x", "scale"}, NormAxis(-1)));
         g.b().Grad("loss", {"x", "scale"}, {"dx", "dscale"});
         g.b().Output("dx", P({{"X"}, {}, {"Y"}}));
         g.b().Output("dscale", P({}));
         return std::move(g).Build();
       },
       std::nullopt},
      // Embedding look-up: table [10, 8@Y], ids [16@X, 4] give e [16@X, 4, 8@Y] locally. The
      // table's cotangent adds every id position's row: each device's scatter-add of its 4 ids
      // rows is a [10, 4] partial over X, psummed (160 B); the loss psums over X and Y (4 B).
      {"TakeGradPsumsTheTableOverTheIds",
       [] {
         Global g;
         g.In("table", {10, 8}, P({{}, {"Y"}}));
         g.Ids("ids", {16, 4}, P({{"X"}}), 10);
         g.SquareLoss(g.Op(OpKind::kTake, {"table", "ids"}));
         g.b().Grad("loss", {"table"}, {"dtable"});
         g.b().Output("loss", P({}));
         g.b().Output("dtable", P({{}, {"Y"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X"}, 160}, {OpKind::kPsum, {"X", "Y"}, 4}}},
      // A vocabulary-split table [32768@Y, 64] (XLA's partitioned gather): each device takes
      // the rows of its 16384 for ids [16@X, 4] (zeros for the other block's), a [4, 4, 64]
      // partial over Y psummed once (4 KiB) rather than its 4 MiB block gathered. (For a table
      // of a few KiB the gather is the cheaper, and auto mode keeps it.)
      {"TakeFromAVocabularySplitTableLooksUpInPlace",
       [] {
         Global g;
         g.In("table", {32768, 64}, P({{"Y"}, {}}));
         g.Ids("ids", {16, 4}, P({{"X"}}), 32768);
         g.Op(OpKind::kTake, {"table", "ids"}, {}, {"e"});
         g.b().Output("e", P({{"X"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"Y"}, 4 * 4 * 64 * 4}}},
      // The same with ids from the end (-1: the last row) and outside the table (40000,
      // -32769), and the two blocks' edges:
      // take's NaN fill comes from block 0 alone, so the psum keeps it (numerics compare NaN
      // with NaN).
      {"TakeFromASplitTableKeepsNegativeIdsAndTheFill",
       [] {
         Global g;
         g.In("table", {32768, 8}, P({{"Y"}, {}}));
         ArraySpec ids;
         ids.name = "ids";
         ids.shape = {8};
         ids.dtype = DType::kI32;
         ids.sharding = P({{"X"}});
         ids.init.kind = InitSpec::Kind::kValue;
         ids.init.values = {0, 32767, -1, 20000, 40000, -32769, 16383, 16384};
         g.b().Input(std::move(ids));
         g.Op(OpKind::kTake, {"table", "ids"}, {}, {"e"});
         g.b().Output("e", P({{"X"}}));
         return std::move(g).Build();
       },
       std::nullopt, /*finite=*/false},
      // repeat along a's whole axis 0 (counts [0, 3, 2, 1, 0, 3] into 12 rows), its columns
      // over Y: forward and backward stay local (the counts and their iota replicated); only
      // the loss is psummed over Y (4 B).
      {"RepeatKeepsTheOtherDimensionsSplit",
       [] {
         Global g;
         g.In("a", {6, 8}, P({{}, {"Y"}}));
         g.Ids("repeats", {6}, P({}), 4);
         g.SquareLoss(g.Op(OpKind::kRepeat, {"a", "repeats"}, [](OpSpec& op) {
           op.axis = 0;
           op.total_repeat_length = 12;
         }));
         g.b().Grad("loss", {"a"}, {"da"});
         g.b().Output("loss", P({}));
         g.b().Output("da", P({{}, {"Y"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"Y"}, 4}}},
      {"TopKGrad",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.SquareLoss(g.Op(OpKind::kTopK, {"x"}, [](OpSpec& op) { op.k = 3; }));
         g.b().Grad("loss", {"x"}, {"dx"});
         g.b().Output("dx", P({{"X"}, {"Y"}}));
         return std::move(g).Build();
       },
       std::nullopt},
      // Attention with batch over X and heads over Y (4 query heads, 2 kv heads: each device
      // holds query heads {2s, 2s+1} and kv head s, the one they read): forward and backward
      // are local; only the loss is psummed over X and Y (4 B).
      {"AttentionSplitsBatchAndHeadsLocally",
       [] {
         Global g;
         g.In("q", {4, 6, 4, 8}, P({{"X"}, {}, {"Y"}}));
         g.In("k", {4, 6, 2, 8}, P({{"X"}, {}, {"Y"}}));
         g.In("v", {4, 6, 2, 8}, P({{"X"}, {}, {"Y"}}));
         g.SquareLoss(g.Op(OpKind::kAttention, {"q", "k", "v"}));
         g.b().Grad("loss", {"q", "k", "v"}, {"dq", "dk", "dv"});
         g.b().Output("loss", P({}));
         g.b().Output("dq", P({{"X"}, {}, {"Y"}}));
         g.b().Output("dk", P({{"X"}, {}, {"Y"}}));
         g.b().Output("dv", P({{"X"}, {}, {"Y"}}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X", "Y"}, 4}}},
      // One kv head cannot split over Y: the query heads are not split either.
      {"AttentionWithKvHeadsThatDoNotDivide",
       [] {
         Global g;
         g.In("q", {4, 6, 4, 8}, P({{"X"}, {}, {"Y"}}));
         g.In("k", {4, 6, 1, 8}, P({{"X"}}));
         g.In("v", {4, 6, 1, 8}, P({{"X"}}));
         g.SquareLoss(g.Op(OpKind::kAttention, {"q", "k", "v"}));
         g.b().Grad("loss", {"q", "k"}, {"dq", "dk"});
         g.b().Output("dq", P({{"X"}, {}, {"Y"}}));
         g.b().Output("dk", P({{"X"}}));
         return std::move(g).Build();
       },
       std::nullopt},
      {"ReduceMaxGradReadsTheReducedAxisWhole",
       [] {
         Global g;
         g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
         g.SquareLoss(g.Op(OpKind::kReduceMax, {"x"}, Axes({1})));
         g.b().Grad("loss", {"x"}, {"dx"});
         g.b().Output("dx", P({{"X"}, {"Y"}}));
         return std::move(g).Build();
       },
       std::nullopt},
      // Explicit mode sums a partial result at once: mean over dim 0 split over X psums the
      // [8] f32 (32 B) right after the op.
      {"ExplicitMeanPsumsAtOnce",
       [] {
         Global g(ProgramMode::kExplicit);
         g.In("x", {16, 8}, P({{"X"}}));
         g.Op(OpKind::kMean, {"x"}, Axes({0}), {"m"});
         g.b().Output("m", P({}));
         return std::move(g).Build();
       },
       std::vector<Inserted>{{OpKind::kPsum, {"X"}, 32}}},
  };
}

class ArrayRuleTest : public testing::TestWithParam<RuleCase> {};

TEST_P(ArrayRuleTest, ShardedRunMatchesTheUnshardedProgram) {
  const ProgramSpec global = GetParam().build();
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  if (GetParam().collectives) {
    EXPECT_EQ(Sorted(Collectives(global, PartitionOnMachine(global, machine, mesh))),
              Sorted(*GetParam().collectives));
  }
  ExpectNumericsPass(global, GetParam().finite);
}

INSTANTIATE_TEST_SUITE_P(Rules, ArrayRuleTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<RuleCase>& info) {
                           return info.param.name;
                         });

// Explicit mode refuses what its fused kernels cannot run where the operands are.
TEST(ArrayRuleTest, ExplicitModeRefusesASplitRowAxis) {
  Global g(ProgramMode::kExplicit);
  g.In("x", {16, 8}, P({{"X"}, {"Y"}}));
  g.Op(OpKind::kSoftmax, {"x"}, NormAxis(-1), {"y"});
  g.b().Output("y", P({{"X"}}));
  const ProgramSpec global = std::move(g).Build();
  try {
    Partition(global);
    FAIL() << "partitioned";
  } catch (const SpecError& e) {
    EXPECT_EQ(std::string(e.what()),
              "softmax y: softmax of f32[16@X,8@Y]: the op reads dimension 1 whole but it is "
              "split; reshard it first");
  }
}

}  // namespace
}  // namespace shardsim::planner
