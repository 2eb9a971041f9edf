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

// Records, per directed link, the intervals during which transfers of each group held it.
//
// Sums over a link's intervals are taken as they are recorded: their bytes and lengths (exact:
// integers), and their union, which needs them in order of their starts. Transfers on a link
// usually leave it, and are recorded, in the order they started; a link that gets one out of
// that order is summed again at the end from every record, sorted (the records are kept).
class LinkAccounting : public FlowRecorder {
 public:
  // `links`: the topology's link count. `group_of_vertex`: the group whose member sends from
  // each vertex (-1: none). `expected_records`: room to reserve for the records.
  LinkAccounting(size_t links, std::vector<int> group_of_vertex, size_t expected_records = 0);

  void OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
              double bytes) override;

  // How many (link, transfer) records were kept.
  size_t records() const { return recorded_.size(); }

  // The links some recorded transfer held, ascending.
  std::vector<LinkId> HeldLinks() const;

  // Fills `timing`'s link_use (for each of timing.profile->links) and group_use (per group),
  // durations relative to the longest member time of the op and of each group. Call once,
  // after recording.
  void Summarize(const std::vector<std::vector<int>>& groups, CollectiveTiming& timing);

 private:
  // One transfer's hold of one link.
  struct Held {
    int group;
    int64_t start, end;  // Picoseconds.
    double bytes;
  };
  // Sums over intervals taken in order of their starts.
  struct Use {
    double bytes = 0;
    int64_t transfer_ps = 0;                 // Sum of the intervals' lengths.
    int64_t held_ps = 0;                     // Length of their union.
    int64_t open_start = -1, open_end = -1;  // The union's last stretch, not yet counted.
    // Adds an interval starting no earlier than any added before.
    void Add(const Held& h);
    // The use of link `l` over a run whose longest member took `longest`.
    LinkUse Finish(LinkId l, Time longest);
  };
  // One link's sums: over every interval, and per group.
  struct LinkSums {
    int64_t last_start = -1;  // The latest start summed.
    bool held = false;        // Some transfer held the link.
    bool unsorted = false;    // A start came before last_start: sums are redone (SumAgain).
    Use whole;
    int first_group = -1;  // The first group seen (-1: none), summed in `first`.
    Use first;
    std::vector<std::pair<int, Use>> more;  // Any other groups.
    // The sums of group `g` (>= 0).
    Use& Of(int g);
  };
  // A hold and its link, as recorded.
  struct Record {
    LinkId link;
    Held held;
  };
  // Sums the links that got a record out of order again, from their records in order of
  // their starts.
  void SumAgain();

  std::vector<LinkSums> sums_;  // By link.
  std::vector<int> group_of_vertex_;
  std::vector<Record> recorded_;  // Every transfer's hops, as recorded.
  int64_t unsorted_ = 0;          // Links with a record out of order.
};

}  // namespace shardsim
