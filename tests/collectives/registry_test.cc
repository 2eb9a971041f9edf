// The op and algorithm registries: one entry per op kind in order, names that round-trip, typed
// attributes, keys and arities the loader reads from them, attributes the builder checks, and
// algorithm support decided before a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

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
            (std::vector<std::string>{"op", "in", "out", "name", "where", "mesh", "axis_name",
                                      "split_axis", "concat_axis", "tiled", "algorithm"}));
  EXPECT_EQ(OpKeys(OpKind::kAxisIndex),
            (std::vector<std::string>{"op", "out", "name", "where", "mesh", "axis_name"}));
  OpSpec add;
  add.kind = OpKind::kAdd;
  add.in = {"a"};
  EXPECT_EQ(CheckArity(add),
            "add takes in: [a, b], or in: a with scalar:, got 1 input and no scalar");
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

// A value of each attribute type, as the loader would read it.
AttrValue SampleValue(const AttrDef& attr) {
  switch (attr.type) {
    case AttrType::kInt:
    case AttrType::kNonNegativeInt:
    case AttrType::kPositiveInt:
      return int64_t{1};
    case AttrType::kBool:
      return true;
    case AttrType::kIntList:
    case AttrType::kShape:
    case AttrType::kAxisList:
      return std::vector<int64_t>{1, 0};
    case AttrType::kString:
      return std::string("ab,bc->ac");
    case AttrType::kOneOf:
      return std::string(attr.values.at(0));
    case AttrType::kNumber:
    case AttrType::kBytes:
      return 1.5;
    case AttrType::kPerm:
      return std::vector<std::pair<int, int>>{{0, 1}};
    case AttrType::kSharding:
      return PartitionSpec{{{"dp"}}};
    case AttrType::kValueName:
      return std::string("x");
    case AttrType::kValueNames:
      return std::vector<std::string>{"x"};
  }
  return int64_t{0};
}

TEST(OpAttrsTest, AttributesAreUniqueTypedAndStorable) {
  const std::set<std::string> common = {"op",    "in",        "out",      "name",
                                        "where", "axis_name", "algorithm"};
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    SCOPED_TRACE(def.name);
    std::set<std::string> names;
    for (const AttrDef& attr : def.attrs) {
      EXPECT_TRUE(names.insert(attr.name).second) << "twice: " << attr.name;
      EXPECT_EQ(common.count(attr.name), 0u) << attr.name << " is a key of every op";
      EXPECT_NE(std::string(attr.doc), "") << attr.name;
      if (attr.type == AttrType::kOneOf) {
        ASSERT_FALSE(attr.values.empty()) << attr.name;
        // An optional one's OpSpec default is one of the values.
        const std::string default_value = OpSpec{}.*std::get<std::string OpSpec::*>(attr.field);
        if (!attr.required) {
          EXPECT_TRUE(std::any_of(attr.values.begin(), attr.values.end(),
                                  [&](const char* v) { return default_value == v; }))
              << attr.name << " defaults to " << default_value;
        }
      } else {
        EXPECT_TRUE(attr.values.empty()) << attr.name;
      }
      if (attr.type == AttrType::kIntList || attr.type == AttrType::kShape ||
          attr.type == AttrType::kPerm || attr.type == AttrType::kValueNames ||
          attr.type == AttrType::kAxisList) {
        EXPECT_NE(attr.expected, nullptr) << attr.name << " needs its expected form";
      }
      // The field holds what the type reads.
      OpSpec op;
      op.kind = def.kind;
      EXPECT_NO_THROW(SetAttr(op, attr, SampleValue(attr))) << attr.name;
      EXPECT_EQ(FindAttr(def, attr.name), &attr);
    }
    for (const ExactlyOneOf& group : def.exactly_one_of) {
      EXPECT_GE(group.names.size(), 2u);
      for (const char* name : group.names) {
        ASSERT_NE(FindAttr(def, name), nullptr) << name;
        EXPECT_FALSE(FindAttr(def, name)->required) << name << " is in an exactly-one-of group";
      }
    }
    // Several outputs come from an attribute (split's sections), the entry's fixed count, or
    // (shard_map) the body's outputs.
    EXPECT_EQ(def.output_count != nullptr || def.outputs > 1 || def.kind == OpKind::kShardMap,
              def.multi_output);
    EXPECT_GE(def.outputs, 1);
    if (def.written_as) {  // Another op's name: the alias must not shadow an attribute of it.
      ASSERT_NE(FindOp(def.written_as), nullptr) << def.written_as;
      for (const AttrDef& attr : def.attrs) {
        EXPECT_EQ(FindAttr(*FindOp(def.written_as), attr.name), nullptr) << attr.name;
      }
    }
    if (def.output_count) {
      ASSERT_NE(FindAttr(def, def.output_count), nullptr);
      const AttrType count_type = FindAttr(def, def.output_count)->type;
      EXPECT_TRUE(count_type == AttrType::kPositiveInt || count_type == AttrType::kValueNames)
          << def.output_count;
      EXPECT_TRUE(FindAttr(def, def.output_count)->required);
    }
  }
}

