#include "collectives/timing/sharing_costs.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "collectives/timing/profile_symmetry.h"

namespace shardsim {

namespace {

// Max-min fair sharing of one link of `capacity` (bytes per second) by two sets of transfers,
// `n1` at once each wanting at most `r1` and `n2` each wanting at most `r2` (what they got
// alone): the rate each transfer not held below it gets, or infinity when both sets fit.
double FairLevel(double n1, double r1, double n2, double r2, double capacity) {
  if (n1 * r1 + n2 * r2 <= capacity) return std::numeric_limits<double>::infinity();
  if (r2 < r1) {
    std::swap(n1, n2);
    std::swap(r1, r2);
  }
  // The slower set keeps its rate if the faster set's transfers still get more.
  if ((n1 + n2) * r1 < capacity) return (capacity - n1 * r1) / n2;
  return capacity / (n1 + n2);
}

// What a transfer set wanting `rate` on a link, holding it `duty` of its time, loses there
// beside another holding it `other_duty` of its time, the fair level there `level`: a
// fraction overlap * (rate / level - 1) of its time, the overlap min(duty, other_duty) when
// both were launched `together`, duty * other_duty otherwise. 0 below an infinite level
// (both fit) or when it wants no more than the level (it keeps its rate): adding that 0 to a
// sum, or taking it into a maximum of costs, leaves them the same to the bit (none is -0).
double SharingCost(double rate, double duty, double level, double other_duty, bool together) {
  if (!(level >= 0 && level < std::numeric_limits<double>::infinity()) || rate <= level) {
    return 0.0;
  }
  const double overlap = together ? std::min(duty, other_duty) : duty * other_duty;
  return overlap * (rate / level - 1.0);
}

}  // namespace

std::vector<double> WorstSharingCosts(const Topology& topo, const LinkProfile& op,
                                      const std::vector<SharingOther>& others, SharingPass pass,
                                      std::vector<double>* partner) {
  if (partner != nullptr) partner->clear();
  const std::vector<double>& capacities = topo.link_bytes_per_second();
  const GroupUseByLink& on_link = op.by_link();
  const bool single = others.size() == 1;
  // With one other op, its worst costs (when asked for) are found in the same pass over the
  // links both use: each link's fair level is the same both ways (FairLevel orders the two sets
  // by rate; only at equal rates does it depend on the order, and then it is found again the
  // other way).
  const bool with_partner = single && partner != nullptr;
  // Where translations of the torus map this op and every other onto themselves, the pass
  // reads one link per orbit of the translations they share, and keeps each group's worst
  // cost per orbit of groups (at its least group): every entry of a group on a link is, moved
  // by some translation, an entry of a group of its orbit on the orbit's representative link,
  // with the same figures on both ops' sides, so the same cost (profile_symmetry.h); a group's
  // worst, the largest over its entries, is the largest over its orbit's entries on
  // representative links, to the bit.
  const LinkProfile::Orbits* orbits = nullptr;
  const LinkProfile::Orbits* partner_orbits = nullptr;
  if (pass == SharingPass::kByOrbit) {
    std::vector<int> steps = op.symmetry(topo).step;
    for (const SharingOther& other : others) {
      steps = CommonSteps(steps, other.profile->symmetry(topo).step);
    }
    if (AnyTranslation(topo, steps)) {
      orbits = &op.orbits(topo, steps);
      if (with_partner) partner_orbits = &others[0].profile->orbits(topo, steps);
    }
  }
  // Where a group's worst cost is kept: at its orbit's least group, or its own.
  auto slot = [](const LinkProfile::Orbits* o, int32_t g) {
    return static_cast<size_t>(o != nullptr ? o->least[static_cast<size_t>(g)] : g);
  };
  // Per link of the op's groups, one after another: the summed costs. Each other op adds to
  // the entries on the links both use (found through their link sets, ascending), at most
  // once per entry, in the order of `others`. With one other op every entry takes at most one
  // cost (it lies on one link, met once), so each group's costliest entry is its largest
  // single cost: kept per group as found, without the per-entry sums.
  std::vector<double> worst(op.group_use.size(), 0.0);
  std::vector<double> link_load;
  if (!single) link_load.assign(on_link.entries, 0.0);
  std::vector<double> partner_worst;
  if (with_partner) partner_worst.assign(others[0].profile->group_use.size(), 0.0);
  for (const SharingOther& other : others) {
    const LinkProfile& u = *other.profile;
    // The cost each entry of `uses` on its links[k] adds beside a set of transfers holding that
    // link `other_duty` of their time, the fair level there `level` (SharingCost), passed to
    // add(entry, cost) where it is not 0.
    const bool together = other.together;
    auto each_cost = [together](const GroupUseByLink& uses, size_t k, double level,
                                double other_duty, const auto& add) {
      if (!(level >= 0 && level < std::numeric_limits<double>::infinity())) return;
      for (int32_t n = uses.start[k]; n < uses.start[k + 1]; ++n) {
        if (uses.rate[n] <= level) continue;
        add(n, SharingCost(uses.rate[n], uses.duty[n], level, other_duty, together));
      }
    };
    // The links both ops use (with orbits, their orbits' representatives), ascending: the set
    // bits of their link sets' intersection, each at its position in both lists; there the
    // fair rate the other op leaves this one's transfers.
    const GroupUseByLink& other_on_link = u.by_link();
    const size_t words = std::min(on_link.link_bits.size(), other_on_link.link_bits.size());
    for (size_t w = 0; w < words; ++w) {
      const uint64_t mine = on_link.link_bits[w];
      const uint64_t theirs = other_on_link.link_bits[w];
      uint64_t both = mine & theirs;
      if (orbits != nullptr) both &= orbits->representative[w];
      for (; both != 0; both &= both - 1) {
        const uint64_t below = (both & -both) - 1;
        const size_t i = static_cast<size_t>(on_link.link_rank[w] + std::popcount(mine & below));
        const size_t j =
            static_cast<size_t>(other_on_link.link_rank[w] + std::popcount(theirs & below));
        const LinkUse& whole = op.link_use[i];
        const LinkUse& b = u.link_use[j];
        const double capacity = capacities[static_cast<size_t>(b.link)];
        const double level =
            FairLevel(whole.flows, whole.flow_rate, b.flows, b.flow_rate, capacity);
        if (with_partner) {
          const double partner_level =
              whole.flow_rate == b.flow_rate
                  ? FairLevel(b.flows, b.flow_rate, whole.flows, whole.flow_rate, capacity)
                  : level;
          each_cost(other_on_link, j, partner_level, whole.duty, [&](int32_t n, double cost) {
            double& worst_cost = partner_worst[slot(partner_orbits, other_on_link.group[n])];
            worst_cost = std::max(worst_cost, cost);
          });
        }
        each_cost(on_link, i, level, b.duty, [&](int32_t n, double cost) {
          if (single) {
            double& worst_cost = worst[slot(orbits, on_link.group[n])];
            worst_cost = std::max(worst_cost, cost);
          } else {
            link_load[on_link.entry[n]] += cost;
          }
        });
      }
    }
  }
  if (!single) {
    size_t e = 0;
    for (size_t g = 0; g < worst.size(); ++g) {
      double& worst_cost = worst[slot(orbits, static_cast<int32_t>(g))];
      for (size_t k = 0; k < op.group_use[g].size(); ++k)
        worst_cost = std::max(worst_cost, link_load[e++]);
    }
  }
  // Each group takes its orbit's: its least group's, kept there (and not moved, as the least
  // group's least is itself).
  auto spread = [](const LinkProfile::Orbits* o, std::vector<double>& costs) {
    if (o == nullptr) return;
    for (size_t g = 0; g < costs.size(); ++g) costs[g] = costs[static_cast<size_t>(o->least[g])];
  };
  spread(orbits, worst);
  if (with_partner) {
    spread(partner_orbits, partner_worst);
    *partner = std::move(partner_worst);
  }
  return worst;
}

}  // namespace shardsim
