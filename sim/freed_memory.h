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

// The allocator arena the calling thread allocates from, or -1 (glibc's malloc, or unknown).
int CurrentArena();

// Makes the calling thread allocate from `arena` (another thread's CurrentArena): a short-lived
// helper thread then reuses the memory its parent freed instead of faulting fresh pages in
// (a helper pricing collectives on its own arena faulted 2,300 pages a run and ran half as
// fast). Nothing for -1 or under glibc's malloc, whose threads share arenas as it sees fit.
void UseArena(int arena);

}  // namespace shardsim
