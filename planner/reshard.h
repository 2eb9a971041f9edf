// Changing a value's sharding: the collectives and local slices that take a value from one
// layout over the mesh to another, as a plan (for pricing) and as manual-mode ops.
#pragma once

#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "planner/value_sharding.h"

namespace shardsim::planner {

// One step of a reshard.
struct ReshardStep {
  enum class Kind {
    kPsum,          // Sum partial values over `axes`.
    kPsumScatter,   // Sum partial values over `axes`, scattering the result along `dim`.
    kAllToAll,      // Move `axes` (one axis) from splitting `dim` to splitting `dim2`.
    kAllGather,     // Stop splitting `dim` over `axes` (its minor-most axes).
    kDynamicSlice,  // Start splitting `dim` over `axes` too (local: no communication).
  };
  Kind kind = Kind::kPsum;  // What it does.
  std::vector<int> axes;    // Mesh axes, in group order (first major).
  int dim = 0;              // The dimension it works along.
  int dim2 = 0;             // kAllToAll: the dimension that becomes split.
  Shape local_in;           // The block each position holds before the step.
};

// The steps that take a value of global `shape` from `from` to `to` (whose partial axes must
// be partial in `from` too: those stay unreduced), in order: partial sums resolved
// (psum_scatter where `to` splits a dimension over a partial axis next, psum otherwise, after
// slicing the axes `to` adds that the value does not use yet), single axes moved between dimensions
// by all-to-all, axes no longer wanted gathered, new axes sliced locally. Empty when they are
// equal.
std::vector<ReshardStep> PlanReshard(const Shape& shape, const ValueSharding& from,
                                     const ValueSharding& to, const std::vector<MeshAxis>& axes);

// The manual-mode op of `step` taking value `in` to `out` (names), with `name` and a key.
OpSpec ReshardOp(const ReshardStep& step, const std::string& in, const std::string& out,
                 const std::vector<MeshAxis>& axes);

// The collective kind a step runs, for pricing; false for the local dynamic slice.
bool StepCommunicates(const ReshardStep& step);

// "all_gather over dp (dim 0)": a step in words, for reasons and messages.
std::string DescribeStep(const ReshardStep& step, const std::vector<MeshAxis>& axes);

}  // namespace shardsim::planner
