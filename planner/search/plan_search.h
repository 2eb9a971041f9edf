// Plan search (SPEC "Searching plans"): enumerate the space, drop what cannot divide, fit or
// win, simulate the rest on worker threads that share one collective cache, and rank.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/slowest_member_model.h"
#include "collectives/timing/stored_collective_model.h"
#include "collectives/timing/timing_store.h"
#include "planner/models/step_build_cache.h"
#include "planner/search/search_space.h"
#include "sim/time.h"
#include "sim/units.h"

namespace shardsim::planner {

// What one evaluation gives: the figures the ranked table, --out and --json show. Plain values
// (times in picoseconds, bytes as counts), so a line of --out reads back to the same outcome.
struct PlanOutcome {
  std::string refused;  // Why the simulator refused the plan (placement, partitioner); "" if not.
  Time step_time;       // Serving: the whole generation, ttft + (decode_len - 1) tpot.
  Time ttft;            // Serving: time to first token.
  Time tpot;            // Serving: time per output token.
  double mfu = 0;       // Model FLOPs utilisation (training).
  double tokens_per_s_per_device = 0;  // Training tokens, or serving's output tokens.
  Time compute;                        // Busiest device's compute (serving: a decode step's).
  Time exposed_comm;                   // Its communication not hidden under compute.
  Time bubble;                         // Pipelines: the schedule's idle time.
  Time recompute;                      // Compute spent on remat's recomputation.
  Bytes peak;                          // Liveness peak per device.
  Bytes capacity;                      // HBM per device.
  bool fits = false;                   // peak <= memory_limit x capacity.
  // The schedule the step ran: one overlapping less than asked for where that kept it
  // within the memory limit (TrainStepOptions::within_memory).
  StepOverlap overlap = StepOverlap::kFull;
  std::string dominant;  // What the step spends most on ("compute", "all_gather over fsdp", ...).
  // Composed from layer counts where the step (a pipeline: each stage step) has settled
  // (TrainStepOptions::settle), as the search confirms its best plans; false: the screening
  // composition.
  bool settled = false;
};

// One evaluated candidate.
struct PlanResult {
  size_t index = 0;  // Its place in the search order.
  PlanCandidate candidate;
  std::string key;  // CandidateKey.
  PlanOutcome outcome;
  bool resumed = false;  // Read from an earlier search's results, not simulated now.
  // The step's whole report when simulated now (null when resumed or refused), its per-link
  // figures left out (link_busy: tens of thousands of entries on a pod).
  std::shared_ptr<const TrainStepReport> report;
};

// Progress, for the caller's progress bar.
struct SearchProgress {
  int64_t done = 0;          // Candidates settled (evaluated, resumed or skipped as dominated).
  int64_t total = 0;         // Candidates to settle.
  double elapsed_s = 0;      // Wall time since the search began.
  std::optional<Time> best;  // Best step time among fitting plans evaluated so far.
};

// What a search has priced and built, kept to serve the next search (a benchmark's warm runs,
// a session exploring one machine): the network simulations of one machine's collectives and
// their slowest-member copies, and each search worker's machine, network model and built and
// expanded steps (StepBuildCache). Searches using it run one at a time, on that hardware.
class SearchCaches {
 public:
  // One search worker's own state (one thread uses it at a time; a Machine's router is not
  // thread-safe).
  struct Worker {
    std::unique_ptr<Machine> machine;                 // Its copy of the hardware.
    std::unique_ptr<NetworkCollectiveModel> network;  // Its network simulation, on `machine`.
    // `network` behind the caches' store, when they have one.
    std::unique_ptr<StoredCollectiveModel> stored;
    StepBuildCache build_cache;  // The steps it built, and its choices of layout per mesh.

    // Where its misses are priced: the store, else the network simulation.
    CollectiveCostModel& model() {
      return stored ? static_cast<CollectiveCostModel&>(*stored) : *network;
    }
  };

  // `machine` is the searches' hardware (its own instance: the caches' misses run on it when
  // no worker's model is at hand); it must outlive this object. With `store` (of `machine`'s
  // hardware; it must outlive this object too), every miss is looked up there first and what
  // is simulated is kept there.
  explicit SearchCaches(const Machine& machine, const TimingStore* store = nullptr)
      : network_(machine),
        store_(store),
        stored_(store
                    ? std::make_unique<StoredCollectiveModel>(network_, *store, machine.topology())
                    : nullptr),
        cache_(stored_ ? static_cast<CollectiveCostModel&>(*stored_) : network_) {}
  // The shared, thread-safe cache of collective timings.
  CachedCollectiveModel& cache() { return cache_; }
  // The slowest-member copies of the cache's timings, shared by the workers' models.
  EvenedTimings& evened() { return evened_; }
  // Search worker `worker` (0: the searching thread), its machine made by `make_machine` when
  // first asked for: a search builds no machine its workers already have.
  Worker& worker(size_t worker, const std::function<std::unique_ptr<Machine>()>& make_machine);
  // The steps search worker `worker` built (made with no machine when not asked for yet).
  StepBuildCache& build_cache(size_t worker);

 private:
  Worker& Slot(size_t worker);

