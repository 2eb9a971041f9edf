#include "collectives/algorithms/ring.h"

#include <array>
#include <cassert>
#include <numeric>
#include <utility>

#include "collectives/ring_pass.h"

namespace shardsim {
namespace {

// Most mesh axes a group may span.
constexpr int kMaxAxes = 16;

class RingFamily : public CollectiveAlgorithm {
 public:
  RingFamily(Network& network, CollectiveJob& job, RingPlan plan)
      : network_(network), job_(job), plan_(std::move(plan)) {
    int g = job_.size();
    int k = static_cast<int>(plan_.axis_sizes.size());
    assert(std::accumulate(plan_.axis_sizes.begin(), plan_.axis_sizes.end(), 1,
                           std::multiplies<int>()) == g);
    strides_.assign(k, 1);
    for (int a = k - 2; a >= 0; --a) strides_[a] = strides_[a + 1] * plan_.axis_sizes[a + 1];
    lanes_ = plan_.channels.empty() ? plan_.parts * plan_.directions
                                    : static_cast<int>(plan_.channels.size());
    finished_.assign(g, 0);
    assert(plan_.order.empty() || static_cast<int>(plan_.order.size()) == g);
    assert(plan_.order.empty() || plan_.channels.empty());
  }

  void Start() override {
    int g = job_.size();
    if (job_.numerics) PrepareWork();
    passes_.resize(lanes_);
    for (int lane = 0; lane < lanes_; ++lane) BuildLane(lane);
    for (int m = 0; m < g; ++m) {
      for (int lane = 0; lane < lanes_; ++lane) {
        if (passes_[lane].empty()) {
          LaneDone(m);
        } else {
          passes_[lane][0]->StartMember(m);
        }
      }
    }
  }

 private:
  // Coordinate of row-major position `position` along `axis`.
  int Coord(int position, int axis) const {
    return (position / strides_[axis]) % plan_.axis_sizes[axis];
  }

  // The member at `position`.
  int MemberAt(int position) const {
    return plan_.order.empty() ? position : plan_.order[position];
  }

  // Element range of chunk `c` (owned in the end by position c) within lane `lane`'s share.
  std::pair<int64_t, int64_t> ChunkRange(int lane, int c) const {
    int64_t g = job_.size();
    if (job_.kind == CollectiveKind::kAllReduce) {
      // Lane q owns [T q / Q, T (q+1) / Q) of the buffer, split evenly into G chunks.
      int64_t t = job_.total;
      int64_t lo = t * lane / lanes_, hi = t * (lane + 1) / lanes_;
      int64_t len = hi - lo;
      return {lo + len * c / g, lo + len * (c + 1) / g};
    }
    // The block of the member at position c, of which lane q owns the q-th share.
    int64_t b = job_.block;
    int64_t first = MemberAt(c) * b;
    return {first + b * lane / lanes_, first + b * (lane + 1) / lanes_};
  }

  // The axes of part p, in its reduce-scatter order (rotated so parts start on different
  // axes), skipping axes of size 1.
  std::vector<int> AxisOrder(int part) const {
    int k = static_cast<int>(plan_.axis_sizes.size());
    std::vector<int> order;
    for (int i = 0; i < k; ++i) {
      int a = (part + i) % k;
      if (plan_.axis_sizes[a] > 1) order.push_back(a);
    }
    return order;
  }

