// How long a collective takes: the cost model interface the timing engine asks, with the
// network simulation behind it and a memoizing cache in front (XLA's LatencyEstimator style).
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/collective.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/timing/profile_symmetry.h"
#include "sim/time.h"
#include "sim/units.h"
#include "topology/routing.h"
#include "topology/topology.h"

namespace shardsim {

class Machine;

// One collective op over a whole mesh: every group of `axes` runs it, all launched together.
struct CollectiveRequest {
  CollectiveKind kind = CollectiveKind::kAllReduce;  // What the algorithms run.
  ReduceOp reduce = ReduceOp::kSum;                  // How partial values combine.
  DType dtype = DType::kF32;                         // Element type.
  int64_t elements = 0;                              // Elements of each member's input block.
  std::string algorithm = "auto";                    // Registry name or "auto".
  std::vector<int> axes;                             // Mesh axis indices, in the op's order.
  std::vector<int> destination;      // kPermute: receiving group index per member, or -1.
  Bytes chunk_size = Bytes::MiB(1);  // The tree algorithm's pipelining unit.

  // Every field equal.
  bool operator==(const CollectiveRequest&) const = default;
};

// How a collective (or one group of it) used one directed link in its standalone run: the
// fraction of its time some transfer of it held the link, how many held it at once on
// average while any did, and how fast each moved. Transfer-time on a link is summed over
// transfers from their start until their last byte left (a fluid transfer holds every link of
// its route at once).
struct LinkUse {
  LinkId link = 0;
  double duty = 0;       // Time held / its longest member time, in (0, 1].
  double flows = 0;      // Transfer-time / time held: transfers at once while held, >= 1.
  double flow_rate = 0;  // Bytes / transfer-time: one transfer's rate there, bytes per second.
};

// A profile's group_use entries (numbered group after group) listed by the link they are on:
// those on its links[k] are entry[start[k] .. start[k + 1]), with their flow rates, duties and
// groups beside them (rate[n], duty[n], group[n]: read in that order, not through the entry);
// `entries` counts them all. The links themselves as a bit set (bit l % 64 of link_bits[l / 64]
// for link l) with, per word, how many links the words before it hold (link_rank): the links
// two profiles share are the set bits of the words' intersection, and a link's position in
// `links` its word's rank plus the bits below it.
struct GroupUseByLink {
  std::vector<int32_t> start, entry;
  std::vector<double> rate, duty;
  std::vector<int32_t> group;
  size_t entries = 0;
  std::vector<uint64_t> link_bits;
  std::vector<int32_t> link_rank;

  // Whether link `l` is one of the profile's.
  bool has(LinkId l) const {
    const size_t w = static_cast<size_t>(l) / 64;
    return w < link_bits.size() && (link_bits[w] >> (l % 64) & 1) != 0;
  }
  // The position in the profile's links of link `l`, one of them (has(l)).
  size_t position(LinkId l) const {
    const size_t w = static_cast<size_t>(l) / 64;
    const uint64_t below = link_bits[w] & ((uint64_t{1} << (l % 64)) - 1);
    return static_cast<size_t>(link_rank[w] + std::popcount(below));
  }
};

// How an op's transfers used the links. Shared by a timing and its copies: a copy that changes
// only member times (SlowestMemberCollectiveModel's) does not copy the lists, which on a pod
// hold tens of thousands of links.
class LinkProfile {
 public:
  LinkProfile() = default;
  // Not copied (a copy would index the lists again).
  LinkProfile(const LinkProfile&) = delete;
  LinkProfile& operator=(const LinkProfile&) = delete;

  std::vector<LinkId> links;  // Directed links that carried its bytes, ascending.
  // Per entry of `links`: the fraction of that link's bandwidth it used on average over its
  // longest member time (bytes / (bandwidth * time)), in (0, 1].
  std::vector<double> link_share;
  // Per entry of `links`: how the whole op used it (durations relative to its longest member
  // time).
  std::vector<LinkUse> link_use;
  // Per group of the op's axes (Mesh::Groups order): the links its members' transfers held,
  // ascending, and how (durations relative to the group's longest member time). The cached
  // timing path reads them to tell how ops in flight together share links (see Executor).
  std::vector<std::vector<LinkUse>> group_use;

