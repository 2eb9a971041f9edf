#include "collectives/timing/stored_collective_model.h"

#include <optional>

namespace shardsim {

std::shared_ptr<const CollectiveTiming> StoredCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  if (std::shared_ptr<const CollectiveTiming> kept = store_.Load(mesh, request)) {
    ++loaded_;
    return kept;
  }
  // Its ring pass's partner kept as a ring: the same transfers at the same times (what the
  // CachedCollectiveModel answers too; tested equal field by field), so whichever of the two an
  // earlier run simulated answers both.
  if (std::optional<CollectiveRequest> partner =
          CachedCollectiveModel::RingPassPartner(mesh, request)) {
    std::shared_ptr<const CollectiveTiming> kept = store_.Load(mesh, *partner);
    if (kept && CachedCollectiveModel::RanAsRingPass(*kept)) {
      ++loaded_;
      return kept;
    }
  }
  std::shared_ptr<const CollectiveTiming> timing = inner_.Estimate(mesh, request);
  // Kept with its translations, which a run reading it would otherwise find again.
  store_.Save(mesh, request, *timing, &timing->profile->symmetry(topo_));
  return timing;
}

}  // namespace shardsim
