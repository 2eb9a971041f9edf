#include "collectives/staged_all_reduce.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <string>
#include <tuple>
#include <utility>

namespace shardsim {
namespace {

class StagedAllReduce : public CollectiveAlgorithm {
 public:
  StagedAllReduce(Network& network, CollectiveJob& job, std::vector<ReductionLevel> levels,
                  int segments)
      : network_(network), job_(job), levels_(std::move(levels)), segments_(segments) {
    assert(job_.kind == CollectiveKind::kAllReduce);
    const int n = job_.size();
    depth_ = static_cast<int>(levels_.size());
    phases_ = 2 * depth_;
    rank_.assign(depth_, std::vector<int>(n, -1));
    group_.assign(depth_, std::vector<int>(n, -1));
    for (int l = 0; l < depth_; ++l) {
      for (size_t g = 0; g < levels_[l].groups.size(); ++g) {
        const std::vector<int>& members = levels_[l].groups[g];
        for (size_t r = 0; r < members.size(); ++r) {
          rank_[l][members[r]] = static_cast<int>(r);
          group_[l][members[r]] = static_cast<int>(g);
        }
      }
      for (int m = 0; m < n; ++m) assert(rank_[l][m] >= 0);
    }
    const size_t states = static_cast<size_t>(n) * segments_ * phases_;
    entered_.assign(states, 0);
    got_.assign(states, 0);
    done_.assign(states, 0);
    next_.assign(static_cast<size_t>(n) * phases_, 0);
    finished_.assign(n, 0);
  }

  void Start() override {
    const int n = job_.size();
    if (job_.numerics) {
      work_.resize(n);
      for (int m = 0; m < n; ++m) work_[m] = InitialWorkBuffer(job_, m);
    }
    for (int m = 0; m < n; ++m) Advance(m);
  }

 private:
  using Range = std::pair<int64_t, int64_t>;

  size_t Index(int m, int s, int t) const {
    return (static_cast<size_t>(m) * segments_ + s) * phases_ + t;
  }
  // The level phase t works on, and whether it reduce-scatters.
  int LevelOf(int t) const { return t < depth_ ? t : phases_ - 1 - t; }
  bool Scatters(int t) const { return t < depth_; }
  const std::vector<int>& GroupOf(int level, int m) const {
    return levels_[level].groups[group_[level][m]];
  }
  // Piece r of g of `range`.
  static Range Piece(Range range, int r, int g) {
    const int64_t len = range.second - range.first;
    return {range.first + len * r / g, range.first + len * (r + 1) / g};
  }
  // The range member m's group shares at `level` for segment s.
  Range RangeAt(int m, int s, int level) const {
    Range range = Piece({0, job_.total}, s, segments_);
    for (int l = 0; l < level; ++l) {
      range = Piece(range, rank_[l][m], static_cast<int>(GroupOf(l, m).size()));
    }
    return range;
  }
  // Arrivals member m waits for in phase t.
  int Expected(int m, int t) const {
    const int g = static_cast<int>(GroupOf(LevelOf(t), m).size());
    if (g == 1) return 0;
    return Scatters(t) && levels_[LevelOf(t)].via_switch ? 1 : g - 1;
  }

  std::vector<float> Payload(const std::vector<float>& buffer, Range range) const {
    if (!job_.numerics) return {};
    return std::vector<float>(buffer.begin() + range.first, buffer.begin() + range.second);
  }

  std::string Label(int s, int t) const {
    if (!network_.tracing()) return {};
    return job_.label + (Scatters(t) ? " reduce-scatter" : " all-gather") + " level " +
           std::to_string(LevelOf(t) + 1) + " seg " + std::to_string(s + 1) + "/" +
           std::to_string(segments_);
  }

  // Starts a transfer of `range` from vertex `from` to member `to` (or to vertex `to_vertex`
  // when it is >= 0).
  void Transfer(VertexId from, VertexId to, Range range, std::string label, Callback done) {
    network_.Start(from, to, job_.WireBytes(range.second - range.first), std::move(label),
                   std::move(done), Callback(), job_.step_latency, job_.split_routes);
  }

