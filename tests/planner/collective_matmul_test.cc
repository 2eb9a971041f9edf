// Collective matmuls chosen by the partitioner: which all-gathers fuse with their matmul (FSDP
// weights, 3-D activations folded into rows, gathered lhs rows, products over several
// dimensions, weights' gradients), which do not (a gather read twice), numerics against the
// unsharded program, and the overlap's gain on the network.
#include "planner/collective_matmul.h"

#include <gtest/gtest.h>

#include "collectives/ir/program_builder.h"
#include "collectives/runtime/run_program.h"
#include "planner/partitioned_numerics.h"
#include "tests/planner/partition_test_support.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

// FSDP over 4: x [b, d] and w [d, f] both split along their first dimension; y = x @ w keeps
// x's rows split, so w is all-gathered along its rows (d, the contracting dimension).
ProgramSpec FsdpMatmul(Shape x, int64_t f, const std::string& spec = "") {
  ProgramBuilder b({{"fsdp", 4}}, {}, ProgramMode::kAuto);
  std::vector<std::vector<std::string>> x_spec(x.size());
  x_spec[0] = {"fsdp"};
  const int64_t d = x.back();
  b.Input("x", x, DType::kF32, P(x_spec), Normal(0));
  b.Input("w", {d, f}, DType::kF32, P({{"fsdp"}, {}}), Normal(1));
  if (spec.empty()) {
    b.Matmul("x", "w", "y");
  } else {
    b.Einsum(spec, "x", "w", "y");
  }
  b.Output("y", P(x_spec));
  return std::move(b).Build();
}

struct Fused {
  PartitionResult partitioned;
  int count = 0;
};

Fused PartitionAndFuse(const ProgramSpec& global, const Machine& machine, const Mesh& mesh,
                       CollectiveMatmulMode mode) {
  Fused f;
  f.partitioned = PartitionOnMachine(global, machine, mesh);
  f.count = FuseCollectiveMatmuls(f.partitioned, mesh, mode);
  return f;
}

int Count(const ProgramSpec& program, OpKind kind) {
  int n = 0;
  for (const OpSpec& op : program.ops) n += op.kind == kind;
  return n;
}

// y = x @ w, both bf16 [size, size] split along their rows over fsdp 4.
ProgramSpec SquareFsdpMatmul(int64_t size) {
  ProgramBuilder b({{"fsdp", 4}}, {}, ProgramMode::kAuto);
  b.Input("x", {size, size}, DType::kBF16, P({{"fsdp"}, {}}));
  b.Input("w", {size, size}, DType::kBF16, P({{"fsdp"}, {}}));
  b.Matmul("x", "w", "y");
  b.Output("y", P({{"fsdp"}, {}}));
  return std::move(b).Build();
}

TEST(CollectiveMatmulTest, FsdpWeightGatherFusesWithItsMatmul) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  const ProgramSpec global = FsdpMatmul({64, 128}, 96);
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  for (CollectiveMatmulMode mode :
       {CollectiveMatmulMode::kUnidirectional, CollectiveMatmulMode::kBidirectional}) {
    SCOPED_TRACE(CollectiveMatmulModeName(mode));
    Fused f = PartitionAndFuse(global, machine, mesh, mode);
    EXPECT_EQ(f.count, 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllGather), 0);
    ASSERT_EQ(Count(f.partitioned.program, OpKind::kAllgatherMatmul), 1);
    for (size_t i = 0; i < f.partitioned.program.ops.size(); ++i) {
      const OpSpec& op = f.partitioned.program.ops[i];
      if (op.kind != OpKind::kAllgatherMatmul) continue;
      EXPECT_EQ(op.gather, "rhs");
      EXPECT_EQ(op.axis, 0);  // w's rows: the contracting dimension.
      EXPECT_EQ(op.variant, CollectiveMatmulModeName(mode));
      EXPECT_EQ(op.name, "y");
      EXPECT_NE(f.partitioned.reasons[i].find("fused with the all_gather of w over fsdp"),
                std::string::npos)
          << f.partitioned.reasons[i];
    }
    ExpectNumericsPass(global, f.partitioned, machine, mesh);
  }
  // Off leaves the program as the partitioner made it.
  Fused off = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kOff);
  EXPECT_EQ(off.count, 0);
  EXPECT_EQ(Count(off.partitioned.program, OpKind::kAllGather), 1);
}

