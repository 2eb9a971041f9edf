#include "collectives/timing/collective_cost_model.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include "collectives/algorithm.h"
#include "collectives/runtime/machine.h"
#include "collectives/timing/link_accounting.h"
#include "collectives/timing/translation_quotient.h"
#include "sim/fnv_hash.h"
#include "sim/freed_memory.h"
#include "sim/simulator.h"
#include "topology/network.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// On a folded network (TranslationQuotient): tells `whole` of each transfer as it ran, over
// representative links, and `own` of its real route, rebuilt from its source port by port
// (the links of an orbit share their port: dimension and direction), so each simulated group's use
// of its own links is recorded as the full simulation records it.
class FoldedRecorder : public FlowRecorder {
 public:
  // All must outlive the recorder.
  FoldedRecorder(const Topology& topo, const TranslationQuotient& quotient, LinkAccounting& whole,
                 LinkAccounting& own)
      : topo_(topo), quotient_(quotient), whole_(whole), own_(own) {}
  void OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
              double bytes) override {
    whole_.OnFlow(src, path, hops, start, drain, bytes);
    route_.clear();
    VertexId at = src;
    for (int h = 0; h < hops; ++h) {
      const LinkId l = quotient_.Out(at, quotient_.port[path[h]]);
      route_.push_back(l);
      at = topo_.link(l).dst;
    }
    own_.OnFlow(src, route_.data(), hops, start, drain, bytes);
  }

 private:
  const Topology& topo_;
  const TranslationQuotient& quotient_;
  LinkAccounting& whole_;
  LinkAccounting& own_;
  std::vector<LinkId> route_;
};

// Forwards every transfer to `inner` and tells `watch` of each link held for the first time;
// stops `sim` when it answers false.
class WatchingRecorder : public FlowRecorder {
 public:
  // All must outlive the recorder.
  WatchingRecorder(Simulator& sim, size_t links, FlowRecorder& inner,
                   const std::function<bool(LinkId)>& watch)
      : sim_(sim), seen_(links, 0), inner_(inner), watch_(watch) {}
  void OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
              double bytes) override {
    inner_.OnFlow(src, path, hops, start, drain, bytes);
    for (int h = 0; h < hops && !stopped_; ++h) {
      if (seen_[path[h]]) continue;
      seen_[path[h]] = 1;
      if (!watch_(path[h])) {
        stopped_ = true;
        sim_.Stop();
      }
    }
  }
  // Whether the watch stopped the simulation.
  bool stopped() const { return stopped_; }

 private:
  Simulator& sim_;
  std::vector<char> seen_;
  FlowRecorder& inner_;
  const std::function<bool(LinkId)>& watch_;
  bool stopped_ = false;
};

// Runs `request` for the groups `run` (indices into `groups`) on `network`, every algorithm
// started at time zero in that order; fills their members' times. Returns the algorithm each
// ran (`auto` resolves per group), by entry of `run`.
std::vector<std::string> RunGroups(Simulator& sim, Network& network, const Mesh& mesh,
                                   const CollectiveRequest& request,
                                   const std::vector<std::vector<int>>& groups,
                                   const std::vector<int>& run, CollectiveTiming& timing) {
  const Topology& topo = network.topology();
  std::vector<int> axis_sizes;
  for (int a : request.axes) axis_sizes.push_back(mesh.axes()[a].size);
  std::vector<CollectiveJob> jobs(run.size());
  std::vector<std::unique_ptr<CollectiveAlgorithm>> algorithms;
  std::vector<std::string> resolved(run.size());
  for (size_t i = 0; i < run.size(); ++i) {
    CollectiveJob& job = jobs[i];
    const std::vector<int>& positions = groups[run[i]];
    int n = static_cast<int>(positions.size());
    job.kind = request.kind;
    job.reduce = request.reduce;
    job.dtype = request.dtype;
    job.numerics = false;
    for (int p : positions) job.members.push_back(topo.device_vertex(mesh.device(p)));
    job.total = request.elements;
    bool chunked =
        job.kind == CollectiveKind::kReduceScatter || job.kind == CollectiveKind::kAllToAll;
    job.block = chunked ? request.elements / n : request.elements;
    job.destination = request.destination;
    job.on_member_done = [&sim, &timing, &positions](int member) {
      timing.member_time[positions[member]] = sim.Now();
    };
    algorithms.push_back(MakeAlgorithm(request.algorithm, network, job, axis_sizes, &resolved[i],
                                       request.chunk_size));
  }
  for (auto& algorithm : algorithms) algorithm->Start();
  sim.Run();
  return resolved;
}