TEST(OpAttrsTest, KeysComeFromTheAttributes) {
  EXPECT_EQ(OpKeys(OpKind::kSlice), (std::vector<std::string>{"op", "in", "out", "name", "where",
                                                              "mesh", "start", "size", "axis"}));
  EXPECT_EQ(OpKeys(OpKind::kPpermute),
            (std::vector<std::string>{"op", "in", "out", "name", "where", "mesh", "axis_name",
                                      "perm", "shift", "algorithm"}));
  const std::vector<std::string> all = AllOpKeys();
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    for (const AttrDef& attr : def.attrs) {
      EXPECT_NE(std::find(all.begin(), all.end(), attr.name), all.end()) << attr.name;
    }
  }
  EXPECT_EQ(CollectiveOpNames(),
            (std::vector<std::string>{"psum", "pmean", "pmax", "pmin", "psum_scatter", "all_gather",
                                      "all_to_all", "ppermute"}));
  EXPECT_EQ(CollectiveOpNames(CollectiveKind::kAllReduce),
            (std::vector<std::string>{"psum", "pmean", "pmax", "pmin"}));
}

// The message and key the builder refuses `op` with ("" if it takes it).
std::pair<std::string, std::string> BuilderRefusal(OpSpec op) {
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {4, 4}, DType::kF32, PartitionSpec{});
  try {
    b.Add(std::move(op));
  } catch (const SpecError& e) {
    return {e.key(), e.what()};
  }
  return {"", ""};
}

TEST(OpAttrsTest, BuilderChecksAttributes) {
  OpSpec einsum;
  einsum.kind = OpKind::kEinsum;
  einsum.in = {"x", "x"};
  EXPECT_EQ(BuilderRefusal(einsum),
            (std::pair<std::string, std::string>{"program.0.spec", "einsum needs spec"}));
  einsum.spec = "ab->ba";
  EXPECT_EQ(BuilderRefusal(einsum).first, "program.0.spec");
  EXPECT_NE(BuilderRefusal(einsum).second.find("two operands"), std::string::npos);
  einsum.spec = "ab,bc->ac";
  EXPECT_EQ(BuilderRefusal(einsum).first, "");

  OpSpec split;
  split.kind = OpKind::kSplit;
  split.in = {"x"};
  EXPECT_EQ(BuilderRefusal(split), (std::pair<std::string, std::string>{
                                       "program.0.sections", "split needs sections >= 1, got 0"}));
  split.sections = 2;
  split.out = {"a"};
  EXPECT_EQ(BuilderRefusal(split),
            (std::pair<std::string, std::string>{
                "program.0.out", "split makes 2 outputs (sections: 2), got 1 names"}));
  // Without names the builder makes one per section.
  split.out.clear();
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {4, 4}, DType::kF32, PartitionSpec{});
  b.Add(split);
  EXPECT_EQ(b.program().ops.back().out, (std::vector<std::string>{"v0", "v1"}));

  // An empty shape is a value (a reshape to a scalar), not a missing attribute.
  OpSpec reshape;
  reshape.kind = OpKind::kReshape;
  reshape.in = {"x"};
  EXPECT_EQ(BuilderRefusal(reshape).first, "");

  OpSpec slice;
  slice.kind = OpKind::kSlice;
  slice.in = {"x"};
  slice.start = -1;
  slice.size = 2;
  EXPECT_EQ(BuilderRefusal(slice), (std::pair<std::string, std::string>{
                                       "program.0.start", "slice needs start >= 0, got -1"}));

  OpSpec matmul;
  matmul.kind = OpKind::kAllgatherMatmul;
  matmul.in = {"x", "x"};
  matmul.axis_name = {"dp"};
  matmul.variant = "sideways";
  EXPECT_EQ(BuilderRefusal(matmul),
            (std::pair<std::string, std::string>{
                "program.0.variant",
                "variant must be one of blocking, unidirectional, bidirectional, got 'sideways'"}));

  OpSpec permute;
  permute.kind = OpKind::kPpermute;
  permute.in = {"x"};
  permute.axis_name = {"dp"};
  permute.perm = {{0, 1}, {1, 0}};
  permute.shift = 1;
  EXPECT_EQ(BuilderRefusal(permute),
            (std::pair<std::string, std::string>{"program.0.shift",
                                                 "give either perm or shift, not both"}));
  permute.shift.reset();
  EXPECT_EQ(BuilderRefusal(permute).first, "");
}

