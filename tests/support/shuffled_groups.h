// Two placements of a mesh's devices whose groups over the first axis are the same devices,
// listed in another order: what tests of moving timings between meshes place.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace shardsim::test {

// For a mesh of `devices` positions whose first axis has `data` members (position k * rest + j
// is member k of group j, rest = devices / data): a random placement, and one whose group j is
// the first's group shuffle[j] for a random shuffle. Both from `seed`.
inline std::pair<std::vector<int>, std::vector<int>> ShuffledGroupPlacements(int devices, int data,
                                                                             unsigned seed) {
  const int rest = devices / data;
  std::vector<int> a(static_cast<size_t>(devices));
  std::iota(a.begin(), a.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(a.begin(), a.end(), rng);
  std::vector<int> shuffle(static_cast<size_t>(rest));
  std::iota(shuffle.begin(), shuffle.end(), 0);
  std::shuffle(shuffle.begin(), shuffle.end(), rng);
  std::vector<int> b(static_cast<size_t>(devices));
  for (int k = 0; k < data; ++k) {
    for (int j = 0; j < rest; ++j) b[k * rest + j] = a[k * rest + shuffle[j]];
  }
  return {std::move(a), std::move(b)};
}

}  // namespace shardsim::test