// The longest of `times`.
Time Slowest(const std::vector<Time>& times) {
  Time t;
  for (Time m : times) t = std::max(t, m);
  return t;
}

}  // namespace

const GroupUseByLink& LinkProfile::by_link() const {
  std::call_once(indexed_, [this] {
    // Counting sort of the entries by their link's position in `links` (ascending: found by
    // binary search); entries on links outside the list (none, as recorded) are left out, as
    // no other op could meet them there.
    std::vector<int32_t> position, group;
    std::vector<const LinkUse*> use;
    by_link_.start.assign(links.size() + 1, 0);
    for (size_t g = 0; g < group_use.size(); ++g) {
      for (const LinkUse& a : group_use[g]) {
        use.push_back(&a);
        group.push_back(static_cast<int32_t>(g));
        const auto it = std::lower_bound(links.begin(), links.end(), a.link);
        const bool listed = it != links.end() && *it == a.link;
        position.push_back(listed ? static_cast<int32_t>(it - links.begin()) : -1);
        if (listed) ++by_link_.start[position.back() + 1];
      }
    }
    for (size_t k = 0; k < links.size(); ++k) by_link_.start[k + 1] += by_link_.start[k];
    by_link_.entry.resize(by_link_.start.back());
    by_link_.rate.resize(by_link_.start.back());
    by_link_.duty.resize(by_link_.start.back());
    by_link_.group.resize(by_link_.start.back());
    by_link_.entries = use.size();
    std::vector<int32_t> next(by_link_.start.begin(), by_link_.start.end() - 1);
    for (size_t e = 0; e < position.size(); ++e) {
      if (position[e] < 0) continue;
      const int32_t n = next[position[e]]++;
      by_link_.entry[n] = static_cast<int32_t>(e);
      by_link_.rate[n] = use[e]->flow_rate;
      by_link_.duty[n] = use[e]->duty;
      by_link_.group[n] = group[e];
    }
    if (!links.empty()) {
      const size_t words = static_cast<size_t>(links.back()) / 64 + 1;
      by_link_.link_bits.assign(words, 0);
      by_link_.link_rank.assign(words, 0);
      for (LinkId l : links) by_link_.link_bits[l / 64] |= uint64_t{1} << (l % 64);
      for (size_t w = 1; w < words; ++w) {
        by_link_.link_rank[w] =
            by_link_.link_rank[w - 1] + std::popcount(by_link_.link_bits[w - 1]);
      }
    }
  });
  return by_link_;
}

const ProfileSymmetry& LinkProfile::symmetry(const Topology& topo) const {
  std::call_once(symmetric_, [this, &topo] { symmetry_ = FindProfileSymmetry(topo, *this); });
  return symmetry_;
}

void LinkProfile::PresetSymmetry(ProfileSymmetry symmetry) const {
  std::call_once(symmetric_, [this, &symmetry] { symmetry_ = std::move(symmetry); });
}

const LinkProfile::Orbits& LinkProfile::orbits(const Topology& topo,
                                               const std::vector<int>& steps) const {
  std::lock_guard<std::mutex> lock(orbits_mutex_);
  std::unique_ptr<Orbits>& found = orbits_[steps];
  if (!found) {
    found = std::make_unique<Orbits>();
    found->least = GroupOrbits(topo, symmetry(topo), steps);
    // Each orbit of links has one member whose source lies in the box below the steps: the
    // translation by minus its source's coordinates rounded down to multiples of the steps.
    found->representative.assign(by_link().link_bits.size(), 0);
    for (LinkId l : links) {
      const std::vector<int>& from = topo.node(topo.link(l).src).coords;
      bool in_box = from.size() == steps.size();
      for (size_t d = 0; d < steps.size() && in_box; ++d) in_box = from[d] < steps[d];
      if (in_box) found->representative[static_cast<size_t>(l) / 64] |= uint64_t{1} << (l % 64);
    }
  }
  return *found;
}

