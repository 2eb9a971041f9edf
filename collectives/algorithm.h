// Choosing and building the algorithm that runs a collective.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "topology/network.h"

namespace shardsim {

// One collective algorithm of the registry: its name, what it implements, and its factory.
struct AlgorithmDef {
  const char* name;                   // SPEC name ("ring").
  std::vector<CollectiveKind> kinds;  // The collectives it implements.
  bool power_of_two_groups;           // Needs a group of 2^k members.
  // Builds it for `job`: axis_sizes are the group's mesh axes (first major), chunk_size the
  // pipelining unit (tree).
  std::unique_ptr<CollectiveAlgorithm> (*make)(Network& network, CollectiveJob& job,
                                               const std::vector<int>& axis_sizes,
                                               Bytes chunk_size);
};

// Every algorithm, in SPEC order (`auto` is not one: it chooses among them).
const std::vector<AlgorithmDef>& AlgorithmRegistry();
// The entry named `name`, or nullptr (also for "auto").
const AlgorithmDef* FindAlgorithm(const std::string& name);
// The names a run file may write: the registry's, then "auto".
const std::vector<std::string>& AlgorithmNames();
// The protocol named `text` ("LL", "LL128", "Simple"), if it is one.
std::optional<Protocol> ParseProtocol(const std::string& text);

// Whether algorithm `name` can run collective `kind` on a group of `group_size` members
// (`name` may carry a protocol, "ring/LL128", as NCCL_ALGO with NCCL_PROTO):
// "" if it can (always for "auto"), else why not ("halving_doubling needs a power-of-two
// group, got 6 devices"). Checked when a program is lowered, before anything runs.
std::string AlgorithmSupports(const std::string& name, CollectiveKind kind, int group_size);

// Picks the algorithm `auto` means for `job` on the network, given the sizes of the group's
// mesh axes (first major). The rule:
// - all_to_all and ppermute: direct (every member has something different for every peer);
// - a group whose members all meet at one switch (an NVSwitch node, a fully connected graph):
//   direct, one hop-pair per transfer and no ring latency chain;
// - small messages (under 64 KiB per member) on a power-of-two group of more than 2 whose
//   rings do not close in one hop (lines): halving_doubling, fewer latencies than a ring whose
//   closing transfer crosses the line (on a closed ring it pays as many hops, on shared links);
//   the rings are those of the next rule where it applies, else the mesh axes';
// - small messages (under 64 KiB per member) on a torus whose group is a grid spanning several
//   of its dimensions (TorusGrid: a mesh axis placed over several dimensions, strided or not):
//   torus_2d, whose rings there run along those dimensions (MakeAlgorithm), paying the sum of
//   their lengths in steps where one ring over the group pays G - 1;
// - several mesh axes of size > 1: torus_2d, both directions when every one of its rings
//   closes in one hop (a wraparound);
// - one axis: bidirectional_ring when the ring closes in one hop, else ring (a line: the
//   closing transfer crosses the whole line on the reverse links, so a second direction would
//   only share those links).
std::string ChooseAlgorithm(Network& network, const CollectiveJob& job,
                            const std::vector<int>& axis_sizes);

// Builds algorithm `name` ("auto" resolves through ChooseAlgorithm) for `job`. Throws
// std::invalid_argument when AlgorithmSupports refuses the job (tree for all_gather, ring
// for all_to_all, halving_doubling on 6 devices, ...). `resolved` receives the concrete name.
// On a machine whose collectives run as NCCL (CommSpec::nccl) the tuner (nccl_tuner.h)
// resolves `auto` and picks the protocol unless `name` gives one ("ring/LL128"); the job then
// pays the protocol's step latency and efficiency on every message, and the algorithm starts
// after the launch latency; `resolved` is "algorithm/protocol".
// torus_2d runs a ring along each torus dimension its group spans where the group is a grid on
// a torus (TorusGrid; TPUs run collectives dimension by dimension), else along the group's
// mesh axes (GPU machines, hand-made device lists).
// `chunk_size` is the tree's pipelining unit: its buffer flows in
// min(64, ceil(bytes / chunk_size)) segments (large messages approach the bandwidth bound,
// small ones stay one latency-bound segment). Rings need no chunking: each step already moves
// one chunk of V/G per member, which reaches the bandwidth bound in the fluid model.
std::unique_ptr<CollectiveAlgorithm> MakeAlgorithm(const std::string& name, Network& network,
                                                   CollectiveJob& job,
                                                   const std::vector<int>& axis_sizes,
                                                   std::string* resolved,
                                                   Bytes chunk_size = Bytes::MiB(1));

}  // namespace shardsim