// Tensor parallelism over 4 with the contraction split on both sides: x [.., 256@tp] @ w [256@tp,
// 64] leaves partial sums, and an output split along `out_dim` over tp makes the partitioner
// psum_scatter the product there.
ProgramSpec RowParallelMatmul(Shape x, int64_t out_dim) {
  ProgramBuilder b({{"tp", 4}}, {}, ProgramMode::kAuto);
  std::vector<std::vector<std::string>> x_spec(x.size()), y_spec(x.size());
  x_spec.back() = {"tp"};
  y_spec[static_cast<size_t>(out_dim)] = {"tp"};
  b.Input("x", x, DType::kF32, P(x_spec), Normal(0));
  b.Input("w", {x.back(), 64}, DType::kF32, P({{"tp"}, {}}), Normal(1));
  std::string spec = x.size() == 2 ? "md,df->mf" : "btd,df->btf";
  b.Einsum(spec, "x", "w", "y");
  b.Output("y", P(y_spec));
  return std::move(b).Build();
}

// The product and the psum_scatter of it fuse into one matmul_reduce_scatter: along rows
// ([64, 256] x [256, 64] scattered along 0), along columns (1), and for [1, 64, 256]
// activations along the sequence (dimension 1: rows, the leading dimension being 1); each
// computes what the unsharded program computes. With two sequences ([2, 64, 256]) the
// sequence blocks are not contiguous rows: the sequence is moved to the front of x first and
// back in the result after (two fused transposes, Megatron's sequence-first layout).
TEST(CollectiveMatmulTest, ReduceScatterFusesWithItsProduct) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  struct Case {
    Shape x;
    int64_t out_dim;
    int64_t scatter_dimension;  // Of the 2-D loop.
    int transposes;
  };
  for (const Case& c : {Case{{64, 256}, 0, 0, 0}, Case{{64, 256}, 1, 1, 0},
                        Case{{1, 64, 256}, 1, 0, 0}, Case{{2, 64, 256}, 1, 0, 2}}) {
    SCOPED_TRACE(FormatShape(c.x) + " out dim " + std::to_string(c.out_dim));
    const ProgramSpec global = RowParallelMatmul(c.x, c.out_dim);
    Mesh mesh = PlaceMesh(machine, global.mesh_axes);
    Fused f = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
    EXPECT_EQ(f.count, 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kTranspose), c.transposes);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kPsumScatter), 0);
    for (size_t i = 0; i < f.partitioned.program.ops.size(); ++i) {
      const OpSpec& op = f.partitioned.program.ops[i];
      if (op.kind != OpKind::kMatmulReduceScatter) continue;
      EXPECT_EQ(op.scatter_dimension, c.scatter_dimension);
      EXPECT_EQ(op.variant, "bidirectional");
      EXPECT_NE(f.partitioned.reasons[i].find("fused with the psum_scatter of its result over tp"),
                std::string::npos)
          << f.partitioned.reasons[i];
    }
    ASSERT_EQ(Count(f.partitioned.program, OpKind::kMatmulReduceScatter), 1);
    ExpectNumericsPass(global, f.partitioned, machine, mesh);
  }
}

// A [b, t, d] activation (einsum "btd,df->btf") is folded into [b t, d] rows around the loop.
TEST(CollectiveMatmulTest, LeadingDimensionsFoldIntoRows) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  const ProgramSpec global = FsdpMatmul({8, 16, 64}, 32, "btd,df->btf");
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  Fused f = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
  EXPECT_EQ(f.count, 1);
  EXPECT_EQ(Count(f.partitioned.program, OpKind::kReshape), 2);
  EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllgatherMatmul), 1);
  ExpectNumericsPass(global, f.partitioned, machine, mesh);
}

