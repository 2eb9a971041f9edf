#include "collectives/timing/stored_collective_model.h"

#include <optional>
#include <string>

namespace shardsim {

namespace {

// The request that runs as the same ring pass as `request` on `mesh` (CachedCollectiveModel's
// ring-pass hits): a reduce-scatter of G blocks and the all-gather of one, over the same groups
// (the reduce-scatter a sum); nullopt for other kinds.
std::optional<CollectiveRequest> RingPassPartner(const Mesh& mesh,
                                                 const CollectiveRequest& request) {
  int64_t g = 1;
  for (int a : request.axes) g *= mesh.axes()[static_cast<size_t>(a)].size;
  CollectiveRequest partner = request;
  if (request.kind == CollectiveKind::kAllGather) {
    partner.kind = CollectiveKind::kReduceScatter;
    partner.reduce = ReduceOp::kSum;
    partner.elements = request.elements * g;
    return partner;
  }
  if (request.kind == CollectiveKind::kReduceScatter && request.elements % g == 0) {
    partner.kind = CollectiveKind::kAllGather;
    partner.reduce = CollectiveRequest().reduce;
    partner.elements = request.elements / g;
    return partner;
  }
  return std::nullopt;
}

}  // namespace

std::shared_ptr<const CollectiveTiming> StoredCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  if (std::shared_ptr<const CollectiveTiming> kept = store_.Load(mesh, request)) {
    ++loaded_;
    return kept;
  }
  // Its ring pass's partner kept as a ring: the same transfers at the same times (what the
  // CachedCollectiveModel answers too; tested equal field by field), so whichever of the two an
  // earlier run simulated answers both.
  if (std::optional<CollectiveRequest> partner = RingPassPartner(mesh, request)) {
    if (std::shared_ptr<const CollectiveTiming> kept = store_.Load(mesh, *partner)) {
      const std::string family = kept->algorithm.substr(0, kept->algorithm.find('/'));
      if (family == "ring" || family == "bidirectional_ring") {
        ++loaded_;
        return kept;
      }
    }
  }
  std::shared_ptr<const CollectiveTiming> timing = inner_.Estimate(mesh, request);
  // Kept with its translations, which a run reading it would otherwise find again.
  store_.Save(mesh, request, *timing, &timing->profile->symmetry(topo_));
  return timing;
}

}  // namespace shardsim
