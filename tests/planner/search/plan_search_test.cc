// Plan search (SPEC "Searching plans"): the space it enumerates (closed-form counts), what it
// prunes, that dominance never discards the best plan an exhaustive evaluation finds, that a
// cache shared across plans and threads gives the same times as a fresh one, that results do
// not depend on the number of jobs, and that known outcomes are resumed, not re-simulated.
#include "planner/search/plan_search.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/placement.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/slowest_member_model.h"
#include "collectives/timing/timing_store.h"
#include "planner/models/serve_step_run.h"
#include "planner/offload.h"
#include "topology/presets.h"

namespace shardsim::planner {
namespace {

TransformerConfig Tiny() {
  TransformerConfig m;
  m.layers = 4;
  m.d_model = 64;
  m.d_ff = 128;
  m.heads = 8;
  m.kv_heads = 2;
  m.head_dim = 8;
  m.vocab = 128;
  return m;
}

TrainConfig TinyTrain() {
  TrainConfig t;
  t.batch = 16;
  t.seq_len = 16;
  t.optimizer = Optimizer::kAdam;
  return t;
}

std::unique_ptr<Machine> V5e8() {
  return std::make_unique<Machine>(BuildPreset("tpu-v5e", {4, 2}));
}

// The tiny model's space on 8 chips: data x fsdp x tensor, every remat, 1 or 2 microbatches;
// a memory limit (0.01% of 16 GiB: 1.7 MB) that some plans exceed.
SearchSpace TinySpace() {
  SearchSpace space;
  space.axes = {"data", "fsdp", "tensor"};
  space.microbatches = {1, 2};
  space.memory_limit = 1e-4;
  return space;
}

SearchOptions Options(int jobs) {
  SearchOptions o;
  o.jobs = jobs;
  o.make_machine = V5e8;
  return o;
}

// Candidate `c` evaluated alone, with a fresh collective cache (what an exhaustive evaluation
// would find).
PlanOutcome EvaluateAlone(const Machine& machine, const TrainConfig& train, const PlanCandidate& c,
                          double memory_limit) {
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  SlowestMemberCollectiveModel collectives(cache);
  return EvaluatePlan(machine, Tiny(), train, c, memory_limit, collectives);
}

TEST(FactorMeshesTest, CountsOrderedFactorisations) {
  // Ordered factorisations of p^a over k axes: C(a + k - 1, k - 1) per prime, multiplied.
  EXPECT_EQ(FactorMeshes(8, {"data", "fsdp", "tensor"}).size(), 10u);      // C(5, 2)
  EXPECT_EQ(FactorMeshes(12, {"data", "tensor"}).size(), 6u);              // C(3, 1) x C(2, 1)
  EXPECT_EQ(FactorMeshes(8960, {"data", "fsdp", "tensor"}).size(), 405u);  // 2^8 5 7: 45 x 3 x 3
  for (const auto& mesh : FactorMeshes(8960, {"data", "fsdp", "tensor"})) {
    int64_t n = 1;
    for (const MeshAxis& a : mesh) {
      EXPECT_GT(a.size, 1);  // Axes of size 1 leave the mesh.
      n *= a.size;
    }
    EXPECT_EQ(n, 8960);
  }
  const auto first = FactorMeshes(8, {"data", "fsdp", "tensor"}).front();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].name, "tensor");
  EXPECT_EQ(first[0].size, 8);
}

// Every order of a mesh's axes once, the given order first: 3! = 6 for three axes.
TEST(AxisOrdersTest, EveryOrderOnceGivenFirst) {
  const std::vector<MeshAxis> mesh = {{"data", 2}, {"fsdp", 4}, {"tensor", 2}};
  const std::vector<std::vector<MeshAxis>> orders = AxisOrders(mesh);
  ASSERT_EQ(orders.size(), 6u);
  std::set<std::string> seen;
  for (const auto& m : orders) {
    std::string text;
    for (const MeshAxis& a : m) text += a.name + "=" + std::to_string(a.size) + " ";
    EXPECT_TRUE(seen.insert(text).second) << text;
    EXPECT_EQ(m.size(), 3u);
  }
  EXPECT_EQ(seen.count("data=2 fsdp=4 tensor=2 "), 1u);
  EXPECT_EQ(orders.front()[0].name, "data");
  EXPECT_EQ(orders.front()[2].name, "tensor");
  EXPECT_EQ(AxisOrders({{"fsdp", 8}}).size(), 1u);
}

// search.axis_orders: all makes each factorisation's every order a family of its own: the tiny
// space's 10 meshes (3 of one axis, 6 of two, 1 of three: 2 x 2 x 2) become 3 + 6 x 2 + 1 x 6 =
// 21, each with its 3 remat x 2 microbatch candidates; the best is at least as fast as the given
// order's best (a superset of plans).
TEST(PlanSearchTest, AllAxisOrdersSearchEveryOrder) {
  SearchSpace space = TinySpace();
  const SearchResult given = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  space.all_axis_orders = true;
  const SearchResult all = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  EXPECT_EQ(all.candidates, 21 * 3 * 2);
  ASSERT_FALSE(given.ranked.empty());
  ASSERT_FALSE(all.ranked.empty());
  EXPECT_LE(all.results[all.ranked[0]].outcome.step_time,
            given.results[given.ranked[0]].outcome.step_time);
}

