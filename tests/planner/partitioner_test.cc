// The partitioner's collectives, derived by hand from shapes and shardings; explicit mode's
// refusals; and sharded runs against the unsharded program.
#include "planner/partitioner.h"

#include <gtest/gtest.h>

#include <functional>

#include "collectives/ir/program_builder.h"
#include "collectives/runtime/run_program.h"
#include "planner/partitioned_numerics.h"
#include "planner/reshard.h"
#include "sim/spec_error.h"
#include "tests/planner/partition_test_support.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

// The Scaling Book's matmul: einsum('bd,df->bf', square(In), W), In: P('X', 'Y'),
// W: P('Y', None), on a 4x2 mesh.
ProgramSpec ScalingBookMatmul(ProgramMode mode, PartitionSpec w_spec, PartitionSpec out_spec) {
  ProgramBuilder b({{"X", 4}, {"Y", 2}}, {}, mode);
  b.Input("In", {64, 128}, DType::kF32, P({{"X"}, {"Y"}}), Normal(0));
  b.Input("W", {128, 32}, DType::kF32, std::move(w_spec), Normal(1));
  std::string sq = b.Unary(OpKind::kSquare, "In", "sq");
  b.Einsum("bd,df->bf", sq, "W", "out");
  b.Output("out", std::move(out_spec));
  return std::move(b).Build();
}

TEST(PartitionerTest, ElementwiseKeepsTheShardingAndInsertsNothing) {
  ProgramBuilder b({{"X", 4}, {"Y", 2}}, {}, ProgramMode::kAuto);
  b.Input("x", {64, 64}, DType::kF32, P({{"X"}, {"Y"}}), Normal(0));
  b.Unary(OpKind::kSin, "x", "y");
  b.Output("y", P({{"X"}, {"Y"}}));
  ProgramSpec global = std::move(b).Build();
  PartitionResult lowered = Partition(global);
  ASSERT_EQ(lowered.program.ops.size(), 1u);
  EXPECT_EQ(lowered.program.ops[0].kind, OpKind::kSin);
  EXPECT_EQ(lowered.types[0], "f32[64@X,64@Y]");
  ExpectNumericsPass(global);
}

// d is split over Y on both sides: local products of [64/4, 32] summed over Y. Out P('X',
// None): one psum of 16 x 32 x 4 B = 2048 B; out P('X', 'Y'): a psum_scatter instead.
TEST(PartitionerTest, ContractionOverASplitDimensionSumsItsPartials) {
  for (ProgramMode mode : {ProgramMode::kAuto, ProgramMode::kExplicit}) {
    SCOPED_TRACE(ProgramModeName(mode));
    ProgramSpec global = ScalingBookMatmul(mode, P({{"Y"}, {}}), P({{"X"}, {}}));
    EXPECT_EQ(Collectives(global, Partition(global)),
              (std::vector<Inserted>{{OpKind::kPsum, {"Y"}, 16 * 32 * 4}}));
    ExpectNumericsPass(global);
  }
  ProgramSpec scatter = ScalingBookMatmul(ProgramMode::kAuto, P({{"Y"}, {}}), P({{"X"}, {"Y"}}));
  EXPECT_EQ(Collectives(scatter, Partition(scatter)),
            (std::vector<Inserted>{{OpKind::kPsumScatter, {"Y"}, 16 * 32 * 4}}));
  ExpectNumericsPass(scatter);
}

// W replicated while In's d is split over Y: auto slices W's rows locally (no communication)
// and sums the partial products over Y; explicit mode refuses, as JAX does.
// An unreduced output (JAX's unreduced out sharding) keeps its partial sums for its reader in
// auto mode: out P('X', None) needs no psum over Y; out P('X', 'Y') splits over the partial
// axis, so its sum is still scattered there as the spec asks. (In explicit mode the einsum's
// rule sums its partials at the einsum, before any output.)
TEST(PartitionerTest, UnreducedOutputKeepsItsPartialSums) {
  ProgramSpec kept = ScalingBookMatmul(ProgramMode::kAuto, P({{"Y"}, {}}), P({{"X"}, {}}));
  kept.outputs[0].unreduced = true;
  const PartitionResult lowered = Partition(kept);
  EXPECT_EQ(Collectives(kept, lowered), std::vector<Inserted>{});
  EXPECT_EQ(lowered.types.back(), "f32[64@X,32]{partial: Y}");
  ProgramSpec scatter = ScalingBookMatmul(ProgramMode::kAuto, P({{"Y"}, {}}), P({{"X"}, {"Y"}}));
  scatter.outputs[0].unreduced = true;
  EXPECT_EQ(Collectives(scatter, Partition(scatter)),
            (std::vector<Inserted>{{OpKind::kPsumScatter, {"Y"}, 16 * 32 * 4}}));
}

