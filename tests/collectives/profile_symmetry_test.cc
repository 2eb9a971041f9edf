// The translations of a torus that map a collective's link use onto itself, its groups' and
// links' orbits under them, and contention rates priced on one link per orbit: the same
// figures, to the bit, as pricing every link.
#include "collectives/timing/profile_symmetry.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/sharing_costs.h"
#include "tests/support/specs.h"
#include "topology/presets.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

using test::P;

// Collective `kind` of `elements` bf16 elements per member over mesh axes `axes`, run by
// `algorithm`.
CollectiveRequest Bf16(CollectiveKind kind, std::vector<int> axes, int64_t elements,
                       std::string algorithm = "auto") {
  CollectiveRequest request;
  request.kind = kind;
  request.dtype = DType::kBF16;
  request.elements = elements;
  request.axes = std::move(axes);
  request.algorithm = std::move(algorithm);
  return request;
}

// An all-reduce of `elements` bf16 elements per member over `axes`.
CollectiveRequest AllReduce(std::vector<int> axes, int64_t elements) {
  return Bf16(CollectiveKind::kAllReduce, std::move(axes), elements);
}

// The coordinates of group `g`'s first member.
std::vector<int> FirstCoords(const Topology& topo, const Mesh& mesh,
                             const std::vector<std::vector<int>>& groups, size_t g) {
  return TorusCoords(topo.torus()->shape, mesh.device(groups[g][0]));
}

// A copy of `from` (profiles are not copyable).
std::unique_ptr<LinkProfile> Copy(const LinkProfile& from) {
  auto to = std::make_unique<LinkProfile>();
  to->links = from.links;
  to->link_share = from.link_share;
  to->link_use = from.link_use;
  to->group_use = from.group_use;
  return to;
}

// TPU v5p 4x4x4 wraps along every dimension. Its mesh {dp: 16, tp: 4} puts tp along one
// dimension: each tp group is a ring of 4 along it, and every translation across it maps the
// groups onto each other, member by member, so their all-reduce's use of the links is the
// same after any such translation (the network model folds those groups: exact). Each
// translation's image of a group is the group whose first member is the moved first member,
// found here from the coordinates.
TEST(ProfileSymmetryTest, RingsAlongOneDimensionMoveAcrossIt) {
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 4}));
  const Topology& topo = machine.topology();
  ASSERT_TRUE(topo.torus());
  ASSERT_EQ(topo.torus()->wraparound, std::vector<bool>({true, true, true}));
  Mesh mesh = PlaceMesh(machine, {{"dp", 16}, {"tp", 4}});
  const std::vector<std::vector<int>> groups = mesh.Groups({1});
  // The dimension tp runs along: the one its first group's members differ in.
  const std::vector<int> a = FirstCoords(topo, mesh, groups, 0);
  const std::vector<int> b = TorusCoords(topo.torus()->shape, mesh.device(groups[0][1]));
  int along = -1;
  for (int d = 0; d < 3; ++d) {
    if (a[d] != b[d]) along = d;
  }
  ASSERT_GE(along, 0);
  NetworkCollectiveModel model(machine);
  std::shared_ptr<const CollectiveTiming> timing = model.Estimate(mesh, AllReduce({1}, 1 << 16));
  const ProfileSymmetry symmetry = FindProfileSymmetry(topo, *timing->profile);
  ASSERT_EQ(symmetry.step.size(), 3u);
  for (int d = 0; d < 3; ++d) {
    if (d == along) continue;
    EXPECT_EQ(symmetry.step[d], 1) << d;
    ASSERT_EQ(symmetry.image[d].size(), groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<int> moved = FirstCoords(topo, mesh, groups, g);
      moved[d] = (moved[d] + 1) % 4;
      EXPECT_EQ(FirstCoords(topo, mesh, groups, static_cast<size_t>(symmetry.image[d][g])), moved)
          << "dimension " << d << ", group " << g;
    }
  }
  // Orbits under translations by 2 across the rings (none along them): 4 groups each, those
  // whose first members lie at the same coordinates mod 2; each group's least is theirs.
  std::vector<int> steps = {2, 2, 2};
  steps[along] = 4;
  const std::vector<int32_t> least = GroupOrbits(topo, symmetry, steps);
  ASSERT_EQ(least.size(), groups.size());
  auto home = [&](size_t g) {
    std::vector<int> c = FirstCoords(topo, mesh, groups, g);
    for (int d = 0; d < 3; ++d) {
      if (d != along) c[d] %= 2;
    }
    return c;
  };
  int orbits = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    size_t want = g;
    for (size_t h = 0; h < g; ++h) {
      if (home(h) == home(g)) {
        want = h;
        break;
      }
    }
    EXPECT_EQ(least[g], static_cast<int32_t>(want)) << g;
    if (want == g) ++orbits;
  }
  EXPECT_EQ(orbits, 4);
  // One representative link per orbit of links (each of 4 links): a quarter of its links.
  const LinkProfile::Orbits& kept = timing->profile->orbits(topo, steps);
  EXPECT_EQ(kept.least, least);
  size_t representatives = 0;
  for (uint64_t word : kept.representative) representatives += std::popcount(word);
  EXPECT_EQ(4 * representatives, timing->profile->links.size());
  EXPECT_EQ(CommonSteps(symmetry.step, steps), steps);
  EXPECT_TRUE(AnyTranslation(topo, steps));
  EXPECT_FALSE(AnyTranslation(topo, topo.torus()->shape));
}

