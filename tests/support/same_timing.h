// Comparing two collective timings field by field, to the bit: what tests of the timing caches
// and the timing store expect of a timing they did not simulate themselves.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "collectives/timing/collective_cost_model.h"

namespace shardsim::test {

// LinkUse entries as comparable tuples.
inline std::vector<std::tuple<LinkId, double, double, double>> Uses(
    const std::vector<LinkUse>& uses) {
  std::vector<std::tuple<LinkId, double, double, double>> out;
  for (const LinkUse& u : uses) out.emplace_back(u.link, u.duty, u.flows, u.flow_rate);
  return out;
}

// Expects `a` and `b` equal to the bit: member times, the longest, algorithm, links, shares,
// link use and each group's use.
inline void ExpectSameTiming(const CollectiveTiming& a, const CollectiveTiming& b,
                             const std::string& what) {
  EXPECT_EQ(a.member_time, b.member_time) << what;
  EXPECT_EQ(a.longest(), b.longest()) << what;
  EXPECT_EQ(a.algorithm, b.algorithm) << what;
  EXPECT_EQ(a.profile->links, b.profile->links) << what;
  EXPECT_EQ(a.profile->link_share, b.profile->link_share) << what;
  EXPECT_EQ(Uses(a.profile->link_use), Uses(b.profile->link_use)) << what;
  ASSERT_EQ(a.profile->group_use.size(), b.profile->group_use.size()) << what;
  for (size_t g = 0; g < a.profile->group_use.size(); ++g) {
    EXPECT_EQ(Uses(a.profile->group_use[g]), Uses(b.profile->group_use[g]))
        << what << " group " << g;
  }
}

}  // namespace shardsim::test