TEST(PartitionerTest, ContractingSplitOnOneSideOnly) {
  ProgramSpec global = ScalingBookMatmul(ProgramMode::kAuto, P({}), P({{"X"}, {}}));
  PartitionResult lowered = Partition(global);
  EXPECT_EQ(Collectives(global, lowered),
            (std::vector<Inserted>{{OpKind::kPsum, {"Y"}, 16 * 32 * 4}}));
  bool sliced = false;
  for (const OpSpec& op : lowered.program.ops) sliced = sliced || op.kind == OpKind::kDynamicSlice;
  EXPECT_TRUE(sliced);
  ExpectNumericsPass(global);
  ProgramSpec strict = ScalingBookMatmul(ProgramMode::kExplicit, P({}), P({{"X"}, {}}));
  try {
    Partition(strict);
    FAIL() << "partitioned";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "program.1");
    EXPECT_NE(std::string(e.what()).find("f32[64@X,128@Y] and f32[128,32]"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("reshard"), std::string::npos) << e.what();
  }
}

// Megatron's MLP under tensor parallelism: x [B, D] replicated, w1 [D, F] column-split over
// tp, w2 [F, D] row-split: h = relu(x @ w1) stays split over tp, h @ w2 is a partial sum over
// tp, and the replicated output takes exactly one psum of B x D x 4 bytes.
TEST(PartitionerTest, TensorParallelMlpTakesOneAllReduce) {
  ProgramBuilder b({{"dp", 4}, {"tp", 2}}, {}, ProgramMode::kAuto);
  b.Input("x", {16, 32}, DType::kF32, P({}), Normal(0));
  b.Input("w1", {32, 64}, DType::kF32, P({{}, {"tp"}}), Normal(1));
  b.Input("w2", {64, 32}, DType::kF32, P({{"tp"}, {}}), Normal(2));
  std::string h = b.Unary(OpKind::kRelu, b.Matmul("x", "w1"));
  b.Matmul(h, "w2", "y");
  b.Output("y", P({}));
  ProgramSpec global = std::move(b).Build();
  EXPECT_EQ(Collectives(global, Partition(global)),
            (std::vector<Inserted>{{OpKind::kPsum, {"tp"}, 16 * 32 * 4}}));
  ExpectNumericsPass(global);
}

// Data parallelism: x split over dp, w replicated: no communication in the forward pass.
TEST(PartitionerTest, DataParallelForwardIsLocal) {
  for (ProgramMode mode : {ProgramMode::kAuto, ProgramMode::kExplicit}) {
    ProgramBuilder b({{"dp", 8}}, {}, mode);
    b.Input("x", {64, 32}, DType::kF32, P({{"dp"}}), Normal(0));
    b.Input("w", {32, 16}, DType::kF32, P({}), Normal(1));
    b.Matmul("x", "w", "y");
    b.Output("y", P({{"dp"}}));
    ProgramSpec global = std::move(b).Build();
    EXPECT_TRUE(Collectives(global, Partition(global)).empty());
  }
}

// FSDP: w's rows split over fsdp with x's batch split over fsdp too: the contraction would
// need fsdp twice, so auto gathers w (8 devices x 4 x 16 x 4 B) before the matmul.
ProgramSpec FsdpMatmul() {
  ProgramBuilder b({{"fsdp", 8}}, {}, ProgramMode::kAuto);
  b.Input("x", {64, 32}, DType::kF32, P({{"fsdp"}}), Normal(0));
  b.Input("w", {32, 16}, DType::kF32, P({{"fsdp"}}), Normal(1));
  b.Matmul("x", "w", "y");
  b.Output("y", P({{"fsdp"}}));
  return std::move(b).Build();
}