// One figure changed by one ulp, on one link or in one group's use of a link, breaks every
// translation: each moves every link and every group.
TEST(ProfileSymmetryTest, OneUlpBreaksIt) {
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 4}));
  const Topology& topo = machine.topology();
  Mesh mesh = PlaceMesh(machine, {{"dp", 16}, {"tp", 4}});
  NetworkCollectiveModel model(machine);
  std::shared_ptr<const CollectiveTiming> timing = model.Estimate(mesh, AllReduce({1}, 1 << 16));
  ASSERT_TRUE(AnyTranslation(topo, FindProfileSymmetry(topo, *timing->profile).step));
  std::unique_ptr<LinkProfile> whole = Copy(*timing->profile);
  whole->link_use[3].flow_rate = std::nextafter(whole->link_use[3].flow_rate, 0.0);
  EXPECT_EQ(FindProfileSymmetry(topo, *whole).step, topo.torus()->shape);
  std::unique_ptr<LinkProfile> group = Copy(*timing->profile);
  group->group_use[5][0].duty = std::nextafter(group->group_use[5][0].duty, 0.0);
  EXPECT_EQ(FindProfileSymmetry(topo, *group).step, topo.torus()->shape);
  std::unique_ptr<LinkProfile> intact = Copy(*timing->profile);
  EXPECT_EQ(FindProfileSymmetry(topo, *intact).step,
            FindProfileSymmetry(topo, *timing->profile).step);
}

// Only a switchless torus has translations.
TEST(ProfileSymmetryTest, NoneOffATorus) {
  Machine machine(BuildPreset("a100-dgx", {}, 2));
  Mesh mesh = PlaceMesh(machine, {{"dp", 2}, {"tp", 8}});
  NetworkCollectiveModel model(machine);
  std::shared_ptr<const CollectiveTiming> timing = model.Estimate(mesh, AllReduce({1}, 1 << 16));
  const ProfileSymmetry symmetry = FindProfileSymmetry(machine.topology(), *timing->profile);
  EXPECT_TRUE(symmetry.step.empty());
  EXPECT_FALSE(AnyTranslation(machine.topology(), symmetry.step));
}

// Three collectives issued together on TPU v5p 4x4x4 (fsdp 16 x tp 4): a ring reduce-scatter
// and an all-gather over fsdp and a psum over tp, every group of each sharing links with the
// others' groups. Their contention rates priced on one link per orbit of their common
// translations give the run every link priced gives, to the picosecond, with three ops in
// flight (sums of costs) and then two (single costs); the orbits are real: the ops have
// common translations.
TEST(ProfileSymmetryTest, PricingByOrbitEqualsByLink) {
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 4}));
  const Topology& topo = machine.topology();
  ProgramBuilder b({{"fsdp", 16}, {"tp", 4}});
  const std::string rs =
      b.PsumScatter(b.Input("g", {1408 * 4, 2048}, DType::kBF16, P({{"tp"}})), {"fsdp"}, 1, true);
  const std::string ps =
      b.Reduce(OpKind::kPsum, b.Input("x", {1024 * 16, 1024}, DType::kBF16, P({{"fsdp"}})), {"tp"});
  const std::string ag =
      b.AllGather(b.Input("y", {256 * 16, 1024}, DType::kBF16, P({{"fsdp"}})), {"fsdp"}, 0, true);
  b.Output(rs, P({}));
  b.Output(ps, P({}));
  b.Output(ag, P({}));
  const ProgramSpec program = std::move(b).Build();
  const Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  // The ops' timings, as the run's own cache finds them (the model is deterministic).
  NetworkCollectiveModel model(machine);
  const CollectiveRequest scatter = Bf16(CollectiveKind::kReduceScatter, {0}, 1408 * 2048, "ring");
  const CollectiveRequest gather = Bf16(CollectiveKind::kAllGather, {0}, 256 * 1024);
  std::vector<int> steps = model.Estimate(mesh, scatter)->profile->symmetry(topo).step;
  for (const CollectiveRequest& r : {AllReduce({1}, 1024 * 1024), gather}) {
    steps = CommonSteps(steps, model.Estimate(mesh, r)->profile->symmetry(topo).step);
  }
  EXPECT_TRUE(AnyTranslation(topo, steps));
  RunConfig config;
  config.timing = TimingPath::kCached;
  config.algorithms = {{"psum_scatter", "ring"}};
  config.max_collectives_in_flight = 0;
  config.sharing_pass = SharingPass::kByLink;
  const RunResult by_link = RunProgram(machine, mesh, program, config);
  {
    config.sharing_pass = SharingPass::kByOrbit;
    const RunResult r = RunProgram(machine, mesh, program, config);
    EXPECT_EQ(r.end, by_link.end);
    ASSERT_EQ(r.ops.size(), by_link.ops.size());
    for (size_t i = 0; i < r.ops.size(); ++i) {
      EXPECT_EQ(r.ops[i].start, by_link.ops[i].start) << i;
      EXPECT_EQ(r.ops[i].end, by_link.ops[i].end) << i;
    }
    // Every position's time in collectives: each group's own rate.
    EXPECT_EQ(r.simulated_devices, by_link.simulated_devices);
    ASSERT_EQ(r.per_device.size(), by_link.per_device.size());
    for (size_t p = 0; p < r.per_device.size(); ++p) {
      EXPECT_EQ(r.per_device[p].comm, by_link.per_device[p].comm) << p;
    }
  }
  // All three were slowed: the rates priced were not all 1.
  Time alone;
  for (const CollectiveRequest& r : {scatter, AllReduce({1}, 1024 * 1024), gather}) {
    alone = std::max(alone, model.Estimate(mesh, r)->longest());
  }
  EXPECT_GT(by_link.end, alone);
}

