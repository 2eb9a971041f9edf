#include "collectives/timing/link_accounting.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace shardsim {
namespace {

// One transfer's hold of one link, as a test records it.
struct Hold {
  VertexId src;
  LinkId link;
  int64_t start_ps, end_ps;
  double bytes;
};

// Groups {position 0} and {position 1}, sending from vertices 0 and 1 (vertex 2 sends for no
// group); link 0 is held by three transfers, link 1 by one.
CollectiveTiming Summarized(const std::vector<Hold>& holds) {
  LinkAccounting accounting(2, {0, 1, -1});
  for (const Hold& h : holds) {
    accounting.OnFlow(h.src, &h.link, 1, Time::Picoseconds(h.start_ps), Time::Picoseconds(h.end_ps),
                      h.bytes);
  }
  CollectiveTiming timing;
  timing.member_time = {Time::Picoseconds(50), Time::Picoseconds(40)};
  timing.profile->links = accounting.HeldLinks();
  accounting.Summarize({{0}, {1}}, timing);
  return timing;
}

// Link 0: [0, 10) by group 0 (100 B), [5, 20) by group 1 (50 B), [30, 40) by no group (10 B).
// Held 30 ps of the op's 50 (the union [0, 20) + [30, 40)), 35 ps of transfer-time: duty 0.6,
// 35/30 flows at once, 160 B / 35 ps. Group 0 holds it 10 ps of its 50, group 1 15 of its 40,
// one transfer each. Recorded in any order (transfers leave a link in another order than they
// started when a later one is faster), the sums are the same.
TEST(LinkAccountingTest, SumsDoNotDependOnTheOrderOfRecords) {
  std::vector<Hold> holds = {
      {0, 0, 0, 10, 100}, {1, 0, 5, 20, 50}, {2, 0, 30, 40, 10}, {1, 1, 0, 8, 16}};
  std::sort(holds.begin(), holds.end(), [](const Hold& a, const Hold& b) {
    return std::tie(a.start_ps, a.link) < std::tie(b.start_ps, b.link);
  });
  do {
    SCOPED_TRACE(::testing::Message() << "first recorded: link " << holds[0].link << " at "
                                      << holds[0].start_ps << " ps");
    CollectiveTiming t = Summarized(holds);
    ASSERT_EQ(t.profile->links, (std::vector<LinkId>{0, 1}));
    ASSERT_EQ(t.profile->link_use.size(), 2u);
    const LinkUse& whole = t.profile->link_use[0];
    EXPECT_DOUBLE_EQ(whole.duty, 30.0 / 50);
    EXPECT_DOUBLE_EQ(whole.flows, 35.0 / 30);
    EXPECT_DOUBLE_EQ(whole.flow_rate, 160.0 / 35 * 1e12);
    ASSERT_EQ(t.profile->group_use.size(), 2u);
    ASSERT_EQ(t.profile->group_use[0].size(), 1u);
    EXPECT_EQ(t.profile->group_use[0][0].link, 0);
    EXPECT_DOUBLE_EQ(t.profile->group_use[0][0].duty, 10.0 / 50);
    EXPECT_DOUBLE_EQ(t.profile->group_use[0][0].flows, 1.0);
    // Group 1 on link 0, then on link 1 (8 ps of its 40, 16 B in 8 ps).
    ASSERT_EQ(t.profile->group_use[1].size(), 2u);
    EXPECT_DOUBLE_EQ(t.profile->group_use[1][0].duty, 15.0 / 40);
    EXPECT_DOUBLE_EQ(t.profile->group_use[1][0].flow_rate, 50.0 / 15 * 1e12);
    EXPECT_EQ(t.profile->group_use[1][1].link, 1);
    EXPECT_DOUBLE_EQ(t.profile->group_use[1][1].duty, 8.0 / 40);
    EXPECT_DOUBLE_EQ(t.profile->link_use[1].flow_rate, 16.0 / 8 * 1e12);
  } while (std::next_permutation(holds.begin(), holds.end(), [](const Hold& a, const Hold& b) {
    return std::tie(a.start_ps, a.link) < std::tie(b.start_ps, b.link);
  }));
}

}  // namespace
}  // namespace shardsim
