// How collectives in flight together slow each other's groups on the cached timing path, from
// their standalone link profiles (the rule the Executor prices their rates by).
//
// Each group is slowed by its most contended link: there, every other op J in flight costs it
//   overlap * (r / r' - 1)
// of its time, where r is the rate its transfers had on the link alone (standalone run) and r'
// the max-min fair rate they keep when J's transfers share it too (each set holding the link
// as many at once, and wanting as much, as alone), and `overlap` the fraction of its time both
// hold the link: min(d_I, d_J) of the duties if they were launched at the same instant (ring
// steps in lockstep), d_I * d_J otherwise (independent phases). Transfers held below their
// share elsewhere (a bottleneck of their own op) leave the rest of the link to others, so an
// op is slowed only where the others take bandwidth it used. A group's worst cost is its
// costliest link's sum over the other ops; its rate 1 / (1 + that).
#pragma once

#include <vector>

#include "collectives/timing/collective_cost_model.h"
#include "topology/topology.h"

namespace shardsim {

// Which links the pass reads: the same figures, to the bit, either way.
enum class SharingPass {
  kByOrbit,  // One per orbit of the ops' common translations where they have some, else all.
  kByLink,   // Every link the ops share.
};

// Another op in flight: how it used the links alone, and whether it was launched at the same
// instant as the op priced.
struct SharingOther {
  const LinkProfile* profile = nullptr;
  bool together = false;
};

// Per group of `op` (its group_use order): its worst cost beside `others` (the sums over them
// taken in this order), found by `pass`. Profiles recorded on `topo`. With one other op and
// `partner` not null, the same pass also finds the other op's worst costs beside `op` (into
// *partner, one per group of it: the same figures its own call gives).
std::vector<double> WorstSharingCosts(const Topology& topo, const LinkProfile& op,
                                      const std::vector<SharingOther>& others, SharingPass pass,
                                      std::vector<double>* partner = nullptr);

}  // namespace shardsim
