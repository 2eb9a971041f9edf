#include "collectives/timing/profile_symmetry.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/translation_quotient.h"

namespace shardsim {

namespace {

// The link `l` becomes moved by `by` (TranslatedLink), with the same bandwidth, or -1.
LinkId Moved(const Topology& topo, LinkId l, const std::vector<int>& by) {
  const std::optional<LinkId> moved = TranslatedLink(topo, l, by);
  if (!moved) return -1;
  const std::vector<double>& bandwidth = topo.link_bytes_per_second();
  return bandwidth[static_cast<size_t>(*moved)] == bandwidth[static_cast<size_t>(l)] ? *moved : -1;
}

// Whether two uses are the same but for their link.
bool SameUse(const LinkUse& a, const LinkUse& b) {
  return a.duty == b.duty && a.flows == b.flows && a.flow_rate == b.flow_rate;
}

// Whether the translation by `k` along `d` maps `profile` onto itself; if so, each group's
// image in `image`.
bool Symmetric(const Topology& topo, const LinkProfile& profile, int d, int k,
               std::vector<int32_t>& image) {
  std::vector<int> by(topo.torus()->shape.size(), 0);
  by[static_cast<size_t>(d)] = k;
  const GroupUseByLink& by_link = profile.by_link();
  for (size_t i = 0; i < profile.links.size(); ++i) {
    const LinkId moved = Moved(topo, profile.links[i], by);
    if (moved < 0 || !by_link.has(moved) ||
        !SameUse(profile.link_use[by_link.position(moved)], profile.link_use[i])) {
      return false;
    }
  }
  // Groups by their first link, to find a moved group's image among.
  const size_t groups = profile.group_use.size();
  std::vector<std::pair<LinkId, int32_t>> first;
  for (size_t g = 0; g < groups; ++g) {
    if (!profile.group_use[g].empty()) {
      first.push_back({profile.group_use[g][0].link, static_cast<int32_t>(g)});
    }
  }
  std::sort(first.begin(), first.end());
  std::vector<char> claimed(groups, 0);
  image.assign(groups, -1);
  std::vector<LinkUse> moved;
  for (size_t g = 0; g < groups; ++g) {
    const std::vector<LinkUse>& uses = profile.group_use[g];
    if (uses.empty()) {
      image[g] = static_cast<int32_t>(g);  // Its worst cost is none wherever it is.
      continue;
    }
    moved = uses;
    for (LinkUse& u : moved) {
      u.link = Moved(topo, u.link, by);
      if (u.link < 0) return false;
    }
    std::sort(moved.begin(), moved.end(),
              [](const LinkUse& a, const LinkUse& b) { return a.link < b.link; });
    auto it =
        std::lower_bound(first.begin(), first.end(), std::pair<LinkId, int32_t>{moved[0].link, -1});
    for (; it != first.end() && it->first == moved[0].link; ++it) {
      const std::vector<LinkUse>& other = profile.group_use[static_cast<size_t>(it->second)];
      if (claimed[static_cast<size_t>(it->second)] || other.size() != moved.size()) continue;
      bool same = true;
      for (size_t n = 0; n < moved.size() && same; ++n) {
        same = other[n].link == moved[n].link && SameUse(other[n], moved[n]);
      }
      if (same) {
        claimed[static_cast<size_t>(it->second)] = 1;
        image[g] = it->second;
        break;
      }
    }
    if (image[g] < 0) return false;
  }
  return true;
}

}  // namespace

ProfileSymmetry FindProfileSymmetry(const Topology& topo, const LinkProfile& profile) {
  ProfileSymmetry symmetry;
  if (!topo.torus() || topo.num_switches() != 0) return symmetry;
  const std::vector<int>& shape = topo.torus()->shape;
  const std::vector<bool>& wrap = topo.torus()->wraparound;
  symmetry.step = shape;
  symmetry.image.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!wrap[d]) continue;  // Also false for lengths 1 and 2 (HasWraparoundLink).
    // The symmetries along d form a subgroup of Z_length: multiples of its least step, a
    // divisor of the length.
    for (int k = 1; k < shape[d]; ++k) {
      if (shape[d] % k != 0) continue;
      if (Symmetric(topo, profile, static_cast<int>(d), k, symmetry.image[d])) {
        symmetry.step[d] = k;
        break;
      }
    }
    if (symmetry.step[d] == shape[d]) symmetry.image[d].clear();
  }
  return symmetry;
}

std::vector<int> CommonSteps(const std::vector<int>& a, const std::vector<int>& b) {
  if (a.empty() || b.empty()) return {};
  std::vector<int> steps(a.size());
  for (size_t d = 0; d < a.size(); ++d) steps[d] = std::lcm(a[d], b[d]);
  return steps;
}

bool AnyTranslation(const Topology& topo, const std::vector<int>& steps) {
  if (steps.empty()) return false;
  const std::vector<int>& shape = topo.torus()->shape;
  for (size_t d = 0; d < steps.size(); ++d) {
    if (steps[d] < shape[d]) return true;
  }
  return false;
}

std::vector<int32_t> GroupOrbits(const Topology& topo, const ProfileSymmetry& symmetry,
                                 const std::vector<int>& steps) {
  const std::vector<int>& shape = topo.torus()->shape;
  size_t groups = 0;
  for (const std::vector<int32_t>& image : symmetry.image) groups = std::max(groups, image.size());
  // Each generator: the translation by steps[d] along d, a power of the one by symmetry.step[d].
  std::vector<std::vector<int32_t>> generators;
  for (size_t d = 0; d < steps.size(); ++d) {
    if (steps[d] >= shape[d]) continue;
    const std::vector<int32_t>& image = symmetry.image[d];
    std::vector<int32_t> generator(image.size());
    for (size_t g = 0; g < image.size(); ++g) {
      int32_t to = static_cast<int32_t>(g);
      for (int p = 0; p < steps[d] / symmetry.step[d]; ++p) to = image[static_cast<size_t>(to)];
      generator[g] = to;
    }
    generators.push_back(std::move(generator));
  }
  // Orbits found from their least group: every smaller group lies in an orbit found before.
  std::vector<int32_t> least(groups, -1);
  std::vector<int32_t> stack;
  for (size_t g = 0; g < groups; ++g) {
    if (least[g] >= 0) continue;
    least[g] = static_cast<int32_t>(g);
    stack.push_back(static_cast<int32_t>(g));
    while (!stack.empty()) {
      const size_t at = static_cast<size_t>(stack.back());
      stack.pop_back();
      for (const std::vector<int32_t>& generator : generators) {
        const int32_t to = generator[at];
        if (least[static_cast<size_t>(to)] < 0) {
          least[static_cast<size_t>(to)] = static_cast<int32_t>(g);
          stack.push_back(to);
        }
      }
    }
  }
  return least;
}

}  // namespace shardsim
