// Short spellings of the specs tests write again and again: a partition spec by its
// dimensions' mesh axes, and the init kinds with their parameters.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collectives/program.h"

namespace shardsim::test {

// PartitionSpec whose dimension d splits over the mesh axes dims[d] (P({{"dp"}, {}}), as
// jax.sharding.PartitionSpec('dp', None)).
inline PartitionSpec P(std::vector<std::vector<std::string>> dims) {
  return PartitionSpec{std::move(dims)};
}

// init: arange (0, 1, 2, ... in row-major order).
inline InitSpec Arange() {
  InitSpec init;
  init.kind = InitSpec::Kind::kArange;
  return init;
}

// init: normal with `seed`.
inline InitSpec Normal(uint64_t seed) {
  InitSpec init;
  init.kind = InitSpec::Kind::kNormal;
  init.seed = seed;
  return init;
}

}  // namespace shardsim::test
