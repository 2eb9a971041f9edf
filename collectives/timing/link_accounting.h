// How a simulated collective used each link: the accounting NetworkCollectiveModel turns into a
// CollectiveTiming's link and group use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "collectives/timing/collective_cost_model.h"
#include "topology/network.h"

namespace shardsim {

// Sums, per directed link, the intervals during which transfers of each group held it.
//
// Each sum (the link's, and each group's on it) keeps the bytes and the intervals' lengths
// (exact: integers), and the length of their union. Transfers are recorded as they leave a
// link, in order of their ends: a new interval then extends the latest stretch of the union,
// starts a new one after a gap, or reaches back over the latest gaps (a transfer that started
// before them, slower than the ones recorded since). The latest kKept stretches are kept;
// those before are summed. An interval that overlaps a summed stretch, or ends before the
// latest stretch starts, cannot be added exactly: the accounting then says it `overflowed`,
// and the caller records the run again with `every_stretch`, which keeps every interval
// (24 bytes for each link a transfer crosses, and again for its group's sum) and sorts them at the
// end. Keeping every interval, as it always did before, took 1.6 GB for one data-axis all-reduce on
// the 8960-chip pod; the latest four stretches take 48 MB. All-reduces over two axes of the pod
// (rings of 1,120 and 2,240 chips as torus_2d) reach back further: they are recorded twice.
class LinkAccounting : public FlowRecorder {
 public:
  // `links`: the topology's link count. `group_of_vertex`: the group whose member sends from
  // each vertex (-1: none). `every_stretch`: keep every interval and take the unions at the
  // end (records in any order add up exactly).
  LinkAccounting(size_t links, std::vector<int> group_of_vertex, bool every_stretch = false);

  void OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
              double bytes) override;

  // Whether some interval could not be added exactly (see the class comment): the sums are
  // then wrong, and the run must be recorded again with `every_stretch`.
  bool overflowed() const { return overflowed_; }

  // The links some recorded transfer held, ascending.
  std::vector<LinkId> HeldLinks() const;

  // Fills `timing`'s link_use (for each of timing.profile->links) and group_use (per group),
  // durations relative to the longest member time of the op and of each group. Call once,
  // after recording.
  void Summarize(const std::vector<std::vector<int>>& groups, CollectiveTiming& timing);

 private:
  // Stretches kept per sum: the latest one and the three before it. In the cold phase of the
  // pod's plan search (23 plans, 206 simulations) records reached back over one gap 27,995
  // times, over two or three 34 times, never further; with eight kept, the searches that vary
  // remat, microbatches and sequence parallelism still record about 30 runs twice.
  static constexpr int kKept = 4;
  // Sums over the intervals of a link (or of a group on it), in picoseconds.
  struct Use {
    double bytes = 0;
    int64_t transfer_ps = 0;  // Sum of the intervals' lengths.
    int64_t summed_ps = 0;    // Length of the union's stretches before those kept.
    int64_t summed_end = -1;  // Where the latest of them ends (-1: none).
    int32_t kept = 0;         // Stretches in `stretch`.
    int32_t every = -1;       // With every_stretch: its number among the sums (Interval::use).
    // The latest stretches, disjoint, in ascending order: [start, end].
    std::pair<int64_t, int64_t> stretch[kKept];
    // Adds the interval [start, end] carrying `b` bytes; false if it cannot (see the class
    // comment). Intervals that touch a stretch join it (the union's length is the same).
    bool Add(int64_t start, int64_t end, double b);
    // The length of the union (without every_stretch).
    int64_t held_ps() const;
  };
  // With every_stretch: one interval of a sum (Use::every), as recorded.
  struct Interval {
    int32_t use;
    int64_t start, end;
  };
  // With every_stretch: the union's length of each sum's intervals, into every_held_.
  void SumEvery();
  // The use of link `l` by `use` over a run whose longest member took `longest`.
  LinkUse Finish(const Use& use, LinkId l, Time longest) const;
  // With every_stretch: records [start, end] carrying `bytes` for `use`.
  void AddEvery(Use& use, int64_t start, int64_t end, double bytes);
  // One link's sums: over every interval, and per group.
  struct LinkSums {
    Use whole;
    int first_group = -1;  // The first group seen (-1: none), summed in `first`.
    Use first;
    // Any other groups, and their sums beside (the ids alone are scanned: a link of a
    // data-axis all-reduce on the pod carries transfers of up to 32 rings).
    std::vector<int> more_groups;
    std::vector<Use> more;
    // The sums of group `g` (>= 0).
    Use& Of(int g);
  };

  // The sums of each link some transfer held, in the order they were first held; index_ has
  // each link's place there (-1: never held).
  std::vector<LinkSums> sums_;
  std::vector<int32_t> index_;
  std::vector<int> group_of_vertex_;
  bool every_stretch_;
  // With every_stretch: every interval of every sum as recorded, how many sums have some, and
  // (after Summarize's SumEvery) each one's union length.
  std::vector<Interval> every_;
  int32_t every_uses_ = 0;
  std::vector<int64_t> every_held_;
  bool overflowed_ = false;
};

}  // namespace shardsim