// search.torus_orders: all adds, for each mesh, every order of handing out the 4x2 torus's
// dimensions that places it differently from the orders before it (the default first): each
// placement once, a family of its own, named by its order (the default's left empty); the best
// is at least as fast as the default placements' best.
TEST(PlanSearchTest, AllTorusOrdersSearchEachDistinctPlacement) {
  SearchSpace space = TinySpace();
  const SearchResult given = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  space.all_torus_orders = true;
  const SearchResult all = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  const std::unique_ptr<Machine> machine = V5e8();
  int64_t placements = 0;
  for (const std::vector<MeshAxis>& mesh : FactorMeshes(8, space.axes)) {
    std::set<std::vector<int>> distinct = {TorusPlacement(mesh, machine->topology(), {1, 0}),
                                           TorusPlacement(mesh, machine->topology(), {0, 1})};
    placements += static_cast<int64_t>(distinct.size());
  }
  EXPECT_GT(placements, 10);  // Some meshes sit differently with dimension 0 handed out first.
  EXPECT_EQ(all.candidates, placements * 3 * 2);
  std::set<std::string> keys;
  for (const PlanResult& r : all.results) {
    EXPECT_TRUE(keys.insert(r.key).second) << r.key;
    const std::vector<int>& order = r.candidate.plan.torus_order;
    if (order.empty()) continue;
    EXPECT_EQ(order, (std::vector<int>{0, 1}));
    EXPECT_NE(TorusPlacement(r.candidate.plan.mesh, machine->topology(), order),
              DefaultPlacement(r.candidate.plan.mesh, machine->topology()));
    EXPECT_NE(r.key.find("; torus_order 0 1"), std::string::npos) << r.key;
  }
  ASSERT_FALSE(all.ranked.empty());
  EXPECT_LE(all.results[all.ranked[0]].outcome.step_time,
            given.results[given.ranked[0]].outcome.step_time);
}

TEST(DefaultRulesTest, EachAxisTakesItsRole) {
  const auto rules = DefaultRules({{"data", 2}, {"fsdp", 4}, {"tensor", 2}});
  EXPECT_EQ(rules.at("batch"), (std::vector<std::string>{"data", "fsdp"}));
  EXPECT_EQ(rules.at("embed"), (std::vector<std::string>{"fsdp"}));
  for (const char* dim : {"heads", "kv_heads", "mlp", "vocab"}) {
    EXPECT_EQ(rules.at(dim), (std::vector<std::string>{"tensor"})) << dim;
  }
  EXPECT_THROW(DefaultRules({{"dp", 2}}), std::invalid_argument);
}

TEST(IndivisibleTest, NamesWhatDoesNotDivide) {
  PlanCandidate c;
  c.plan.mesh = {{"tensor", 4}};
  c.plan.rules = DefaultRules(c.plan.mesh);
  const auto why = Indivisible(Tiny(), TinyTrain(), c);  // kv_heads 2 over tensor 4.
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("kv_heads (2) over tensor=4"), std::string::npos) << *why;
  c.plan.mesh = {{"fsdp", 8}};
  c.plan.rules = DefaultRules(c.plan.mesh);
  EXPECT_FALSE(Indivisible(Tiny(), TinyTrain(), c).has_value());
  c.microbatches = 4;  // 16 / 4 = 4 sequences over fsdp 8.
  ASSERT_TRUE(Indivisible(Tiny(), TinyTrain(), c).has_value());
  c.microbatches = 3;
  EXPECT_NE(Indivisible(Tiny(), TinyTrain(), c)->find("do not divide the batch"),
            std::string::npos);
  // The interleaved schedule needs microbatches a multiple of the stages (SimulatePipeline
  // refuses it): pruned, not simulated and refused.
  c.plan.mesh = {{"data", 2}, {"stage", 4}};
  c.plan.rules = DefaultRules(c.plan.mesh);
  c.plan.pipeline = PipelinePlan{"stage", PipelineSchedule::kInterleaved, 1};
  c.microbatches = 2;
  const auto interleaved = Indivisible(Tiny(), TinyTrain(), c);
  ASSERT_TRUE(interleaved.has_value());
  EXPECT_NE(interleaved->find("not a multiple of the 4 stages"), std::string::npos) << *interleaved;
  c.microbatches = 4;
  EXPECT_FALSE(Indivisible(Tiny(), TinyTrain(), c).has_value());
  // A first stage of 3 of the 4 layers leaves 1 for the 3 stages after it: pruned with
  // PipelineChunkLayers' reason; 1 leaves one each.
  c.plan.pipeline->first_stage_layers = 3;
  const auto first = Indivisible(Tiny(), TinyTrain(), c);
  ASSERT_TRUE(first.has_value());
  EXPECT_NE(first->find("do not split evenly among 3 stages between"), std::string::npos) << *first;
  c.plan.pipeline->first_stage_layers = 1;
  EXPECT_FALSE(Indivisible(Tiny(), TinyTrain(), c).has_value());
}

TEST(PlanSearchTest, PrunesDominatesAndRanks) {
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(1));
  EXPECT_EQ(r.candidates, 10 * 3 * 2);
  int64_t settled = r.dominated + r.beyond_budget + static_cast<int64_t>(r.results.size());
  for (const auto& [reason, n] : r.pruned) settled += n;
  EXPECT_EQ(settled, r.candidates);
  EXPECT_GT(r.pruned.at("logical dimensions the mesh does not divide"), 0);
  EXPECT_GT(r.dominated, 0);
  EXPECT_GT(r.not_fitting, 0);
  ASSERT_FALSE(r.ranked.empty());
  // Ranked: fitting plans, step time ascending.
  for (size_t k = 0; k < r.ranked.size(); ++k) {
    const PlanOutcome& o = r.results[r.ranked[k]].outcome;
    EXPECT_TRUE(o.fits);
    EXPECT_LE(static_cast<double>(o.peak.count()), 1e-4 * static_cast<double>(o.capacity.count()));
    if (k) {
      EXPECT_LE(r.results[r.ranked[k - 1]].outcome.step_time, o.step_time);
    }
  }
  // Nothing evaluated is dominated by a fitting plan of the same mesh and rules.
  for (const PlanResult& a : r.results) {
    for (const PlanResult& b : r.results) {
      if (&a == &b || !b.outcome.fits ||
          a.candidate.plan.mesh.size() != b.candidate.plan.mesh.size())
        continue;
      bool same = a.candidate.plan.rules == b.candidate.plan.rules;
      for (size_t i = 0; same && i < a.candidate.plan.mesh.size(); ++i) {
        same = a.candidate.plan.mesh[i].name == b.candidate.plan.mesh[i].name &&
               a.candidate.plan.mesh[i].size == b.candidate.plan.mesh[i].size;
      }
      if (!same) continue;
      const bool dominated =
          static_cast<int>(b.candidate.plan.remat) <= static_cast<int>(a.candidate.plan.remat) &&
          b.candidate.microbatches <= a.candidate.microbatches;
      EXPECT_FALSE(dominated) << a.key << " dominated by " << b.key;
    }
  }
}

