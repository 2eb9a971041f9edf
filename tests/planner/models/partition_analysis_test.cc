// What the partitioner reads of a global program alone (PartitionAnalysis): made by a program's
// first partition and read by the next ones, on meshes of other sizes too, giving the
// partitions made without it, op for op; made again for another program or mode, and for
// other sizes where an op's shape reads the mesh.
#include "planner/partition_analysis.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "planner/models/step_build_cache.h"
#include "planner/models/train_step_run.h"
#include "planner/partitioner.h"
#include "sim/spec_error.h"
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

// The small transformer's step, built once for 4 x 2 and found again (StepBuildCache) for
// 8 x 1 and then 4 x 2 as a search's plans find it, is analysed once and partitioned on each
// mesh as a step built and partitioned there alone.
TEST(PartitionAnalysisTest, OneStepOnMeshesOfOtherSizes) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const TransformerConfig model = test::SmallTransformer(2);
  for (RematPolicy remat : {RematPolicy::kNone, RematPolicy::kSelective}) {
    SCOPED_TRACE(static_cast<int>(remat));
    StepBuildCache cache;
    std::shared_ptr<const ExpandedTrainStep> first;
    for (auto [fsdp, tensor] : {std::pair{4, 2}, std::pair{8, 1}, std::pair{4, 2}}) {
      SCOPED_TRACE(fsdp);
      const StepPlan plan = FsdpTensorPlan(fsdp, tensor, remat);
      const Mesh mesh = PlacePlanMesh(machine, plan);
      StepCollectives collectives(machine, nullptr);
      const BuiltTrainStep alone = BuildPartitionedStep(
          machine, mesh, model, test::SmallTrain(), plan, PlanRules(plan), collectives.model(), {});
      const BuiltTrainStep found =
          BuildPartitionedStep(machine, mesh, model, test::SmallTrain(), plan, PlanRules(plan),
                               collectives.model(), {}, &cache);
      if (!first) first = found.built;
      EXPECT_EQ(found.built, first);  // One step for every mesh...
      ExpectSamePartition(found.partitioned.partitioned, alone.partitioned.partitioned);
    }
    EXPECT_EQ(first->analysis->made(), 1);  // ... analysed once.
  }
}

// x [64, 32] @ w [32, 16], x's rows over fsdp; w's rows too in auto mode (FSDP), whole in
// explicit mode (which refuses a contraction split in one operand only).
ProgramSpec FsdpMatmul(ProgramMode mode) {
  ProgramBuilder b({{"fsdp", 8}}, {}, mode);
  b.Input("x", {64, 32}, DType::kF32, P({{"fsdp"}}), Normal(0));
  b.Input("w", {32, 16}, DType::kF32, mode == ProgramMode::kExplicit ? P({}) : P({{"fsdp"}}),
          Normal(1));
  b.Matmul("x", "w", "y");
  b.Output("y", P({{"fsdp"}}));
  return std::move(b).Build();
}

// Given another program, or the same in another mode, it is made again, and the partitions
// are those made without it.
TEST(PartitionAnalysisTest, AnotherProgramOrModeMakesItAgain) {
  const ProgramSpec a = FsdpMatmul(ProgramMode::kAuto);
  const ProgramSpec b = [] {
    ProgramSpec other = FsdpMatmul(ProgramMode::kAuto);
    other.outputs[0].spec = P({});
    return other;
  }();
  const ProgramSpec c = FsdpMatmul(ProgramMode::kExplicit);
  PartitionAnalysis analysis;
  for (const ProgramSpec* p : {&a, &a, &b, &c, &a}) {
    ExpectSamePartition(PartitionExpanded(*p, {}, {}, nullptr, nullptr, &analysis), Partition(*p));
  }
  EXPECT_EQ(analysis.made(), 4);  // a, b, c, a: the second a reads the first's.
}

// An op whose shape reads the mesh (axis_index names an axis) keeps the analysis to the sizes
// it was made at: other sizes make it again. Such an op cannot be partitioned (no sharding
// rule; the builder refuses it in a global program, so the program is written by hand here):
// the error is the one made without the analysis.
TEST(PartitionAnalysisTest, ShapesReadingTheMeshKeepItToItsSizes) {
  ProgramSpec global;
  global.mode = ProgramMode::kAuto;
  global.mesh_axes = {{"fsdp", 8}};
  ArraySpec x;
  x.name = "x";
  x.shape = {64, 32};
  x.sharding = P({{"fsdp"}});
  global.arrays.push_back(x);
  OpSpec index;
  index.kind = OpKind::kAxisIndex;
  index.name = "index";
  index.key = "program.0";
  index.axis_name = {"fsdp"};
  index.out = {"i"};
  global.ops.push_back(index);
  OutputSpec out;
  out.name = "x";
  out.spec = P({{"fsdp"}});
  global.outputs.push_back(out);
  auto error = [&global](const std::vector<MeshAxis>* sizes, PartitionAnalysis* analysis) {
    try {
      PartitionExpanded(global, {}, {}, sizes, nullptr, analysis);
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::vector<MeshAxis> four = {{"fsdp", 4}};
  PartitionAnalysis analysis;
  const std::string expected = error(nullptr, nullptr);
  EXPECT_NE(expected.find("no sharding rule"), std::string::npos) << expected;
  EXPECT_EQ(error(nullptr, &analysis), expected);
  EXPECT_EQ(error(nullptr, &analysis), expected);
  EXPECT_EQ(analysis.made(), 1);
  EXPECT_EQ(error(&four, &analysis), error(&four, nullptr));
  EXPECT_EQ(analysis.made(), 2);
  // Without such an op, other sizes read it as it is.
  const ProgramSpec free = FsdpMatmul(ProgramMode::kAuto);
  PartitionAnalysis kept;
  ExpectSamePartition(PartitionExpanded(free, {}, {}, nullptr, nullptr, &kept), Partition(free));
  ExpectSamePartition(PartitionExpanded(free, {}, {}, &four, nullptr, &kept),
                      PartitionExpanded(free, {}, {}, &four));
  EXPECT_EQ(kept.made(), 1);
}

}  // namespace
}  // namespace shardsim::planner
