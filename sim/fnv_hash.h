// A 64-bit FNV-1a hash, fed 64-bit values byte by byte: how caches find a placement (a mesh,
// a collective's groups) before comparing it whole.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

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

// A 64-bit hash of `bytes`: FNV-1a's step over 64-bit words (eight times fewer steps than
// FnvHash's bytewise one, for megabytes: files, timing store entries), then the leftover bytes,
// then a final mix so every input bit reaches the high bits.
inline uint64_t HashBytes(std::string_view bytes) {
  constexpr uint64_t kPrime = 1099511628211ull;
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + i, 8);
    h = (h ^ v) * kPrime;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<unsigned char>(bytes[i])) * kPrime;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace shardsim