  NetworkCollectiveModel network_;
  const TimingStore* store_;
  std::unique_ptr<StoredCollectiveModel> stored_;
  CachedCollectiveModel cache_;
  EvenedTimings evened_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// How to search.
struct SearchOptions {
  int jobs = 1;             // Worker threads.
  int64_t budget = 0;       // Consider only the first this many candidates (0: all).
  double time_limit_s = 0;  // Start no new evaluation after this much wall time (0: none).
  // Builds one worker's machine (a Machine's router is not thread-safe): the same hardware.
  std::function<std::unique_ptr<Machine>()> make_machine;
  // Outcomes of an earlier, interrupted search, by CandidateKey: taken as they are.
  std::map<std::string, PlanOutcome> known;
  // Called for each settled result in search order (never concurrently), e.g. to append to
  // --out: the same sequence for any number of jobs.
  std::function<void(const PlanResult&)> on_result;
  // Called (never concurrently) as candidates settle.
  std::function<void(const SearchProgress&)> on_progress;
  // Spreading one search over processes (shardsim plan --mpi): this process evaluates only
  // the (mesh, rules) families whose index modulo `process_count` is `process_rank`; results
  // hold just those. Merging the processes' outcomes as `known` into a search of the whole
  // space gives the single-process result (dominance is decided within a family, which one
  // process holds whole).
  int process_rank = 0;   // This process.
  int process_count = 1;  // Processes sharing the search.
  // False: simulate nothing; candidates not in `known` count as beyond the budget (merging
  // the outcomes other processes evaluated).
  bool simulate = true;
  // Collective timings to start from and add to (not owned; null: the search's own). Every
  // answer is what the network model gives, so results do not depend on it, only speed.
  SearchCaches* caches = nullptr;
  // Collective timings kept across searches (not owned; of the machine make_machine builds):
  // the search's own caches look up their misses there and keep what they simulate. Ignored
  // when `caches` is given (theirs is used).
  const TimingStore* store = nullptr;
  // Plans are screened with the fast composition (the first pair of layer counts whose peaks
  // extrapolate); then the best `confirm` fitting plans are simulated again with the settled
  // one (TrainStepOptions::settle), until the best `confirm` of the ranking are all settled
  // (a plan that confirms slower may let one below it up). Plans screened over the memory
  // limit by at most 5% (the screening's error on peaks) that would rank among them are
  // confirmed too, and ranked if they fit then. This process does it even when it simulates
  // nothing else (`simulate` false), so a merged search ranks as a single one.
  int confirm = 0;
};

// What a search found.
struct SearchResult {
  int64_t candidates = 0;                 // Enumerated.
  std::map<std::string, int64_t> pruned;  // Dropped before simulation, by reason.
  int64_t dominated = 0;                  // Skipped: the same plan fits with less remat
                                          // or fewer microbatches.
  int64_t beyond_budget = 0;              // Not considered (--budget, --time-limit).
  std::vector<PlanResult> results;        // Evaluated (or resumed), in search order.
  std::vector<size_t> ranked;             // Indices into results: fitting plans, best first.
  int64_t refused = 0;                    // Results the simulator refused.
  int64_t not_fitting = 0;                // Results over the memory limit.
  int64_t simulated = 0;                  // Results simulated now (not resumed).
  int64_t confirmed = 0;                  // Plans simulated again to confirm them.
  double wall_s = 0;                      // Wall time of the search.
};

// Searches `space` for `model` trained on `train`'s batch (or served, space.serve). Every
// plan uses all the machine's devices. Candidates are enumerated by meshes, then rules, then
// per (mesh, rules) family the microbatches ascending and the remat policies from none to
// full, and simulated best first: every family's first candidate (the fastest it can be),
// then the rest of each family, the families in order of their first candidate's step time
// (fitting ones first). A candidate is skipped as dominated when the same mesh and rules
// already fit with no more remat and no more microbatches (both only add work: recomputation,
// or weight collectives repeated per microbatch; a pipeline's microbatches shrink its bubble,
// so there only the same count dominates). Candidates whose logical dimensions do not divide
// (Indivisible) or whose parameters and optimizer state alone exceed the memory limit are
// pruned. Each plan is simulated as SimulateTrainStep (SimulateServe) does, composed from 2
// and 3 layers (screening: without settling, TrainStepOptions::settle; the best
// `options.confirm` are then settled), with the collectives priced by a cache shared across
// plans and threads and
// every member of a collective ending with its slowest member (SlowestMemberCollectiveModel:
// one timeline for a symmetric mesh). Results do not depend on `options.jobs`.
SearchResult SearchPlans(const TransformerConfig& model, const TrainConfig& train,
                         const SearchSpace& space, const SearchOptions& options);

// Evaluates one candidate as SearchPlans does, on `machine`, pricing collectives with
// `collectives` (which SearchPlans wraps as described there).
// `report`, when given, receives the step's report (unset when refused), with its per-link
// figures unless not `link_busy`. `build_cache`, when given, holds steps built for earlier
// candidates (TrainStepOptions::build_cache). Serving candidates (space.serve) go through
// EvaluateServePlan.
PlanOutcome EvaluatePlan(const Machine& machine, const TransformerConfig& model,
                         const TrainConfig& train, const PlanCandidate& candidate,
                         double memory_limit, CollectiveCostModel& collectives,
                         TrainStepReport* report = nullptr, bool settle = false,
                         bool link_busy = true, StepBuildCache* build_cache = nullptr);

// Evaluates one serving candidate (SimulateServe) as SearchPlans does.
PlanOutcome EvaluateServePlan(const Machine& machine, const TransformerConfig& model,
                              const ServeConfig& serve, const PlanCandidate& candidate,
                              double memory_limit, CollectiveCostModel& collectives,
                              bool settle = false);

// What dominates a step: "compute", "bubble", or its largest exposed collective class.
std::string DominantPart(const TrainStepReport& report);

}  // namespace shardsim::planner