// Products over several dimensions fold them with free reshapes: the attention's projections
// "btd,dhk->bthk" (w's kept heads and head dimension folded into columns) and
// "bthk,hkd->btd" (the contraction over heads and head dimension folded), with w gathered
// over fsdp along its first contracted dimension (rows of the loop's w) or its kept one
// (columns), and the row-parallel form under tensor parallelism scattered along the sequence.
// An activation's gradient reads w transposed ("btf,df->btd", "bthk,dhk->btd"): its local
// block is turned by a transpose and the loop gathers the columns of w^T (FSDP's rows of w),
// or scatters the product along the sequence; gathered along the sequence (one sequence per
// device), the activation's row blocks travel instead. Each computes what the unsharded
// program computes. A weight's gradient ("btd,bthk->dhk", contracting the leading dimensions)
// reads its activation transposed: its local block is turned and the loop scatters the
// product's rows or columns; with the operands the other way round ("bthk,btd->dhk") the
// second operand is the loop's x.
TEST(CollectiveMatmulTest, SeveralContractedOrKeptDimensionsFold) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  struct Case {
    std::string name;
    std::string axis;  // Mesh axis (size 4).
    std::string spec;
    Shape x, w;
    std::vector<std::vector<std::string>> x_split, w_split, y_split;
    OpKind fused;  // kPsumScatter: nothing fuses.
    int64_t loop_axis;
    int turns = 0;  // Transposes of local blocks: w read transposed, x read transposed.
  };
  const std::vector<Case> cases = {
      {"qkv_projection",
       "fsdp",
       "btd,dhk->bthk",
       {4, 8, 64},
       {64, 4, 16},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}, {}},
       OpKind::kAllgatherMatmul,
       0},
      {"out_projection",
       "fsdp",
       "bthk,hkd->btd",
       {4, 8, 4, 16},
       {4, 16, 64},
       {{"fsdp"}, {}, {}, {}},
       {{}, {}, {"fsdp"}},
       {{"fsdp"}, {}, {}},
       OpKind::kAllgatherMatmul,
       1},
      {"out_projection_sequence_scatter",
       "tp",
       "bthk,hkd->btd",
       {1, 8, 4, 16},
       {4, 16, 64},
       {{}, {}, {"tp"}, {}},
       {{"tp"}, {}, {}},
       {{}, {"tp"}, {}},
       OpKind::kMatmulReduceScatter,
       0},
      {"activation_gradient",
       "fsdp",
       "btf,df->btd",
       {4, 8, 32},
       {64, 32},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}},
       {{"fsdp"}, {}, {}},
       OpKind::kAllgatherMatmul,
       1,
       1},
      {"activation_gradient_2d",
       "fsdp",
       "bf,df->bd",
       {32, 32},
       {64, 32},
       {{"fsdp"}, {}},
       {{"fsdp"}, {}},
       {{"fsdp"}, {}},
       OpKind::kAllgatherMatmul,
       1,
       1},
      {"activation_gradient_of_a_projection",
       "fsdp",
       "bthk,dhk->btd",
       {4, 8, 4, 16},
       {64, 4, 16},
       {{"fsdp"}, {}, {}, {}},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}},
       OpKind::kAllgatherMatmul,
       1,
       1},
      {"activation_gradient_sequence_scatter",
       "tp",
       "btf,df->btd",
       {1, 8, 32},
       {64, 32},
       {{}, {}, {"tp"}},
       {{}, {"tp"}},
       {{}, {"tp"}, {}},
       OpKind::kMatmulReduceScatter,
       0,
       1},
      {"sequence_travels",
       "tp",
       "btf,df->btd",
       {1, 8, 32},
       {64, 32},
       {{}, {"tp"}, {}},
       {{"tp"}, {}},
       {{}, {}, {"tp"}},
       OpKind::kAllgatherMatmul,
       0,
       1},
      // Two sequences a device: the sequence moved to the front of the travelling block and
      // back in the result (two more transposes).
      {"two_sequences_travel",
       "tp",
       "btf,df->btd",
       {2, 8, 32},
       {64, 32},
       {{}, {"tp"}, {}},
       {{"tp"}, {}},
       {{}, {}, {"tp"}},
       OpKind::kAllgatherMatmul,
       0,
       3},
      {"two_sequences_scatter",
       "tp",
       "btf,df->btd",
       {2, 8, 32},
       {64, 32},
       {{}, {}, {"tp"}},
       {{}, {"tp"}},
       {{}, {"tp"}, {}},
       OpKind::kMatmulReduceScatter,
       0,
       3},
      // A weight's gradient: the activation read transposed (its contracted batch and
      // sequence lead), the product's rows (d) or columns (f, d) scattered.
      {"weight_gradient",
       "fsdp",
       "btd,bthk->dhk",
       {4, 8, 64},
       {4, 8, 4, 16},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}, {}},
       {{"fsdp"}, {}, {}},
       OpKind::kMatmulReduceScatter,
       0,
       1},
      {"weight_gradient_gradient_first",
       "fsdp",
       "bthk,btd->dhk",
       {4, 8, 4, 16},
       {4, 8, 64},
       {{"fsdp"}, {}, {}, {}},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}},
       OpKind::kMatmulReduceScatter,
       0,
       1},
      {"weight_gradient_columns",
       "fsdp",
       "btf,btd->fd",
       {4, 8, 32},
       {4, 8, 64},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}},
       {{}, {"fsdp"}},
       OpKind::kMatmulReduceScatter,
       1,
       1},
      {"weight_gradient_of_the_out_projection",
       "fsdp",
       "btd,bthk->hkd",
       {4, 8, 64},
       {4, 8, 4, 16},
       {{"fsdp"}, {}, {}},
       {{"fsdp"}, {}, {}, {}},
       {{}, {}, {"fsdp"}},
       OpKind::kMatmulReduceScatter,
       1,
       1},
      {"weight_gradient_2d",
       "fsdp",
       "bd,bf->df",
       {32, 64},
       {32, 16},
       {{"fsdp"}, {}},
       {{"fsdp"}, {}},
       {{"fsdp"}, {}},
       OpKind::kMatmulReduceScatter,
       0,
       1},
      // Both operands read transposed: two turns.
      {"both_transposed",
       "fsdp",
       "bd,fb->df",
       {32, 64},
       {16, 32},
       {{"fsdp"}, {}},
       {{}, {"fsdp"}},
       {{"fsdp"}, {}},
       OpKind::kMatmulReduceScatter,
       0,
       2},
      // x read transposed and kept whole while w's columns are gathered (the result cheaper to
      // make from 8 gathered rows of w than to gather whole).
      {"transposed_x_meets_gathered_columns",
       "fsdp",
       "bd,bf->df",
       {8, 64},
       {8, 64},
       {{}, {}},
       {{}, {"fsdp"}},
       {{}, {}},
       OpKind::kAllgatherMatmul,
       1,
       1},
      // Contracted letters neither leading nor closing x: not a product.
      {"contraction_in_the_middle",
       "fsdp",
       "tbd,bf->tdf",
       {8, 32, 64},
       {32, 16},
       {{}, {"fsdp"}, {}},
       {{"fsdp"}, {}},
       {{"fsdp"}, {}, {}},
       OpKind::kPsumScatter,
       -1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ProgramBuilder b({{c.axis, 4}}, {}, ProgramMode::kAuto);
    b.Input("x", c.x, DType::kF32, P(c.x_split), Normal(0));
    b.Input("w", c.w, DType::kF32, P(c.w_split), Normal(1));
    b.Einsum(c.spec, "x", "w", "y");
    b.Output("y", P(c.y_split));
    const ProgramSpec global = std::move(b).Build();
    Mesh mesh = PlaceMesh(machine, global.mesh_axes);
    Fused f = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
    if (c.fused == OpKind::kPsumScatter) {
      EXPECT_EQ(f.count, 0);
      EXPECT_EQ(Count(f.partitioned.program, OpKind::kPsumScatter), 1);
      continue;
    }
    EXPECT_EQ(f.count, 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllGather), 0);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kPsumScatter), 0);
    ASSERT_EQ(Count(f.partitioned.program, c.fused), 1);
    // Only an operand read transposed is turned, once (its local block), and a row dimension
    // moved to the front and back, each by a fused transpose.
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kTranspose), c.turns);
    for (const OpSpec& op : f.partitioned.program.ops) {
      if (op.kind == OpKind::kTranspose) {
        EXPECT_TRUE(op.fused) << op.name;
      }
    }
    for (const OpSpec& op : f.partitioned.program.ops) {
      if (op.kind == OpKind::kAllgatherMatmul) {
        EXPECT_EQ(op.axis, c.loop_axis);
      } else if (op.kind == OpKind::kMatmulReduceScatter) {
        EXPECT_EQ(op.scatter_dimension, c.loop_axis);
      }
    }
    ExpectNumericsPass(global, f.partitioned, machine, mesh);
  }
}