TEST(PartitionerTest, FsdpGathersTheWeight) {
  const ProgramSpec global = FsdpMatmul();
  EXPECT_EQ(Collectives(global, Partition(global)),
            (std::vector<Inserted>{{OpKind::kAllGather, {"fsdp"}, 4 * 16 * 4}}));
  ExpectNumericsPass(global);
}

// Without descriptions the partition is the same, op for op, and every reason and type is
// empty; with them, the inserted gather says why and both ops their types.
TEST(PartitionerTest, UndescribedPartitionIsTheSameProgram) {
  const ProgramSpec global = FsdpMatmul();
  const PartitionResult described = Partition(global);
  PartitionCosts costs;
  costs.describe = false;
  const PartitionResult bare = Partition(global, costs);
  EXPECT_EQ(bare.program.ops, described.program.ops);
  ASSERT_EQ(described.program.ops.size(), 2u);
  EXPECT_EQ(described.types, (std::vector<std::string>{"f32[32,16]", "f32[64@fsdp,16]"}));
  EXPECT_NE(described.reasons[0].find("needs w as f32[32,16]"), std::string::npos)
      << described.reasons[0];
  EXPECT_EQ(bare.reasons, (std::vector<std::string>(2)));
  EXPECT_EQ(bare.types, (std::vector<std::string>(2)));
}

// The backward's activation gradient under FSDP x TP with the residual stream's d_model split
// over tensor (MaxText's activation_embed): dy [B, T, D] split (fsdp, -, tensor), the weight
// W [F, D] split (tensor, fsdp), dx = einsum('btd,fd->btf', dy, W), summed over T.
// The operands split the contraction D over different axes; the cheapest way keeps both
// operands' splits of the result (B over fsdp, F over tensor) and gathers the contraction on
// each side: dy over tensor (16/4 x 8 x 64/2 x 4 B per device) and W over fsdp as FSDP does
// (128/2 x 64/4 x 4 B), with nothing left to reduce. Keeping dy's layout instead resharded W
// into D over tensor (F gathered whole) and reduce-scattered the result.
TEST(PartitionerTest, ConflictingContractionSplitsGatherBothOperands) {
  ProgramBuilder b({{"fsdp", 4}, {"tensor", 2}}, {}, ProgramMode::kAuto);
  b.Input("dy", {16, 8, 64}, DType::kF32, P({{"fsdp"}, {}, {"tensor"}}), Normal(0));
  b.Input("w", {128, 64}, DType::kF32, P({{"tensor"}, {"fsdp"}}), Normal(1));
  b.Einsum("btd,fd->btf", "dy", "w", "dx");
  // Read by a reduction, through which no layout preference reaches dx.
  OpSpec sum;
  sum.kind = OpKind::kSum;
  sum.in = {"dx"};
  sum.out = {"s"};
  sum.axes = {1};
  b.Add(std::move(sum));
  b.Output("s", P({{"fsdp"}, {"tensor"}}));
  ProgramSpec global = std::move(b).Build();
  EXPECT_EQ(Collectives(global, Partition(global)),
            (std::vector<Inserted>{{OpKind::kAllGather, {"tensor"}, 16 / 4 * 8 * 64 / 2 * 4},
                                   {OpKind::kAllGather, {"fsdp"}, 128 / 2 * 64 / 4 * 4}}));
  ExpectNumericsPass(global);
}