// Worst costs by orbit equal those by link, bit for bit, for every pair and the triple of
// three collectives on TPU v5p 4x4x4 (dp 4 x fsdp 4 x tp 4, each along one dimension): a ring
// reduce-scatter over fsdp, an all-reduce over tp and an all-gather over fsdp x tp (a snake
// through each plane), launched together or not; and the other op's costs found beside an op's
// equal its own call's. The ops have common translations, and some op's groups differ in worst
// cost (so an orbit mixing them would show).
TEST(WorstSharingCostsTest, ByOrbitEqualsByLink) {
  Machine machine(BuildPreset("tpu-v5p", {4, 4, 4}));
  const Topology& topo = machine.topology();
  const Mesh mesh = PlaceMesh(machine, {{"dp", 4}, {"fsdp", 4}, {"tp", 4}});
  NetworkCollectiveModel model(machine);
  std::vector<std::shared_ptr<const CollectiveTiming>> timings;
  for (const CollectiveRequest& r :
       {Bf16(CollectiveKind::kReduceScatter, {1}, 1408 * 2048, "ring"), AllReduce({2}, 1024 * 1024),
        Bf16(CollectiveKind::kAllGather, {1, 2}, 256 * 1024, "ring")}) {
    timings.push_back(model.Estimate(mesh, r));
  }
  int by_orbit = 0;
  bool uneven = false;
  auto check = [&](size_t i, const std::vector<SharingOther>& others) {
    const LinkProfile& op = *timings[i]->profile;
    std::vector<int> steps = op.symmetry(topo).step;
    for (const SharingOther& o : others) steps = CommonSteps(steps, o.profile->symmetry(topo).step);
    if (AnyTranslation(topo, steps)) ++by_orbit;
    const std::vector<double> want = WorstSharingCosts(topo, op, others, SharingPass::kByLink);
    EXPECT_EQ(WorstSharingCosts(topo, op, others, SharingPass::kByOrbit), want) << i;
    for (double w : want) uneven = uneven || w != want[0];
  };
  for (bool together : {false, true}) {
    for (size_t i = 0; i < 3; ++i) {
      std::vector<SharingOther> all;
      for (size_t j = 0; j < 3; ++j) {
        if (j == i) continue;
        all.push_back({timings[j]->profile.get(), together});
        check(i, {{timings[j]->profile.get(), together}});
        const std::vector<double> own =
            WorstSharingCosts(topo, *timings[j]->profile, {{timings[i]->profile.get(), together}},
                              SharingPass::kByLink);
        for (SharingPass pass : {SharingPass::kByLink, SharingPass::kByOrbit}) {
          std::vector<double> partner;
          WorstSharingCosts(topo, *timings[i]->profile, {{timings[j]->profile.get(), together}},
                            pass, &partner);
          EXPECT_EQ(partner, own) << i << " beside " << j;
        }
      }
      check(i, all);
    }
  }
  EXPECT_GT(by_orbit, 0);
  EXPECT_TRUE(uneven);
}

}  // namespace
}  // namespace shardsim