// An odd travelling block (d / 4 = 3 rows of w) cannot be halved: bidirectional falls back to
// one way.
TEST(CollectiveMatmulTest, OddBlocksTravelOneWay) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  const ProgramSpec global = FsdpMatmul({8, 12}, 8);
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  Fused f = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
  ASSERT_EQ(f.count, 1);
  for (const OpSpec& op : f.partitioned.program.ops) {
    if (op.kind == OpKind::kAllgatherMatmul) {
      EXPECT_EQ(op.variant, "unidirectional");
    }
  }
  ExpectNumericsPass(global, f.partitioned, machine, mesh);
}

// A gathered weight read by two products (or kept as an output) stays a blocking gather: the
// loop would gather it twice.
TEST(CollectiveMatmulTest, GatherReadTwiceIsNotFused) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  ProgramBuilder b({{"fsdp", 4}}, {}, ProgramMode::kAuto);
  b.Input("x", {64, 128}, DType::kF32, P({{"fsdp"}, {}}), Normal(0));
  b.Input("z", {64, 128}, DType::kF32, P({{"fsdp"}, {}}), Normal(2));
  b.Input("w", {128, 96}, DType::kF32, P({{"fsdp"}, {}}), Normal(1));
  b.Matmul("x", "w", "y1");
  b.Matmul("z", "w", "y2");
  b.Output("y1", P({{"fsdp"}, {}}));
  b.Output("y2", P({{"fsdp"}, {}}));
  const ProgramSpec global = std::move(b).Build();
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  PartitionResult p = PartitionOnMachine(global, machine, mesh);
  const int gathers = Count(p.program, OpKind::kAllGather);
  ASSERT_GE(gathers, 1);
  // Reshards are reused: one gather of w feeds both products, so nothing fuses.
  if (gathers == 1) {
    EXPECT_EQ(FuseCollectiveMatmuls(p, mesh, CollectiveMatmulMode::kBidirectional), 0);
  }
}