std::vector<int> CanonicalGroupOrder(const Mesh& mesh,
                                     const std::vector<std::vector<int>>& groups) {
  std::vector<int> order(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) order[g] = static_cast<int>(g);
  // Groups are disjoint: their first members' devices differ.
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return mesh.device(groups[a][0]) < mesh.device(groups[b][0]); });
  return order;
}

NetworkCollectiveModel::NetworkCollectiveModel(const Machine& machine, bool translate_groups)
    : machine_(machine), router_(&machine.router()), translate_groups_(translate_groups) {}

NetworkCollectiveModel::NetworkCollectiveModel(const Machine& machine, OwnRouter)
    : machine_(machine),
      own_router_(MakeRouter(machine.topology())),
      router_(own_router_.get()),
      translate_groups_(true) {}

std::shared_ptr<const CollectiveTiming> NetworkCollectiveModel::Estimate(
    const Mesh& mesh, const CollectiveRequest& request) {
  ++simulations_;
  auto timing = std::make_shared<CollectiveTiming>();
  timing->member_time.assign(mesh.size(), Time());
  // The groups run in the order of their first members' devices, whatever the mesh's order of
  // them: the answer is then one of the groups' devices alone (CanonicalGroupOrder), which
  // the cache moves between meshes that share them.
  std::vector<std::vector<int>> groups = mesh.Groups(request.axes);
  const std::vector<int> order = CanonicalGroupOrder(mesh, groups);
  std::vector<std::vector<int>> sorted(groups.size());
  for (size_t c = 0; c < order.size(); ++c) sorted[c] = std::move(groups[order[c]]);
  SimulateAnyWay(mesh, request, sorted, *timing);
  std::vector<std::vector<LinkUse>>& group_use = timing->profile->group_use;
  if (group_use.size() == order.size()) {
    std::vector<std::vector<LinkUse>> by_mesh(order.size());
    for (size_t c = 0; c < order.size(); ++c) by_mesh[order[c]] = std::move(group_use[c]);
    group_use = std::move(by_mesh);
  }
  timing->slowest = Slowest(timing->member_time);
  return timing;
}

void NetworkCollectiveModel::SimulateAnyWay(const Mesh& mesh, const CollectiveRequest& request,
                                            const std::vector<std::vector<int>>& groups,
                                            CollectiveTiming& timing) {
  if (translate_groups_ && groups.size() > 1) {
    Layout layout = LayoutOf(mesh, request);
    if (!untranslatable_.count(layout)) {
      if (SimulateByTranslation(mesh, request, groups, timing)) {
        ++translated_;
        return;
      }
      untranslatable_.insert(std::move(layout));
      // What a refused translation left in `timing` goes; the next simulation fills it.
      timing = CollectiveTiming();
      timing.member_time.assign(mesh.size(), Time());
    }
    if (SimulateFolded(mesh, request, groups, timing)) {
      ++folded_;
      return;
    }
  }
  Simulate(mesh, request, groups, timing);
}

NetworkCollectiveModel::Layout NetworkCollectiveModel::LayoutOf(const Mesh& mesh,
                                                                const CollectiveRequest& request) {
  return {mesh.fingerprint(), static_cast<int>(request.kind), request.algorithm, request.axes,
          request.destination};
}

