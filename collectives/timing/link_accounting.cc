#include "collectives/timing/link_accounting.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim {

LinkAccounting::LinkAccounting(size_t links, std::vector<int> group_of_vertex, bool every_stretch)
    : index_(links, -1),
      group_of_vertex_(std::move(group_of_vertex)),
      every_stretch_(every_stretch) {}

void LinkAccounting::OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
                            double bytes) {
  const int group = group_of_vertex_[src];
  const int64_t from = start.picoseconds(), to = drain.picoseconds();
  // Every hop adds the same interval to its link's sums (the whole op's and the group's); one
  // that a sum cannot add exactly (Use::Add) marks the run to be recorded again.
  bool exact = true;
  for (int h = 0; h < hops; ++h) {
    int32_t& index = index_[path[h]];
    if (index < 0) {
      index = static_cast<int32_t>(sums_.size());
      sums_.emplace_back();
    }
    LinkSums& sums = sums_[index];
    if (every_stretch_) {
      AddEvery(sums.whole, from, to, bytes);
      if (group >= 0) AddEvery(sums.Of(group), from, to, bytes);
      continue;
    }
    exact &= sums.whole.Add(from, to, bytes);
    if (group >= 0) exact &= sums.Of(group).Add(from, to, bytes);
  }
  if (!exact) overflowed_ = true;
}

std::vector<LinkId> LinkAccounting::HeldLinks() const {
  std::vector<LinkId> links;
  for (size_t l = 0; l < index_.size(); ++l) {
    if (index_[l] >= 0) links.push_back(static_cast<LinkId>(l));
  }
  return links;
}

void LinkAccounting::Summarize(const std::vector<std::vector<int>>& groups,
                               CollectiveTiming& timing) {
  Time longest;
  std::vector<Time> group_longest(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int p : groups[g]) group_longest[g] = std::max(group_longest[g], timing.member_time[p]);
    longest = std::max(longest, group_longest[g]);
  }
  timing.profile->group_use.assign(groups.size(), {});
  timing.profile->link_use.clear();
  if (every_stretch_ && every_held_.size() != static_cast<size_t>(every_uses_)) SumEvery();
  std::vector<std::pair<int, const Use*>> by_group;  // A link's groups, ascending.
  for (LinkId l : timing.profile->links) {
    if (index_[l] < 0) throw std::logic_error("a link with bytes was never recorded as held");
    const LinkSums& sums = sums_[index_[l]];
    timing.profile->link_use.push_back(Finish(sums.whole, l, longest));
    by_group.clear();
    if (sums.first_group >= 0) by_group.push_back({sums.first_group, &sums.first});
    for (size_t k = 0; k < sums.more.size(); ++k) {
      by_group.push_back({sums.more_groups[k], &sums.more[k]});
    }
    std::sort(by_group.begin(), by_group.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [g, use] : by_group) {
      if (group_longest[g] > Time()) {
        timing.profile->group_use[g].push_back(Finish(*use, l, group_longest[g]));
      }
    }
  }
}

void LinkAccounting::AddEvery(Use& use, int64_t start, int64_t end, double bytes) {
  if (use.every < 0) use.every = every_uses_++;
  every_.push_back({use.every, start, end});
  use.bytes += bytes;
  use.transfer_ps += end - start;
}

void LinkAccounting::SumEvery() {
  // The intervals of each sum, in order of their starts (a counting sort by sum, then each
  // sum's sorted), and their union's length.
  std::vector<int64_t> first(static_cast<size_t>(every_uses_) + 1, 0);
  for (const Interval& i : every_) ++first[static_cast<size_t>(i.use) + 1];
  for (size_t u = 0; u < static_cast<size_t>(every_uses_); ++u) first[u + 1] += first[u];
  std::vector<std::pair<int64_t, int64_t>> sorted(every_.size());
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  for (const Interval& i : every_) sorted[static_cast<size_t>(next[i.use]++)] = {i.start, i.end};
  every_held_.assign(static_cast<size_t>(every_uses_), 0);
  for (size_t u = 0; u < static_cast<size_t>(every_uses_); ++u) {
    auto begin = sorted.begin() + first[u], end = sorted.begin() + first[u + 1];
    std::sort(begin, end);
    int64_t held = 0, open_start = -1, open_end = -1;
    for (auto it = begin; it != end; ++it) {
      if (it->first > open_end) {
        held += open_end - open_start;
        open_start = it->first;
        open_end = it->second;
      } else {
        open_end = std::max(open_end, it->second);
      }
    }
    every_held_[u] = held + (open_end - open_start);
  }
  every_.clear();
  every_.shrink_to_fit();
}

bool LinkAccounting::Use::Add(int64_t start, int64_t end, double b) {
  bytes += b;
  transfer_ps += end - start;
  if (kept == 0) {
    stretch[kept++] = {start, end};
    return true;
  }
  std::pair<int64_t, int64_t>& latest = stretch[kept - 1];
  if (start > latest.second) {  // After a gap: a new latest stretch.
    if (kept == kKept) {        // The oldest kept is summed.
      summed_ps += stretch[0].second - stretch[0].first;
      summed_end = stretch[0].second;
      std::copy(stretch + 1, stretch + kKept, stretch);
      --kept;
    }
    stretch[kept++] = {start, end};
    return true;
  }
  if (end < latest.first) return false;  // Before the latest stretch, apart from it.
  latest.second = std::max(latest.second, end);
  if (start >= latest.first) return true;
  // Back over gaps: the kept stretches it meets join the latest.
  std::pair<int64_t, int64_t> joined = {start, latest.second};
  --kept;
  while (kept > 0 && stretch[kept - 1].second >= start) {
    joined.first = std::min(joined.first, stretch[kept - 1].first);
    --kept;
  }
  stretch[kept++] = joined;
  // Overlapping a summed stretch (touching it adds nothing to the union's length) it cannot.
  return kept > 1 || start >= summed_end;
}

int64_t LinkAccounting::Use::held_ps() const {
  int64_t held = summed_ps;
  for (int k = 0; k < kept; ++k) held += stretch[k].second - stretch[k].first;
  return held;
}

LinkUse LinkAccounting::Finish(const Use& use, LinkId l, Time longest) const {
  int64_t held_ps = use.held_ps();
  if (use.every >= 0) held_ps = every_held_[static_cast<size_t>(use.every)];
  LinkUse u;
  u.link = l;
  double held = static_cast<double>(std::max<int64_t>(held_ps, 1));
  double transfer = static_cast<double>(std::max<int64_t>(use.transfer_ps, 1));
  u.duty = std::min(1.0, held / static_cast<double>(longest.picoseconds()));
  u.flows = transfer / held;
  u.flow_rate = use.bytes / transfer * 1e12;
  return u;
}

LinkAccounting::Use& LinkAccounting::LinkSums::Of(int g) {
  if (first_group == g) return first;
  if (first_group < 0) {
    first_group = g;
    return first;
  }
  for (size_t k = 0; k < more_groups.size(); ++k) {
    if (more_groups[k] == g) return more[k];
  }
  more_groups.push_back(g);
  return more.emplace_back();
}

}  // namespace shardsim
