#include "sim/freed_memory.h"

#include <malloc.h>
#ifdef SHARDSIM_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include <sys/types.h>

#include <string>

namespace shardsim {

void KeepFreedMemory() {
#ifdef SHARDSIM_HAVE_JEMALLOC
  // Arenas made from now on, and every existing one (MALLCTL_ARENAS_ALL): never decay.
  ssize_t never = -1;
  const std::string all = "arena." + std::to_string(MALLCTL_ARENAS_ALL);
  for (const std::string& key :
       {std::string("arenas.dirty_decay_ms"), std::string("arenas.muzzy_decay_ms"),
        all + ".dirty_decay_ms", all + ".muzzy_decay_ms"}) {
    mallctl(key.c_str(), nullptr, nullptr, &never, sizeof(never));
  }
#else
  // glibc serves large arrays with mmap and unmaps them on free: serve them from the heap and
  // keep freed memory instead.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

int CurrentArena() {
#ifdef SHARDSIM_HAVE_JEMALLOC
  unsigned arena = 0;
  size_t size = sizeof(arena);
  if (mallctl("thread.arena", &arena, &size, nullptr, 0) == 0) return static_cast<int>(arena);
#endif
  return -1;
}

void UseArena(int arena) {
#ifdef SHARDSIM_HAVE_JEMALLOC
  if (arena < 0) return;
  unsigned chosen = static_cast<unsigned>(arena);
  mallctl("thread.arena", nullptr, nullptr, &chosen, sizeof(chosen));
#else
  (void)arena;
#endif
}

}  // namespace shardsim