// An activation gathered once and read by several products (sequence parallelism's q, k and v
// projections) fuses with all of them: their weights side by side (a fused concatenation, one
// of them read transposed and turned), one loop, and each result a fused slice of its columns.
// Whatever the sequences a device holds (with two, the sequence is moved to the front and
// back) and whether x is 2-D, each result is the unsharded program's.
TEST(CollectiveMatmulTest, GatherReadBySeveralProductsFusesWithAll) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  for (const Shape& x : {Shape{1, 8, 32}, Shape{2, 8, 32}, Shape{16, 32}}) {
    SCOPED_TRACE(FormatShape(x));
    const bool three_d = x.size() == 3;
    ProgramBuilder b({{"tp", 4}}, {}, ProgramMode::kAuto);
    b.Input("x", x, DType::kF32, three_d ? P({{}, {"tp"}, {}}) : P({{"tp"}, {}}), Normal(0));
    b.Input("wq", {32, 16}, DType::kF32, P({{}, {"tp"}}), Normal(1));
    b.Input("wk", {32, 4, 8}, DType::kF32, P({{}, {"tp"}, {}}), Normal(2));
    b.Input("wv", {24, 32}, DType::kF32, P({{"tp"}, {}}), Normal(3));
    b.Einsum(three_d ? "btd,df->btf" : "td,df->tf", "x", "wq", "q");
    b.Einsum(three_d ? "btd,dhk->bthk" : "td,dhk->thk", "x", "wk", "k");
    b.Einsum(three_d ? "btd,fd->btf" : "td,fd->tf", "x", "wv", "v");
    const size_t r = x.size();
    std::vector<std::vector<std::string>> last(r), heads(r + 1);
    last[r - 1] = {"tp"};
    heads[r - 1] = {"tp"};
    b.Output("q", P(last));
    b.Output("k", P(heads));
    b.Output("v", P(last));
    const ProgramSpec global = std::move(b).Build();
    Mesh mesh = PlaceMesh(machine, global.mesh_axes);
    PartitionResult plain = PartitionOnMachine(global, machine, mesh);
    ASSERT_EQ(Count(plain.program, OpKind::kAllGather), 1);
    Fused f = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
    EXPECT_EQ(f.count, 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllGather), 0);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllgatherMatmul), 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kConcatenate), 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kSlice), 3);
    // wv turned; with two sequences, x's block and the three results permuted.
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kTranspose), x[0] == 2 ? 5 : 1);
    for (const OpSpec& op : f.partitioned.program.ops) {
      if (op.kind == OpKind::kConcatenate || op.kind == OpKind::kSlice ||
          op.kind == OpKind::kTranspose) {
        EXPECT_TRUE(op.fused) << op.name;
      }
    }
    ExpectNumericsPass(global, f.partitioned, machine, mesh);
  }
}

