// A directory of collective timings kept across runs: what a network simulation answered for a
// collective on a machine, read back instead of simulated again by a later run (`shardsim plan
// --cache DIR`), as JAX keeps compiled programs in its persistent compilation cache.
//
// A timing is a function of the machine, the request and its groups alone (NetworkCollectiveModel
// is deterministic and simulates the groups in CanonicalGroupOrder, whatever the mesh: the
// CachedCollectiveModel moves timings between meshes on that ground), and of the code that
// simulated it. An entry is therefore found by a 128-bit digest of:
// - `version`, which names the code (the CLI passes a digest of its own executable, so any
//   rebuild that changes the simulator misses every entry made before);
// - every figure of the topology a simulation reads: each vertex's kind, device number and
//   coordinates; each link's ends, bandwidth, latency, kind, physical id and torus dimension and
//   direction; the torus shape; every field of the CommSpec;
// - the request's group layout (CachedCollectiveModel::GroupLayout: its axes' sizes and its
//   groups' devices, member by member, in canonical order);
// - every other field of the request.
// An entry holds its timing laid out canonically (members and groups in that order) and is moved
// onto the mesh that asks: any mesh with the same groups finds what another one simulated. The
// file holds the digest again and a checksum of its contents: a file written by another key, cut
// short or altered reads as a miss, never as an answer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/profile_symmetry.h"
#include "topology/topology.h"

namespace shardsim {

// Timings of collectives on one machine, one file each in a directory.
class TimingStore {
 public:
  // The store of `topo`'s timings in `dir` (made when missing), for code named by `version`:
  // its entries go to a folder of `dir` named by a hash of `version`. Throws
  // std::runtime_error "cannot use DIR: reason" when the directories cannot be made.
  TimingStore(std::string dir, std::string version, const Topology& topo);

  // The timing kept for `request` on `mesh`, or null when there is none (or it is unreadable).
  std::shared_ptr<const CollectiveTiming> Load(const Mesh& mesh,
                                               const CollectiveRequest& request) const;
  // Keeps `timing` as the answer for `request` on `mesh`, with its profile's translations
  // `symmetry` when given (LinkProfile::symmetry on the store's topology; a timing read back then
  // answers them without finding them again): written to a file of its own beside the entry and
  // renamed into place, so readers (other threads, other processes) see a whole entry or none. A
  // failed write is ignored: the store only saves work.
  void Save(const Mesh& mesh, const CollectiveRequest& request, const CollectiveTiming& timing,
            const ProfileSymmetry* symmetry = nullptr) const;

  // The entry's path for `request` on `mesh` (present or not).
  std::string PathOf(const Mesh& mesh, const CollectiveRequest& request) const;
  // The folder of this version's entries.
  const std::string& dir() const { return dir_; }

 private:
  // The key's two 64-bit halves.
  struct Digest {
    uint64_t a = 0, b = 0;
  };
  Digest KeyOf(const std::vector<int64_t>& placement, const CollectiveRequest& request) const;
  std::string PathOf(const Digest& key) const;

  std::string dir_;
  Digest machine_;  // The version and the topology's figures.
};

}  // namespace shardsim
