#include "sim/intervals.h"

#include <algorithm>

namespace shardsim {

Time CoveredTime(std::vector<std::pair<Time, Time>> spans) {
  std::sort(spans.begin(), spans.end());
  return CoveredTimeOfSorted(spans);
}

Time CoveredTimeOfSorted(const std::vector<std::pair<Time, Time>>& spans) {
  Time busy, covered;
  for (const auto& [a, b] : spans) {
    Time s = std::max(a, covered);
    if (b > s) busy += b - s;
    covered = std::max(covered, b);
  }
  return busy;
}

}  // namespace shardsim