TEST(PlanSearchTest, DominanceKeepsTheBestOfAnExhaustiveEvaluation) {
  // Every candidate that divides, evaluated on its own with a fresh cache: the best fitting
  // one must be the search's best (dominance and the state prune discard only losers).
  const SearchSpace space = TinySpace();
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, Options(1));
  ASSERT_FALSE(r.ranked.empty());
  const PlanResult& best = r.results[r.ranked.front()];
  std::unique_ptr<Machine> machine = V5e8();
  Time exhaustive_best = Time::Picoseconds(INT64_MAX);
  std::string exhaustive_key;
  for (const auto& mesh : FactorMeshes(8, space.axes)) {
    for (int64_t m : space.microbatches) {
      for (RematPolicy remat : space.remat) {
        PlanCandidate c;
        c.plan.mesh = mesh;
        c.plan.rules = DefaultRules(mesh);
        c.plan.remat = remat;
        c.microbatches = m;
        if (Indivisible(Tiny(), TinyTrain(), c)) continue;
        const PlanOutcome o = EvaluateAlone(*machine, TinyTrain(), c, space.memory_limit);
        if (o.refused.empty() && o.fits && o.step_time < exhaustive_best) {
          exhaustive_best = o.step_time;
          exhaustive_key = CandidateKey(c);
        }
      }
    }
  }
  EXPECT_EQ(best.key, exhaustive_key);
  // The shared cache (filled by every plan before) and a fresh one give the same time.
  EXPECT_EQ(best.outcome.step_time, exhaustive_best);
}

// Under memory limits that some plans keep only by not prefetching their weight gathers
// (StepOverlap::kNoPrefetch, slower), the search's best is an exhaustive evaluation's best,
// every plan settled. The limits: just under each no-remat plan's prefetching peak. (Such a
// plan dominates nothing: the same mesh recomputing more may keep the full schedule and be
// faster. This tiny space has no such pair, so the test holds with either rule.)
TEST(PlanSearchTest, FindsTheExhaustiveBestWhenPlansFitOnlyOverlappingLess) {
  SearchSpace space = TinySpace();
  space.microbatches = {1};
  space.remat = {RematPolicy::kNone, RematPolicy::kFull};
  std::unique_ptr<Machine> machine = V5e8();
  std::vector<PlanCandidate> candidates;
  std::vector<double> limits;
  for (const auto& mesh : FactorMeshes(8, space.axes)) {
    for (RematPolicy remat : space.remat) {
      PlanCandidate c;
      c.plan.mesh = mesh;
      c.plan.rules = DefaultRules(mesh);
      c.plan.remat = remat;
      if (Indivisible(Tiny(), TinyTrain(), c)) continue;
      candidates.push_back(c);
      const PlanOutcome o = EvaluateAlone(*machine, TinyTrain(), c, 1.0);
      ASSERT_EQ(o.overlap, StepOverlap::kFull);
      if (remat == RematPolicy::kNone) {
        limits.push_back((static_cast<double>(o.peak.count()) - 1) /
                         static_cast<double>(o.capacity.count()));
      }
    }
  }
  std::sort(limits.begin(), limits.end());
  ASSERT_GE(limits.size(), 3u);
  int fell_back = 0;
  for (double limit : {limits.front(), limits[limits.size() / 2], limits.back()}) {
    space.memory_limit = limit;
    SearchOptions options = Options(1);
    options.confirm = 100;  // Every plan settled, as the exhaustive evaluation below.
    const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, options);
    Time exhaustive_best = Time::Picoseconds(INT64_MAX);
    std::string exhaustive_key;
    for (const PlanCandidate& c : candidates) {
      NetworkCollectiveModel network(*machine);
      CachedCollectiveModel cache(network);
      SlowestMemberCollectiveModel collectives(cache);
      const PlanOutcome o = EvaluatePlan(*machine, Tiny(), TinyTrain(), c, limit, collectives,
                                         nullptr, /*settle=*/true);
      fell_back += o.overlap != StepOverlap::kFull && o.fits;
      if (o.refused.empty() && o.fits && o.step_time < exhaustive_best) {
        exhaustive_best = o.step_time;
        exhaustive_key = CandidateKey(c);
      }
    }
    ASSERT_FALSE(r.ranked.empty()) << limit;
    EXPECT_EQ(r.results[r.ranked.front()].key, exhaustive_key) << limit;
    EXPECT_EQ(r.results[r.ranked.front()].outcome.step_time, exhaustive_best) << limit;
  }
  EXPECT_GT(fell_back, 0);  // Some plans fit only by overlapping less.
}