// As a step casts each weight to the compute dtype just before its product, the casts of k's
// and v's weights come between the products: they are made before the first instead, once
// each, and the loop fuses all three. A weight computed from a value the program computes
// between the products (k's cast weight, then its exp) is not moved: the gather stays.
TEST(CollectiveMatmulTest, SharedGatherCastsLaterWeightsFirst) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  for (bool computed : {false, true}) {
    SCOPED_TRACE(computed);
    ProgramBuilder b({{"tp", 4}}, {}, ProgramMode::kAuto);
    b.Input("x", {1, 8, 32}, DType::kBF16, P({{}, {"tp"}, {}}), Normal(0));
    std::vector<std::string> results;
    for (const char* name : {"q", "k", "v"}) {
      const std::string w = std::string("w") + name;
      b.Input(w, {32, 16}, DType::kF32, P({{}, {"tp"}}), Normal(1));
      OpSpec cast;
      cast.kind = OpKind::kConvert;
      cast.in = {w};
      cast.out = {w + "_c"};
      cast.dtype = "bf16";
      b.Add(cast);
      std::string read = w + "_c";
      if (computed && std::string(name) == "k") read = b.Unary(OpKind::kExp, read, "wk_exp");
      b.Einsum("btd,df->btf", "x", read, name);
      b.Output(name, P({{}, {}, {"tp"}}));
    }
    const ProgramSpec global = std::move(b).Build();
    Mesh mesh = PlaceMesh(machine, global.mesh_axes);
    Fused f = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
    if (computed) {
      EXPECT_EQ(f.count, 0);
      EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllGather), 1);
      continue;
    }
    ASSERT_EQ(f.count, 1);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kConvert), 3);
    EXPECT_EQ(Count(f.partitioned.program, OpKind::kAllgatherMatmul), 1);
    // The three casts come before the loop's weights are set side by side.
    const auto& ops = f.partitioned.program.ops;
    size_t converts = 0;
    for (const OpSpec& op : ops) {
      if (op.kind == OpKind::kConvert) ++converts;
      if (op.kind == OpKind::kConcatenate) {
        EXPECT_EQ(converts, 3u);
      }
    }
    ExpectNumericsPass(global, f.partitioned, machine, mesh);
  }
}

