#include "collectives/timing/stored_collective_model.h"

namespace shardsim {

std::shared_ptr<const CollectiveTiming> StoredCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  if (std::shared_ptr<CollectiveTiming> kept = store_.Load(mesh, request)) {
    ++loaded_;
    return kept;
  }
  std::shared_ptr<const CollectiveTiming> timing = inner_.Estimate(mesh, request);
  store_.Save(mesh, request, *timing);
  return timing;
}

}  // namespace shardsim