// `max` names two ops: the elementwise max (two inputs, or one and a scalar) and, with one
// input and axis or keepdims, the reduction reduce_max (jnp.max).
TEST(OpRegistryTest, MaxOfOneInputWithAxisIsTheReduction) {
  const std::vector<std::string> axis = {"op", "in", "out", "axis"};
  EXPECT_EQ(ResolveOp("max", 1, axis)->kind, OpKind::kReduceMax);
  EXPECT_EQ(ResolveOp("max", 1, {"op", "in", "out", "keepdims"})->kind, OpKind::kReduceMax);
  EXPECT_EQ(ResolveOp("max", 1, {"op", "in", "out", "scalar"})->kind, OpKind::kMax);
  EXPECT_EQ(ResolveOp("max", 1, {"op", "in", "out", "scalar", "axis"})->kind, OpKind::kMax);
  EXPECT_EQ(ResolveOp("max", 2, axis)->kind, OpKind::kMax);
  EXPECT_EQ(ResolveOp("max", 1, {"op", "in", "out"})->kind, OpKind::kMax);
  EXPECT_EQ(ResolveOp("reduce_max", 1, {"op", "in"})->kind, OpKind::kReduceMax);
  EXPECT_EQ(ResolveOp("add", 1, axis)->kind, OpKind::kAdd);  // Only max has a reduction.
  EXPECT_EQ(ResolveOp("nope", 1, axis), nullptr);

  OpSpec op;
  op.kind = OpKind::kMax;
  op.in = {"x"};
  op.axes = {0};
  EXPECT_EQ(ResolveOpKind(op), OpKind::kReduceMax);
  op.axes.clear();
  op.keepdims = true;
  EXPECT_EQ(ResolveOpKind(op), OpKind::kReduceMax);
  op.scalar = 0.0;
  EXPECT_EQ(ResolveOpKind(op), OpKind::kMax);
  op.scalar.reset();
  op.keepdims = false;
  EXPECT_EQ(ResolveOpKind(op), OpKind::kMax);
  op.in = {"x", "y"};
  op.axes = {0};
  EXPECT_EQ(ResolveOpKind(op), OpKind::kMax);
}

TEST(ProgramBuilderTest, ReadsMaxWithAxesAsReduceMaxAndCountsOutputs) {
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {4, 6}, DType::kF32, PartitionSpec{});
  OpSpec max;
  max.kind = OpKind::kMax;
  max.in = {"x"};
  max.axes = {1};
  b.Add(max);
  EXPECT_EQ(b.program().ops.back().kind, OpKind::kReduceMax);
  // Without axes, keepdims or a scalar it is neither: the message says how to get either.
  max.axes.clear();
  EXPECT_EQ(BuilderRefusal(max),
            (std::pair<std::string, std::string>{
                "program.0.in",
                "max takes in: [a, b], or in: a with scalar:, got 1 input and no scalar (the "
                "reduction max of one input needs axis: or keepdims:, or is reduce_max)"}));
  // top_k names two outputs (fresh ones when none are given).
  OpSpec top;
  top.kind = OpKind::kTopK;
  top.in = {"x"};
  top.k = 2;
  b.Add(top);
  EXPECT_EQ(b.program().ops.back().out, (std::vector<std::string>{"v1", "v2"}));
  top.out = {"only"};
  EXPECT_EQ(BuilderRefusal(top), (std::pair<std::string, std::string>{
                                     "program.0.out", "top_k makes 2 outputs, got 1 names"}));
  OpSpec norm;
  norm.kind = OpKind::kRmsNorm;
  norm.in = {"x", "x"};
  norm.eps = -1;
  EXPECT_EQ(BuilderRefusal(norm),
            (std::pair<std::string, std::string>{"program.0.eps",
                                                 "eps must be a finite number >= 0, got -1"}));
  OpSpec attention;
  attention.kind = OpKind::kAttention;
  attention.in = {"x", "x"};
  EXPECT_EQ(BuilderRefusal(attention),
            (std::pair<std::string, std::string>{
                "program.0.in", "attention takes 3 inputs (in: [a, b, c]), got 2"}));
}

// WithoutOps keeps every part of a program but its ops (meshes, devices, arrays, outputs and
// mode), for passes that make the ops anew.
TEST(ProgramBuilderTest, WithoutOpsKeepsAllButTheOps) {
  ProgramBuilder b({{"dp", 2}}, {}, ProgramMode::kAuto);
  b.Input("x", {4, 6}, DType::kBF16, PartitionSpec{{{"dp"}}});
  b.Output(b.Unary(OpKind::kExp, "x"), PartitionSpec{});
  ProgramSpec program = std::move(b).Build();
  program.mesh_devices = {1, 0};
  program.meshes = {MeshSpec{"m", {{"dp", 2}}, {1, 0}}};
  const ProgramSpec shell = WithoutOps(program);
  EXPECT_TRUE(shell.ops.empty());
  EXPECT_EQ(shell.mode, ProgramMode::kAuto);
  ASSERT_EQ(shell.mesh_axes.size(), 1u);
  EXPECT_EQ(shell.mesh_axes[0].name, "dp");
  EXPECT_EQ(shell.mesh_devices, program.mesh_devices);
  ASSERT_EQ(shell.meshes.size(), 1u);
  EXPECT_EQ(shell.meshes[0].devices, program.meshes[0].devices);
  ASSERT_EQ(shell.arrays.size(), 1u);
  EXPECT_EQ(shell.arrays[0].name, "x");
  EXPECT_EQ(shell.arrays[0].dtype, DType::kBF16);
  ASSERT_EQ(shell.outputs.size(), 1u);
  EXPECT_EQ(shell.outputs[0].name, program.outputs[0].name);
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
