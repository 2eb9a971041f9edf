// Writes a topology as a Graphviz dot graph (`shardsim topo --dot G.dot`).
#pragma once

#include <ostream>

#include "topology/topology.h"

namespace shardsim {

// Writes `topo` with boost::write_graphviz as a digraph: one vertex per device (ellipse,
// labelled with its name) or switch (box); one edge per physical link, labelled with its
// bandwidth per direction and latency ("45 GB/s, 1 us") plus its kind when not ICI/generic;
// duplex links are drawn once with arrows at both ends (dir=both), one-way links as arrows.
void WriteGraphviz(const Topology& topo, std::ostream& out);

}  // namespace shardsim