bool NetworkCollectiveModel::Simulate(const Mesh& mesh, const CollectiveRequest& request,
                                      const std::vector<std::vector<int>>& groups,
                                      CollectiveTiming& timing, const LinkWatch& watch) {
  const Topology& topo = machine_.topology();
  // Recorded keeping the latest stretches of each link's use; again keeping every one if that
  // did not add up exactly (LinkAccounting::overflowed), as other sizes of it are from the
  // start. The second run is the first's again: the watch saw its links already.
  Layout layout = LayoutOf(mesh, request);
  const bool every_from_start = every_stretch_ || recorded_again_layouts_.count(layout);
  for (const bool again : {false, true}) {
    const bool every_stretch = every_from_start || again;
    Simulator sim;
    Network network(sim, topo, *router_);
    std::vector<int> group_of_vertex(topo.num_vertices(), -1);
    for (size_t g = 0; g < groups.size(); ++g) {
      for (int p : groups[g])
        group_of_vertex[topo.device_vertex(mesh.device(p))] = static_cast<int>(g);
    }
    LinkAccounting accounting(topo.links().size(), std::move(group_of_vertex), every_stretch);
    std::optional<WatchingRecorder> watching;
    if (watch && !again) watching.emplace(sim, topo.links().size(), accounting, watch);
    network.set_flow_recorder(watching ? static_cast<FlowRecorder*>(&*watching) : &accounting);
    std::vector<int> all(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) all[g] = static_cast<int>(g);
    timing.algorithm = RunGroups(sim, network, mesh, request, groups, all, timing)[0];
    if (watching && watching->stopped()) return false;
    if (accounting.overflowed()) {
      ++recorded_again_;
      recorded_again_layouts_.insert(layout);
      continue;
    }
    Time longest;
    for (const std::vector<int>& group : groups) {
      for (int p : group) longest = std::max(longest, timing.member_time[p]);
    }
    for (LinkId l = 0; l < static_cast<LinkId>(topo.links().size()); ++l) {
      if (network.link_bytes(l) <= 0 || longest == Time()) continue;
      timing.profile->links.push_back(l);
      double capacity = topo.links()[l].bandwidth.bytes_per_second() * longest.seconds();
      timing.profile->link_share.push_back(std::min(1.0, network.link_bytes(l) / capacity));
    }
    accounting.Summarize(groups, timing);
    return true;
  }
  throw std::logic_error("a link's use did not add up with every stretch kept");
}

bool NetworkCollectiveModel::SimulateFolded(const Mesh& mesh, const CollectiveRequest& request,
                                            const std::vector<std::vector<int>>& groups,
                                            CollectiveTiming& timing) {
  const Topology& topo = machine_.topology();
  std::optional<TranslationQuotient> quotient = FindTranslationQuotient(topo, mesh, groups);
  if (!quotient) return false;
  const TranslationQuotient& q = *quotient;
  QuotientRouter router(*router_, q);
  const size_t links = topo.links().size();
  std::vector<int> group_of_vertex(topo.num_vertices(), -1);
  for (int g : q.simulated) {
    for (int p : groups[g]) group_of_vertex[topo.device_vertex(mesh.device(p))] = g;
  }
  // As Simulate: recorded again keeping every stretch if the latest ones did not add up.
  Layout layout = LayoutOf(mesh, request);
  const bool every_from_start = every_stretch_ || recorded_again_layouts_.count(layout);
  std::optional<Simulator> sim;
  std::optional<Network> network;
  std::optional<LinkAccounting> whole, own;
  std::vector<std::string> resolved;
  for (const bool again : {false, true}) {
    const bool every_stretch = every_from_start || again;
    network.reset();
    sim.emplace();
    network.emplace(*sim, topo, router);
    whole.emplace(links, std::vector<int>(topo.num_vertices(), -1), every_stretch);
    own.emplace(links, group_of_vertex, every_stretch);
    FoldedRecorder recorder(topo, q, *whole, *own);
    network->set_flow_recorder(&recorder);
    resolved = RunGroups(*sim, *network, mesh, request, groups, q.simulated, timing);
    network->set_flow_recorder(nullptr);
    if (!whole->overflowed() && !own->overflowed()) break;
    if (every_stretch) {
      throw std::logic_error("a link's use did not add up with every stretch kept");
    }
    ++recorded_again_;
    recorded_again_layouts_.insert(layout);
  }
  // The full simulation names what the first group ran: its source's choice.
  timing.algorithm =
      resolved[std::lower_bound(q.simulated.begin(), q.simulated.end(), q.source[0]) -
               q.simulated.begin()];
  // Every member finishes when the same member of its group's source does.
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t m = 0; m < groups[g].size(); ++m) {
      timing.member_time[groups[g][m]] = timing.member_time[groups[q.source[g]][m]];
    }
  }
  const Time longest = Slowest(timing.member_time);
  timing.profile->group_use.assign(groups.size(), {});
  if (longest == Time()) return true;  // No link was held: as the full simulation leaves it.
  // A representative link carries what each link of its orbit carries in the full run.
  CollectiveTiming folded;
  folded.member_time = timing.member_time;
  std::vector<int32_t> index(links, -1);
  for (LinkId l = 0; l < static_cast<LinkId>(links); ++l) {
    if (q.representative[l] == l && network->link_bytes(l) > 0) {
      index[l] = static_cast<int32_t>(folded.profile->links.size());
      folded.profile->links.push_back(l);
    }
  }
  whole->Summarize(groups, folded);
  for (LinkId l = 0; l < static_cast<LinkId>(links); ++l) {
    const LinkId r = q.representative[l];
    if (index[r] < 0) continue;
    timing.profile->links.push_back(l);
    double capacity = topo.link(l).bandwidth.bytes_per_second() * longest.seconds();
    timing.profile->link_share.push_back(std::min(1.0, network->link_bytes(r) / capacity));
    LinkUse use = folded.profile->link_use[index[r]];
    use.link = l;
    timing.profile->link_use.push_back(use);
  }
  // The simulated groups' use of their own links, translated to every other group.
  CollectiveTiming mine;
  mine.member_time = timing.member_time;
  mine.profile->links = own->HeldLinks();
  own->Summarize(groups, mine);
  std::vector<std::vector<LinkUse>>& group_use = timing.profile->group_use;
  group_use = std::move(mine.profile->group_use);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (q.source[g] == static_cast<int>(g)) continue;
    group_use[g] = group_use[q.source[g]];
    for (LinkUse& u : group_use[g]) u.link = *TranslatedLink(topo, u.link, q.shift[g]);
    std::sort(group_use[g].begin(), group_use[g].end(),
              [](const LinkUse& a, const LinkUse& b) { return a.link < b.link; });
  }
  return true;
}

