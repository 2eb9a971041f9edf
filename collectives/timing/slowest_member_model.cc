#include "collectives/timing/slowest_member_model.h"

namespace shardsim {

std::shared_ptr<const CollectiveTiming> SlowestMemberCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  std::shared_ptr<const CollectiveTiming> timing = inner_.Estimate(mesh, request);
  std::shared_ptr<const CollectiveTiming>& evened = evened_[timing];
  if (!evened) {
    auto copy = std::make_shared<CollectiveTiming>(*timing);
    const Time longest = timing->longest();
    // Members of groups of one take no time and stay so.
    for (Time& t : copy->member_time) {
      if (t > Time()) t = longest;
    }
    evened = std::move(copy);
  }
  return evened;
}

}  // namespace shardsim