// x = einsum(a, b) [16, 16] split (-, d) and partial over t, read by an add beside y split
// (t, -) and by tanh: summed beside y it keeps its d split and scatters over t, y's next axis
// and a partial one: one psum_scatter of its [16, 16/4] f32 block (256 B); the output u wanted
// (-, d) gathers t back ([16/2, 4] f32, 128 B), as many bytes as the all-reduce. Taking y's
// layout whole gathered x's d split and sliced it again (2.1x the time). With x whole
// (b split (t, -)) beside y split (d, -), an axis x is not partial over, x is all-reduced as
// before ([16, 16] f32, 1024 B) and the add slices it: summing into (d, -) psummed a quarter
// of it but made tanh's output u gather d (1.35x).
TEST(PartitionerTest, PartialValueSummedBesideASplitOperandKeepsItsSplits) {
  for (const bool scatter : {true, false}) {
    SCOPED_TRACE(scatter ? "y (t, -)" : "y (d, -)");
    ProgramBuilder b({{"d", 4}, {"t", 2}}, {}, ProgramMode::kAuto);
    b.Input("a", {16, 32}, DType::kF32, P({{}, {"t"}}), Normal(0));
    b.Input("b", {32, 16}, DType::kF32, scatter ? P({{"t"}, {"d"}}) : P({{"t"}, {}}), Normal(1));
    b.Input("y", {16, 16}, DType::kF32, scatter ? P({{"t"}, {}}) : P({{"d"}, {}}), Normal(2));
    b.Einsum("ik,kj->ij", "a", "b", "x");
    b.Binary(OpKind::kAdd, "x", "y", "s");
    b.Unary(OpKind::kTanh, "x", "u");
    b.Output("s", scatter ? P({{"t"}, {"d"}}) : P({{"d"}, {}}));
    b.Output("u", scatter ? P({{}, {"d"}}) : P({}));
    ProgramSpec global = std::move(b).Build();
    const std::vector<Inserted> want =
        scatter ? std::vector<Inserted>{{OpKind::kPsumScatter, {"t"}, 16 * 16 / 4 * 4},
                                        {OpKind::kAllGather, {"t"}, 16 / 2 * 16 / 4 * 4}}
                : std::vector<Inserted>{{OpKind::kPsum, {"t"}, 16 * 16 * 4}};
    EXPECT_EQ(Collectives(global, Partition(global)), want);
    ExpectNumericsPass(global);
  }
}

TEST(ReshardTest, PlansTheCheapestMoves) {
  const std::vector<MeshAxis> axes = {{"dp", 4}, {"tp", 2}};
  auto plan = [&](const char* from, const char* to, std::vector<int> partial = {}) {
    ValueSharding f = FromSpec(ParsePartitionSpec(from), 2, axes);
    f.partial = std::move(partial);
    std::string text;
    for (const ReshardStep& s :
         PlanReshard({64, 64}, f, FromSpec(ParsePartitionSpec(to), 2, axes), axes)) {
      text += (text.empty() ? "" : "; ") + DescribeStep(s, axes);
    }
    return text;
  };
  EXPECT_EQ(plan("P('dp')", "P('dp')"), "");
  EXPECT_EQ(plan("P(('dp', 'tp'))", "P('dp')"), "all_gather over tp (dim 0)");
  EXPECT_EQ(plan("P()", "P(None, 'tp')"), "slice over tp (dim 1)");
  EXPECT_EQ(plan("P('dp')", "P(None, 'dp')"), "all_to_all over dp (dim 0 to dim 1)");
  EXPECT_EQ(plan("P('dp')", "P('dp', 'tp')", {1}), "psum_scatter over tp (dim 1)");
  EXPECT_EQ(plan("P('dp')", "P()", {1}), "psum over tp; all_gather over dp (dim 0)");
  // A free axis is sliced before the sum moves: the psum_scatter carries half the block.
  EXPECT_EQ(plan("P()", "P('dp', 'tp')", {0}),
            "slice over tp (dim 1); psum_scatter over dp (dim 0)");
  EXPECT_EQ(plan("P(('tp', 'dp'))", "P('dp')"),
            "all_gather over tp,dp (dim 0); slice over dp (dim 0)");
}

// Explicit mode refuses what JAX refuses, at the op, naming the operands' types and the fix.
struct Refusal {
  std::string name;
  std::function<ProgramSpec()> build;
  std::string key;
  std::string message;
};

class ExplicitRefusesTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(ExplicitRefusesTest, NamesTheOpAndTheFix) {
  try {
    Partition(GetParam().build());
    FAIL() << "partitioned";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), GetParam().key);
    EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos) << e.what();
  }
}

