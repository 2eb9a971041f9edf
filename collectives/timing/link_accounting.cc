#include "collectives/timing/link_accounting.h"

#include <algorithm>

namespace shardsim {

LinkAccounting::LinkAccounting(size_t links, std::vector<int> group_of_vertex,
                               size_t expected_records)
    : sums_(links), group_of_vertex_(std::move(group_of_vertex)) {
  recorded_.reserve(expected_records);
}

void LinkAccounting::OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
                            double bytes) {
  const Held held{group_of_vertex_[src], start.picoseconds(), drain.picoseconds(), bytes};
  for (int h = 0; h < hops; ++h) {
    recorded_.push_back({path[h], held});
    LinkSums& sums = sums_[path[h]];
    sums.held = true;
    if (sums.unsorted) continue;
    if (held.start < sums.last_start) {
      sums.unsorted = true;
      ++unsorted_;
      continue;
    }
    sums.last_start = held.start;
    sums.whole.Add(held);
    if (held.group >= 0) sums.Of(held.group).Add(held);
  }
}

std::vector<LinkId> LinkAccounting::HeldLinks() const {
  std::vector<LinkId> links;
  for (size_t l = 0; l < sums_.size(); ++l) {
    if (sums_[l].held) links.push_back(static_cast<LinkId>(l));
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
  if (unsorted_ > 0) SumAgain();
  std::vector<std::pair<int, Use*>> by_group;  // A link's groups, ascending.
  for (LinkId l : timing.profile->links) {
    LinkSums& sums = sums_[l];
    timing.profile->link_use.push_back(sums.whole.Finish(l, longest));
    by_group.clear();
    if (sums.first_group >= 0) by_group.push_back({sums.first_group, &sums.first});
    for (auto& [g, use] : sums.more) by_group.push_back({g, &use});
    std::sort(by_group.begin(), by_group.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [g, use] : by_group) {
      if (group_longest[g] > Time()) {
        timing.profile->group_use[g].push_back(use->Finish(l, group_longest[g]));
      }
    }
  }
}

void LinkAccounting::Use::Add(const Held& h) {
  bytes += h.bytes;
  transfer_ps += h.end - h.start;
  if (h.start > open_end) {
    if (open_end > open_start) held_ps += open_end - open_start;
    open_start = h.start;
    open_end = h.end;
  } else {
    open_end = std::max(open_end, h.end);
  }
}

LinkUse LinkAccounting::Use::Finish(LinkId l, Time longest) {
  if (open_end > open_start) held_ps += open_end - open_start;
  open_start = open_end = -1;
  LinkUse u;
  u.link = l;
  double held = static_cast<double>(std::max<int64_t>(held_ps, 1));
  double transfer = static_cast<double>(std::max<int64_t>(transfer_ps, 1));
  u.duty = std::min(1.0, held / static_cast<double>(longest.picoseconds()));
  u.flows = transfer / held;
  u.flow_rate = bytes / transfer * 1e12;
  return u;
}

LinkAccounting::Use& LinkAccounting::LinkSums::Of(int g) {
  if (first_group == g) return first;
  if (first_group < 0) {
    first_group = g;
    return first;
  }
  for (auto& [group, use] : more) {
    if (group == g) return use;
  }
  more.push_back({g, Use()});
  return more.back().second;
}

void LinkAccounting::SumAgain() {
  std::vector<int32_t> bucket(sums_.size(), -1);
  std::vector<std::vector<Held>> held;
  for (size_t l = 0; l < sums_.size(); ++l) {
    if (!sums_[l].unsorted) continue;
    bucket[l] = static_cast<int32_t>(held.size());
    held.emplace_back();
  }
  for (const Record& r : recorded_) {
    if (bucket[r.link] >= 0) held[bucket[r.link]].push_back(r.held);
  }
  for (size_t l = 0; l < sums_.size(); ++l) {
    if (bucket[l] < 0) continue;
    std::vector<Held>& mine = held[bucket[l]];
    std::stable_sort(mine.begin(), mine.end(),
                     [](const Held& a, const Held& b) { return a.start < b.start; });
    LinkSums& sums = sums_[l];
    sums = LinkSums();
    sums.held = true;
    for (const Held& h : mine) {
      sums.whole.Add(h);
      if (h.group >= 0) sums.Of(h.group).Add(h);
    }
  }
  unsorted_ = 0;
}

}  // namespace shardsim
