// The translations of a torus that map a collective's recorded use of the links onto itself
// (ProfileSymmetry), and the orbits of its groups under a subgroup of them: where ops in flight
// together share links, the cached timing path reads one link per orbit of the translations
// they have in common and keeps one worst cost per orbit of groups (WorstSharingCosts).
//
// Why that is exact. Let t be a translation such that, for two ops A and B,
// every link l each uses maps to a link t(l) of the same bandwidth that the op uses alike
// (the duty, flows and flow rate of its whole use there equal, to the bit), and each group g
// of A maps to a group t(g) whose uses are g's moved by t, entry by entry (link, rate, duty).
// The contention rule reads, for an entry of group g on link l, only those figures of A and B
// at l and the link's bandwidth: for t(g) at t(l) it reads equal numbers, so it computes the
// same costs, and a group's worst cost (a maximum over its entries, of sums taken in the
// fixed order of the other ops) is the same bits for g and t(g). Translations compose, so
// this holds over the subgroup they generate. Each entry of a group on a link is then, moved by
// the translation that takes the link to its orbit's representative, an entry of a group of
// the same orbit there with the same cost: a group's worst is the largest cost of its orbit's
// entries on representative links.
#pragma once

#include <cstdint>
#include <vector>

#include "topology/topology.h"

namespace shardsim {

class LinkProfile;

// Translations of a torus under which a profile is the same, as a product of cyclic groups.
struct ProfileSymmetry {
  // Per torus dimension: translations by multiples of step[d] along d are symmetries (step[d]
  // equal to the dimension's length: none moves along d). Empty when the topology is not a
  // switchless torus.
  std::vector<int> step;
  // Per dimension: each group's image under the translation by step[d] along d (empty where
  // no translation moves along d).
  std::vector<std::vector<int32_t>> image;
};

// The symmetries of `profile`, recorded on `topo` (every link it names is one of topo's):
// for each dimension that wraps, the least step whose translation maps the profile onto itself
// as above, checked on every link and every group.
ProfileSymmetry FindProfileSymmetry(const Topology& topo, const LinkProfile& profile);

// Per dimension: the least common multiple of `a`'s and `b`'s steps (each divides the length,
// so their lcm does: the length when no translation along it is common). Both from one topology;
// either empty gives empty.
std::vector<int> CommonSteps(const std::vector<int>& a, const std::vector<int>& b);

// Whether `steps` (CommonSteps of a topology's profiles) moves along some dimension of `topo`.
bool AnyTranslation(const Topology& topo, const std::vector<int>& steps);

// Per group of the profile `symmetry` was found for: the least group of its orbit under the
// translations by multiples of `steps[d]` along each dimension d (each a multiple of
// symmetry.step[d], or the length).
std::vector<int32_t> GroupOrbits(const Topology& topo, const ProfileSymmetry& symmetry,
                                 const std::vector<int>& steps);

}  // namespace shardsim