// An explicit program on dp=4 x tp=2 with inputs a [8, 8] and b [8, 8] of the given specs
// and one op made by `add`.
std::function<ProgramSpec()> Two(PartitionSpec a, PartitionSpec b,
                                 std::function<void(ProgramBuilder&)> add) {
  return [=] {
    ProgramBuilder builder({{"dp", 4}, {"tp", 2}}, {}, ProgramMode::kExplicit);
    builder.Input("a", {8, 8}, DType::kF32, a);
    builder.Input("b", {8, 8}, DType::kF32, b);
    add(builder);
    builder.Output("y", P({}));
    return std::move(builder).Build();
  };
}

OpSpec AlongAxis(OpKind kind, std::vector<std::string> in, int64_t axis) {
  OpSpec op;
  op.kind = kind;
  op.in = std::move(in);
  op.out = {"y"};
  op.axis = axis;
  if (kind == OpKind::kSlice) op.size = 4;
  if (kind == OpKind::kSplit) {
    op.sections = 2;
    op.out = {"y", "z"};
  }
  return op;
}

INSTANTIATE_TEST_SUITE_P(
    Programs, ExplicitRefusesTest,
    ::testing::Values(
        Refusal{"AddSplitDifferently",
                Two(P({{"dp"}}), P({{"tp"}}),
                    [](ProgramBuilder& b) { b.Binary(OpKind::kAdd, "a", "b", "y"); }),
                "program.0", "f32[8@dp,8] and f32[8@tp,8] are sharded incompatibly"},
        Refusal{"MulOneAxisOnTwoDims",
                Two(P({{"dp"}}), P({{}, {"dp"}}),
                    [](ProgramBuilder& b) { b.Binary(OpKind::kMul, "a", "b", "y"); }),
                "program.0", "one mesh axis would split two dimensions"},
        Refusal{"ContractingSplitOneSide",
                Two(P({{}, {"tp"}}), P({}), [](ProgramBuilder& b) { b.Matmul("a", "b", "y"); }),
                "program.0", "split in the first operand only"},
        Refusal{
            "ContractingSplitDifferently",
            Two(P({{}, {"tp"}}), P({{"dp"}}), [](ProgramBuilder& b) { b.Matmul("a", "b", "y"); }),
            "program.0", "split differently in the two operands"},
        Refusal{
            "FreeDimsOnOneAxis",
            Two(P({{"dp"}}), P({{}, {"dp"}}), [](ProgramBuilder& b) { b.Matmul("a", "b", "y"); }),
            "program.0", "one mesh axis would split two dimensions of the result"},
        Refusal{"EinsumBatchSplitDifferently",
                Two(P({{"dp"}}), P({{"tp"}}),
                    [](ProgramBuilder& b) { b.Einsum("bi,bj->bij", "a", "b", "y"); }),
                "program.0", "letter 'b' is split differently"},
        Refusal{"ConcatenateAlongSplitAxis",
                Two(P({{"dp"}}), P({{"dp"}}),
                    [](ProgramBuilder& b) {
                      b.Add(AlongAxis(OpKind::kConcatenate, {"a", "b"}, 0));
                    }),
                "program.0", "dimension 0 is split; reshard it first"},
        Refusal{"ConcatenateOperandsDiffer",
                Two(P({{}, {"dp"}}), P({}),
                    [](ProgramBuilder& b) {
                      b.Add(AlongAxis(OpKind::kConcatenate, {"a", "b"}, 0));
                    }),
                "program.0", "operands are split differently"},
        Refusal{"SliceAlongSplitAxis",
                Two(P({{}, {"tp"}}), P({}),
                    [](ProgramBuilder& b) { b.Add(AlongAxis(OpKind::kSlice, {"a"}, 1)); }),
                "program.0", "dimension 1 is split"},
        Refusal{"SplitAlongSplitAxis",
                Two(P({{"dp"}}), P({}),
                    [](ProgramBuilder& b) { b.Add(AlongAxis(OpKind::kSplit, {"a"}, 0)); }),
                "program.0", "dimension 0 is split"},
        Refusal{"ReshapeCannotCarry",
                Two(P({{}, {"dp"}}), P({}),
                    [](ProgramBuilder& b) {
                      OpSpec op;
                      op.kind = OpKind::kReshape;
                      op.in = {"a"};
                      op.out = {"y"};
                      op.shape = {2, 32};
                      b.Add(op);
                    }),
                "program.0", "split cannot carry into shape [2,32]"},
        Refusal{"ConstraintThatDisagrees",
                Two(P({{"dp"}}), P({}),
                    [](ProgramBuilder& b) {
                      OpSpec op;
                      op.kind = OpKind::kShardingConstraint;
                      op.in = {"a"};
                      op.out = {"y"};
                      op.sharding = P({{"tp"}});
                      b.Add(op);
                    }),
                "program.0", "in explicit mode change a sharding with reshard"}),
    [](const auto& info) { return info.param.name; });

