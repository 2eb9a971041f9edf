// Reading the text output of nccl-tests (all_reduce_perf, all_gather_perf,
// reduce_scatter_perf, alltoall_perf) into validated measurements.
#pragma once

#include <string>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {

// One row: the size nccl-tests reports and its out-of-place time.
struct NcclTestsPoint {
  Bytes size;    // The "size (B)" column: the whole operation (nccl-tests' convention).
  Time time;     // The out-of-place "time (us)" column.
  int line = 0;  // Where it was read (1-based).
};

// One nccl-tests output.
struct NcclTestsRun {
  std::string path;           // The file it came from.
  std::string test;           // "all_reduce_perf", ...
  OpKind op = OpKind::kPsum;  // The shardsim op it measures (psum, all_gather, ...).
  int ranks = 0;              // GPUs: the "#  Rank N ..." lines.
  std::vector<NcclTestsPoint> points;
};

// Parses `text` (the contents of `path`). The test comes from a "Collective test starting:
// NAME" line or, failing that, from the file name; the ranks from the "#  Rank" lines; the
// rows are the lines that do not start with '#' and begin with a byte count. Throws
// InputError "PATH:LINE: ..." for a row it cannot read, an unknown test, no ranks or no rows.
NcclTestsRun ParseNcclTests(const std::string& path, const std::string& text);

}  // namespace shardsim