bool NetworkCollectiveModel::SimulateByTranslation(const Mesh& mesh,
                                                   const CollectiveRequest& request,
                                                   const std::vector<std::vector<int>>& groups,
                                                   CollectiveTiming& timing) {
  const Topology& topo = machine_.topology();
  if (!topo.torus()) return false;
  const std::vector<int>& shape = topo.torus()->shape;
  const std::vector<bool>& wrap = topo.torus()->wraparound;
  const int rank = static_cast<int>(shape.size());
  auto coords = [&](int position) { return TorusCoords(shape, mesh.device(position)); };
  // Each group's offset from the first, checked member by member.
  const std::vector<int>& first = groups[0];
  std::vector<std::vector<int>> first_coords;
  for (int p : first) first_coords.push_back(coords(p));
  std::vector<std::vector<int>> offsets;
  for (const std::vector<int>& group : groups) {
    if (group.size() != first.size()) return false;
    std::vector<int> base = coords(group[0]), t(rank);
    for (int d = 0; d < rank; ++d) t[d] = base[d] - first_coords[0][d];
    for (size_t m = 0; m < group.size(); ++m) {
      std::vector<int> at = coords(group[m]);
      for (int d = 0; d < rank; ++d) {
        int want = first_coords[m][d] + t[d];
        if (wrap[d]) {
          want = ((want % shape[d]) + shape[d]) % shape[d];
        } else if (want < 0 || want >= shape[d]) {
          return false;
        }
        if (at[d] != want) return false;
      }
    }
    offsets.push_back(std::move(t));
  }
  // The first group alone. Its links, translated to every group, must exist, match, and never
  // meet: checked as the simulation finds them, which stops at the first that fails (a
  // collision is often among the first transfers). `moved[l]`: link l's translate by each
  // offset, once checked.
  std::vector<char> claimed(topo.links().size(), 0);
  std::vector<std::vector<LinkId>> moved(topo.links().size());
  const LinkWatch watch = [&](LinkId l) {
    const Link& link = topo.link(l);
    for (const std::vector<int>& t : offsets) {
      const std::optional<LinkId> m = TranslatedLink(topo, l, t);
      if (!m || claimed[*m] || topo.link(*m).bandwidth != link.bandwidth ||
          topo.link(*m).latency != link.latency) {
        return false;
      }
      claimed[*m] = 1;
      moved[l].push_back(*m);
    }
    return true;
  };
  CollectiveTiming solo;
  solo.member_time.assign(mesh.size(), Time());
  if (!Simulate(mesh, request, {first}, solo, watch)) return false;
  std::vector<std::tuple<LinkId, double, LinkUse>> links;
  // The first group's use of each of its links, by link.
  std::vector<LinkUse> first_use(solo.profile->links.size());
  for (const LinkUse& u : solo.profile->group_use[0]) {
    first_use[std::lower_bound(solo.profile->links.begin(), solo.profile->links.end(), u.link) -
              solo.profile->links.begin()] = u;
  }
  timing.profile->group_use.assign(groups.size(), {});
  for (size_t g = 0; g < offsets.size(); ++g) {
    for (size_t k = 0; k < solo.profile->links.size(); ++k) {
      // Every link the solo run carried bytes on was held by a recorded transfer: watched.
      const std::vector<LinkId>& translates = moved[solo.profile->links[k]];
      if (translates.size() != offsets.size()) {
        throw std::logic_error("a link of the lone group's run was never checked for translation");
      }
      const LinkId to = translates[g];
      LinkUse use = first_use[k];
      use.link = to;
      timing.profile->group_use[g].push_back(use);
      use = solo.profile->link_use[k];
      use.link = to;
      links.push_back({to, solo.profile->link_share[k], use});
    }
    std::sort(timing.profile->group_use[g].begin(), timing.profile->group_use[g].end(),
              [](const LinkUse& a, const LinkUse& b) { return a.link < b.link; });
  }
  for (const std::vector<int>& group : groups) {
    for (size_t m = 0; m < group.size(); ++m) {
      timing.member_time[group[m]] = solo.member_time[first[m]];
    }
  }
  timing.algorithm = solo.algorithm;
  std::sort(links.begin(), links.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  for (const auto& [l, share, use] : links) {
    timing.profile->links.push_back(l);
    timing.profile->link_share.push_back(share);
    timing.profile->link_use.push_back(use);
  }
  return true;
}

namespace {

// Every field of `request` but its kind and reduction (its axes only `with_axes`), then the
// placement's id in the cache (MeshId, or PlacementId of a group layout, which stands for the
// axes). Algorithm names are spelled out character by character.
std::vector<int64_t> RequestKey(int64_t mesh_id, const CollectiveRequest& request, int64_t elements,
                                bool with_axes) {
  std::vector<int64_t> key = {static_cast<int64_t>(request.dtype), elements,
                              request.chunk_size.count(),
                              static_cast<int64_t>(request.algorithm.size())};
  for (char c : request.algorithm) key.push_back(c);
  if (with_axes) {
    key.push_back(static_cast<int64_t>(request.axes.size()));
    key.insert(key.end(), request.axes.begin(), request.axes.end());
  }
  key.push_back(static_cast<int64_t>(request.destination.size()));
  key.insert(key.end(), request.destination.begin(), request.destination.end());
  key.push_back(mesh_id);
  return key;
}

}  // namespace

int64_t CachedCollectiveModel::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

int64_t CachedCollectiveModel::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

int64_t CachedCollectiveModel::ring_pass_hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_pass_hits_;
}

