// The rates at which a collective's groups progress while other ops share its links (the cached
// timing path's contention rule, Executor::SharedRates), kept across runs.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/timing/collective_cost_model.h"

namespace shardsim {

// SharedRates' answers keyed by what determines them: the op's timing, then each other op in
// flight with it (its timing, and whether it was launched at the same instant), in the order
// their costs are summed. Timings are named by identity (a model's answers never change), so an
// answer found again is, bit for bit, the one computing it would give: runs with and without the
// cache agree exactly (tested). The cache keeps every timing it names alive, so no identity is
// reused. A plan search gives each worker one: the runs of a plan (its composed short steps)
// and the plans of one mesh meet the same sets of ops in flight again. Not thread-safe.
class SharedRatesCache {
 public:
  // The op's timing (launched: false), then the others in summation order.
  using Key = std::vector<std::pair<const CollectiveTiming*, bool>>;

  // The rate of each group of the key's op, or null when not known yet.
  const std::vector<double>* Find(const Key& key) const {
    auto it = rates_.find(key);
    return it == rates_.end() ? nullptr : &it->second;
  }
  // Records `rates` for `key`, whose timings `owners` holds.
  void Insert(Key key, std::vector<double> rates,
              const std::vector<std::shared_ptr<const CollectiveTiming>>& owners) {
    for (const std::shared_ptr<const CollectiveTiming>& t : owners) held_.emplace(t.get(), t);
    rates_.emplace(std::move(key), std::move(rates));
  }
  // Answers kept.
  size_t size() const { return rates_.size(); }

 private:
  std::map<Key, std::vector<double>> rates_;
  std::map<const CollectiveTiming*, std::shared_ptr<const CollectiveTiming>> held_;
};

}  // namespace shardsim