  // group_use by link, built on first use and kept (thread-safe; the lists above are final by
  // then, as they are once a model has answered): every run of the cached timing path that
  // prices the op's sharing of links reads it.
  const GroupUseByLink& by_link() const;
  // The translations of `topo` (the topology it was recorded on) that map it onto itself,
  // found on first use and kept (thread-safe, as by_link): a run pricing ops that share links
  // reads one link per orbit of the translations they have in common (WorstSharingCosts).
  const ProfileSymmetry& symmetry(const Topology& topo) const;
  // Sets what symmetry() answers to `symmetry`, found on this profile's figures before (a
  // timing store's entry read back); no effect once symmetry() has answered.
  void PresetSymmetry(ProfileSymmetry symmetry) const;
  // Its groups' orbits under the translations of `topo` by multiples of `steps` (CommonSteps of
  // symmetries, one of them this profile's): per group the least of its orbit (GroupOrbits);
  // and one of its links per orbit of links, the one leaving a device whose every coordinate
  // is below its step, as a bit set laid out as by_link()'s. Found on first use per `steps`
  // and kept (thread-safe).
  struct Orbits {
    std::vector<int32_t> least;
    std::vector<uint64_t> representative;
  };
  const Orbits& orbits(const Topology& topo, const std::vector<int>& steps) const;

 private:
  mutable std::once_flag indexed_;
  mutable GroupUseByLink by_link_;
  mutable std::once_flag symmetric_;
  mutable ProfileSymmetry symmetry_;
  mutable std::mutex orbits_mutex_;
  mutable std::map<std::vector<int>, std::unique_ptr<Orbits>> orbits_;
};

// The answer: per mesh position, the time from the launch until that member's output is
// complete (zero for members of a group of one), and the algorithm that ran.
struct CollectiveTiming {
  std::vector<Time> member_time;  // By mesh position.
  // The longest of member_time: when the op is done everywhere (kept, not recomputed: asked
  // for every collective a partitioner prices, over every position of a pod's mesh).
  Time longest() const { return slowest; }
  // What longest() answers: set by the model that made the timing once member_time is final.
  Time slowest;
  std::string algorithm;  // Concrete algorithm ("auto" resolved).
  // The links it used (never null; filled by the model that made the timing).
  std::shared_ptr<LinkProfile> profile = std::make_shared<LinkProfile>();
};

class TimelineCache;

// The order in which a collective's groups over some axes of `mesh` (Mesh::Groups order) are
// simulated: their indices, ascending by their first member's device. Two meshes whose groups
// are the same lists of devices, listed in other orders, simulate them alike.
std::vector<int> CanonicalGroupOrder(const Mesh& mesh, const std::vector<std::vector<int>>& groups);

// Prices one collective op over a mesh. Implementations must be deterministic: the same
// request on the same mesh gives the same answer.
class CollectiveCostModel {
 public:
  virtual ~CollectiveCostModel() = default;
  // The timing of `request` on `mesh`. Throws std::invalid_argument when the algorithm
  // cannot run it.
  virtual std::shared_ptr<const CollectiveTiming> Estimate(const Mesh& mesh,
                                                           const CollectiveRequest& request) = 0;
  // Where runs pricing with this model keep what they derive from its timings (contention
  // rates, timeline classes) across runs (TimelineCache), or null: each run computes its own.
  // Answers are the same either way.
  virtual TimelineCache* timeline_cache() { return nullptr; }
  // Told, before a run asks for them one by one, of every request it will make on `mesh`, in
  // order: a model may compute them ahead, on several threads. Answers are the same either
  // way. The default does nothing.
  virtual void Prepare(const Mesh& mesh, const std::vector<CollectiveRequest>& requests) {}
};

// Simulates the op on the machine's network: a fresh simulator and network, every group's
// algorithm started at time zero, so the groups of one op contend for the links they share
// exactly as in a full run (contention with other ops in flight is not seen).
// On a torus, groups that are translations of the first group (the same member offsets, in
// range on dimensions without wraparound) see the same routes (dimension-order routing depends
// only on coordinate differences), so when the first group's links, translated to each other
// group, are pairwise disjoint and alike in bandwidth and latency, no two groups interact in
// the fluid model and each has the first group's member times: only the first is simulated.
// When they do meet (a strided axis whose rings cross each other's chips), translations that
// map every group onto another, member by member, along dimensions that wrap still fold the
// network: one group per orbit runs on the orbits of the links (translation_quotient.h), the
// same max-min solution on |S| times fewer transfers.
class NetworkCollectiveModel : public CollectiveCostModel {
 public:
  // `machine` must outlive the model. `translate_groups` enables the shortcuts above.
  explicit NetworkCollectiveModel(const Machine& machine, bool translate_groups = true);
  // A model that routes with a router of its own (MakeRouter of the machine's topology), so
  // it may run on another thread than the machine's router is used from (a Machine is not
  // thread-safe). Its answers are the same: routes are a function of their ends.
  struct OwnRouter {};
  NetworkCollectiveModel(const Machine& machine, OwnRouter);
  std::shared_ptr<const CollectiveTiming> Estimate(const Mesh& mesh,
                                                   const CollectiveRequest& request) override;
  // Network simulations run so far.
  int64_t simulations() const { return simulations_; }
  // Requests answered by simulating one group for all its translations.
  int64_t translated() const { return translated_; }
  // Requests answered by simulating one group per orbit of translations on the folded network.
  int64_t folded() const { return folded_; }
  // Simulations run a second time to record their links' use keeping every stretch of it
  // (LinkAccounting::overflowed).
  int64_t recorded_again() const { return recorded_again_; }
  // Records every simulation's link use keeping every stretch of it from the start
  // (LinkAccounting's every_stretch), as a run is recorded again when its latest stretches do
  // not add up: slower, the same answers (tested).
  void set_every_stretch(bool every_stretch) { every_stretch_ = every_stretch; }

