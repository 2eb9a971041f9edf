// A collective model for plan search: every member of an op ends with its slowest member.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/timeline_cache.h"

namespace shardsim {

// The slowest-member copies of an inner model's timings (SlowestMemberCollectiveModel's), which
// the models of several threads (a search's workers, one search after another) may share:
// each timing is copied once, however many of them meet it. Thread-safe; it keeps every
// timing it copied alive, as the copy is found by the timing's identity.
class EvenedTimings {
 public:
  // `timing` with every member of a group of more than one ending at its longest member time.
  std::shared_ptr<const CollectiveTiming> Of(const std::shared_ptr<const CollectiveTiming>& timing);

 private:
  std::mutex mutex_;
  // The inner model's answers (kept alive here) -> their slowest-member copies.
  std::map<std::shared_ptr<const CollectiveTiming>, std::shared_ptr<const CollectiveTiming>>
      evened_;
};

// Wraps another model and gives every member of a collective (of a group of more than one)
// the op's longest member time: the op behaves as if it ended with a barrier. On symmetric
// SPMD programs this makes every device one timeline class (Executor's colour refinement), so
// a run simulates one device instead of thousands: on Llama-3-70B on the 8960-chip v5p pod,
// 1,588 events instead of 10.5 M for a step within 0.03% of the exact per-member timing (the
// groups of an op differ by a few microseconds there, as they share links unevenly). No member
// ends earlier than its own time, so the model errs towards slow (not a strict bound: a later
// end can change how later ops overlap).
class SlowestMemberCollectiveModel : public CollectiveCostModel {
 public:
  // `inner` must outlive this model. Not thread-safe (one per thread; the inner may be shared).
  // `keep_rates`: runs pricing with this model keep their contention rates and timeline classes
  // here across runs (timeline_cache()), as a search worker's plans meet the same ops in flight
  // and the same collectives again. `evened`: where the slowest-member copies are kept (shared
  // with other threads' models; it must outlive this model), or null for this model's own.
  explicit SlowestMemberCollectiveModel(CollectiveCostModel& inner, bool keep_rates = true,
                                        EvenedTimings* evened = nullptr)
      : inner_(inner), keep_rates_(keep_rates), evened_(evened ? evened : &own_evened_) {}
  std::shared_ptr<const CollectiveTiming> Estimate(const Mesh& mesh,
                                                   const CollectiveRequest& request) override;
  TimelineCache* timeline_cache() override { return keep_rates_ ? &kept_ : nullptr; }

 private:
  CollectiveCostModel& inner_;
  bool keep_rates_;
  TimelineCache kept_;
  EvenedTimings own_evened_;
  EvenedTimings* evened_;  // own_evened_ or a shared store.
};

}  // namespace shardsim