// Host offload sets are candidates beside remat: the search's best is an exhaustive
// evaluation's best, and under full remat offloading more is never taken as dominated (it keeps
// values full remat would recompute), while a plan without remat that fits dominates its
// offloading variants (copies only add).
TEST(PlanSearchTest, OffloadSetsAreSearchedAndDominanceKeepsTheBest) {
  SearchSpace space = TinySpace();
  space.microbatches = {1};
  const std::vector<std::string> input = {"decoder_layer_input"};
  const std::vector<std::string> four = {"decoder_layer_input", "query_proj", "key_proj",
                                         "value_proj"};
  space.offload = {four, {}, input};  // Any order: the search takes subsets first.
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  EXPECT_EQ(r.candidates, 10 * 3 * 3);
  ASSERT_FALSE(r.ranked.empty());
  std::unique_ptr<Machine> machine = V5e8();
  Time exhaustive_best = Time::Picoseconds(INT64_MAX);
  std::string exhaustive_key;
  std::map<std::string, PlanOutcome> all;
  for (const auto& mesh : FactorMeshes(8, space.axes)) {
    for (RematPolicy remat : space.remat) {
      for (const std::vector<std::string>& offload : space.offload) {
        PlanCandidate c;
        c.plan.mesh = mesh;
        c.plan.rules = DefaultRules(mesh);
        c.plan.remat = remat;
        c.plan.offload = offload;
        if (Indivisible(Tiny(), TinyTrain(), c)) continue;
        const PlanOutcome o = EvaluateAlone(*machine, TinyTrain(), c, space.memory_limit);
        all[CandidateKey(c)] = o;
        if (o.refused.empty() && o.fits && o.step_time < exhaustive_best) {
          exhaustive_best = o.step_time;
          exhaustive_key = CandidateKey(c);
        }
      }
    }
  }
  // The best time (plans may tie: offloading without remat can cost nothing).
  EXPECT_EQ(r.results[r.ranked.front()].outcome.step_time, exhaustive_best) << exhaustive_key;
  // Every plan the search left unevaluated is no faster than one it evaluated that fits.
  std::set<std::string> evaluated;
  for (const PlanResult& p : r.results) evaluated.insert(p.key);
  int64_t full_with_more_offload = 0;
  for (const auto& [key, o] : all) {
    if (evaluated.count(key) || !o.refused.empty() || !o.fits) continue;
    EXPECT_GE(o.step_time, exhaustive_best) << key;
  }
  for (const PlanResult& p : r.results) {
    const bool more = p.candidate.plan.remat == RematPolicy::kFull &&
                      p.candidate.plan.offload.size() == four.size();
    full_with_more_offload += more ? 1 : 0;
  }
  EXPECT_GT(full_with_more_offload, 0);
  // Keys and the plan's text name the offload.
  EXPECT_NE(r.results[0].key.find("; remat"), std::string::npos);
  bool named = false;
  for (const PlanResult& p : r.results) {
    named = named || p.key.find("; offload decoder_layer_input+query_proj") != std::string::npos;
  }
  EXPECT_TRUE(named);
}

// The dominance rule's premise: offloading more of what a plan's remat keeps anyway
// (RematKeeps: every policy the layer's input, none and selective the projections, none the
// attention's output) only adds copies, so nested sets of such names take no less time. It
// failed when a pass's first layer fetched its copies at its own first backward reader (with
// only the layer's input offloaded, its last op: the backward waited for the copy) while a
// larger set fetched earlier; the first layer now fetches as the pass starts.
TEST(PlanSearchTest, OffloadingWhatRematKeepsNeverSpeedsAStep) {
  TrainConfig train = TinyTrain();
  train.seq_len = 64;
  std::unique_ptr<Machine> machine = V5e8();
  for (RematPolicy remat : {RematPolicy::kNone, RematPolicy::kSelective, RematPolicy::kFull}) {
    Time last;
    std::vector<std::string> offload;
    for (const std::string& name : CheckpointNames()) {
      if (!RematKeeps(remat, name)) continue;
      offload.push_back(name);
      PlanCandidate c;
      c.plan.mesh = {{"fsdp", 4}, {"tensor", 2}};
      c.plan.rules = DefaultRules(c.plan.mesh);
      c.plan.remat = remat;
      c.plan.offload = offload;
      const PlanOutcome o = EvaluateAlone(*machine, train, c, 1.0);
      ASSERT_TRUE(o.refused.empty()) << o.refused;
      EXPECT_GE(o.step_time, last) << RematPolicyName(remat) << " " << CandidateKey(c);
      last = o.step_time;
    }
  }
}

// Selective remat keeps the projections but recomputes the attention's output (context), so
// offloading it saves that recompute: a selective plan without offload does not dominate one
// offloading context, and the search evaluates both and ranks the faster first. (It was taken
// as dominated while every checkpoint name was a projection or the layer's input.)
TEST(PlanSearchTest, SelectiveRematDoesNotDominateOffloadingWhatItRecomputes) {
  TrainConfig train = TinyTrain();
  train.seq_len = 256;
  SearchSpace space;
  space.meshes = {{{"fsdp", 4}, {"tensor", 2}}};
  space.remat = {RematPolicy::kSelective};
  space.offload = {{}, {"context"}};
  const SearchResult r = SearchPlans(Tiny(), train, space, Options(1));
  ASSERT_EQ(r.results.size(), 2u);
  std::unique_ptr<Machine> machine = V5e8();
  Time best = Time::Picoseconds(INT64_MAX);
  for (const PlanResult& p : r.results) {
    ASSERT_TRUE(p.outcome.refused.empty()) << p.outcome.refused;
    const PlanOutcome o = EvaluateAlone(*machine, train, p.candidate, space.memory_limit);
    EXPECT_EQ(o.step_time, p.outcome.step_time) << p.key;
    best = std::min(best, o.step_time);
  }
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.results[r.ranked.front()].outcome.step_time, best);
}

