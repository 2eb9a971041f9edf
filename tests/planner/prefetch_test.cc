// Prefetching weight collectives: which ops move where, what never moves, and the distance a
// training step's layers give.
#include "planner/prefetch.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shardsim::planner {
namespace {

OpSpec MakeOp(OpKind kind, std::vector<std::string> in, std::string out) {
  OpSpec op;
  op.kind = kind;
  op.in = std::move(in);
  op.out = {std::move(out)};
  if (kind == OpKind::kAllGather) op.axis_name = {"fsdp"};
  return op;
}

// A layer chain as FSDP partitions it: per layer i, c_i = convert(w_i), g_i = all_gather(c_i),
// y_{i+1} = matmul(y_i, g_i). Ops 3i, 3i+1, 3i+2.
ProgramSpec Chain(int layers) {
  ProgramSpec p;
  p.mode = ProgramMode::kManual;
  p.arrays.push_back({"y0", {4, 4}, DType::kF32, {}, {}, ""});
  for (int i = 0; i < layers; ++i) {
    const std::string k = std::to_string(i);
    p.arrays.push_back({"w" + k, {1, 4}, DType::kF32, {}, {}, ""});
    p.ops.push_back(MakeOp(OpKind::kConvert, {"w" + k}, "c" + k));
    p.ops.push_back(MakeOp(OpKind::kAllGather, {"c" + k}, "g" + k));
    p.ops.push_back(MakeOp(OpKind::kMatmul, {"y" + k, "g" + k}, "y" + std::to_string(i + 1)));
  }
  return p;
}

// Distance 1: the first gather (with its cast) at the start, each later one just before the
// matmul reading the one before it, so gather i+1 runs beside matmul i.
TEST(PrefetchTest, EachGatherMovesBeforeTheReaderOfTheOneBefore) {
  EXPECT_EQ(PrefetchOrder(Chain(3), 1), (std::vector<size_t>{0, 1, 3, 4, 2, 6, 7, 5, 8}));
}

// Distance 2: two gathers at the start, then gather i+2 before matmul i.
TEST(PrefetchTest, DistanceTwoRunsTwoAhead) {
  EXPECT_EQ(PrefetchOrder(Chain(4), 2),
            (std::vector<size_t>{0, 1, 3, 4, 6, 7, 2, 9, 10, 5, 8, 11}));
}

TEST(PrefetchTest, DistanceZeroKeepsTheOrder) {
  EXPECT_EQ(PrefetchOrder(Chain(3), 0), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
}

// A collective of what the step computes (here of a matmul's result) is not a weight
// collective: it stays, and so does everything it reads.
TEST(PrefetchTest, CollectivesOfComputedValuesStay) {
  ProgramSpec p = Chain(2);
  p.ops.push_back(MakeOp(OpKind::kPsum, {"y2"}, "s"));
  p.ops[6].axis_name = {"fsdp"};
  EXPECT_EQ(PrefetchOrder(p, 1), (std::vector<size_t>{0, 1, 3, 4, 2, 5, 6}));
}

// A name bound twice is left where it is, and so is the collective reading it: moving either
// could change which binding a reader sees.
TEST(PrefetchTest, ReboundNamesStay) {
  ProgramSpec p = Chain(2);
  p.ops[3].out = {"c0"};  // Layer 1's cast rebinds c0 ...
  p.ops[4].in = {"c0"};   // ... and its gather reads that.
  EXPECT_EQ(PrefetchOrder(p, 1), (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

// With 6 weight collectives in 3 groups (layers), the distance is 2; the reasons and types the
// partitioner keeps per op follow their ops.
TEST(PrefetchTest, GroupsGiveTheDistanceAndReasonsFollow) {
  PartitionResult r;
  r.program = Chain(6);
  for (size_t i = 0; i < r.program.ops.size(); ++i) {
    r.reasons.push_back("reason " + std::to_string(i));
    r.types.push_back("type " + std::to_string(i));
  }
  const std::vector<size_t> order = PrefetchOrder(r.program, 2);
  const ProgramSpec before = r.program;
  PrefetchWeightCollectives(r, 3);
  ASSERT_EQ(r.program.ops.size(), order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    EXPECT_EQ(r.program.ops[k].out, before.ops[order[k]].out);
    EXPECT_EQ(r.reasons[k], "reason " + std::to_string(order[k]));
    EXPECT_EQ(r.types[k], "type " + std::to_string(order[k]));
  }
}

}  // namespace
}  // namespace shardsim::planner
