// Measuring sets of time intervals.
#pragma once

#include <utility>
#include <vector>

#include "sim/time.h"

namespace shardsim {

// The total time covered by the union of [start, end) intervals (overlaps counted once).
Time CoveredTime(std::vector<std::pair<Time, Time>> spans);
// The same for spans already in ascending order (as std::sort leaves them), without a copy.
Time CoveredTimeOfSorted(const std::vector<std::pair<Time, Time>>& spans);

}  // namespace shardsim
