// The steps a search builds once for plans whose meshes differ only in sizes: what tells them
// apart, when a kept step serves, and that it gives the reports a fresh build gives.
#include "planner/models/step_build_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "planner/models/train_step_run.h"
#include "sim/spec_error.h"
#include "tests/planner/models/small_model.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

TransformerConfig Small() { return test::SmallTransformer(8); }

using test::SmallTrain;

StepPlan PlanOf(int fsdp, int tensor) {
  StepPlan p;
  p.mesh = {{"fsdp", fsdp}, {"tensor", tensor}};
  p.rules = test::FsdpTensorRules();
  p.remat = RematPolicy::kSelective;
  return p;
}

StepBuildCache::Key KeyOf(const TransformerConfig& model, const StepPlan& plan) {
  return StepBuildCache::KeyOf(model, SmallTrain(), PlanRules(plan), plan.mesh, plan.remat,
                               plan.remat_save, plan.offload);
}

// A dense step reads its mesh's sizes only to check that its parameters divide: meshes of the
// same axis names share a key. A mixture of experts lays out its dispatch by them: its key
// holds them. Remat, the training configuration and the axis names tell steps apart.
TEST(StepBuildCacheTest, KeysHoldWhatDecidesTheStep) {
  EXPECT_EQ(KeyOf(Small(), PlanOf(4, 2)), KeyOf(Small(), PlanOf(8, 1)));
  TransformerConfig moe = Small();
  moe.experts = 4;
  EXPECT_FALSE(KeyOf(moe, PlanOf(4, 2)) == KeyOf(moe, PlanOf(8, 1)));
  EXPECT_EQ(KeyOf(moe, PlanOf(4, 2)), KeyOf(moe, PlanOf(4, 2)));
  StepPlan full = PlanOf(4, 2);
  full.remat = RematPolicy::kFull;
  EXPECT_FALSE(KeyOf(Small(), full) == KeyOf(Small(), PlanOf(4, 2)));
  TransformerConfig deeper = Small();
  deeper.layers = 3;
  EXPECT_FALSE(KeyOf(deeper, PlanOf(4, 2)) == KeyOf(Small(), PlanOf(4, 2)));
  StepPlan renamed = PlanOf(4, 2);
  renamed.mesh[0].name = "data";
  renamed.rules["batch"] = {"data"};
  renamed.rules["embed"] = {"data"};
  EXPECT_FALSE(KeyOf(Small(), renamed) == KeyOf(Small(), PlanOf(4, 2)));
  TrainConfig micro = SmallTrain();
  micro.microbatches = 2;
  const StepPlan p = PlanOf(4, 2);
  EXPECT_FALSE(StepBuildCache::KeyOf(Small(), micro, PlanRules(p), p.mesh, p.remat, {}, {}) ==
               KeyOf(Small(), p));
}

// Found only for its key, and only where every input array divides over the sizes asked for;
// the oldest step goes once kCapacity are kept.
TEST(StepBuildCacheTest, FindsStepsWhoseArraysDivide) {
  StepBuildCache cache;
  auto step = std::make_shared<ExpandedTrainStep>();
  ArraySpec w;
  w.name = "w";
  w.shape = {256, 2};
  w.sharding.dims = {{"fsdp"}, {"tensor"}};
  step->global.arrays.push_back(w);
  const StepBuildCache::Key key = KeyOf(Small(), PlanOf(4, 2));
  cache.Insert(key, step);
  EXPECT_EQ(cache.Find(key, PlanOf(8, 1).mesh), step);
  EXPECT_EQ(cache.Find(key, PlanOf(4, 2).mesh), step);
  EXPECT_EQ(cache.Find(key, PlanOf(2, 4).mesh), nullptr);  // 2 over tensor 4.
  StepPlan other = PlanOf(4, 2);
  other.remat = RematPolicy::kFull;
  EXPECT_EQ(cache.Find(KeyOf(Small(), other), PlanOf(4, 2).mesh), nullptr);
  EXPECT_EQ(cache.hits(), 2);
  EXPECT_EQ(cache.misses(), 2);
  for (size_t k = 0; k < StepBuildCache::kCapacity; ++k) {
    TransformerConfig m = Small();
    m.layers = 100 + static_cast<int64_t>(k);
    cache.Insert(KeyOf(m, PlanOf(4, 2)), std::make_shared<ExpandedTrainStep>());
  }
  EXPECT_EQ(cache.Find(key, PlanOf(4, 2).mesh), nullptr);
}

// Plans whose meshes differ only in sizes (fsdp 4 x tensor 2, fsdp 8 x tensor 1) share their
// built and expanded steps, and each report equals the step built afresh to the picosecond and
// the byte. Tensor 4 does not divide the 2 key/value heads: the step built for the others does
// not serve it, and it fails as a fresh build does.
TEST(StepBuildCacheTest, SharedStepsGiveTheFreshReports) {
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  StepBuildCache cache;
  auto run = [&](const StepPlan& plan, StepBuildCache* c) {
    TrainStepOptions o;
    o.build_cache = c;
    return SimulateTrainStep(machine, Small(), SmallTrain(), plan, o);
  };
  int64_t hits = 0;
  for (auto [fsdp, tensor] : {std::pair{4, 2}, std::pair{8, 1}, std::pair{4, 2}}) {
    const TrainStepReport fresh = run(PlanOf(fsdp, tensor), nullptr);
    const TrainStepReport shared = run(PlanOf(fsdp, tensor), &cache);
    EXPECT_EQ(shared.step_time, fresh.step_time) << fsdp;
    EXPECT_EQ(shared.compute, fresh.compute) << fsdp;
    EXPECT_EQ(shared.exposed_comm, fresh.exposed_comm) << fsdp;
    EXPECT_EQ(shared.exposed_by_collective, fresh.exposed_by_collective) << fsdp;
    EXPECT_EQ(shared.memory.peak, fresh.memory.peak) << fsdp;
    EXPECT_EQ(shared.memory.forced_peak, fresh.memory.forced_peak) << fsdp;
    EXPECT_EQ(shared.memory.params, fresh.memory.params) << fsdp;
    EXPECT_EQ(shared.events, fresh.events) << fsdp;
    EXPECT_EQ(shared.simulated_layers, fresh.simulated_layers) << fsdp;
    if (fsdp == 8) {
      EXPECT_GT(cache.hits(), hits);  // Found the first plan's steps.
    }
    hits = cache.hits();
  }
  std::string fresh_error, shared_error;
  try {
    run(PlanOf(2, 4), nullptr);
  } catch (const SpecError& e) {
    fresh_error = e.what();
  }
  const int64_t misses = cache.misses();
  try {
    run(PlanOf(2, 4), &cache);
  } catch (const SpecError& e) {
    shared_error = e.what();
  }
  EXPECT_NE(fresh_error.find("does not divide"), std::string::npos) << fresh_error;
  EXPECT_EQ(shared_error, fresh_error);
  EXPECT_GT(cache.misses(), misses);
  EXPECT_EQ(cache.hits(), hits);
}

}  // namespace
}  // namespace shardsim::planner