// The point of it: with the gather as long as the product, the overlapped loop ends sooner
// than gather-then-multiply on the same network (v5e, 4 chips in a line, bf16 weights).
TEST(CollectiveMatmulTest, OverlapShortensTheStep) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  const ProgramSpec global = SquareFsdpMatmul(4096);
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  Fused blocking = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kOff);
  Fused fused = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
  ASSERT_EQ(fused.count, 1);
  const Time t_blocking = RunProgram(machine, mesh, blocking.partitioned.program, {}).end;
  const Time t_fused = RunProgram(machine, mesh, fused.partitioned.program, {}).end;
  EXPECT_LT(t_fused, t_blocking);
}

// `global` on a TPU v5e 4x1 partitioned three ways: collective matmuls off, bidirectional, and
// auto (timing each pair both ways); how many auto fused, and each program's simulated time.
struct ModeTimes {
  int auto_fused = 0;
  Time blocking, loop, automatic;
};

ModeTimes TimeModes(const ProgramSpec& global) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  Fused blocking = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kOff);
  Fused loop = PartitionAndFuse(global, machine, mesh, CollectiveMatmulMode::kBidirectional);
  PartitionResult automatic = PartitionOnMachine(global, machine, mesh);
  ModeTimes t;
  t.auto_fused =
      FuseCollectiveMatmuls(automatic, mesh, CollectiveMatmulMode::kAuto, &machine, &cache);
  t.blocking = RunProgram(machine, mesh, blocking.partitioned.program, {}).end;
  t.loop = RunProgram(machine, mesh, loop.partitioned.program, {}).end;
  t.automatic = RunProgram(machine, mesh, automatic.program, {}).end;
  return t;
}

// auto times each pair both ways on the machine: the 32 MiB weight above (transfer-bound) goes
// into the loop, whose step is then the bidirectional one's; a tiny product, where the loop's
// n partial products and shifts each pay their fixed costs, stays blocking.
TEST(CollectiveMatmulTest, AutoKeepsTheFasterWay) {
  for (int64_t size : {4096, 64}) {
    SCOPED_TRACE(size);
    const ModeTimes t = TimeModes(SquareFsdpMatmul(size));
    EXPECT_EQ(t.auto_fused, size == 4096 ? 1 : 0);
    EXPECT_EQ(t.automatic, std::min(t.blocking, t.loop));
  }
}

// Where the step prefetches its weight collectives, auto leaves a weight's gather to
// prefetching (the 32 MiB weight above, whose loop is faster alone, stays blocking), and still
// times the rest (a row-parallel product's scatter, whose loop is faster: fused either way).
TEST(CollectiveMatmulTest, AutoLeavesPrefetchedWeightGathersBlocking) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  const ProgramSpec weight = SquareFsdpMatmul(4096);
  Mesh mesh = PlaceMesh(machine, weight.mesh_axes);
  PartitionResult p = PartitionOnMachine(weight, machine, mesh);
  ASSERT_EQ(Count(p.program, OpKind::kAllGather), 1);
  EXPECT_EQ(FuseCollectiveMatmuls(p, mesh, CollectiveMatmulMode::kAuto, &machine, &cache, true), 0);
  EXPECT_EQ(Count(p.program, OpKind::kAllGather), 1);
  // A product's scatter (row-parallel, partial sums over tp) is no weight's: still timed.
  const ProgramSpec row_parallel = RowParallelMatmul({4096, 1024}, 0);
  Mesh tp = PlaceMesh(machine, row_parallel.mesh_axes);
  PartitionResult q = PartitionOnMachine(row_parallel, machine, tp);
  PartitionResult unprefetched = q;
  const int fused =
      FuseCollectiveMatmuls(unprefetched, tp, CollectiveMatmulMode::kAuto, &machine, &cache);
  EXPECT_EQ(fused, 1);
  EXPECT_EQ(FuseCollectiveMatmuls(q, tp, CollectiveMatmulMode::kAuto, &machine, &cache, true),
            fused);
}