// Reorder puts each op, its reason and its type at the place `order` gives (in place, cycle
// by cycle: a 3-cycle, a swap and a fixed point here), and refuses an order that is not a
// permutation of the ops.
// `n` ops named op0, op1, ..., each with its reason (why0, ...) and, for the first `types`,
// its type (t0, ...).
PartitionResult NamedOps(int n, int types) {
  PartitionResult r;
  for (int k = 0; k < n; ++k) {
    OpSpec op;
    op.name = "op" + std::to_string(k);
    r.program.ops.push_back(op);
    r.reasons.push_back("why" + std::to_string(k));
    if (k < types) r.types.push_back("t" + std::to_string(k));
  }
  return r;
}

TEST(ReorderTest, PermutesOpsWithTheirReasonsAndTypes) {
  PartitionResult r = NamedOps(6, 3);  // Types shorter than the ops: the rest have none.
  const std::vector<size_t> order = {2, 0, 1, 4, 3, 5};
  Reorder(r, order);
  ASSERT_EQ(r.program.ops.size(), 6u);
  ASSERT_EQ(r.types.size(), 6u);
  for (size_t k = 0; k < order.size(); ++k) {
    EXPECT_EQ(r.program.ops[k].name, "op" + std::to_string(order[k]));
    EXPECT_EQ(r.reasons[k], "why" + std::to_string(order[k]));
    EXPECT_EQ(r.types[k], order[k] < 3 ? "t" + std::to_string(order[k]) : "");
  }
  for (const std::vector<size_t>& bad :
       {std::vector<size_t>{1, 0, 0, 3, 4, 5}, std::vector<size_t>{0, 1, 2, 3, 4},
        std::vector<size_t>{1, 0, 2, 3, 4, 9}, std::vector<size_t>{3, 1, 2, 3, 4, 5}}) {
    PartitionResult copy = r;
    EXPECT_THROW(Reorder(copy, bad), std::logic_error);
  }
}

// Ops numbered by KeepOrigin and reordered twice (two scheduling passes) go back to their
// first order, reasons and types with them, and their numbers are dropped.
TEST(ReorderTest, RestoreOrderUndoesReorders) {
  PartitionResult r = NamedOps(7, 7);
  const PartitionResult before = r;
  KeepOrigin(r);
  Reorder(r, {3, 0, 1, 2, 6, 5, 4});
  Reorder(r, {1, 2, 0, 4, 3, 6, 5});
  EXPECT_EQ(r.program.ops[2].name, "op3");
  EXPECT_EQ(r.origin, std::vector<size_t>({0, 1, 3, 6, 2, 4, 5}));
  RestoreOrder(r);
  EXPECT_TRUE(r.origin.empty());
  ASSERT_EQ(r.program.ops.size(), before.program.ops.size());
  for (size_t k = 0; k < before.program.ops.size(); ++k) {
    EXPECT_EQ(r.program.ops[k].name, before.program.ops[k].name) << k;
    EXPECT_EQ(r.reasons[k], before.reasons[k]) << k;
    EXPECT_EQ(r.types[k], before.types[k]) << k;
  }
}

}  // namespace
}  // namespace shardsim::planner
