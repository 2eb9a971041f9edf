#include "collectives/timing/slowest_member_model.h"

namespace shardsim {

std::shared_ptr<const CollectiveTiming> EvenedTimings::Of(
    const std::shared_ptr<const CollectiveTiming>& timing) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = evened_.find(timing); it != evened_.end()) return it->second;
  }
  // Copied outside the lock (a pod's timing lists 8,960 members); should another thread have
  // stored its (equal) copy meanwhile, that one is the answer, for every thread alike.
  auto copy = std::make_shared<CollectiveTiming>(*timing);
  const Time longest = timing->longest();
  // Members of groups of one take no time and stay so.
  for (Time& t : copy->member_time) {
    if (t > Time()) t = longest;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return evened_.emplace(timing, std::move(copy)).first->second;
}

std::shared_ptr<const CollectiveTiming> SlowestMemberCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  return evened_->Of(inner_.Estimate(mesh, request));
}

}  // namespace shardsim
