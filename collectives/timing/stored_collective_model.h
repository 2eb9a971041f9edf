// A collective cost model that reads its answers from a TimingStore and keeps there what it has
// to compute: a later run on the same machine finds every collective an earlier one simulated.
#pragma once

#include <memory>

#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/timing_store.h"

namespace shardsim {

// `inner` behind `store`: a request found in the store is answered from it (or, for a
// reduce-scatter or all-gather, by its ring pass's partner kept as a ring), else by `inner`,
// whose answer is then kept. The answers are `inner`'s (TimingStore's round trip is exact).
class StoredCollectiveModel : public CollectiveCostModel {
 public:
  // All must outlive the model; `store` and `topo` must be of `inner`'s machine (each timing
  // kept with its translations on `topo`, LinkProfile::symmetry).
  StoredCollectiveModel(CollectiveCostModel& inner, const TimingStore& store, const Topology& topo)
      : inner_(inner), store_(store), topo_(topo) {}
  std::shared_ptr<const CollectiveTiming> Estimate(const Mesh& mesh,
                                                   const CollectiveRequest& request) override;
  // Requests answered from the store.
  int64_t loaded() const { return loaded_; }

 private:
  CollectiveCostModel& inner_;
  const TimingStore& store_;
  const Topology& topo_;
  int64_t loaded_ = 0;
};

}  // namespace shardsim