TEST(PlanSearchTest, ResultsDoNotDependOnJobs) {
  std::vector<std::string> seen[2];
  SearchOptions one_job = Options(1);
  one_job.confirm = 3;
  const SearchResult one = SearchPlans(Tiny(), TinyTrain(), TinySpace(), one_job);
  SearchOptions two_jobs = Options(2);
  two_jobs.confirm = 3;
  two_jobs.on_result = [&](const PlanResult& r) { seen[1].push_back(r.key); };
  const SearchResult two = SearchPlans(Tiny(), TinyTrain(), TinySpace(), two_jobs);
  ASSERT_EQ(one.results.size(), two.results.size());
  for (size_t i = 0; i < one.results.size(); ++i) {
    seen[0].push_back(one.results[i].key);
    EXPECT_EQ(one.results[i].key, two.results[i].key);
    EXPECT_EQ(one.results[i].index, i);
    EXPECT_EQ(one.results[i].outcome.step_time, two.results[i].outcome.step_time)
        << one.results[i].key;
    EXPECT_EQ(one.results[i].outcome.peak, two.results[i].outcome.peak);
  }
  EXPECT_EQ(one.ranked, two.ranked);
  EXPECT_EQ(seen[0], seen[1]);  // on_result sees the search order.
}

// The search screens plans with the fast composition (2 and 3 layers) and confirms its best
// `confirm` with run's settled one: the best three are settled, each with the outcome
// EvaluatePlan gives with settle on (the step of 4 layers itself here: the settled composition
// probes up to it), the others keep their screening outcomes, and the ranking is by the
// figures shown.
TEST(PlanSearchTest, ConfirmsTheBestPlansWithTheSettledComposition) {
  SearchOptions options = Options(2);
  options.confirm = 3;
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), TinySpace(), options);
  ASSERT_GE(r.ranked.size(), 4u);
  EXPECT_GE(r.confirmed, 3);
  const std::unique_ptr<Machine> machine = V5e8();
  NetworkCollectiveModel network(*machine);
  CachedCollectiveModel cache(network);
  SlowestMemberCollectiveModel collectives(cache);
  int differ = 0;
  for (size_t k = 0; k < r.ranked.size(); ++k) {
    const PlanResult& p = r.results[r.ranked[k]];
    TrainConfig train = TinyTrain();
    const bool settled = k < 3;
    EXPECT_EQ(p.outcome.settled, settled) << k;
    const PlanOutcome alone = EvaluatePlan(*machine, Tiny(), train, p.candidate,
                                           TinySpace().memory_limit, collectives, nullptr, settled);
    EXPECT_EQ(p.outcome.step_time, alone.step_time) << p.key;
    EXPECT_EQ(p.outcome.peak, alone.peak) << p.key;
    if (k > 0) {
      EXPECT_LE(r.results[r.ranked[k - 1]].outcome.step_time, p.outcome.step_time) << k;
    }
    if (settled) {
      const PlanOutcome screened =
          EvaluatePlan(*machine, Tiny(), train, p.candidate, TinySpace().memory_limit, collectives);
      differ += screened.step_time != p.outcome.step_time;
    }
  }
  EXPECT_GT(differ, 0);  // The confirmation changed something: a real check.
}

// A search keeps no per-link figures (tens of thousands of links on a pod) and no longer makes
// them: its reports' link_busy is empty, while EvaluatePlan with a report gives them (for the
// --report page's best plan) and the same figures otherwise.
TEST(SearchPlansTest, ReportsLeaveOutPerLinkFiguresWithoutChangingTheRest) {
  SearchOptions options = Options(1);
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), TinySpace(), options);
  const std::unique_ptr<Machine> machine = V5e8();
  NetworkCollectiveModel network(*machine);
  CachedCollectiveModel cache(network);
  SlowestMemberCollectiveModel collectives(cache);
  int checked = 0;
  for (const PlanResult& p : r.results) {
    if (!p.report) continue;  // Refused.
    EXPECT_TRUE(p.report->link_busy.empty()) << p.key;
    TrainStepReport with, without;
    EvaluatePlan(*machine, Tiny(), TinyTrain(), p.candidate, TinySpace().memory_limit, collectives,
                 &with, p.outcome.settled);
    EvaluatePlan(*machine, Tiny(), TinyTrain(), p.candidate, TinySpace().memory_limit, collectives,
                 &without, p.outcome.settled, /*link_busy=*/false);
    EXPECT_FALSE(with.link_busy.empty()) << p.key;
    EXPECT_TRUE(without.link_busy.empty()) << p.key;
    EXPECT_EQ(with.step_time, without.step_time) << p.key;
    EXPECT_EQ(with.memory.peak, without.memory.peak) << p.key;
    EXPECT_EQ(with.exposed_comm, without.exposed_comm) << p.key;
    ++checked;
  }
  EXPECT_GT(checked, 1);
}

// A plan that fits when screened and not when confirmed no longer dominates its family: the
// variants it had skipped are screened then. The tiny model with 8 layers: the first mesh
// whose plan without remat peaks lower when screened (2 and 3 layers) than when settled; under
// a limit between the two, that plan dominates its family's remat variants while screening,
// then fails its confirmation, and they are simulated (before, the family vanished from the
// ranking: a review found the best plan lost so).
// The tiny model with 8 layers, and on the 8-chip machine the first mesh whose plan without
// remat, screened and settled (its outcomes), satisfies `wanted`.
struct ScreenedAndSettled {
  TransformerConfig model;
  std::optional<PlanCandidate> found;
  PlanOutcome screened, settled;
};
ScreenedAndSettled FirstPlanWhere(
    const std::function<bool(const PlanOutcome& screened, const PlanOutcome& settled)>& wanted) {
  ScreenedAndSettled r;
  r.model = Tiny();
  r.model.layers = 8;
  const std::unique_ptr<Machine> machine = V5e8();
  NetworkCollectiveModel network(*machine);
  CachedCollectiveModel cache(network);
  SlowestMemberCollectiveModel collectives(cache);
  for (const std::vector<MeshAxis>& mesh : FactorMeshes(8, TinySpace().axes)) {
    PlanCandidate c;
    c.plan.mesh = mesh;
    c.plan.rules = DefaultRules(mesh);
    c.microbatches = 1;
    r.screened = EvaluatePlan(*machine, r.model, TinyTrain(), c, 1, collectives, nullptr, false);
    r.settled = EvaluatePlan(*machine, r.model, TinyTrain(), c, 1, collectives, nullptr, true);
    if (r.screened.refused.empty() && wanted(r.screened, r.settled)) {
      r.found = c;
      break;
    }
  }
  return r;
}