int64_t CachedCollectiveModel::MeshId(const Mesh& mesh) {
  std::vector<KnownMesh>& same = meshes_[mesh.fingerprint()];
  auto same_sizes = [&](const std::vector<int>& sizes) {
    return std::equal(sizes.begin(), sizes.end(), mesh.axes().begin(), mesh.axes().end(),
                      [](int size, const MeshAxis& axis) { return size == axis.size; });
  };
  for (const KnownMesh& known : same) {
    if (same_sizes(known.sizes) && known.devices == mesh.devices()) return known.id;
  }
  std::vector<int> sizes;
  for (const MeshAxis& axis : mesh.axes()) sizes.push_back(axis.size);
  same.push_back({std::move(sizes), mesh.devices(), next_mesh_id_});
  return next_mesh_id_++;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> CachedCollectiveModel::Keys(
    int64_t mesh_id, const Mesh& mesh, const CollectiveRequest& request, bool with_axes) {
  std::vector<int64_t> key = RequestKey(mesh_id, request, request.elements, with_axes);
  key.insert(key.begin(),
             {static_cast<int64_t>(request.kind), static_cast<int64_t>(request.reduce)});
  // A ring pass: a reduce-scatter of G blocks sends, step for step, the transfers of the
  // all-gather of one block (it forwards chunk r - s - 1 where the gather forwards r - s, all
  // chunks one block), so on one ring, or two opposite ones, their timings are one. `auto`
  // resolves both alike (it reads the bytes per member, G blocks either way).
  std::vector<int64_t> pass;
  if (request.kind == CollectiveKind::kAllGather ||
      request.kind == CollectiveKind::kReduceScatter) {
    int64_t g = 1;
    for (int a : request.axes) g *= mesh.axes()[a].size;
    bool scatter = request.kind == CollectiveKind::kReduceScatter;
    if (!scatter || request.elements % g == 0) {
      pass = RequestKey(mesh_id, request, scatter ? request.elements / g : request.elements,
                        with_axes);
    }
  }
  return {std::move(key), std::move(pass)};
}

std::optional<CollectiveRequest> CachedCollectiveModel::RingPassPartner(
    const Mesh& mesh, const CollectiveRequest& request) {
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

bool CachedCollectiveModel::RanAsRingPass(const CollectiveTiming& timing) {
  const std::string family = timing.algorithm.substr(0, timing.algorithm.find('/'));
  return family == "ring" || family == "bidirectional_ring";
}

CachedCollectiveModel::GroupLayout CachedCollectiveModel::Layout(const Mesh& mesh,
                                                                 const std::vector<int>& axes) {
  GroupLayout layout;
  for (int a : axes) layout.placement.push_back(mesh.axes()[a].size);
  layout.placement.push_back(-1);
  const std::vector<std::vector<int>> groups = mesh.Groups(axes);
  layout.order = CanonicalGroupOrder(mesh, groups);
  for (int g : layout.order) {
    for (int p : groups[g]) {
      layout.positions.push_back(p);
      layout.placement.push_back(mesh.device(p));
    }
  }
  return layout;
}

std::shared_ptr<const CollectiveTiming> CachedCollectiveModel::Moved(
    const std::shared_ptr<const CollectiveTiming>& timing, const GroupLayout& from,
    const GroupLayout& to, int positions) {
  if (from.positions == to.positions && from.order == to.order &&
      timing->member_time.size() == static_cast<size_t>(positions)) {
    return timing;
  }
  auto moved = std::make_shared<CollectiveTiming>();
  moved->member_time.assign(positions, Time());
  for (size_t i = 0; i < to.positions.size(); ++i) {
    moved->member_time[to.positions[i]] = timing->member_time[from.positions[i]];
  }
  moved->slowest = timing->slowest;
  moved->algorithm = timing->algorithm;
  if (from.order == to.order) {  // Each group keeps its number: the links' use is the same.
    moved->profile = timing->profile;
    return moved;
  }
  const LinkProfile& a = *timing->profile;
  LinkProfile& b = *moved->profile;
  b.links = a.links;
  b.link_share = a.link_share;
  b.link_use = a.link_use;
  if (a.group_use.size() == from.order.size()) {
    b.group_use.resize(to.order.size());
    for (size_t c = 0; c < to.order.size(); ++c)
      b.group_use[to.order[c]] = a.group_use[from.order[c]];
  } else {
    b.group_use = a.group_use;  // None recorded.
  }
  return moved;
}

int64_t CachedCollectiveModel::PlacementId(const std::vector<int64_t>& placement) {
  FnvHash hash;
  for (int64_t v : placement) hash.Mix(static_cast<uint64_t>(v));
  std::vector<std::pair<std::vector<int64_t>, int64_t>>& same = placements_[hash.value()];
  for (const auto& [known, id] : same) {
    if (known == placement) return id;
  }
  same.push_back({placement, next_placement_id_});
  return next_placement_id_++;
}

std::shared_ptr<const CollectiveTiming> CachedCollectiveModel::EstimateWith(
    const Mesh& mesh, const CollectiveRequest& request, CollectiveCostModel& inner) {
  std::vector<int64_t> key;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    key = Keys(MeshId(mesh), mesh, request).first;
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      ++hits_;
      return it->second;
    }
  }
  // Not asked on this mesh: perhaps on another with the same groups.
  auto layout = std::make_shared<const GroupLayout>(Layout(mesh, request.axes));
  std::vector<int64_t> laid_key, pass;
  std::shared_ptr<const CollectiveTiming> timing;
  LaidOut known;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::tie(laid_key, pass) =
        Keys(PlacementId(layout->placement), mesh, request, /*with_axes=*/false);
    if (auto it = by_layout_.find(laid_key); it != by_layout_.end()) {
      known = it->second;
    } else if (!pass.empty()) {
      if (auto found = ring_passes_.find(pass); found != ring_passes_.end()) {
        known = found->second;
        ++ring_pass_hits_;
      }
    }
    if (known.timing) {
      ++hits_;
    } else {
      ++misses_;
      auto ahead = prepared_.find(key);
      if (ahead != prepared_.end()) {
        timing = std::move(ahead->second);
        prepared_.erase(ahead);
      }
    }
  }
  if (known.timing) {
    // Moved outside the lock: a pod's timing lists tens of thousands of links.
    timing = Moved(known.timing, *known.layout, *layout, mesh.size());
    std::lock_guard<std::mutex> lock(mutex_);
    by_layout_.emplace(std::move(laid_key), LaidOut{timing, layout});
    return cache_.emplace(std::move(key), timing).first->second;
  }
  if (!timing) timing = inner.Estimate(mesh, request);
  std::lock_guard<std::mutex> lock(mutex_);
  // The tuner gives a reduce-scatter and an all-gather of the same array the same protocol.
  if (!pass.empty() && RanAsRingPass(*timing)) {
    ring_passes_.emplace(std::move(pass), LaidOut{timing, layout});
  }
  // Another thread may have stored these keys meanwhile: keep its (equal) answer.
  by_layout_.emplace(std::move(laid_key), LaidOut{timing, layout});
  return cache_.emplace(std::move(key), timing).first->second;
}

