// Summary figures of a topology: counts, diameter and bisection bandwidth (`shardsim topo`).
#pragma once

#include <string>
#include <vector>

#include "sim/units.h"
#include "topology/topology.h"

namespace shardsim {

// The facts `shardsim topo` prints and writes to JSON.
struct GraphFacts {
  int devices = 0;               // Devices (chips/GPUs).
  int switches = 0;              // Switch vertices.
  int physical_links = 0;        // Physical links, a duplex link counted once.
  int diameter = 0;              // Most hops between two devices on a shortest path (-1 if
                                 // some device cannot reach another).
  Bandwidth bisection;           // One-way B/s across the weakest cut of the devices into
                                 // halves (sizes floor(N/2) and ceil(N/2)); 0 for 1 device.
  std::string bisection_method;  // How `bisection` was found: "closed form: torus", ...,
                                 // "exact enumeration", "upper bound: best of N candidate cuts".
  std::vector<bool> wraparound;  // Per torus dimension, whether it wraps; empty if no torus.
};

// The most devices for which ComputeFacts enumerates every bisection exactly.
inline constexpr int kMaxExactBisectionDevices = 16;

// Computes the facts. Closed forms where the structure is known (torus/ring, one-way ring,
// single switch, fully connected, fat tree from BuildHierarchical); otherwise BFS for the
// diameter and, for the bisection, exact enumeration up to kMaxExactBisectionDevices devices
// or else the best of a few structured candidate cuts (an upper bound). The derivations are
// in graph_facts.cc.
GraphFacts ComputeFacts(const Topology& topo);

// The exact bisection bandwidth by enumerating every split of the devices into halves: for
// each, the one-way capacity from one half to the other (the max flow, switches free to sit
// on either side), taking the smaller direction; the minimum over splits. Requires
// num_devices() <= kMaxExactBisectionDevices (asserted). Used for explicit graphs and to
// check the closed forms.
Bandwidth ExactBisection(const Topology& topo);

}  // namespace shardsim
