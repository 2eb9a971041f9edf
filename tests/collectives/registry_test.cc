// The op and algorithm registries: one entry per op kind in order, names that round-trip, keys
// and arities the loader reads from them, and algorithm support decided before a run.
#include <gtest/gtest.h>

#include "collectives/algorithm.h"
#include "collectives/ir/op_registry.h"
#include "collectives/ir/program_builder.h"
#include "collectives/lowering.h"
#include "sim/spec_error.h"

namespace shardsim {
namespace {

TEST(OpRegistryTest, EveryKindHasItsEntry) {
  const std::vector<OpDef>& ops = OpRegistry();
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(ops[i].kind), i) << ops[i].name;
    EXPECT_STREQ(OpKindName(ops[i].kind), ops[i].name);
    if (ops[i].user_visible) {
      ASSERT_NE(FindOp(ops[i].name), nullptr) << ops[i].name;
      EXPECT_EQ(FindOp(ops[i].name)->kind, ops[i].kind);
    } else {
      EXPECT_EQ(FindOp(ops[i].name), nullptr) << "internal op found by name: " << ops[i].name;
    }
  }
  EXPECT_EQ(FindOp("psum")->collective, CollectiveKind::kAllReduce);
  EXPECT_EQ(FindOp("pmin")->reduce, ReduceOp::kMin);
  EXPECT_EQ(FindOp("psum_scatter")->collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(FindOp("reshape")->stream, OpStream::kFree);
  EXPECT_TRUE(FindOp("add")->elementwise);
  EXPECT_FALSE(FindOp("matmul")->elementwise);
}

TEST(OpRegistryTest, KeysAndArity) {
  EXPECT_EQ(OpKeys(OpKind::kAllToAll),
            (std::vector<std::string>{"op", "in", "out", "name", "where", "axis_name", "split_axis",
                                      "concat_axis", "tiled", "algorithm"}));
  EXPECT_EQ(OpKeys(OpKind::kAxisIndex),
            (std::vector<std::string>{"op", "out", "name", "where", "axis_name"}));
  OpSpec add;
  add.kind = OpKind::kAdd;
  add.in = {"a"};
  EXPECT_EQ(CheckArity(add), "add takes in: [a, b], or in: a with scalar:, got 1 input and no scalar");
  add.scalar = 1.0;
  EXPECT_EQ(CheckArity(add), "");
  OpSpec concat;
  concat.kind = OpKind::kConcatenate;
  concat.in = {"a"};
  EXPECT_EQ(CheckArity(concat), "concatenate takes at least 2 inputs, got 1");
}

TEST(AlgorithmRegistryTest, SupportIsDecidedByTheEntry) {
  EXPECT_EQ(AlgorithmSupports("ring", CollectiveKind::kAllGather, 6), "");
  EXPECT_EQ(AlgorithmSupports("auto", CollectiveKind::kPermute, 3), "");
  EXPECT_EQ(AlgorithmSupports("halving_doubling", CollectiveKind::kAllReduce, 6),
            "halving_doubling needs a power-of-two group, got 6 devices");
  EXPECT_EQ(AlgorithmSupports("tree", CollectiveKind::kAllGather, 4),
            "tree implements all-reduce only (psum, pmean, pmax, pmin), not all_gather");
  EXPECT_EQ(AlgorithmSupports("ring", CollectiveKind::kAllToAll, 4),
            "ring does not implement all_to_all; use direct");
  std::vector<std::string> names = AlgorithmNames();
  EXPECT_EQ(names.back(), "auto");
  EXPECT_EQ(names.size(), AlgorithmRegistry().size() + 1);
}

// An algorithm that cannot run an op is refused when the program is lowered, naming the key.
TEST(AlgorithmRegistryTest, RefusedAtLowering) {
  ProgramBuilder b({{"dp", 6}});
  b.Input("x", {6, 4}, DType::kF32, PartitionSpec{{{"dp"}}});
  OpSpec op;
  op.kind = OpKind::kPsum;
  op.in = {"x"};
  op.axis_name = {"dp"};
  op.algorithm = "halving_doubling";
  b.Add(op);
  b.Output("v0", PartitionSpec{{{"dp"}}});
  ProgramSpec program = std::move(b).Build();
  Mesh mesh(program.mesh_axes, {0, 1, 2, 3, 4, 5});
  try {
    LowerProgram(mesh, program);
    FAIL() << "lowered";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "program.0.algorithm");
    EXPECT_NE(std::string(e.what()).find("power-of-two"), std::string::npos) << e.what();
  }
  // The run's default for psum is checked too, and blamed on the op.
  program.ops[0].algorithm.clear();
  try {
    LowerProgram(mesh, program, {{"all_reduce", "halving_doubling"}});
    FAIL() << "lowered";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "program.0");
  }
}

TEST(ProgramBuilderTest, ChecksNamesAndArity) {
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {4, 4}, DType::kF32, PartitionSpec{});
  EXPECT_THROW(b.Matmul("x", "nope"), SpecError);
  OpSpec one;
  one.kind = OpKind::kMatmul;
  one.in = {"x"};
  EXPECT_THROW(b.Add(one), SpecError);
  EXPECT_THROW(b.Input("x", {1}, DType::kF32, PartitionSpec{}), SpecError);
  std::string y = b.Matmul("x", "x");
  EXPECT_EQ(y, "v0");
  // Refused ops leave nothing behind: the matmul is the program's first op.
  EXPECT_EQ(b.program().ops.size(), 1u);
  EXPECT_EQ(b.program().ops.back().key, "program.0");
}

}  // namespace
}  // namespace shardsim
