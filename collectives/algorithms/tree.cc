#include "collectives/algorithms/tree.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithm.h"

namespace shardsim {
namespace {

// What one tree covers: elements [lo, hi) of the buffer, the member at each heap position,
// whom to tell when a member has its range, and whether to copy the inputs to the outputs
// first (a tree sharing the buffer with another leaves that to their owner).
struct TreeSpan {
  int64_t lo = 0, hi = 0;
  std::vector<int> order;  // Heap position -> member.
  std::function<void(int member)> on_done;
  bool copy_inputs = true;
};

// Heap positions are p = 0..G-1 (parent (p - 1) / 2); member order[p] stands at p.
class Tree : public CollectiveAlgorithm {
 public:
  Tree(Network& network, CollectiveJob& job, int pipeline, TreeSpan span)
      : network_(network), job_(job), segments_(std::max(1, pipeline)), span_(std::move(span)) {
    if (job_.kind != CollectiveKind::kAllReduce) {
      throw std::invalid_argument(AlgorithmSupports("tree", job_.kind, 1));
    }
  }

  void Start() override {
    int g = job_.size();
    const int64_t len = span_.hi - span_.lo;
    for (int s = 0; s <= segments_; ++s) bounds_.push_back(span_.lo + len * s / segments_);
    up_.assign(static_cast<size_t>(g) * segments_, 0);
    down_done_.assign(g, 0);
    done_.assign(g, false);
    if (job_.numerics && span_.copy_inputs) {
      for (int m = 0; m < g; ++m) (*job_.out)[m] = (*job_.in)[m];
    }
    for (int m = 0; m < g; ++m) {
      for (int s = 0; s < segments_; ++s) {
        if (Children(m) == 0) ReducedUp(m, s);
      }
    }
  }

 private:
  int Children(int m) const {
    int g = job_.size();
    return (2 * m + 1 < g) + (2 * m + 2 < g);
  }

  // Segment s of member m now holds the reduction over m's subtree.
  void ReducedUp(int m, int s) {
    if (m == 0) {
      SendDown(0, s);
      return;
    }
    int parent = (m - 1) / 2;
    Send(m, parent, s, /*up=*/true);
  }

  void SendDown(int m, int s) {
    for (int child : {2 * m + 1, 2 * m + 2}) {
      if (child < job_.size()) Send(m, child, s, /*up=*/false);
    }
    if (++down_done_[m] == segments_ && !done_[m]) {
      done_[m] = true;
      span_.on_done(span_.order[m]);
    }
  }

  // Each (sender, receiver) pair sends its segments one after another, the next as soon as
  // the previous one drained: a pipeline, not segments racing for the same link.
  struct Queue {
    bool busy = false;
    std::deque<int> waiting;
  };
  Queue& QueueOf(int from, int to) { return queues_[{from, to}]; }

  void Send(int from, int to, int s, bool up) {
    Queue& q = QueueOf(from, to);
    if (q.busy) {
      q.waiting.push_back(s);
      return;
    }
    q.busy = true;
    Launch(from, to, s, up);
  }

  void Drained(int from, int to, bool up) {
    Queue& q = QueueOf(from, to);
    if (q.waiting.empty()) {
      q.busy = false;
      return;
    }
    int s = q.waiting.front();
    q.waiting.pop_front();
    Launch(from, to, s, up);
  }

  void Launch(int from, int to, int s, bool up) {
    int64_t lo = bounds_[s], hi = bounds_[s + 1];
    std::vector<float> payload;
    if (job_.numerics) {
      const std::vector<float>& src = (*job_.out)[span_.order[from]];
      payload.assign(src.begin() + lo, src.begin() + hi);
    }
    std::string label;
    if (network_.tracing()) {
      label = job_.label + (up ? " reduce" : " broadcast") + " seg " + std::to_string(s + 1) + "/" +
              std::to_string(segments_);
    }
    job_.Send(
        network_, span_.order[from], span_.order[to], hi - lo, std::move(label),
        [this, to, s, up, lo, payload = std::move(payload)]() {
          if (up) {
            if (job_.numerics) {
              Combine(job_.reduce, job_.dtype, (*job_.out)[span_.order[to]].data() + lo,
                      payload.data(), static_cast<int64_t>(payload.size()));
            }
            if (++up_[static_cast<size_t>(to) * segments_ + s] == Children(to)) {
              ReducedUp(to, s);
            }
          } else {
            if (job_.numerics) {
              std::copy(payload.begin(), payload.end(), (*job_.out)[span_.order[to]].begin() + lo);
            }
            SendDown(to, s);
          }
        },
        [this, from, to, up] { Drained(from, to, up); });
  }

  Network& network_;
  CollectiveJob& job_;
  int segments_;
  TreeSpan span_;
  std::vector<int64_t> bounds_;
  std::vector<int> up_;         // Per (member, segment): children combined.
  std::vector<int> down_done_;  // Per member: segments received from above.
  std::vector<bool> done_;
  std::map<std::pair<int, int>, Queue> queues_;
};

// Two trees, each over half the buffer; the second's heap holds the members in reverse, so
// the first tree's leaves (the upper half of the heap) are the second's inner members (but
// for the middle member of an odd group, a leaf of both).
class DoubleTree : public CollectiveAlgorithm {
 public:
  DoubleTree(Network& network, CollectiveJob& job, int pipeline) : job_(job) {
    const int g = job.size();
    halves_.assign(g, 0);
    std::vector<int> forward(g), backward(g);
    for (int p = 0; p < g; ++p) {
      forward[p] = p;
      backward[p] = g - 1 - p;
    }
    auto done = [this](int member) {
      if (++halves_[member] == 2) job_.on_member_done(member);
    };
    const int64_t half = job.total / 2;
    trees_[0] =
        std::make_unique<Tree>(network, job, pipeline, TreeSpan{0, half, forward, done, false});
    trees_[1] = std::make_unique<Tree>(network, job, pipeline,
                                       TreeSpan{half, job.total, backward, done, false});
  }

  void Start() override {
    if (job_.numerics) {
      for (int m = 0; m < job_.size(); ++m) (*job_.out)[m] = (*job_.in)[m];
    }
    for (auto& tree : trees_) tree->Start();
  }

 private:
  CollectiveJob& job_;
  std::vector<int> halves_;  // Per member: trees that delivered its range.
  std::unique_ptr<Tree> trees_[2];
};

}  // namespace

std::unique_ptr<CollectiveAlgorithm> MakeTreeAlgorithm(Network& network, CollectiveJob& job,
                                                       int pipeline) {
  std::vector<int> order(job.size());
  for (int p = 0; p < job.size(); ++p) order[p] = p;
  return std::make_unique<Tree>(network, job, pipeline,
                                TreeSpan{0, job.total, std::move(order),
                                         [&job](int member) { job.on_member_done(member); }, true});
}

std::unique_ptr<CollectiveAlgorithm> MakeDoubleTreeAlgorithm(Network& network, CollectiveJob& job,
                                                             int pipeline) {
  return std::make_unique<DoubleTree>(network, job, pipeline);
}

}  // namespace shardsim
