// The partitioner's kept choices of layout (PartitionChoices): partitions made with them are the
// partitions made without, op for op; they serve the ops that repeat (a step's layers, its
// partitions at several layer counts) and only those; given another mesh they start afresh.
#include "planner/partition_choices.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "planner/models/step_build_cache.h"
#include "planner/models/train_step_run.h"
#include "planner/partitioner.h"
#include "tests/planner/models/same_partition.h"
#include "tests/planner/models/small_model.h"
#include "tests/support/specs.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

using test::ExpectSamePartition;
using test::FsdpTensorPlan;
using test::Normal;
using test::P;

// The small transformer's steps at 2, 3 and 4 layers (as a step is composed), partitioned one
// after another with one set of choices, are the steps partitioned alone; the second and later
// partitions take most of their choices from the first.
TEST(PartitionChoicesTest, StepsPartitionedWithChoicesAreTheStepsWithout) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  for (RematPolicy remat : {RematPolicy::kNone, RematPolicy::kSelective, RematPolicy::kFull}) {
    SCOPED_TRACE(static_cast<int>(remat));
    const StepPlan plan = FsdpTensorPlan(4, 2, remat);
    const Mesh mesh = PlacePlanMesh(machine, plan);
    StepCollectives collectives(machine, nullptr);
    PartitionChoices choices;
    int64_t reused = 0;
    for (int64_t layers : {2, 3, 4}) {
      SCOPED_TRACE(layers);
      const TransformerConfig model = test::SmallTransformer(layers);
      const BuiltTrainStep alone = BuildPartitionedStep(
          machine, mesh, model, test::SmallTrain(), plan, PlanRules(plan), collectives.model(), {});
      const BuiltTrainStep kept =
          BuildPartitionedStep(machine, mesh, model, test::SmallTrain(), plan, PlanRules(plan),
                               collectives.model(), {}, nullptr, &choices);
      ExpectSamePartition(kept.partitioned.partitioned, alone.partitioned.partitioned);
      // Each layer after the first repeats the first's choices (and each partition after the
      // first repeats the last's): more are reused than the ops of a layer.
      EXPECT_GT(choices.reused() - reused, 0);
      reused = choices.reused();
    }
    EXPECT_GT(choices.reused(), static_cast<int64_t>(choices.size()));
  }
}

// Kept for one mesh, the choices are forgotten on another: partitions there are the partitions
// made without, and what is kept is only what that mesh chose.
TEST(PartitionChoicesTest, AnotherMeshStartsAfresh) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const TransformerConfig model = test::SmallTransformer(2);
  StepCollectives collectives(machine, nullptr);
  PartitionChoices choices;
  size_t alone_size = 0;
  for (auto [fsdp, tensor] : {std::pair{4, 2}, std::pair{8, 1}}) {
    const StepPlan plan = FsdpTensorPlan(fsdp, tensor, RematPolicy::kSelective);
    const Mesh mesh = PlacePlanMesh(machine, plan);
    PartitionChoices fresh;
    const BuiltTrainStep alone =
        BuildPartitionedStep(machine, mesh, model, test::SmallTrain(), plan, PlanRules(plan),
                             collectives.model(), {}, nullptr, &fresh);
    const BuiltTrainStep kept =
        BuildPartitionedStep(machine, mesh, model, test::SmallTrain(), plan, PlanRules(plan),
                             collectives.model(), {}, nullptr, &choices);
    ExpectSamePartition(kept.partitioned.partitioned, alone.partitioned.partitioned);
    EXPECT_EQ(choices.size(), fresh.size()) << fsdp;
    alone_size = fresh.size();
  }
  EXPECT_GT(alone_size, 0u);
}

// Plans on one mesh share a search worker's choices (StepBuildCache::Choices), whatever their
// rules: a plan under other rules partitions as it does alone and takes some of its choices
// from the first plan's; another placement of the mesh gets choices of its own.
TEST(PartitionChoicesTest, PlansOnOneMeshShareThem) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const TransformerConfig model = test::SmallTransformer(2);
  StepCollectives collectives(machine, nullptr);
  StepBuildCache cache;
  const StepPlan fsdp_tensor = FsdpTensorPlan(4, 2, RematPolicy::kSelective);
  const StepPlan sequence = [&fsdp_tensor] {  // Activations' length over tensor, not heads.
    StepPlan p = fsdp_tensor;
    p.rules = {{"batch", {"fsdp"}},
               {"embed", {"fsdp"}},
               {"length", {"tensor"}},
               {"mlp", {"tensor"}},
               {"vocab", {"tensor"}}};
    return p;
  }();
  const Mesh mesh = PlacePlanMesh(machine, fsdp_tensor);
  PartitionChoices& shared = cache.Choices(mesh);
  int64_t reused = 0;
  for (const StepPlan* plan : {&fsdp_tensor, &sequence}) {
    SCOPED_TRACE(plan == &sequence ? "sequence" : "fsdp x tensor");
    EXPECT_EQ(&cache.Choices(PlacePlanMesh(machine, *plan)), &shared);
    const BuiltTrainStep alone = BuildPartitionedStep(
        machine, mesh, model, test::SmallTrain(), *plan, PlanRules(*plan), collectives.model(), {});
    PartitionChoices fresh;
    BuildPartitionedStep(machine, mesh, model, test::SmallTrain(), *plan, PlanRules(*plan),
                         collectives.model(), {}, nullptr, &fresh);
    const BuiltTrainStep kept =
        BuildPartitionedStep(machine, mesh, model, test::SmallTrain(), *plan, PlanRules(*plan),
                             collectives.model(), {}, &cache, &shared);
    ExpectSamePartition(kept.partitioned.partitioned, alone.partitioned.partitioned);
    // The second plan reuses more than it would alone: some of its ops' choices are the
    // first plan's.
    if (plan == &sequence) {
      EXPECT_GT(shared.reused() - reused, fresh.reused());
    }
    reused = shared.reused();
  }
  // Another placement of the same axes: its own choices.
  std::vector<int> devices = mesh.devices();
  std::reverse(devices.begin(), devices.end());
  const Mesh reversed(mesh.axes(), devices);
  EXPECT_NE(&cache.Choices(reversed), &shared);
  EXPECT_EQ(cache.Choices(reversed).size(), 0u);
}