// A weight's gradient under FSDP over 4: the activation x [b, t, d] and the output's gradient
// g [b, t, f], both split along the batch, contract over the tokens ("btf,btd->df", the
// operands in the order autodiff writes them); the
// gradient kept split along d makes the partitioner psum_scatter the product there.
ProgramSpec WeightGradient(int64_t tokens, int64_t d, int64_t f) {
  ProgramBuilder b({{"fsdp", 4}}, {}, ProgramMode::kAuto);
  b.Input("x", {4, tokens, d}, DType::kBF16, P({{"fsdp"}, {}, {}}));
  b.Input("g", {4, tokens, f}, DType::kBF16, P({{"fsdp"}, {}, {}}));
  b.Einsum("btf,btd->df", "g", "x", "dw");
  b.Output("dw", P({{"fsdp"}, {}}));
  return std::move(b).Build();
}

// Auto times a weight's gradient scatter like any other where nothing schedules the step (this
// one's loop beats the blocking product and scatter: 1024 tokens a device keep the product long
// enough to hide the shifts); where the step prefetches its weight collectives (a training step,
// whose weight gradients nothing reads until the optimizer), it leaves the scatter blocking to
// overlap the backward after it, while the explicit modes still fuse it.
TEST(CollectiveMatmulTest, AutoLeavesScheduledWeightGradientScattersBlocking) {
  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  const ProgramSpec global = WeightGradient(1024, 2048, 2048);
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  const ModeTimes t = TimeModes(global);
  EXPECT_EQ(t.auto_fused, 1);
  EXPECT_EQ(t.automatic, t.loop);
  PartitionResult p = PartitionOnMachine(global, machine, mesh);
  ASSERT_EQ(Count(p.program, OpKind::kPsumScatter), 1);
  PartitionResult explicit_loop = p;
  EXPECT_EQ(FuseCollectiveMatmuls(p, mesh, CollectiveMatmulMode::kAuto, &machine, &cache, true), 0);
  EXPECT_EQ(Count(p.program, OpKind::kPsumScatter), 1);
  EXPECT_EQ(FuseCollectiveMatmuls(explicit_loop, mesh, CollectiveMatmulMode::kBidirectional,
                                  &machine, &cache, true),
            1);
  EXPECT_EQ(Count(explicit_loop.program, OpKind::kMatmulReduceScatter), 1);
}

// Auto on a reduce-scatter keeps whichever of blocking and the loop runs faster, as for gathers:
// the program it leaves takes the smaller of the two times.
TEST(CollectiveMatmulTest, AutoKeepsTheFasterReduceScatter) {
  for (int64_t rows : {4096, 16}) {
    SCOPED_TRACE(rows);
    const ModeTimes t = TimeModes(RowParallelMatmul({rows, 1024}, 0));
    EXPECT_EQ(t.automatic, std::min(t.blocking, t.loop));
  }
}

TEST(CollectiveMatmulTest, ModeNames) {
  CollectiveMatmulMode mode = CollectiveMatmulMode::kOff;
  for (const char* name : {"off", "unidirectional", "bidirectional", "auto"}) {
    ASSERT_TRUE(ParseCollectiveMatmulMode(name, &mode)) << name;
    EXPECT_STREQ(CollectiveMatmulModeName(mode), name);
  }
  EXPECT_FALSE(ParseCollectiveMatmulMode("windowed", &mode));
}

}  // namespace
}  // namespace shardsim::planner