  // Member m's work for segment s, phase t.
  void Enter(int m, int s, int t) {
    entered_[Index(m, s, t)] = 1;
    const int level = LevelOf(t);
    const ReductionLevel& lv = levels_[level];
    const std::vector<int>& group = GroupOf(level, m);
    const int g = static_cast<int>(group.size());
    const int r = rank_[level][m];
    const Range range = RangeAt(m, s, level);
    if (g > 1) {
      if (Scatters(t) && !lv.via_switch) {
        for (int q = 0; q < g; ++q) {
          if (q == r) continue;
          const Range piece = Piece(range, q, g);
          const int to = group[q];
          Transfer(job_.members[m], job_.members[to], piece, Label(s, t),
                   [this, to, s, t, piece,
                    payload = Payload(work_.empty() ? Empty() : work_[m], piece)]() mutable {
                     if (job_.numerics) {
                       // Until the receiver's step before is done, a switch may still
                       // overwrite this piece with its reduction: hold the part till then.
                       if (t > 0 && !done_[Index(to, s, t - 1)]) {
                         held_[Index(to, s, t)].push_back({piece, std::move(payload)});
                       } else {
                         Combine(job_.reduce, job_.dtype, work_[to].data() + piece.first,
                                 payload.data(), piece.second - piece.first);
                       }
                     }
                     Arrived(to, s, t);
                   });
        }
      } else if (Scatters(t)) {
        const VertexId hub = lv.switches[group_[level][m]];
        Transfer(job_.members[m], hub, range, Label(s, t),
                 [this, m, s, t, level, range,
                  payload = Payload(work_.empty() ? Empty() : work_[m], range)]() {
                   AtSwitch(m, s, t, level, range, payload);
                 });
      } else {
        const Range piece = Piece(range, r, g);
        if (!lv.via_switch) {
          for (int q = 0; q < g; ++q) {
            if (q == r) continue;
            const int to = group[q];
            Transfer(job_.members[m], job_.members[to], piece, Label(s, t),
                     [this, to, s, t, piece,
                      payload = Payload(work_.empty() ? Empty() : work_[m], piece)]() {
                       if (job_.numerics) {
                         std::copy(payload.begin(), payload.end(), work_[to].begin() + piece.first);
                       }
                       Arrived(to, s, t);
                     });
          }
        } else {
          const VertexId hub = lv.switches[group_[level][m]];
          Transfer(job_.members[m], hub, piece, Label(s, t),
                   [this, m, s, t, level, hub, piece,
                    payload = Payload(work_.empty() ? Empty() : work_[m], piece)]() {
                     // The switch multicasts the piece to the group's other members.
                     const std::vector<int>& members = GroupOf(level, m);
                     for (int to : members) {
                       if (to == m) continue;
                       Transfer(hub, job_.members[to], piece, Label(s, t),
                                [this, to, s, t, piece, payload]() {
                                  if (job_.numerics) {
                                    std::copy(payload.begin(), payload.end(),
                                              work_[to].begin() + piece.first);
                                  }
                                  Arrived(to, s, t);
                                });
                     }
                   });
        }
      }
    }
    CheckDone(m, s, t);
  }

  static const std::vector<float>& Empty() {
    static const std::vector<float> empty;
    return empty;
  }

  // Member m's whole range of segment s reached its group's switch in phase t.
  void AtSwitch(int m, int s, int t, int level, Range range, const std::vector<float>& payload) {
    const int grp = group_[level][m];
    Pending& p = pending_[{level, grp, s}];
    if (job_.numerics) {
      if (p.arrived == 0) {
        p.sum = payload;
      } else {
        Combine(job_.reduce, job_.dtype, p.sum.data(), payload.data(),
                static_cast<int64_t>(payload.size()));
      }
    }
    const std::vector<int>& group = levels_[level].groups[grp];
    const int g = static_cast<int>(group.size());
    if (++p.arrived < g) return;
    // Reduced: each member gets its piece.
    const VertexId hub = levels_[level].switches[grp];
    std::vector<float> sum = std::move(p.sum);
    pending_.erase({level, grp, s});
    for (int q = 0; q < g; ++q) {
      const Range piece = Piece(range, q, g);
      std::vector<float> part;
      if (job_.numerics) {
        part.assign(sum.begin() + (piece.first - range.first),
                    sum.begin() + (piece.second - range.first));
      }
      const int to = group[q];
      Transfer(hub, job_.members[to], piece, Label(s, t),
               [this, to, s, t, piece, part = std::move(part)]() {
                 if (job_.numerics) {
                   std::copy(part.begin(), part.end(), work_[to].begin() + piece.first);
                 }
                 Arrived(to, s, t);
               });
    }
  }