TEST(PlanSearchTest, APlanThatStopsFittingWhenConfirmedNoLongerDominates) {
  // The first mesh whose plan without remat peaks lower screened than settled.
  const auto [model, found, screened, settled] =
      FirstPlanWhere([](const PlanOutcome& screened, const PlanOutcome& settled) {
        return screened.peak < settled.peak;
      });
  ASSERT_TRUE(found.has_value());  // The case's premise.
  SearchSpace space = TinySpace();
  space.memory_limit = 0.5 * static_cast<double>((screened.peak + settled.peak).count()) /
                       static_cast<double>(screened.capacity.count());
  SearchOptions options = Options(2);
  options.confirm = 10;
  const SearchResult r = SearchPlans(model, TinyTrain(), space, options);
  bool failed_confirmation = false, reopened = false;
  for (const PlanResult& p : r.results) {
    if (p.key == CandidateKey(*found)) failed_confirmation = p.outcome.settled && !p.outcome.fits;
    bool same_mesh = p.candidate.plan.mesh.size() == found->plan.mesh.size();
    for (size_t a = 0; same_mesh && a < found->plan.mesh.size(); ++a) {
      same_mesh = p.candidate.plan.mesh[a].name == found->plan.mesh[a].name &&
                  p.candidate.plan.mesh[a].size == found->plan.mesh[a].size;
    }
    reopened = reopened || (same_mesh && p.candidate.plan.remat != RematPolicy::kNone);
  }
  EXPECT_TRUE(failed_confirmation) << CandidateKey(*found);
  EXPECT_TRUE(reopened) << CandidateKey(*found);
}

// The converse: a plan screened just over the limit that fits once settled is confirmed and
// ranked. The tiny model with 8 layers: the first mesh whose plan without remat peaks higher
// when screened than when settled, by under 5%; under a limit between the two, screening
// finds it does not fit, and confirmation finds it does (before, it was counted as not
// fitting, its settled peak never computed).
TEST(PlanSearchTest, APlanScreenedJustOverTheLimitIsConfirmed) {
  const auto [model, found, screened, settled] =
      FirstPlanWhere([](const PlanOutcome& screened, const PlanOutcome& settled) {
        return screened.peak > settled.peak && static_cast<double>(screened.peak.count()) <
                                                   1.05 * static_cast<double>(settled.peak.count());
      });
  ASSERT_TRUE(found.has_value());  // The case's premise.
  SearchSpace space = TinySpace();
  space.memory_limit = 0.5 * static_cast<double>((screened.peak + settled.peak).count()) /
                       static_cast<double>(screened.capacity.count());
  SearchOptions options = Options(2);
  options.confirm = 100;  // Every plan would rank among them.
  const SearchResult r = SearchPlans(model, TinyTrain(), space, options);
  bool ranked = false;
  for (size_t i : r.ranked) {
    const PlanResult& p = r.results[i];
    if (p.key != CandidateKey(*found)) continue;
    ranked = true;
    EXPECT_TRUE(p.outcome.settled);
    EXPECT_EQ(p.outcome.peak, settled.peak);
  }
  EXPECT_TRUE(ranked) << CandidateKey(*found);
}

TEST(PlanSearchTest, ResumesKnownOutcomesWithoutSimulating) {
  const SearchResult first = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(1));
  SearchOptions resume = Options(1);
  const size_t half = first.results.size() / 2;
  for (size_t i = 0; i < half; ++i) {
    resume.known[first.results[i].key] = first.results[i].outcome;
  }
  const SearchResult again = SearchPlans(Tiny(), TinyTrain(), TinySpace(), resume);
  EXPECT_EQ(again.simulated, static_cast<int64_t>(first.results.size() - half));
  ASSERT_EQ(again.results.size(), first.results.size());
  for (size_t i = 0; i < first.results.size(); ++i) {
    EXPECT_EQ(again.results[i].resumed, i < half);
    EXPECT_EQ(again.results[i].outcome.step_time, first.results[i].outcome.step_time);
  }
  EXPECT_EQ(again.ranked, first.ranked);
}

// A search keeping its caches (collective timings, their slowest-member copies, the workers'
// machines and built steps) serves the next from them, and both give the fresh search's
// outcomes.
TEST(PlanSearchTest, KeptCachesPriceTheNextSearchAlike) {
  std::unique_ptr<Machine> machine = V5e8();
  SearchCaches caches(*machine);
  SearchOptions o = Options(2);
  int machines = 0;
  o.make_machine = [&machines] {
    ++machines;
    return V5e8();
  };
  o.caches = &caches;
  const SearchResult first = SearchPlans(Tiny(), TinyTrain(), TinySpace(), o);
  EXPECT_EQ(machines, 2);  // One per worker, this thread's included.
  const int64_t misses = caches.cache().misses();
  EXPECT_GT(misses, 0);
  const Machine* worker_machine = caches.worker(1, o.make_machine).machine.get();
  auto builds = [&caches] {
    return caches.build_cache(0).misses() + caches.build_cache(1).misses();
  };
  const int64_t built = builds();
  EXPECT_GT(built, 0);
  const SearchResult second = SearchPlans(Tiny(), TinyTrain(), TinySpace(), o);
  EXPECT_EQ(caches.cache().misses(), misses);  // Nothing simulated again.
  EXPECT_EQ(machines, 2);                      // Nor any machine built again.
  EXPECT_EQ(caches.worker(1, o.make_machine).machine.get(), worker_machine);
  // Each worker builds only what it did not build for the first (which plans it takes varies).
  EXPECT_LT(builds() - built, built);
  const SearchResult fresh = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(1));
  ASSERT_EQ(second.results.size(), fresh.results.size());
  for (size_t i = 0; i < fresh.results.size(); ++i) {
    EXPECT_EQ(second.results[i].outcome.step_time, fresh.results[i].outcome.step_time);
    EXPECT_EQ(first.results[i].outcome.step_time, fresh.results[i].outcome.step_time);
  }
}

