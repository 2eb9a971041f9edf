// What the cached timing path derives from a model's collective timings, kept across runs: the
// rates at which a collective's groups progress while other ops share its links
// (Executor::SharedRates) and the devices' timeline classes (Executor::BuildClasses).
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/timing/collective_cost_model.h"

namespace shardsim {

// Answers keyed by what determines them. Timings are named by identity (a model's answers never
// change), so an answer found again is, bit for bit, the one computing it would give: runs with
// and without the cache agree exactly (tested). The cache keeps every timing it names alive, so
// no identity is reused. A plan search gives each worker one: the runs of a plan (its composed
// short steps) and the plans of one mesh meet the same sets of ops in flight, and the same
// collectives, again. Not thread-safe.
class TimelineCache {
 public:
  // SharedRates: the op's timing (launched: false), then each other op in flight with it (its
  // timing, and whether it was launched at the same instant), in the order their costs are
  // summed.
  using RatesKey = std::vector<std::pair<const CollectiveTiming*, bool>>;
  // BuildClasses: the mesh's axis sizes (then, on a union of meshes, where each part's axes
  // start, as -1 - index), the mesh axes `where` clauses name (a flag per axis;
  // empty when no op has one), and the program's distinct collectives (their axes and timing,
  // which was made for one placement of the mesh), ascending. The classes do not depend on the
  // collectives' order: colour refinement reaches the same stable partition whatever order it
  // reads them in, and numbers the classes by their first position.
  using ClassesKey = std::tuple<std::vector<int>, std::vector<char>,
                                std::vector<std::pair<std::vector<int>, const CollectiveTiming*>>>;

  // The rate of each group of the key's op, or null when not known yet.
  const std::vector<double>* FindRates(const RatesKey& key) const {
    auto it = rates_.find(key);
    return it == rates_.end() ? nullptr : &it->second;
  }
  // Records `rates` for `key`, whose timings `owners` holds.
  void InsertRates(RatesKey key, std::vector<double> rates,
                   const std::vector<std::shared_ptr<const CollectiveTiming>>& owners) {
    Hold(owners);
    rates_.emplace(std::move(key), std::move(rates));
  }
  // Rates kept.
  size_t rates_size() const { return rates_.size(); }

  // Each mesh position's class, or null when not known yet.
  const std::vector<int>* FindClasses(const ClassesKey& key) const {
    auto it = classes_.find(key);
    return it == classes_.end() ? nullptr : &it->second;
  }
  // Records `classes` for `key`, whose timings `owners` holds.
  void InsertClasses(ClassesKey key, std::vector<int> classes,
                     const std::vector<std::shared_ptr<const CollectiveTiming>>& owners) {
    Hold(owners);
    classes_.emplace(std::move(key), std::move(classes));
  }
  // Class lists kept.
  size_t classes_size() const { return classes_.size(); }

 private:
  void Hold(const std::vector<std::shared_ptr<const CollectiveTiming>>& owners) {
    for (const std::shared_ptr<const CollectiveTiming>& t : owners) held_.emplace(t.get(), t);
  }

  std::map<RatesKey, std::vector<double>> rates_;
  std::map<ClassesKey, std::vector<int>> classes_;
  std::map<const CollectiveTiming*, std::shared_ptr<const CollectiveTiming>> held_;
};

}  // namespace shardsim
