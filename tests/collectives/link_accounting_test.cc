#include "collectives/timing/link_accounting.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <utility>
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
// With `every_stretch` (any order adds up); without, nullopt if the accounting overflowed.
std::optional<CollectiveTiming> Summarized(const std::vector<Hold>& holds, bool every_stretch) {
  LinkAccounting accounting(2, {0, 1, -1}, every_stretch);
  for (const Hold& h : holds) {
    accounting.OnFlow(h.src, &h.link, 1, Time::Picoseconds(h.start_ps), Time::Picoseconds(h.end_ps),
                      h.bytes);
  }
  if (accounting.overflowed()) {
    EXPECT_FALSE(every_stretch) << "keeping every stretch overflowed";
    return std::nullopt;
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
// one transfer each. Recorded in any order with every stretch kept, and in every order the
// latest stretches kept can sum (the network's: by their ends, among others), the sums are the
// same.
TEST(LinkAccountingTest, SumsDoNotDependOnTheOrderOfRecords) {
  std::vector<Hold> holds = {
      {0, 0, 0, 10, 100}, {1, 0, 5, 20, 50}, {2, 0, 30, 40, 10}, {1, 1, 0, 8, 16}};
  auto by_start = [](const Hold& a, const Hold& b) {
    return std::tie(a.start_ps, a.link) < std::tie(b.start_ps, b.link);
  };
  std::sort(holds.begin(), holds.end(), by_start);
  int summed = 0, orders = 0;
  do {
    ++orders;
    for (const bool every_stretch : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "first recorded: link " << holds[0].link << " at " << holds[0].start_ps
                   << " ps, every stretch " << every_stretch);
      std::optional<CollectiveTiming> summary = Summarized(holds, every_stretch);
      if (!summary) continue;
      summed += every_stretch ? 0 : 1;
      const CollectiveTiming& t = *summary;
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
    }
  } while (std::next_permutation(holds.begin(), holds.end(), by_start));
  EXPECT_EQ(orders, 24);
  // Some orders cannot be summed keeping the latest stretches ([30, 40) recorded before both
  // others, which then start before the latest stretch and apart from it); the network's, by ends,
  // can.
  EXPECT_GT(summed, 0);
  EXPECT_LT(summed, orders);
  std::stable_sort(holds.begin(), holds.end(),
                   [](const Hold& a, const Hold& b) { return a.end_ps < b.end_ps; });
  EXPECT_TRUE(Summarized(holds, false).has_value());
}

// The length of the union of `intervals`, by sorting them: the reference.
int64_t UnionLength(std::vector<std::pair<int64_t, int64_t>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  int64_t length = 0, start = -1, end = -1;
  for (const auto& [s, e] : intervals) {
    if (s > end) {
      length += end - start;
      start = s;
      end = e;
    } else {
      end = std::max(end, e);
    }
  }
  return length + (end - start);
}

// Random transfers on one link, recorded by their ends as the network records them: long ones
// reach back over gaps that shorter, later ones left. The union's length, kept a few stretches
// at a time, is the reference's, and so it is shuffled with every stretch kept; where the kept
// stretches do not suffice, the accounting says so. It is read as `flows`, the transfers'
// total length over the union's (both integers of picoseconds: exact).
TEST(LinkAccountingTest, UnionOfRandomTransfersMatchesItsReference) {
  std::mt19937_64 rng(12345);
  int overflowed = 0;
  for (int trial = 0; trial < 400; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    std::vector<Hold> holds;
    std::vector<std::pair<int64_t, int64_t>> intervals;
    int64_t total = 0;
    const int count = 1 + static_cast<int>(rng() % 40);
    // One transfer in 2 to 9 is long: some trials reach back over more gaps than are kept.
    const int long_every = 2 + trial % 8;
    for (int i = 0; i < count; ++i) {
      const int64_t start = static_cast<int64_t>(rng() % 1000);
      const int64_t length = 1 + static_cast<int64_t>(rng() % (i % long_every == 0 ? 300 : 20));
      holds.push_back({0, 0, start, start + length, 1.0});
      intervals.push_back({start, start + length});
      total += length;
    }
    std::stable_sort(holds.begin(), holds.end(),
                     [](const Hold& a, const Hold& b) { return a.end_ps < b.end_ps; });
    const double flows = static_cast<double>(total) / static_cast<double>(UnionLength(intervals));
    std::optional<CollectiveTiming> fast = Summarized(holds, false);
    std::shuffle(holds.begin(), holds.end(), rng);
    std::optional<CollectiveTiming> every = Summarized(holds, true);
    ASSERT_TRUE(every.has_value());
    EXPECT_DOUBLE_EQ(every->profile->link_use[0].flows, flows);
    if (!fast) {
      ++overflowed;
      continue;
    }
    EXPECT_DOUBLE_EQ(fast->profile->link_use[0].flows, flows);
  }
  // Both ways are exercised, each in a good share of the trials.
  EXPECT_GT(overflowed, 40);
  EXPECT_LT(overflowed, 360);
}

}  // namespace
}  // namespace shardsim