// A search with a store of timings ranks as one without, twice: the first fills the store, the
// second, with caches of its own, reads every collective the first simulated and simulates none.
TEST(PlanSearchTest, AStoreOfTimingsPricesTheNextSearchAlike) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("shardsim_search_store_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::unique_ptr<Machine> machine = V5e8();
  const TimingStore store(dir.string(), "test", machine->topology());
  auto times = [](const SearchResult& r) {
    std::vector<std::tuple<std::string, int64_t, int64_t>> out;
    for (const PlanResult& p : r.results) {
      out.emplace_back(p.key, p.outcome.step_time.picoseconds(), p.outcome.peak.count());
    }
    return out;
  };
  const SearchResult plain = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(1));
  ASSERT_GT(plain.results.size(), 2u);
  SearchOptions o = Options(1);
  SearchCaches filling_caches(*machine, &store);
  o.caches = &filling_caches;
  const SearchResult filling = SearchPlans(Tiny(), TinyTrain(), TinySpace(), o);
  SearchCaches::Worker& filler = filling_caches.worker(0, o.make_machine);
  EXPECT_GT(filler.network->simulations(), 0);
  EXPECT_EQ(filler.stored->loaded(), 0);
  SearchCaches reading_caches(*machine, &store);
  o.caches = &reading_caches;
  const SearchResult reading = SearchPlans(Tiny(), TinyTrain(), TinySpace(), o);
  SearchCaches::Worker& reader = reading_caches.worker(0, o.make_machine);
  EXPECT_EQ(reader.network->simulations(), 0);
  EXPECT_EQ(reader.stored->loaded(), filler.network->simulations());
  EXPECT_EQ(times(filling), times(plain));
  EXPECT_EQ(times(reading), times(plain));
  EXPECT_EQ(filling.ranked, plain.ranked);
  EXPECT_EQ(reading.ranked, plain.ranked);
  std::filesystem::remove_all(dir);
}

TEST(PlanSearchTest, ResumedOutcomesAreJudgedByThisSearchsMemoryLimit) {
  const SearchResult tight = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(1));
  ASSERT_GT(tight.not_fitting, 0);
  SearchOptions resume = Options(1);
  resume.simulate = false;  // Only what the first search evaluated.
  for (const PlanResult& r : tight.results) resume.known[r.key] = r.outcome;
  SearchSpace loose = TinySpace();
  loose.memory_limit = 1.0;
  const SearchResult again = SearchPlans(Tiny(), TinyTrain(), loose, resume);
  EXPECT_EQ(again.not_fitting, 0);
  EXPECT_EQ(again.simulated, 0);
}

TEST(PlanSearchTest, BudgetTakesTheFirstCandidates) {
  SearchOptions o = Options(2);
  o.budget = 5;
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), TinySpace(), o);
  const SearchResult all = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(1));
  // Exactly five candidates considered (simulated or skipped as dominated), the rest counted.
  EXPECT_EQ(static_cast<int64_t>(r.results.size()) + r.dominated, 5);
  EXPECT_EQ(r.beyond_budget,
            static_cast<int64_t>(all.results.size()) + all.dominated + all.beyond_budget - 5);
  // Each is what the whole search found for the same plan.
  for (const PlanResult& p : r.results) {
    bool found = false;
    for (const PlanResult& q : all.results) {
      if (q.key != p.key) continue;
      found = true;
      EXPECT_EQ(q.outcome.step_time, p.outcome.step_time) << p.key;
    }
    EXPECT_TRUE(found) << p.key;
  }
}

TEST(PlanSearchTest, SimulatesBestFirst) {
  // Phase 1 takes each family's first candidate; phase 2 the rest of the families in order of
  // those first candidates' step times, fitting ones first.
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), TinySpace(), Options(2));
  std::set<std::string> families_seen;
  size_t phase1 = 0;
  auto family = [](const PlanResult& p) { return p.key.substr(0, p.key.find("; remat")); };
  while (phase1 < r.results.size() && families_seen.insert(family(r.results[phase1])).second) {
    ++phase1;
  }
  ASSERT_LT(phase1, r.results.size());
  // Phase 2's families appear in order of their first candidate's (fits, step time).
  std::map<std::string, std::pair<int, Time>> first;
  for (size_t i = 0; i < phase1; ++i) {
    const PlanOutcome& o = r.results[i].outcome;
    first[family(r.results[i])] = {o.fits ? 0 : 1, o.step_time};
  }
  std::pair<int, Time> last{-1, Time()};
  for (size_t i = phase1; i < r.results.size(); ++i) {
    const auto key = first.at(family(r.results[i]));
    EXPECT_LE(last, key) << r.results[i].key;
    last = key;
  }
}