 private:
  // Fills `timing` (member times, links, shares and use) by the first way that applies: the
  // translated-groups shortcut, the folded simulation, or all groups together.
  void SimulateAnyWay(const Mesh& mesh, const CollectiveRequest& request,
                      const std::vector<std::vector<int>>& groups, CollectiveTiming& timing);
  // Told of each link the simulated transfers hold for the first time (as each leaves its
  // links); false stops the simulation.
  using LinkWatch = std::function<bool(LinkId)>;
  // Simulates `groups` together; fills member times (by position), links and shares. With a
  // `watch`, returns false if it stopped the simulation (`timing` is then incomplete).
  bool Simulate(const Mesh& mesh, const CollectiveRequest& request,
                const std::vector<std::vector<int>>& groups, CollectiveTiming& timing,
                const LinkWatch& watch = LinkWatch());
  // The translated-groups shortcut; false when it does not apply.
  bool SimulateByTranslation(const Mesh& mesh, const CollectiveRequest& request,
                             const std::vector<std::vector<int>>& groups, CollectiveTiming& timing);
  // The folded simulation; false when no translation is a symmetry of the groups.
  bool SimulateFolded(const Mesh& mesh, const CollectiveRequest& request,
                      const std::vector<std::vector<int>>& groups, CollectiveTiming& timing);

