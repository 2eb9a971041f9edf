#include "sim/cli/timing_cache.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "sim/cli/run_file.h"
#include "sim/fnv_hash.h"

namespace shardsim {

namespace {

// Names this build: a hash of the running executable's bytes, eight at a time.
std::string ExecutableDigest() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  if (!in) throw InputError("--cache: cannot read this program's executable to name its build");
  FnvHash h;
  char buffer[1 << 16];
  uint64_t total = 0;
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    const std::streamsize n = in.gcount();
    total += static_cast<uint64_t>(n);
    std::streamsize i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t v;
      std::memcpy(&v, buffer + i, 8);
      h.Mix(v);
    }
    for (; i < n; ++i) h.Mix(static_cast<unsigned char>(buffer[i]));
  }
  h.Mix(total);
  char name[24];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(h.value()));
  return name;
}

}  // namespace

std::unique_ptr<TimingStore> OpenTimingStore(const std::string& dir, const Topology& topo) {
  const std::string version = ExecutableDigest();
  try {
    return std::make_unique<TimingStore>(dir, version, topo);
  } catch (const std::runtime_error& e) {
    throw InputError(std::string("--cache: ") + e.what());
  }
}

StoredCollectives::StoredCollectives(const Machine& machine, const TimingStore* store)
    : network_(machine),
      stored_(store ? std::make_unique<StoredCollectiveModel>(network_, *store, machine.topology())
                    : nullptr),
      cache_(stored_ ? static_cast<CollectiveCostModel&>(*stored_) : network_) {}

}  // namespace shardsim