  void Arrived(int m, int s, int t) {
    ++got_[Index(m, s, t)];
    CheckDone(m, s, t);
  }

  void CheckDone(int m, int s, int t) {
    const size_t i = Index(m, s, t);
    if (!entered_[i] || done_[i] || got_[i] < Expected(m, t)) return;
    done_[i] = 1;
    // Parts of the next step that arrived before this one was done, now safe to add.
    if (t + 1 < phases_) {
      auto held = held_.find(Index(m, s, t + 1));
      if (held != held_.end()) {
        for (const Held& h : held->second) {
          Combine(job_.reduce, job_.dtype, work_[m].data() + h.piece.first, h.payload.data(),
                  h.piece.second - h.piece.first);
        }
        held_.erase(held);
      }
    }
    if (t == phases_ - 1 && ++finished_[m] == segments_) {
      if (job_.numerics) (*job_.out)[m] = std::move(work_[m]);
      job_.on_member_done(m);
      return;
    }
    Advance(m);
  }

  // Enters every phase member m may enter now: segment s of phase t once phase t - 1 of s
  // and phase t of s - kStagedInFlight are done.
  void Advance(int m) {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int t = 0; t < phases_; ++t) {
        int& s = next_[static_cast<size_t>(m) * phases_ + t];
        if (s >= segments_) continue;
        if (t > 0 && !done_[Index(m, s, t - 1)]) continue;
        if (s >= kStagedInFlight && !done_[Index(m, s - kStagedInFlight, t)]) continue;
        const int entering = s++;
        Enter(m, entering, t);
        progress = true;
      }
    }
  }

  struct Pending {
    int arrived = 0;
    std::vector<float> sum;
  };
  // A reduce-scatter part that reached a member before its previous step was done.
  struct Held {
    Range piece;
    std::vector<float> payload;
  };

  Network& network_;
  CollectiveJob& job_;
  std::vector<ReductionLevel> levels_;
  int segments_;
  int depth_ = 0;
  int phases_ = 0;
  std::vector<std::vector<int>> rank_, group_;  // Per level, per member.
  std::vector<char> entered_, done_;
  std::vector<int> got_;
  std::vector<int> next_;      // Per (member, phase): next segment to enter.
  std::vector<int> finished_;  // Per member: segments through the last phase.
  std::vector<std::vector<float>> work_;
  std::map<std::tuple<int, int, int>, Pending> pending_;  // (level, group, segment).
  std::map<size_t, std::vector<Held>> held_;              // By Index(member, segment, step).
};

}  // namespace

int64_t StagedTransfersPerSegment(const std::vector<ReductionLevel>& levels) {
  int64_t n = 0;
  for (const ReductionLevel& level : levels) {
    for (const std::vector<int>& group : level.groups) {
      const int64_t g = static_cast<int64_t>(group.size());
      n += level.via_switch ? 3 * g + g * (g - 1) : 2 * g * (g - 1);
    }
  }
  return std::max<int64_t>(1, n);
}

int StagedSegments(int64_t bytes, int64_t chunk, int64_t transfers_per_segment) {
  chunk = std::max<int64_t>(1, chunk);
  const int64_t most = std::clamp<int64_t>(
      kStagedTransferBudget / std::max<int64_t>(1, transfers_per_segment), 1, 64);
  return static_cast<int>(std::clamp<int64_t>((bytes + chunk - 1) / chunk, 1, most));
}

std::unique_ptr<CollectiveAlgorithm> MakeStagedAllReduce(Network& network, CollectiveJob& job,
                                                         std::vector<ReductionLevel> levels,
                                                         int segments) {
  return std::make_unique<StagedAllReduce>(network, job, std::move(levels), std::max(1, segments));
}

int StagedSegmentsOf(const Network& network, const CollectiveJob& job,
                     const std::vector<ReductionLevel>& levels) {
  return StagedSegments(job.BytesOf(job.total).count(),
                        network.topology().comm().chunk_size.count(),
                        StagedTransfersPerSegment(levels));
}

std::unique_ptr<CollectiveAlgorithm> MakeStagedAllReduce(Network& network, CollectiveJob& job,
                                                         std::vector<ReductionLevel> levels) {
  const int segments = StagedSegmentsOf(network, job, levels);
  return MakeStagedAllReduce(network, job, std::move(levels), segments);
}

}  // namespace shardsim