TEST(PlanSearchTest, ServingPlansRankByTheirObjective) {
  SearchSpace space;
  space.axes = {"data", "tensor"};
  ServeConfig serve;
  serve.batch = 8;
  serve.prompt_len = 16;
  serve.decode_len = 8;
  space.serve = serve;
  for (SearchObjective objective :
       {SearchObjective::kTtft, SearchObjective::kTpot, SearchObjective::kTokensPerSPerDevice}) {
    space.objective = objective;
    const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
    // data x tensor over 8 chips, tensor dividing kv_heads 2: tensor 1 or 2.
    EXPECT_EQ(r.candidates, 4);
    ASSERT_EQ(r.ranked.size(), 2u);
    const PlanOutcome& a = r.results[r.ranked[0]].outcome;
    const PlanOutcome& b = r.results[r.ranked[1]].outcome;
    if (objective == SearchObjective::kTtft) {
      EXPECT_LE(a.ttft, b.ttft);
    }
    if (objective == SearchObjective::kTpot) {
      EXPECT_LE(a.tpot, b.tpot);
    }
    if (objective == SearchObjective::kTokensPerSPerDevice) {
      EXPECT_GE(a.tokens_per_s_per_device, b.tokens_per_s_per_device);
    }
    // Each is SimulateServe's answer (with the search's slowest-member timing).
    std::unique_ptr<Machine> machine = V5e8();
    for (const PlanResult& p : r.results) {
      NetworkCollectiveModel network(*machine);
      CachedCollectiveModel cache(network);
      SlowestMemberCollectiveModel collectives(cache);
      TrainStepOptions options;
      options.collective_model = &collectives;
      const ServeReport direct = SimulateServe(*machine, Tiny(), serve, p.candidate.plan, options);
      EXPECT_EQ(p.outcome.ttft, direct.ttft) << p.key;
      EXPECT_EQ(p.outcome.tpot, direct.tpot) << p.key;
      EXPECT_EQ(p.outcome.step_time, direct.total) << p.key;
    }
  }
}

TEST(PlanSearchTest, EachPipelineScheduleIsAFamily) {
  SearchSpace space;
  space.axes = {"data", "stage"};
  space.microbatches = {2, 4};
  space.pipelines = {PipelinePlan{"stage", PipelineSchedule::kOneFOneB, 1},
                     PipelinePlan{"stage", PipelineSchedule::kInterleaved, 2}};
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  // data x stage over 8: 1 mesh without a stage axis (data 8), 3 with one; each candidate
  // family per mesh and schedule: 2 microbatches x 3 remat.
  EXPECT_EQ(r.candidates, 1 * 2 * 3 + 3 * 2 * 2 * 3);
  std::set<std::string> schedules;
  for (const PlanResult& p : r.results) {
    if (p.candidate.plan.pipeline) {
      schedules.insert(std::string(PipelineScheduleName(p.candidate.plan.pipeline->schedule)) +
                       std::to_string(p.candidate.plan.pipeline->virtual_stages));
      EXPECT_NE(p.key.find("; pipeline stage"), std::string::npos) << p.key;
    }
  }
  EXPECT_EQ(schedules, (std::set<std::string>{"1f1b1", "interleaved2"}));
}

// The state bound of a mixture of experts with leading dense layers (it built 1- and 2-layer
// models keeping 3 dense layers, an invalid model, and the whole search stopped) and of one
// whose layers are all dense.
TEST(PlanSearchTest, SearchesMixturesOfExpertsWithLeadingDenseLayers) {
  TransformerConfig moe = Tiny();
  moe.layers = 7;
  moe.experts = 4;
  moe.top_k = 2;
  moe.expert_d_ff = 64;
  SearchSpace space = TinySpace();
  space.axes = {"data", "expert"};
  space.microbatches = {1};
  space.memory_limit = 1;
  for (int64_t dense : {3, 7}) {
    moe.dense_layers = dense;
    const SearchResult r = SearchPlans(moe, TinyTrain(), space, Options(1));
    EXPECT_GT(r.simulated, 0) << dense;
    EXPECT_EQ(r.refused, 0) << dense;
  }
}

// Algorithm sets are families of their own: twice the candidates for two sets, each plan
// evaluated with its own algorithms (the outcome an evaluation alone gives), and the
// algorithm changes some step (the tensor axis' psums run as one ring or two).
TEST(PlanSearchTest, AlgorithmSetsAreSearched) {
  SearchSpace space = TinySpace();
  const SearchResult plain = SearchPlans(Tiny(), TinyTrain(), space, Options(1));
  space.algorithms = {{{"all_reduce", "ring"}}, {{"all_reduce", "bidirectional_ring"}}};
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, Options(2));
  EXPECT_EQ(r.candidates, 2 * plain.candidates);
  std::map<std::string, std::map<std::string, Time>> by_plan;  // key less algorithm -> times
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  for (const PlanResult& p : r.results) {
    if (!p.outcome.refused.empty()) continue;
    const std::string algorithm = p.candidate.plan.algorithms.at("all_reduce");
    std::string key = p.key.substr(0, p.key.find("; all_reduce="));
    by_plan[key][algorithm] = p.outcome.step_time;
  }
  int differ = 0;
  for (const auto& [key, times] : by_plan) {
    if (times.size() == 2 && times.at("ring") != times.at("bidirectional_ring")) ++differ;
  }
  EXPECT_GT(differ, 0);
  int checked = 0;
  for (const PlanResult& p : r.results) {
    if (!p.outcome.refused.empty() || checked == 2) continue;
    EXPECT_EQ(EvaluateAlone(machine, TinyTrain(), p.candidate, space.memory_limit).step_time,
              p.outcome.step_time)
        << p.key;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(PlanSearchTest, StateOverTheLimitIsPrunedUnsimulated) {
  SearchSpace space = TinySpace();
  space.memory_limit = 1e-6;  // 16 KiB: less than the tiny model's parameters per device.
  const SearchResult r = SearchPlans(Tiny(), TinyTrain(), space, Options(1));
  EXPECT_EQ(r.simulated, 0);
  EXPECT_GT(r.pruned.at("parameters and optimizer state alone over the memory limit"), 0);
}

}  // namespace
}  // namespace shardsim::planner