void CachedCollectiveModel::Prepare(const Mesh& mesh,
                                    const std::vector<CollectiveRequest>& requests) {
  if (helpers_.empty()) return;
  // The requests Estimate would pass to the inner model, in order, less those whose ring pass
  // an earlier one shares (their fate depends on its answer).
  std::vector<size_t> work;
  std::vector<std::vector<int64_t>> work_keys;
  // Each request's group layout (one per distinct list of axes), found outside the lock.
  std::map<std::vector<int>, GroupLayout> layouts;
  for (const CollectiveRequest& request : requests) {
    if (!layouts.count(request.axes)) layouts.emplace(request.axes, Layout(mesh, request.axes));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t mesh_id = MeshId(mesh);
    std::set<std::vector<int64_t>> keys, laid_keys, passes;
    for (size_t i = 0; i < requests.size(); ++i) {
      std::vector<int64_t> key = Keys(mesh_id, mesh, requests[i]).first;
      if (cache_.count(key) || prepared_.count(key) || !keys.insert(key).second) continue;
      // A request whose timing another mesh with the same groups has (or will have from this
      // list) is moved, not priced.
      auto [laid_key, pass] = Keys(PlacementId(layouts.at(requests[i].axes).placement), mesh,
                                   requests[i], /*with_axes=*/false);
      if (by_layout_.count(laid_key) || !laid_keys.insert(std::move(laid_key)).second) continue;
      if (!pass.empty() && (ring_passes_.count(pass) || !passes.insert(std::move(pass)).second)) {
        continue;
      }
      work.push_back(i);
      work_keys.push_back(std::move(key));
    }
  }
  if (work.size() < 2) return;  // Nothing to share out.
  std::vector<std::shared_ptr<const CollectiveTiming>> done(work.size());
  // Thread t (0: this one, with the inner model; t > 0: helper t - 1) first takes request t,
  // then each the next not yet taken: every thread prices at least one, however late it
  // starts. A request that throws is left to Estimate, which throws it again where the run
  // asks for it.
  const size_t threads_used = std::min(helpers_.size() + 1, work.size());
  std::atomic<size_t> next{threads_used};
  auto run = [&](CollectiveCostModel& model, size_t first) {
    for (size_t w = first; w < work.size(); w = next++) {
      try {
        done[w] = model.Estimate(mesh, requests[work[w]]);
      } catch (...) {
        done[w] = nullptr;
      }
    }
  };
  std::vector<std::thread> threads;
  const int arena = CurrentArena();
  for (size_t t = 1; t < threads_used; ++t) {
    threads.emplace_back([&run, &model = *helpers_[t - 1], t, arena] {
      UseArena(arena);
      run(model, t);
    });
  }
  run(inner_, 0);
  for (std::thread& t : threads) t.join();
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t w = 0; w < work.size(); ++w) {
    if (done[w]) prepared_.emplace(std::move(work_keys[w]), std::move(done[w]));
  }
}

}  // namespace shardsim
