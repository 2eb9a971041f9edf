#include "planner/search/plan_search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>

#include "collectives/placement.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/slowest_member_model.h"
#include "planner/models/logical_rules.h"
#include "planner/models/serve_step_run.h"
#include "planner/offload.h"
#include "sim/fnv_hash.h"
#include "sim/spec_error.h"

namespace shardsim::planner {

std::string DominantPart(const TrainStepReport& report) {
  std::string part = "compute";
  Time most = report.compute;
  if (report.bubble > most) {
    part = "bubble";
    most = report.bubble;
  }
  if (report.exposed_comm > most) {
    part = "exposed comm";
    Time largest;
    for (const auto& [name, t] : report.exposed_by_collective) {
      if (t > largest) {
        largest = t;
        part = name;
      }
    }
  }
  return part;
}

namespace {

// Runs `simulate`; returns why the simulator refused the plan (a SpecError or
// std::invalid_argument it threw), or "" when it ran.
template <typename Simulate>
std::string RefusalOf(Simulate&& simulate) {
  try {
    simulate();
  } catch (const SpecError& e) {
    return e.what();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Whether `peak` is at most `memory_limit` of `capacity`.
bool WithinLimit(Bytes peak, Bytes capacity, double memory_limit) {
  return static_cast<double>(peak.count()) <= memory_limit * static_cast<double>(capacity.count());
}

// How far over the memory limit a screened peak may be and the plan still be confirmed: the
// composition's own bound on peaks (TrainStepOptions::compose: within 5% of the whole step's).
// Screening overestimated by at most 0.53% on the example searches' 394 plans screened over
// the limit (it underestimates far more often, and by up to 44%).
constexpr double kScreenedPeakMargin = 0.05;

}  // namespace

PlanOutcome EvaluatePlan(const Machine& machine, const TransformerConfig& model,
                         const TrainConfig& train, const PlanCandidate& candidate,
                         double memory_limit, CollectiveCostModel& collectives,
                         TrainStepReport* report, bool settle, bool link_busy,
                         StepBuildCache* build_cache) {
  TrainConfig t = train;
  t.microbatches = candidate.microbatches;
  TrainStepOptions options;
  options.collective_model = &collectives;
  options.build_cache = build_cache;
  options.settle = settle;
  options.link_busy = link_busy && report != nullptr;
  // The schedule keeps to the limit `fits` checks; screening's peaks, which confirmation
  // settles, keep the full schedule up to the margin it confirms over the limit.
  options.memory_limit = settle ? memory_limit : memory_limit * (1 + kScreenedPeakMargin);
  PlanOutcome o;
  TrainStepReport r;
  o.refused = RefusalOf([&] { r = SimulateTrainStep(machine, model, t, candidate.plan, options); });
  if (!o.refused.empty()) return o;
  o.step_time = r.step_time;
  o.mfu = r.mfu;
  o.tokens_per_s_per_device = r.tokens_per_s_per_device;
  o.compute = r.compute;
  o.exposed_comm = r.exposed_comm;
  o.bubble = r.bubble;
  o.recompute = r.recompute;
  o.peak = r.memory.peak;
  o.capacity = r.memory.capacity;
  o.fits = WithinLimit(o.peak, o.capacity, memory_limit);
  o.overlap = r.overlap;
  o.dominant = DominantPart(r);
  if (r.overlap != StepOverlap::kFull) {
    o.dominant += std::string(" (schedule ") + StepOverlapName(r.overlap) + ")";
  }
  o.settled = settle;
  if (report) *report = std::move(r);
  return o;
}

PlanOutcome EvaluateServePlan(const Machine& machine, const TransformerConfig& model,
                              const ServeConfig& serve, const PlanCandidate& candidate,
                              double memory_limit, CollectiveCostModel& collectives, bool settle) {
  TrainStepOptions options;
  options.collective_model = &collectives;
  options.settle = settle;
  PlanOutcome o;
  ServeReport r;
  o.refused = RefusalOf([&] { r = SimulateServe(machine, model, serve, candidate.plan, options); });
  if (!o.refused.empty()) return o;
  o.step_time = r.total;
  o.ttft = r.ttft;
  o.tpot = r.tpot;
  o.tokens_per_s_per_device = r.tokens_per_s_per_device;
  o.compute = r.decode_compute;
  o.exposed_comm = r.decode_exposed_comm;
  o.peak = r.memory.peak;
  o.capacity = r.memory.capacity;
  o.fits = WithinLimit(o.peak, o.capacity, memory_limit);
  o.dominant =
      r.decode_exposed_comm > r.decode_compute ? "decode's exposed comm" : "decode's compute";
  o.settled = settle;
  return o;
}

namespace {

// A (mesh, rules) pair's candidates in dominance order: microbatches ascending, then remat
// from none to full, then offload sets by size, so every candidate that could dominate one
// comes before it.
struct Family {
  std::vector<PlanCandidate> variants;
};

// Per device, the parameters and optimizer state of `model` under `plan` (mesh and rules):
// affine in the layer count, so read from 1- and 2-layer steps (after a mixture of experts'
// leading dense layers: affine in the expert layers; all dense, a dense model's). Those steps
// are taken from `steps` where built for another plan with the same axis names (the state
// reads each array's shape and sharding by axis names, at this mesh's sizes), else built and
// kept there.
Bytes StateLowerBound(const TransformerConfig& model, const TrainConfig& train,
                      const StepPlan& plan, StepBuildCache& steps) {
  std::vector<int> devices(static_cast<size_t>(std::accumulate(
      plan.mesh.begin(), plan.mesh.end(), 1, [](int n, const MeshAxis& a) { return n * a.size; })));
  std::iota(devices.begin(), devices.end(), 0);
  const Mesh mesh(plan.mesh, devices);
  const LogicalRules rules = PlanRules(plan);
  TransformerConfig shorter = model;
  int64_t dense = model.experts > 0 ? model.dense_layers : 0;
  if (dense >= model.layers) {
    shorter.experts = 0;
    shorter.dense_layers = 0;
    dense = 0;
  }
  TrainConfig one = train;
  one.microbatches = 1;  // State does not depend on microbatches.
  int64_t s[2];
  for (int64_t layers : {1, 2}) {
    shorter.layers = dense + layers;
    const StepBuildCache::Key key =
        StepBuildCache::KeyOf(shorter, one, rules, plan.mesh, RematPolicy::kNone, {}, {});
    std::shared_ptr<const ExpandedTrainStep> built = steps.Find(key, plan.mesh);
    if (!built) {
      auto made = std::make_shared<ExpandedTrainStep>();
      made->global = BuildTrainStep(shorter, one, plan.mesh, rules);
      built = std::move(made);
      steps.Insert(key, built);
    }
    const StateBytes b = StepStateBytes(built->global, mesh);
    s[layers - 1] = (b.params + b.optimizer).count();
  }
  return Bytes(s[0] + (s[1] - s[0]) * (model.layers - dense - 1));
}

// Every pair of an entry of `a` and one of `b`, `a` major.
std::vector<std::pair<bool, bool>> Pairs(const std::vector<bool>& a, const std::vector<bool>& b) {
  std::vector<std::pair<bool, bool>> out;
  for (bool x : a) {
    for (bool y : b) out.push_back({x, y});
  }
  return out;
}

// Whether every name of `a` is in `b`.
bool Within(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (const std::string& name : a) {
    if (std::find(b.begin(), b.end(), name) == b.end()) return false;
  }
  return true;
}

// Whether `o` is better than `p` by `objective` (ties: neither).
bool Better(SearchObjective objective, const PlanOutcome& o, const PlanOutcome& p) {
  switch (objective) {
    case SearchObjective::kTokensPerSPerDevice:
      return o.tokens_per_s_per_device > p.tokens_per_s_per_device;
    case SearchObjective::kTtft:
      return o.ttft < p.ttft;
    case SearchObjective::kTpot:
      return o.tpot < p.tpot;
    case SearchObjective::kStepTime:
      break;
  }
  return o.step_time < p.step_time;
}

}  // namespace

SearchCaches::Worker& SearchCaches::Slot(size_t worker) {
  while (workers_.size() <= worker) workers_.push_back(std::make_unique<Worker>());
  return *workers_[worker];
}

SearchCaches::Worker& SearchCaches::worker(
    size_t worker, const std::function<std::unique_ptr<Machine>()>& make_machine) {
  Worker& w = Slot(worker);
  if (!w.machine) {
    w.machine = make_machine();
    w.network = std::make_unique<NetworkCollectiveModel>(*w.machine);
    if (store_)
      w.stored =
          std::make_unique<StoredCollectiveModel>(*w.network, *store_, w.machine->topology());
  }
  return w;
}

StepBuildCache& SearchCaches::build_cache(size_t worker) { return Slot(worker).build_cache; }

SearchResult SearchPlans(const TransformerConfig& model, const TrainConfig& train,
                         const SearchSpace& space, const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  SearchResult result;
  // The caches given, or this search's own (their misses priced on a machine of their own).
  std::unique_ptr<Machine> own_machine;
  std::unique_ptr<SearchCaches> own_caches;
  if (!options.caches) {
    own_machine = options.make_machine();
    own_caches = std::make_unique<SearchCaches>(*own_machine, options.store);
  }
  SearchCaches& caches = options.caches ? *options.caches : *own_caches;
  // Each worker's machine and network model (0: this thread's), kept in the caches.
  std::vector<SearchCaches::Worker*> workers;
  for (int j = 0; j < std::max(1, options.jobs); ++j) {
    workers.push_back(&caches.worker(static_cast<size_t>(j), options.make_machine));
  }
  Machine* main_machine = workers[0]->machine.get();
  const int devices = main_machine->topology().num_devices();
  const Bytes capacity = main_machine->hbm_capacity();

  // Enumerate and prune.
  std::vector<std::vector<MeshAxis>> meshes = space.meshes;
  if (meshes.empty()) meshes = FactorMeshes(devices, space.axes);
  if (space.all_axis_orders) {
    std::vector<std::vector<MeshAxis>> ordered;
    for (const std::vector<MeshAxis>& mesh : meshes) {
      for (std::vector<MeshAxis>& m : AxisOrders(mesh)) ordered.push_back(std::move(m));
    }
    meshes = std::move(ordered);
  }
  // Serving has no remat or microbatches; its batch and prompt stand for train's in the
  // divisibility checks.
  TrainConfig shape = train;
  if (space.serve) {
    shape.batch = space.serve->batch;
    shape.seq_len = space.serve->prompt_len;
    shape.microbatches = 1;
  }
  std::vector<int64_t> microbatches = space.serve ? std::vector<int64_t>{1} : space.microbatches;
  std::sort(microbatches.begin(), microbatches.end());
  microbatches.erase(std::unique(microbatches.begin(), microbatches.end()), microbatches.end());
  // Offload sets by size (a set's subsets first), each once; serving offloads nothing.
  std::vector<std::vector<std::string>> offload;
  for (const std::vector<std::string>& set :
       space.serve ? std::vector<std::vector<std::string>>{{}} : space.offload) {
    bool seen = false;
    for (const std::vector<std::string>& o : offload) {
      seen = seen || (o.size() == set.size() && Within(o, set));
    }
    if (!seen) offload.push_back(set);
  }
  std::stable_sort(offload.begin(), offload.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  std::vector<RematPolicy> remat =
      space.serve ? std::vector<RematPolicy>{RematPolicy::kNone} : space.remat;
  std::sort(remat.begin(), remat.end(),
            [](RematPolicy a, RematPolicy b) { return RematRank(a) < RematRank(b); });
  remat.erase(std::unique(remat.begin(), remat.end()), remat.end());
  // Modes and sequence parallelism once each, in the order given; serving takes the first
  // collective matmul mode (its steps have no weight gathers to fuse).
  auto distinct = [](const auto& list) {
    std::decay_t<decltype(list)> once;
    for (const auto& x : list) {
      if (std::find(once.begin(), once.end(), x) == once.end()) once.push_back(x);
    }
    return once;
  };
  std::vector<CollectiveMatmulMode> matmul_modes = distinct(space.collective_matmul);
  if (space.serve && matmul_modes.size() > 1) matmul_modes.resize(1);
  const std::vector<bool> sequence_parallel = distinct(space.sequence_parallel);
  const std::vector<bool> activation_embed = distinct(space.activation_embed);
  std::vector<std::map<std::string, std::string>> algorithm_sets = distinct(space.algorithms);
  if (algorithm_sets.empty()) algorithm_sets = {{}};
  std::vector<Family> families;
  int64_t kept = 0;
  StepBuildCache state_steps;  // The 1- and 2-layer steps StateLowerBound reads.
  // The family of `plan` (its mesh, rules and schedule): every microbatch count and remat
  // policy, less what is pruned or beyond the budget.
  auto add_family = [&](const StepPlan& plan) {
    Family family;
    std::optional<bool> state_fits;
    for (int64_t m : microbatches) {
      for (RematPolicy r : remat) {
        for (const std::vector<std::string>& o : offload) {
          ++result.candidates;
          PlanCandidate c{plan, m};
          c.plan.remat = r;
          c.plan.remat_save =
              r == RematPolicy::kCustom ? space.remat_save : std::vector<std::string>{};
          c.plan.offload = o;
          if (Indivisible(model, shape, c)) {
            ++result.pruned["logical dimensions the mesh does not divide"];
            continue;
          }
          if (!state_fits && !plan.pipeline && !space.serve) {
            state_fits = WithinLimit(StateLowerBound(model, train, plan, state_steps), capacity,
                                     space.memory_limit);
          }
          if (state_fits && !*state_fits) {
            ++result.pruned["parameters and optimizer state alone over the memory limit"];
            continue;
          }
          if (options.budget > 0 && kept >= options.budget) {
            ++result.beyond_budget;
            continue;
          }
          ++kept;
          family.variants.push_back(std::move(c));
        }
      }
    }
    if (!family.variants.empty()) families.push_back(std::move(family));
  };
  // Each mesh with each torus order that places it differently (the default order first,
  // left empty; equal placements once), or with the pinned order.
  std::vector<std::pair<std::vector<MeshAxis>, std::vector<int>>> placed;
  const std::optional<TorusShape>& torus = main_machine->topology().torus();
  for (const std::vector<MeshAxis>& mesh : meshes) {
    placed.push_back({mesh, space.torus_order});
    if (!space.all_torus_orders || !torus) continue;
    const std::vector<int> first = DefaultTorusOrder(static_cast<int>(torus->shape.size()));
    std::set<std::vector<int>> seen;
    std::vector<int> order = first;
    std::sort(order.begin(), order.end());
    try {
      seen.insert(main_machine->Placement(mesh, first));
      do {
        if (seen.insert(main_machine->Placement(mesh, order)).second) {
          placed.push_back({mesh, order});
        }
      } while (std::next_permutation(order.begin(), order.end()));
    } catch (const std::invalid_argument&) {
      // A mesh that does not use the whole machine: its run says why.
    }
  }
  for (const auto& [mesh, torus_order] : placed) {
    std::vector<std::map<std::string, std::vector<std::string>>> rule_sets = space.rules;
    if (rule_sets.empty()) rule_sets = {DefaultRules(mesh)};
    // A mesh with a stage axis makes a family per pipeline schedule; others one family.
    std::vector<std::optional<PipelinePlan>> schedules = {std::nullopt};
    for (const MeshAxis& m : mesh) {
      if (!space.pipelines.empty() && m.name == space.pipelines.front().axis && m.size > 1) {
        schedules.assign(space.pipelines.begin(), space.pipelines.end());
      }
    }
    for (const auto& rules : rule_sets) {
      for (const auto& [sp, ae] : Pairs(sequence_parallel, activation_embed)) {
        StepPlan plan;
        plan.mesh = mesh;
        plan.torus_order = torus_order;
        // Rules naming an axis this mesh left out (size 1) drop it.
        for (const auto& [dim, axes] : rules) {
          std::vector<std::string> present;
          for (const std::string& a : axes) {
            for (const MeshAxis& m : mesh) {
              if (m.name == a) present.push_back(a);
            }
          }
          if (!present.empty()) plan.rules[dim] = present;
        }
        if (sp) {
          // Megatron's sequence parallelism: the sequence splits over the heads' (tensor) axes
          // outside attention and the MLP. Without such axes, or with the sequence split
          // already, it is the plan without it.
          auto heads = plan.rules.find("heads");
          if (heads != plan.rules.end() && !plan.rules.count("length")) {
            plan.rules["length"] = heads->second;
          } else if (std::count(sequence_parallel.begin(), sequence_parallel.end(), false) > 0) {
            continue;  // Tried without it already.
          }
        }
        if (ae) {
          // MaxText's activation_embed: the residual stream's d_model splits over the heads'
          // (tensor) axes, as its logical_axis_rules do. Likewise tried once without such axes,
          // and once where batch or length takes them all: the stream is [batch, length,
          // activation_embed] and a later name drops an earlier one's axes (LogicalRules::Spec),
          // so with sequence parallelism over the heads' axes it splits nothing more.
          auto heads = plan.rules.find("heads");
          auto taken = [&](const std::string& axis) {
            for (const char* dim : {"batch", "length"}) {
              auto it = plan.rules.find(dim);
              if (it != plan.rules.end() &&
                  std::find(it->second.begin(), it->second.end(), axis) != it->second.end()) {
                return true;
              }
            }
            return false;
          };
          if (heads != plan.rules.end() && !plan.rules.count("activation_embed") &&
              !std::all_of(heads->second.begin(), heads->second.end(), taken)) {
            plan.rules["activation_embed"] = heads->second;
          } else if (std::count(activation_embed.begin(), activation_embed.end(), false) > 0) {
            continue;
          }
        }
        for (const std::optional<PipelinePlan>& schedule : schedules) {
          plan.pipeline = schedule;
          // Each collective matmul mode and each algorithm set is a family of its own (its
          // remat and microbatches dominate only each other).
          for (CollectiveMatmulMode cm : matmul_modes) {
            plan.collective_matmul = cm;
            for (const std::map<std::string, std::string>& algorithms : algorithm_sets) {
              plan.algorithms = algorithms;
              add_family(plan);
            }
          }
        }
      }
    }
  }

  // Evaluate, best first, in two phases. Phase 1 simulates each family's first candidate (the
  // least remat and fewest microbatches: the fastest it can be if it fits); phase 2 the rest
  // of each family, families in order of their first candidate's step time (those that fit
  // first). Within a family the candidates run in order on one worker, so dominance sees the
  // same outcomes whatever the threads do; each phase commits its items in its order, so
  // on_result sees one sequence for any number of jobs. Families whose index modulo
  // process_count is not process_rank belong to other processes.
  CachedCollectiveModel& shared = caches.cache();
  // Per machine (one thread uses each at a time): the steps built for its earlier plans (and
  // for an earlier search's, with options.caches).
  std::map<const Machine*, StepBuildCache*> build_caches;
  for (SearchCaches::Worker* w : workers) build_caches[w->machine.get()] = &w->build_cache;
  const int processes = std::max(1, options.process_count);
  auto mine = [&](size_t f) {
    return static_cast<int>(f % static_cast<size_t>(processes)) == options.process_rank;
  };
  // Per family: the candidates that fit (their remat, microbatches and offload), and the first
  // candidate's outcome (phase 2's order).
  std::vector<std::vector<const PlanCandidate*>> fitting(families.size());
  std::vector<std::optional<PlanOutcome>> first_outcome(families.size());
  std::atomic<bool> out_of_time{false};
  std::mutex commit_mutex;
  SearchProgress progress;
  for (size_t f = 0; f < families.size(); ++f) {
    if (mine(f)) progress.total += static_cast<int64_t>(families[f].variants.size());
  }
  std::exception_ptr failure;

  // One unit of work: candidates [first, last) of family f, and what settling them gave.
  struct Item {
    Item(size_t f, size_t a, size_t b) : family(f), first(a), last(b) {}
    size_t family = 0, first = 0, last = 0;
    std::vector<PlanResult> results;
    int64_t dominated = 0, unknown = 0;
    bool done = false;
  };
  // Whether a fitting plan among `fits` makes `c` (of the same family) not worth simulating.
  // Whether plan f's remat recomputes no more of a layer than plan c's: none least and full
  // most; a custom policy against another custom one when it keeps every value c keeps, and
  // against selective never (conservative: most lists keep something selective recomputes, or
  // the reverse).
  auto recomputes_no_more = [](const StepPlan& f, const StepPlan& c) {
    if (f.remat == RematPolicy::kNone || c.remat == RematPolicy::kFull) return true;
    const bool custom_f = f.remat == RematPolicy::kCustom,
               custom_c = c.remat == RematPolicy::kCustom;
    if (custom_f && custom_c) return Within(c.remat_save, f.remat_save);
    if (custom_f || custom_c) return false;
    return RematRank(f.remat) <= RematRank(c.remat);
  };
  // Whether `o` may dominate: it fits with the schedule every plan asks for (a plan that fits
  // only overlapping less may be slower than one recomputing more that fits overlapping all).
  auto may_dominate = [](const PlanOutcome& o) {
    return o.refused.empty() && o.fits && o.overlap == StepOverlap::kFull;
  };
  auto dominated = [&](const PlanCandidate& c, const std::vector<const PlanCandidate*>& fits) {
    for (const PlanCandidate* f : fits) {
      // More pipeline microbatches shrink the bubble: only gradient accumulation's are pure
      // extra work. Offloading more adds copies (which never speed a step up) and saves only
      // the recompute of values f's remat would recompute: a fitting plan offloading a subset
      // of c's dominates c when f's remat keeps every value c offloads beyond it.
      const int64_t m = f->microbatches;
      const bool fewer = c.plan.pipeline ? m == c.microbatches : m <= c.microbatches;
      const std::vector<std::string>& fo = f->plan.offload;
      bool offload = Within(fo, c.plan.offload);
      for (const std::string& name : c.plan.offload) {
        const bool more = std::find(fo.begin(), fo.end(), name) == fo.end();
        offload = offload && (!more || RematKeeps(f->plan.remat, name, f->plan.remat_save));
      }
      if (recomputes_no_more(f->plan, c.plan) && fewer && offload) return true;
    }
    return false;
  };
  // Simulates `pr.candidate` on `machine` (screened, or `settle`d as confirmation does) into
  // pr.outcome and pr.report (its per-link figures left out).
  auto simulate = [&](PlanResult& pr, Machine& machine, CollectiveCostModel& collectives,
                      bool settle) {
    pr.report.reset();
    if (space.serve) {
      pr.outcome = EvaluateServePlan(machine, model, *space.serve, pr.candidate, space.memory_limit,
                                     collectives, settle);
      return;
    }
    TrainStepReport report;
    pr.outcome = EvaluatePlan(machine, model, train, pr.candidate, space.memory_limit, collectives,
                              &report, settle, /*link_busy=*/false, build_caches.at(&machine));
    if (pr.outcome.refused.empty()) {
      pr.report = std::make_shared<const TrainStepReport>(std::move(report));
    }
  };
  // Candidate `c`'s result: known (resumed), or screened on `machine` (nullopt when it is not
  // known and this process simulates nothing, unless `always`).
  auto evaluate = [&](const PlanCandidate& c, Machine& machine, CollectiveCostModel& collectives,
                      bool always = false) -> std::optional<PlanResult> {
    PlanResult pr;
    pr.candidate = c;
    pr.key = CandidateKey(c);
    if (const auto known = options.known.find(pr.key); known != options.known.end()) {
      pr.outcome = known->second;
      pr.resumed = true;
      // Fitting is this search's question (its memory limit may differ from the one the
      // outcome was first judged by); --out holds screening outcomes.
      pr.outcome.fits = WithinLimit(pr.outcome.peak, pr.outcome.capacity, space.memory_limit);
      pr.outcome.settled = false;
    } else if (!options.simulate && !always) {
      return std::nullopt;
    } else {
      simulate(pr, machine, collectives, false);
    }
    return pr;
  };
  // Per family, the variants skipped as dominated (in order), should their dominator fail its
  // confirmation; each family's items run one at a time, on one worker.
  std::vector<std::vector<size_t>> skipped(families.size());
  // Settles `item` on one worker.
  auto settle = [&](Item& item, Machine& machine, CollectiveCostModel& collectives) {
    std::vector<const PlanCandidate*>& fits = fitting[item.family];
    for (size_t v = item.first; v < item.last; ++v) {
      const PlanCandidate& c = families[item.family].variants[v];
      if (dominated(c, fits)) {
        ++item.dominated;
        skipped[item.family].push_back(v);
        continue;
      }
      std::optional<PlanResult> pr = evaluate(c, machine, collectives);
      if (!pr) {
        ++item.unknown;
        continue;
      }
      if (may_dominate(pr->outcome)) fits.push_back(&c);
      if (v == 0) first_outcome[item.family] = pr->outcome;
      item.results.push_back(std::move(*pr));
    }
  };

  // Runs `work` on every worker thread and this one, each with its machine and a
  // slowest-member model over the shared cache; the first failure stops the search's phases
  // and is rethrown.
  auto on_workers = [&](const std::function<void(Machine&, CollectiveCostModel&)>& work) {
    auto guarded = [&](Machine& machine, CollectiveCostModel& network) {
      try {
        SharedCacheView view(shared, network);
        SlowestMemberCollectiveModel collectives(view, /*keep_rates=*/true, &caches.evened());
        work(machine, collectives);
      } catch (...) {
        std::lock_guard<std::mutex> lock(commit_mutex);
        if (!failure) failure = std::current_exception();
        out_of_time = true;
      }
    };
    std::vector<std::thread> threads;
    for (size_t j = 1; j < workers.size(); ++j) {
      threads.emplace_back(guarded, std::ref(*workers[j]->machine), std::ref(workers[j]->model()));
    }
    guarded(*workers[0]->machine, workers[0]->model());
    for (std::thread& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
  };

  // Per family (found when first needed): a hash of each of its mesh's axes over 1 with the
  // group layout over it (CachedCollectiveModel::Layout). Two families sharing one share that
  // axis's collectives (the cache moves them between meshes), so workers keep them apart: one
  // prices, the other finds.
  std::vector<std::optional<std::vector<uint64_t>>> axis_layouts(families.size());
  auto layouts_of = [&](size_t f) -> const std::vector<uint64_t>& {
    if (!axis_layouts[f]) {
      std::vector<uint64_t> hashes;
      const StepPlan& plan = families[f].variants.front().plan;
      try {
        const Mesh mesh = PlacePlanMesh(*main_machine, plan);
        for (size_t a = 0; a < mesh.axes().size(); ++a) {
          if (mesh.axes()[a].size < 2) continue;
          FnvHash hash;
          for (int64_t v : CachedCollectiveModel::Layout(mesh, {static_cast<int>(a)}).placement) {
            hash.Mix(static_cast<uint64_t>(v));
          }
          hashes.push_back(hash.value());
        }
      } catch (const SpecError&) {
        // Refused when simulated (its outcome says why): nothing to share.
      } catch (const std::invalid_argument&) {
        // A mesh the Mesh constructor refuses: likewise.
      }
      std::sort(hashes.begin(), hashes.end());
      axis_layouts[f] = std::move(hashes);
    }
    return *axis_layouts[f];
  };
  std::vector<size_t> result_family;  // Each result's family.
  // Runs `items` over the workers; commits them in order into `result`. A worker takes the
  // first item not taken, or the first of the next few whose family shares no axis's groups
  // with an item in progress (only the order of work changes: every answer is the cache's).
  auto run_phase = [&](std::vector<Item>& items) {
    std::vector<char> taken(items.size(), 0);
    std::vector<size_t> running;  // Taken, not yet done.
    size_t first_free = 0;
    size_t next_commit = 0;
    constexpr size_t kLookAhead = 16;
    auto shares_groups = [&](size_t a, size_t b) {
      const std::vector<uint64_t>& x = layouts_of(items[a].family);
      const std::vector<uint64_t>& y = layouts_of(items[b].family);
      return std::any_of(x.begin(), x.end(),
                         [&](uint64_t h) { return std::binary_search(y.begin(), y.end(), h); });
    };
    // Needs commit_mutex; items.size() when none is left.
    auto take = [&]() -> size_t {
      while (first_free < items.size() && taken[first_free]) ++first_free;
      if (first_free == items.size()) return first_free;
      size_t pick = first_free;
      if (!running.empty()) {
        for (size_t k = first_free; k < items.size() && k < first_free + kLookAhead; ++k) {
          if (taken[k]) continue;
          if (std::none_of(running.begin(), running.end(),
                           [&](size_t j) { return shares_groups(j, k); })) {
            pick = k;
            break;
          }
        }
      }
      taken[pick] = 1;
      running.push_back(pick);
      return pick;
    };
    // Needs commit_mutex (or the workers done).
    auto commit = [&](Item& item) {
      result.dominated += item.dominated;
      result.beyond_budget += item.unknown;
      for (PlanResult& r : item.results) {
        r.index = result.results.size();
        if (options.on_result) options.on_result(r);
        result.results.push_back(std::move(r));
        result_family.push_back(item.family);
      }
    };
    on_workers([&](Machine& machine, CollectiveCostModel& collectives) {
      for (;;) {
        if (options.time_limit_s > 0 && elapsed() > options.time_limit_s) out_of_time = true;
        if (out_of_time) return;
        size_t k;
        {
          std::lock_guard<std::mutex> lock(commit_mutex);
          k = take();
        }
        if (k >= items.size()) return;
        settle(items[k], machine, collectives);
        std::lock_guard<std::mutex> lock(commit_mutex);
        items[k].done = true;
        running.erase(std::find(running.begin(), running.end(), k));
        for (const PlanResult& r : items[k].results) {
          const PlanOutcome& o = r.outcome;
          if (o.refused.empty() && o.fits && (!progress.best || o.step_time < *progress.best)) {
            progress.best = o.step_time;
          }
        }
        progress.done += static_cast<int64_t>(items[k].last - items[k].first);
        while (next_commit < items.size() && items[next_commit].done) commit(items[next_commit++]);
        progress.elapsed_s = elapsed();
        if (options.on_progress) options.on_progress(progress);
      }
    });
    // A time limit may leave an item untaken before others that were settled: those are
    // committed too, in order.
    for (; next_commit < items.size(); ++next_commit) {
      if (items[next_commit].done) commit(items[next_commit]);
    }
    // What a time limit left unsettled.
    for (const Item& item : items) {
      if (!item.done) result.beyond_budget += static_cast<int64_t>(item.last - item.first);
    }
  };

  std::vector<Item> first;
  for (size_t f = 0; f < families.size(); ++f) {
    if (mine(f)) first.emplace_back(f, 0, 1);
  }
  run_phase(first);
  std::vector<size_t> order;  // Families with more candidates, best first candidate first.
  for (const Item& item : first) {
    if (item.done && families[item.family].variants.size() > 1) order.push_back(item.family);
  }
  auto rank = [&](size_t f) {
    const std::optional<PlanOutcome>& o = first_outcome[f];
    // Refused or unknown first candidates last, then those over the limit, each by time.
    const int tier = !o || !o->refused.empty() ? 2 : o->fits ? 0 : 1;
    return std::make_tuple(tier, o ? o->step_time : Time(), f);
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rank(a) < rank(b); });
  std::vector<Item> rest;
  for (size_t f : order) rest.emplace_back(f, 1, families[f].variants.size());
  run_phase(rest);

  auto rank_results = [&] {
    result.ranked.clear();
    for (size_t i = 0; i < result.results.size(); ++i) {
      const PlanOutcome& o = result.results[i].outcome;
      if (o.refused.empty() && o.fits) result.ranked.push_back(i);
    }
    std::stable_sort(result.ranked.begin(), result.ranked.end(), [&](size_t a, size_t b) {
      return Better(space.objective, result.results[a].outcome, result.results[b].outcome);
    });
  };
  rank_results();
  // Confirmation: the best plans simulated again with the settled composition, over the
  // workers (each result changed by one), until the best `confirm` are all settled. A plan
  // that fitted when screened and does not when confirmed no longer dominates: its family's
  // skipped variants that nothing else dominates are screened then (on this thread, in the
  // family's order), and the ranking confirmed again.
  auto out_of_time_now = [&] {
    return options.time_limit_s > 0 && elapsed() > options.time_limit_s;
  };
  for (;;) {
    std::set<size_t> reopen;  // Families whose confirmed plan stopped fitting.
    for (;;) {
      std::vector<size_t> unsettled;  // Among the best `confirm`, by result index.
      const size_t best = std::min(result.ranked.size(), static_cast<size_t>(options.confirm));
      for (size_t k = 0; k < best; ++k) {
        if (!result.results[result.ranked[k]].outcome.settled) {
          unsettled.push_back(result.ranked[k]);
        }
      }
      // Plans screened just over the limit (kScreenedPeakMargin) that would rank among the
      // best `confirm`: confirmed too, so one that fits once settled is ranked.
      const size_t fitted = unsettled.size();
      for (size_t i = 0; options.confirm > 0 && i < result.results.size(); ++i) {
        const PlanOutcome& o = result.results[i].outcome;
        if (!o.refused.empty() || o.fits || o.settled ||
            !WithinLimit(o.peak, o.capacity, space.memory_limit * (1 + kScreenedPeakMargin))) {
          continue;
        }
        if (best == static_cast<size_t>(options.confirm) &&
            !Better(space.objective, o, result.results[result.ranked[best - 1]].outcome)) {
          continue;
        }
        unsettled.push_back(i);
      }
      if (unsettled.empty() || out_of_time_now()) break;
      result.confirmed += static_cast<int64_t>(unsettled.size());
      std::atomic<size_t> next{0};
      on_workers([&](Machine& machine, CollectiveCostModel& collectives) {
        for (size_t k = next++; k < unsettled.size(); k = next++) {
          simulate(result.results[unsettled[k]], machine, collectives, true);
        }
      });
      for (size_t k = 0; k < fitted; ++k) {  // Each fitted when screened: it was ranked.
        const PlanOutcome& o = result.results[unsettled[k]].outcome;
        if (!o.refused.empty() || !o.fits) reopen.insert(result_family[unsettled[k]]);
      }
      rank_results();
    }
    if (reopen.empty() || out_of_time_now()) break;
    SharedCacheView view(shared, workers[0]->model());
    SlowestMemberCollectiveModel collectives(view, /*keep_rates=*/true, &caches.evened());
    bool added = false;
    for (size_t f : reopen) {
      // The family's fitting plans now, and its skipped variants no longer dominated.
      std::vector<PlanCandidate> fit_now;
      for (size_t i = 0; i < result.results.size(); ++i) {
        const PlanOutcome& o = result.results[i].outcome;
        if (result_family[i] == f && may_dominate(o)) {
          fit_now.push_back(result.results[i].candidate);
        }
      }
      std::vector<size_t> still;
      for (size_t v : skipped[f]) {
        const PlanCandidate& c = families[f].variants[v];
        std::vector<const PlanCandidate*> fits;
        for (const PlanCandidate& x : fit_now) fits.push_back(&x);
        std::optional<PlanResult> pr;
        // Simulated even by a merging process, as confirmation is (a single process would).
        if (!dominated(c, fits)) pr = evaluate(c, *main_machine, collectives, true);
        if (!pr) {
          still.push_back(v);
          continue;
        }
        --result.dominated;
        if (may_dominate(pr->outcome)) fit_now.push_back(c);
        pr->index = result.results.size();
        if (options.on_result) options.on_result(*pr);
        result.results.push_back(std::move(*pr));
        result_family.push_back(f);
        added = true;
      }
      skipped[f] = std::move(still);
    }
    if (!added) break;
    rank_results();
  }
  for (const PlanResult& r : result.results) {
    if (!r.outcome.refused.empty()) {
      ++result.refused;
    } else if (!r.outcome.fits) {
      ++result.not_fitting;
    }
    if (!r.resumed) ++result.simulated;
  }
  result.wall_s = elapsed();
  return result;
}

}  // namespace shardsim::planner
