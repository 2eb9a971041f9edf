// Auto mode's choices of layout, kept across partitions (PartitionExpanded) on one mesh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace shardsim::planner {

// Auto mode's choices of layout, kept across the partitions of programs that repeat ops on
// one mesh with one cost model: a training step's layers repeat their ops, and its partitions
// at several layer counts (the short steps a step is composed from) or of several stage steps
// repeat each other. An op whose attributes (all but its names), operands (global shape,
// dtype, layout, whether in host memory, the layouts they were already resharded to in this
// pass), layout hint and dimensions wanted whole are those of an op chosen for before takes
// the strategy chosen then, without asking its rule or pricing candidates again: the choice is
// a function of exactly these, so partitions with and without it are equal (tested). Given
// for another mesh or cost model, it starts afresh. Not thread-safe.
class PartitionChoices {
 public:
  PartitionChoices();
  ~PartitionChoices();
  PartitionChoices(const PartitionChoices&) = delete;
  PartitionChoices& operator=(const PartitionChoices&) = delete;

  // Choices kept.
  size_t size() const;
  // Ops given a kept choice.
  int64_t reused() const;

  // What the partitioner keeps (its own, defined in partitioner.cc).
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardsim::planner
