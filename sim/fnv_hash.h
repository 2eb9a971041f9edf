// A 64-bit FNV-1a hash, fed 64-bit values byte by byte: how caches find a placement (a mesh,
// a collective's groups) before comparing it whole.
#pragma once

#include <cstdint>

namespace shardsim {

// Accumulates values into one FNV-1a hash.
class FnvHash {
 public:
  // Mixes the eight bytes of `v`, lowest first.
  void Mix(uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      hash_ ^= (v >> (8 * b)) & 0xff;
      hash_ *= 1099511628211ull;
    }
  }
  // The hash of everything mixed so far.
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace shardsim
