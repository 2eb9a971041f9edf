// Measuring sets of time intervals.
#pragma once

#include <utility>
#include <vector>

#include "sim/time.h"

namespace shardsim {

// The total time covered by the union of [start, end) intervals (overlaps counted once).
Time CoveredTime(std::vector<std::pair<Time, Time>> spans);

}  // namespace shardsim