  // Calls fn(first, n) for each run of n consecutive chunk indices that the member at
  // `position` contributes in the phase along order[j]: the chunks whose coordinates equal
  // its own on order[0..j] (axes reduced before, and this one) and run over the others. Free
  // axes that are the group's innermost ones make consecutive chunk indices, so they form one
  // run.
  template <typename Fn>
  void ForEachRun(const std::vector<int>& order, int j, int position, Fn fn) const {
    // Called once per position of every pass: fixed-size scratch, no allocation.
    int k = static_cast<int>(plan_.axis_sizes.size());
    assert(k <= kMaxAxes);
    std::array<bool, kMaxAxes> fixed{};
    int base = 0;
    for (int i = 0; i <= j; ++i) {
      fixed[order[i]] = true;
      base += Coord(position, order[i]) * strides_[order[i]];
    }
    int run = 1, a = k - 1;
    for (; a >= 0 && !fixed[a]; --a) run *= plan_.axis_sizes[a];
    std::array<int, kMaxAxes> outer;  // Free axes outside the run.
    int n_outer = 0;
    for (int i = 0; i <= a; ++i) {
      if (!fixed[i] && plan_.axis_sizes[i] > 1) outer[n_outer++] = i;
    }
    std::array<int, kMaxAxes> idx{};
    while (true) {
      int c = base;
      for (int f = 0; f < n_outer; ++f) c += idx[f] * strides_[outer[f]];
      fn(c, run);
      int f = n_outer;
      while (f > 0) {
        --f;
        if (++idx[f] < plan_.axis_sizes[outer[f]]) break;
        idx[f] = 0;
        if (f == 0) return;
      }
      if (n_outer == 0) return;
    }
  }

  // Elements of the chunks ForEachRun visits, within lane `lane`'s share.
  int64_t ChunkCount(int lane, const std::vector<int>& order, int j, int position) const {
    int64_t n = 0;
    ForEachRun(order, j, position, [&](int first, int run) {
      if (job_.kind == CollectiveKind::kAllReduce) {
        // Chunks of a lane are contiguous: a run telescopes to one range.
        n += ChunkRange(lane, first + run - 1).second - ChunkRange(lane, first).first;
      } else {
        auto [lo, hi] = ChunkRange(lane, first);
        n += (hi - lo) * run;  // Every block has the same share in a lane.
      }
    });
    return n;
  }

  // The segments of those chunks.
  void ChunkSet(int lane, const std::vector<int>& order, int j, int position,
                std::vector<Segment>* out) const {
    out->clear();
    ForEachRun(order, j, position, [&](int first, int run) {
      if (job_.kind == CollectiveKind::kAllReduce) {
        int64_t lo = ChunkRange(lane, first).first;
        int64_t hi = ChunkRange(lane, first + run - 1).second;
        if (hi > lo) out->push_back(Segment{lo, hi - lo});
        return;
      }
      for (int c = first; c < first + run; ++c) {
        auto [lo, hi] = ChunkRange(lane, c);
        if (hi > lo) out->push_back(Segment{lo, hi - lo});
      }
    });
  }

  // Rings along `axis`: positions that differ only there, ordered by that coordinate
  // (reversed for the second direction).
  std::vector<std::vector<int>> RingsAlong(int axis, bool reversed) const {
    std::vector<std::vector<int>> rings;
    int n = plan_.axis_sizes[axis];
    for (int m = 0; m < job_.size(); ++m) {
      if (Coord(m, axis) != 0) continue;
      std::vector<int> ring(n);
      for (int v = 0; v < n; ++v) ring[reversed ? n - 1 - v : v] = m + v * strides_[axis];
      rings.push_back(std::move(ring));
    }
    return rings;
  }