// Two sums of one operand, wanted in the same layout, differ only in the axis they reduce:
// neither takes the other's choice (the first's layout would not even fit the second's
// result). Two sines of it wanted in the same layout are one choice, made once.
TEST(PartitionChoicesTest, OnlyOpsWithTheSameAttributesShareAChoice) {
  ProgramBuilder b({{"X", 4}, {"Y", 2}}, {}, ProgramMode::kAuto);
  b.Input("x", {64, 128}, DType::kF32, P({{"X"}, {"Y"}}), Normal(0));
  OpSpec rows;
  rows.kind = OpKind::kSum;
  rows.in = {"x"};
  rows.out = {"rows"};
  rows.axes = {1};
  b.Add(rows);
  OpSpec cols = rows;
  cols.out = {"cols"};
  cols.axes = {0};
  b.Add(cols);
  b.Unary(OpKind::kSin, "x", "s1");
  b.Unary(OpKind::kSin, "x", "s2");
  b.Output("rows", P({}));
  b.Output("cols", P({}));
  b.Output("s1", P({{"X"}, {"Y"}}));
  b.Output("s2", P({{"X"}, {"Y"}}));
  const ProgramSpec global = std::move(b).Build();
  const PartitionResult alone = Partition(global);
  PartitionChoices choices;
  const PartitionResult kept = PartitionExpanded(global, {}, {}, nullptr, &choices);
  ExpectSamePartition(kept, alone);
  EXPECT_EQ(choices.reused(), 1);  // s2 takes s1's.
  EXPECT_EQ(choices.size(), 3u);   // rows, cols, s1.
  const PartitionResult again = PartitionExpanded(global, {}, {}, nullptr, &choices);
  ExpectSamePartition(again, alone);
  EXPECT_EQ(choices.reused(), 1 + 4);
}

// Random programs of elementwise ops and matmuls on 64 x 64 values, inputs and outputs in
// random layouts of a 4 x 2 mesh, read by several ops each (so values are resharded for one
// reader and read again by another), partition as they do without the choices.
TEST(PartitionChoicesTest, RandomProgramsPartitionAsWithout) {
  const std::vector<PartitionSpec> layouts = {P({{"X"}, {"Y"}}), P({{"Y"}, {"X"}}), P({{"X"}}),
                                              P({{}, {"Y"}}),    P({{"X", "Y"}}),   P({})};
  std::mt19937 rng(12);
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  int64_t reused = 0;
  for (int program = 0; program < 400; ++program) {
    SCOPED_TRACE(program);
    ProgramBuilder b({{"X", 4}, {"Y", 2}}, {}, ProgramMode::kAuto);
    std::vector<std::string> values;
    for (int i = 0; i < 3; ++i) {
      values.push_back(b.Input("in" + std::to_string(i), {64, 64}, DType::kF32,
                               layouts[pick(layouts.size())], Normal(i)));
    }
    std::vector<std::string> results;
    for (int k = 0; k < 16; ++k) {
      const std::string x = values[pick(values.size())];
      const std::string y = values[pick(values.size())];
      const std::string out = "v" + std::to_string(k);
      switch (pick(4)) {
        case 0:
          b.Unary(OpKind::kSin, x, out);
          break;
        case 1:
          b.Binary(OpKind::kAdd, x, y, out);
          break;
        case 2:
          b.Binary(OpKind::kMul, x, y, out);
          break;
        default:
          b.Matmul(x, y, out);
      }
      values.push_back(out);
      results.push_back(out);
    }
    for (const std::string& r : results) b.Output(r, layouts[pick(layouts.size())]);
    const ProgramSpec global = std::move(b).Build();
    PartitionChoices choices;
    const PartitionResult alone = Partition(global);
    ExpectSamePartition(PartitionExpanded(global, {}, {}, nullptr, &choices), alone);
    ExpectSamePartition(PartitionExpanded(global, {}, {}, nullptr, &choices), alone);
    reused += choices.reused();
  }
  EXPECT_GT(reused, 60 * 10);  // Each second partition reuses its first's choices, and more.
}

}  // namespace
}  // namespace shardsim::planner
