// How the process's allocator treats freed memory.
#pragma once

namespace shardsim {

// Keeps memory the program frees for its own reuse instead of returning it to the system: a
// run that allocates and frees large buffers (arrays of tens of MiB per op, a 15,000-op
// program's op lists) otherwise faults the same pages in again and again (jemalloc's default
// decay; glibc's mmap threshold). For processes whose live memory stays near its peak (`run`):
// a plan search's worker threads keep growing their arenas with it (the pod search passed 24
// GB), so `plan` keeps the defaults. Call once, before the heavy work.
void KeepFreedMemory();

}  // namespace shardsim