  void BuildLane(int lane) {
    int part = plan_.channels.empty() ? lane / plan_.directions : 0;
    bool reversed = plan_.channels.empty() && lane % plan_.directions == 1;
    std::vector<int> order = AxisOrder(part);
    bool reduce = job_.kind != CollectiveKind::kAllGather;
    bool gather = job_.kind != CollectiveKind::kReduceScatter;
    std::vector<std::pair<RingPass::Mode, int>> phases;  // (mode, j)
    if (reduce) {
      for (int j = 0; j < static_cast<int>(order.size()); ++j) {
        phases.push_back({RingPass::Mode::kReduceScatter, j});
      }
    }
    if (gather) {
      for (int j = static_cast<int>(order.size()) - 1; j >= 0; --j) {
        phases.push_back({RingPass::Mode::kAllGather, j});
      }
    }
    for (size_t p = 0; p < phases.size(); ++p) {
      auto [mode, j] = phases[p];
      std::vector<std::vector<int>> rings =
          plan_.channels.empty() ? RingsAlong(order[j], reversed)
                                 : std::vector<std::vector<int>>{plan_.channels[lane]};
      // Rings list row-major positions; place r of ring i is rings[i][r]. The passes take
      // member ids.
      std::vector<std::vector<int>> positions = rings;
      if (!plan_.order.empty()) {
        for (std::vector<int>& ring : rings) {
          for (int& member : ring) member = plan_.order[member];
        }
      }
      RingPass::ChunkLayout layout = [this, lane, order, j, positions](int ring, int index,
                                                                       std::vector<Segment>* out) {
        ChunkSet(lane, order, j, positions[ring][index], out);
      };
      // A position's chunk set depends only on its coordinates along order[0..j]: count each
      // distinct set once (a pass over 4096 members has as few as 16 of them).
      std::vector<int64_t> counted(static_cast<size_t>(job_.size()), -1);
      RingPass::ChunkCount count = [this, lane, &order, j, &positions, &counted](int ring,
                                                                                 int index) {
        int position = positions[ring][index];
        int base = 0;
        for (int i = 0; i <= j; ++i) base += Coord(position, order[i]) * strides_[order[i]];
        int64_t& n = counted[base];
        if (n < 0) n = ChunkCount(lane, order, j, position);
        return n;
      };
      size_t next = p + 1;
      auto done = [this, lane, next](int member) {
        if (next < passes_[lane].size()) {
          passes_[lane][next]->StartMember(member);
        } else {
          LaneDone(member);
        }
      };
      passes_[lane].push_back(std::make_unique<RingPass>(network_, job_, mode, std::move(rings),
                                                         std::move(layout), count, &work_, done));
    }
  }

  void PrepareWork() {
    work_.resize(job_.size());
    for (int m = 0; m < job_.size(); ++m) work_[m] = InitialWorkBuffer(job_, m);
  }

  void LaneDone(int member) {
    if (++finished_[member] < lanes_) return;
    if (job_.numerics) {
      std::vector<float>& out = (*job_.out)[member];
      if (job_.kind == CollectiveKind::kReduceScatter) {
        auto first = work_[member].begin() + job_.block * member;
        out.assign(first, first + job_.block);
        work_[member] = {};
      } else {
        out = std::move(work_[member]);
      }
    }
    job_.on_member_done(member);
  }

  Network& network_;
  CollectiveJob& job_;
  RingPlan plan_;
  std::vector<int> strides_;
  int lanes_ = 1;
  std::vector<int> finished_;
  std::vector<std::vector<float>> work_;
  std::vector<std::vector<std::unique_ptr<RingPass>>> passes_;
};

}  // namespace

RingPlan MakeRingPlan(const std::string& algorithm, const std::vector<int>& axis_sizes,
                      bool bidirectional_axes) {
  int g = std::accumulate(axis_sizes.begin(), axis_sizes.end(), 1, std::multiplies<int>());
  if (algorithm == "torus_2d") {
    RingPlan plan;
    for (int n : axis_sizes) {
      if (n > 1) plan.axis_sizes.push_back(n);
    }
    if (plan.axis_sizes.empty()) plan.axis_sizes = {1};
    plan.parts = static_cast<int>(plan.axis_sizes.size());
    plan.directions = bidirectional_axes ? 2 : 1;
    return plan;
  }
  RingPlan plan;
  plan.axis_sizes = {g};
  plan.directions = algorithm == "bidirectional_ring" ? 2 : 1;
  return plan;
}

std::vector<std::vector<int>> RailAlignedRings(const std::vector<std::vector<int>>& nodes,
                                               int channels) {
  std::vector<std::vector<int>> rings;
  for (int c = 0; c < channels; ++c) {
    std::vector<int> ring;
    for (const std::vector<int>& node : nodes) {
      const int k = static_cast<int>(node.size());
      for (int i = 0; i < k; ++i) ring.push_back(node[(c + i) % k]);
    }
    rings.push_back(std::move(ring));
  }
  return rings;
}

std::unique_ptr<CollectiveAlgorithm> MakeRingAlgorithm(Network& network, CollectiveJob& job,
                                                       RingPlan plan) {
  return std::make_unique<RingFamily>(network, job, std::move(plan));
}

}  // namespace shardsim