  const Machine& machine_;
  std::unique_ptr<Router> own_router_;  // Set with OwnRouter.
  Router* router_;                      // The machine's, or own_router_.
  bool translate_groups_;
  int64_t simulations_ = 0;
  int64_t translated_ = 0;
  int64_t folded_ = 0;
  int64_t recorded_again_ = 0;
  bool every_stretch_ = false;
  // A collective's layout as untranslatable_ names it.
  using Layout = std::tuple<uint64_t, int, std::string, std::vector<int>, std::vector<int>>;
  static Layout LayoutOf(const Mesh& mesh, const CollectiveRequest& request);
  // Layouts whose simulation was recorded again (its transfers reached back over more busy
  // stretches of a link than LinkAccounting keeps: all-reduces over several axes of the pod,
  // say): other sizes of them are recorded keeping every stretch from the start.
  std::set<Layout> recorded_again_layouts_;
  // Group layouts whose first group's links, translated, met another group's: (mesh
  // fingerprint, kind, algorithm asked for, axes, permute destinations). Another size of the
  // same collective uses the same links, so its lone first group is not simulated only to find
  // that out again. Answers do not depend on it: where translation applies it equals the full
  // simulation exactly (TranslatedGroupsEqualTheFullSimulation), so a request simulated in
  // full (`auto` resolving otherwise at another size, say) gets the same timing.
  std::set<Layout> untranslatable_;
};

// Memoizes another model by everything that determines its answer: the request and the
// mesh's axes and device placement (which fixes each group's members and the links they
// use). A hit on the same mesh returns the very answer the inner model gave for the same key
// (one moved from another mesh, below, is that answer with its members renumbered). A
// reduce-scatter and an all-gather that run as the same ring pass (one ring or two opposite ones,
// the scatter of G blocks and the gather of one) move the same transfers at the same times: once
// one is known, the other is a hit too.
// Another mesh whose groups over the request's axes are the same lists of devices (in any
// order of the groups) and whose axes there have the same sizes gets the timing moved: member
// times by member, each group's link use to that group's number in the other mesh (a plan
// search's meshes data 280 x fsdp 4 x tensor 8 and data 280 x fsdp 8 x tensor 4 share every
// data-axis group). That is exact for inner models whose answer is a function of those groups
// and sizes alone, as NetworkCollectiveModel's is (it simulates groups in CanonicalGroupOrder).
//
// Thread-safe: plan search shares one cache between worker threads, each asking through its
// own inner model (EstimateWith; a Machine's router is not thread-safe). A miss is computed
// outside the lock; two threads missing the same key compute equal answers (the inner models
// are deterministic) and the first one stored is kept, so answers do not depend on which
// thread asked first.
class CachedCollectiveModel : public CollectiveCostModel {
 public:
  // `inner` must outlive the cache.
  explicit CachedCollectiveModel(CollectiveCostModel& inner) : inner_(inner) {}
  std::shared_ptr<const CollectiveTiming> Estimate(const Mesh& mesh,
                                                   const CollectiveRequest& request) override {
    return EstimateWith(mesh, request, inner_);
  }
  // As Estimate, a miss asking `inner` (a model of the same machine) instead of the cache's.
  std::shared_ptr<const CollectiveTiming> EstimateWith(const Mesh& mesh,
                                                       const CollectiveRequest& request,
                                                       CollectiveCostModel& inner);
  // Adds a helper: another inner model of the same machine, usable from a thread of its own
  // (NetworkCollectiveModel::OwnRouter), which Prepare runs beside the cache's inner model.
  // It must outlive the cache.
  void AddHelper(CollectiveCostModel& helper) { helpers_.push_back(&helper); }
  // With helpers: computes the requests' misses ahead on 1 + helpers threads, and keeps them
  // until Estimate asks. Each request Estimate would pass to the inner model is computed, in
  // any order, by the inner model or a helper; the inner models are deterministic, so the
  // answer is the one Estimate would get, and hits, misses and ring-pass hits count the same.
  // Of two misses that share a ring pass (a reduce-scatter and its all-gather), the second is
  // left to Estimate: it is a hit if the first resolves to a ring, so computing it ahead could
  // be wasted. A request whose pricing throws (an algorithm that cannot run it) is left to
  // Estimate too, which throws where the run asks for it. Not to be called concurrently with
  // other calls.
  void Prepare(const Mesh& mesh, const std::vector<CollectiveRequest>& requests) override;
  // Requests answered from the cache.
  int64_t hits() const;
  // Requests passed to the inner model.
  int64_t misses() const;
  // Hits answered by the other kind's ring pass.
  int64_t ring_pass_hits() const;

