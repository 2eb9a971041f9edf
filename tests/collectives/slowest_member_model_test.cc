// SlowestMemberCollectiveModel: every member of a group of more than one ends with the op's
// slowest member; members of groups of one keep zero; each inner answer is evened once.
#include "collectives/timing/slowest_member_model.h"

#include <gtest/gtest.h>

#include <set>

#include "collectives/runtime/machine.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

// A bf16 all-gather of 64 Ki elements a member, as one ring over each group of mesh axis 0.
CollectiveRequest FsdpRingGather() {
  CollectiveRequest request;
  request.kind = CollectiveKind::kAllGather;
  request.dtype = DType::kBF16;
  request.elements = 1 << 16;
  request.axes = {0};
  request.algorithm = "ring";
  return request;
}

TEST(SlowestMemberCollectiveModelTest, EveryMemberEndsWithTheSlowest) {
  // FSDP 32 x TP 4 on a 4x4x8 v5p slice, one ring over each fsdp group in mesh (snake)
  // order: the groups share links, so their member times differ (the case the model exists
  // for).
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 8}));
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  SlowestMemberCollectiveModel slowest(cache);
  CollectiveRequest request = FsdpRingGather();
  const auto exact = cache.Estimate(mesh, request);
  const auto evened = slowest.Estimate(mesh, request);
  std::set<Time> distinct(exact->member_time.begin(), exact->member_time.end());
  EXPECT_GT(distinct.size(), 1u);  // Members end at different times.
  ASSERT_EQ(evened->member_time.size(), exact->member_time.size());
  for (Time t : evened->member_time) EXPECT_EQ(t, exact->longest());
  EXPECT_EQ(evened->algorithm, exact->algorithm);
  EXPECT_EQ(evened->profile, exact->profile);  // The link lists are shared, not copied.
  // A one-member group (a size-1 axis) keeps its zero time.
  const Mesh single = PlaceMesh(machine, {{"one", 1}, {"rest", 128}});
  request.axes = {0};
  for (Time t : slowest.Estimate(single, request)->member_time) EXPECT_EQ(t, Time());
}

// Models sharing an EvenedTimings (a search's workers) copy each inner answer once and give
// one object for it; a model with its own copies gives an equal one of its own.
TEST(SlowestMemberCollectiveModelTest, SharedCopiesAreMadeOnce) {
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 8}));
  const Mesh mesh = PlaceMesh(machine, {{"fsdp", 32}, {"tp", 4}});
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  EvenedTimings shared;
  SlowestMemberCollectiveModel a(cache, /*keep_rates=*/true, &shared);
  SlowestMemberCollectiveModel b(cache, /*keep_rates=*/true, &shared);
  SlowestMemberCollectiveModel own(cache);
  const CollectiveRequest request = FsdpRingGather();
  const auto from_a = a.Estimate(mesh, request);
  EXPECT_EQ(b.Estimate(mesh, request), from_a);
  EXPECT_EQ(shared.Of(cache.Estimate(mesh, request)), from_a);
  const auto from_own = own.Estimate(mesh, request);
  EXPECT_NE(from_own, from_a);
  EXPECT_EQ(from_own->member_time, from_a->member_time);
  const Time longest = cache.Estimate(mesh, request)->longest();
  for (Time t : from_a->member_time) EXPECT_EQ(t, longest);
}

}  // namespace
}  // namespace shardsim
