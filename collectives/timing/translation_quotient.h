// A torus folded by the translations that map every group of a collective onto another, member
// by member: one group per orbit is simulated on the orbits of the links, which gives every
// group's timing when the groups share links (NetworkCollectiveModel).
//
// Why it is exact. Let S be a group of translations of a torus that wraps along every
// dimension S moves, such that translating any group of the op by any s in S gives a group of
// the op, member m onto member m. Dimension-order routing depends only on coordinate
// differences and every algorithm only on its members' order and routes, so S maps the set of
// all the op's transfers onto itself, start times included. Max-min fair sharing has one
// solution, so it is S-invariant: a transfer and its translates move at one rate, and every
// member of a group finishes when the same member of its orbit's simulated group does.
// A nonzero translation moves every vertex, so each orbit of links has |S| members and each
// translate of a transfer crosses a given link of an orbit once per hop it has in that orbit:
// a link carries sum over simulated transfers f of rate(f) * (f's hops in the link's orbit).
// So the simulated groups' transfers, routed over one representative link per orbit (a hop
// counted as often as it occurs), see exactly the load each real link sees: the fluid model
// with a path that crosses a link k times charges that link k times the rate (Network).
// The answer is the same max-min allocation computed on |S| times fewer transfers. Only its
// floating-point roundings may differ, by the order of the sums: on default placements every
// fold a review tried (519) and every test gives the full simulation's figures to the bit; on
// hand-made device lists a drain rounded 1-3 ps apart can grow, through the algorithms'
// dependencies, to a few percent of a member's time. The full simulation is no steadier
// there: it gives translated groups, which the exact model treats alike, times as far apart.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "collectives/mesh.h"
#include "topology/routing.h"
#include "topology/topology.h"

namespace shardsim {

// The fold: which translations are symmetries, each link's orbit, and the groups to simulate.
struct TranslationQuotient {
  // Per torus dimension: translations by multiples of step[d] are symmetries (step[d] equal to
  // the dimension's length: none moves along it).
  std::vector<int> step;
  int64_t order = 1;  // |S|: the product of length / step over the dimensions.
  // Per link: the representative of its orbit, the link through the same port of the
  // orbit's canonical vertex (every coordinate below its step).
  std::vector<LinkId> representative;
  // Per link: its port, 2 * dimension + (1 if it runs in the + direction); links of one
  // orbit share it.
  std::vector<int32_t> port;
  // The link leaving each vertex through each port (vertex * ports + port), or -1.
  std::vector<LinkId> out;
  int32_t ports = 0;  // Ports per vertex: twice the torus rank.

  // The link leaving vertex `v` through port `p`, or -1.
  LinkId Out(VertexId v, int32_t p) const { return out[static_cast<size_t>(v) * ports + p]; }
  // The groups simulated, one per orbit of groups: those whose first member sits on a
  // canonical vertex. Ascending.
  std::vector<int> simulated;
  // Per group: the simulated group it is a translate of, and the translation (per dimension,
  // in [0, length)).
  std::vector<int> source;
  std::vector<std::vector<int>> shift;
};

// The link of torus `topo` that `link` becomes when moved by `by` (per dimension, any sign):
// the one joining the moved ends along the same dimension and direction. Nullopt when an end
// leaves a dimension without wraparound, an end has no coordinates, or no single such link
// exists.
std::optional<LinkId> TranslatedLink(const Topology& topo, LinkId link, const std::vector<int>& by);

// The quotient of `groups` (mesh positions, Mesh::Groups) of `mesh` on `topo`, or nullopt
// when no nonzero translation is a symmetry: `topo` is not a switchless torus whose vertices
// have one link per port, no dimension that wraps carries one, or the links of some orbit
// differ (bandwidth, latency or kind).
std::optional<TranslationQuotient> FindTranslationQuotient(
    const Topology& topo, const Mesh& mesh, const std::vector<std::vector<int>>& groups);

// Routes of the underlying router with every link replaced by its orbit's representative.
class QuotientRouter : public Router {
 public:
  // Both must outlive the router.
  QuotientRouter(Router& inner, const TranslationQuotient& quotient)
      : inner_(inner), quotient_(quotient) {}
  const std::vector<LinkId>& Route(VertexId src, VertexId dst) override;
  std::vector<std::vector<LinkId>> MinimalRoutes(VertexId src, VertexId dst) override;

 private:
  Router& inner_;
  const TranslationQuotient& quotient_;
  std::vector<LinkId> route_;
};

}  // namespace shardsim
