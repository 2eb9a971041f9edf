// What the tests of the partitioner's kept state (choices of layout, analysis) compare: a plan
// of the small transformer on an FSDP x TP mesh, and two partitions op for op.
#pragma once

#include <gtest/gtest.h>

#include "planner/models/train_step_run.h"
#include "planner/partitioner.h"
#include "tests/planner/models/small_model.h"

namespace shardsim::test {

// FSDP `fsdp` x TP `tensor` under FsdpTensorRules, with `remat`.
inline planner::StepPlan FsdpTensorPlan(int fsdp, int tensor, planner::RematPolicy remat) {
  planner::StepPlan p;
  p.mesh = {{"fsdp", fsdp}, {"tensor", tensor}};
  p.rules = FsdpTensorRules();
  p.remat = remat;
  return p;
}

// Every op of `a` is `b`'s, with the same reason and type, and they have the same arrays.
inline void ExpectSamePartition(const planner::PartitionResult& a,
                                const planner::PartitionResult& b) {
  ASSERT_EQ(a.program.ops.size(), b.program.ops.size());
  for (size_t i = 0; i < a.program.ops.size(); ++i) {
    EXPECT_TRUE(a.program.ops[i] == b.program.ops[i]) << "op " << i << " " << a.program.ops[i].name;
  }
  EXPECT_EQ(a.reasons, b.reasons);
  EXPECT_EQ(a.types, b.types);
  EXPECT_EQ(a.program.arrays.size(), b.program.arrays.size());
}

}  // namespace shardsim::test
