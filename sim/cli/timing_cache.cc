#include "sim/cli/timing_cache.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "sim/cli/run_file.h"
#include "sim/fnv_hash.h"

namespace shardsim {

namespace {

// Names this build: a hash of the running executable's bytes.
std::string ExecutableDigest() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  if (!in) throw InputError("--cache: cannot read this program's executable to name its build");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  char name[24];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(HashBytes(bytes)));
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

}  // namespace shardsim
