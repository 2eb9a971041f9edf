// What partitioning reads of a global program alone, kept for the program's next partitions.
#pragma once

#include <memory>

namespace shardsim::planner {

// What the partitioner reads of a global program before it partitions it, whatever the mesh's
// sizes: each name's id, each value's readers, the global shapes and auto mode's hints (the
// layouts and whole dimensions later readers want). A search partitions one expanded step on
// many meshes of the same axis names: given to each of those partitions (PartitionExpanded),
// it is made by the first and read by the rest. It serves the program it was made for (which
// must outlive it) at any sizes when no op's shape reads the mesh (every op of a program that
// partitions), and else only at those sizes; asked for another program or mode, it is made
// again. Partitions with and without it are equal (tested). Not thread-safe.
class PartitionAnalysis {
 public:
  PartitionAnalysis();
  ~PartitionAnalysis();
  PartitionAnalysis(const PartitionAnalysis&) = delete;
  PartitionAnalysis& operator=(const PartitionAnalysis&) = delete;

  // How many times it was made (for another program, mode or sizes than it held).
  int made() const;

  // What the partitioner keeps (its own, defined in partitioner.cc).
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardsim::planner