  // A collective's groups over some axes of a mesh, as timings move between meshes that share
  // them.
  struct GroupLayout {
    // The sizes of the axes, -1, then the groups' devices member by member, the groups in
    // CanonicalGroupOrder: equal for meshes whose timings are one.
    std::vector<int64_t> placement;
    std::vector<int> positions;  // The mesh positions of those members, in the same order.
    std::vector<int> order;      // The mesh's group number of each group in that order.
  };
  // The layout of the groups over `axes` (axis indices, in the op's order) of `mesh`.
  static GroupLayout Layout(const Mesh& mesh, const std::vector<int>& axes);
  // The request that runs as the same ring pass as `request` on `mesh` (the ring-pass hits
  // above): the reduce-scatter (a sum) of G blocks for the all-gather of one, and back; nullopt
  // for other kinds. A timing answers both only when it ran as one (RanAsRingPass).
  static std::optional<CollectiveRequest> RingPassPartner(const Mesh& mesh,
                                                          const CollectiveRequest& request);
  // Whether `timing` ran as a ring pass that its reduce-scatter and all-gather share: one ring
  // or two opposite ones (NCCL machines name the protocol after the algorithm, "ring/Simple").
  static bool RanAsRingPass(const CollectiveTiming& timing);
  // A timing made on a mesh laid out as `from`, moved to a mesh of `positions` positions laid
  // out as `to` (the same timing when the layouts agree position for position; its link
  // profile shared when each group keeps its number).
  static std::shared_ptr<const CollectiveTiming> Moved(
      const std::shared_ptr<const CollectiveTiming>& timing, const GroupLayout& from,
      const GroupLayout& to, int positions);

 private:
  // The id of `mesh`'s placement (axis sizes and devices), found by its fingerprint and
  // compared whole; a new placement gets the next id. Needs mutex_.
  int64_t MeshId(const Mesh& mesh);

  // The cache key of `request` on the placement numbered `mesh_id`, and its ring-pass key
  // (empty: none). `with_axes`: the key names the request's mesh axes (a mesh's key); without,
  // the placement id stands for them (a group layout's key, GroupLayout).
  static std::pair<std::vector<int64_t>, std::vector<int64_t>> Keys(
      int64_t mesh_id, const Mesh& mesh, const CollectiveRequest& request, bool with_axes = true);

  // The id of a group layout's placement, found by its hash and compared whole; a new one gets
  // the next id. Needs mutex_.
  int64_t PlacementId(const std::vector<int64_t>& placement);
  // A timing and the layout it was made on.
  struct LaidOut {
    std::shared_ptr<const CollectiveTiming> timing;
    std::shared_ptr<const GroupLayout> layout;
  };

  CollectiveCostModel& inner_;
  std::vector<CollectiveCostModel*> helpers_;
  mutable std::mutex mutex_;  // Guards everything below.
  // Answers Prepare computed, by cache key, until Estimate takes them.
  std::map<std::vector<int64_t>, std::shared_ptr<const CollectiveTiming>> prepared_;
  // A placement seen: the axis sizes and the devices by position (compared whole on every
  // request: as the mesh stores them, so the comparison is one memcmp), and its id.
  struct KnownMesh {
    std::vector<int> sizes;
    std::vector<int> devices;
    int64_t id = 0;
  };
  std::map<uint64_t, std::vector<KnownMesh>> meshes_;  // By fingerprint.
  int64_t next_mesh_id_ = 0;
  std::map<std::vector<int64_t>, std::shared_ptr<const CollectiveTiming>> cache_;
  // Group layouts seen, by hash: each with its id.
  std::map<uint64_t, std::vector<std::pair<std::vector<int64_t>, int64_t>>> placements_;
  int64_t next_placement_id_ = 0;
  // Timings by group layout (keys without axes, Keys' `with_axes` false): what another mesh
  // with the same groups moves.
  std::map<std::vector<int64_t>, LaidOut> by_layout_;
  // Ring passes timed so far, by their request without kind or reduction, per-block elements,
  // on their group layout.
  std::map<std::vector<int64_t>, LaidOut> ring_passes_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  int64_t ring_pass_hits_ = 0;
};

// A cache shared between threads seen through one thread's inner model: every miss of
// `shared` asked through here is computed by `inner`.
class SharedCacheView : public CollectiveCostModel {
 public:
  // Both must outlive the view.
  SharedCacheView(CachedCollectiveModel& shared, CollectiveCostModel& inner)
      : shared_(shared), inner_(inner) {}
  std::shared_ptr<const CollectiveTiming> Estimate(const Mesh& mesh,
                                                   const CollectiveRequest& request) override {
    return shared_.EstimateWith(mesh, request, inner_);
  }

 private:
  CachedCollectiveModel& shared_;
  CollectiveCostModel& inner_;
};

}  // namespace shardsim
