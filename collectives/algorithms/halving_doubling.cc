#include "collectives/algorithms/halving_doubling.h"

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardsim {
namespace {

class HalvingDoubling : public CollectiveAlgorithm {
 public:
  HalvingDoubling(Network& network, CollectiveJob& job) : network_(network), job_(job) {
    int g = job_.size();
    if (g & (g - 1)) {
      throw std::invalid_argument("halving_doubling needs a power-of-two group, got " +
                                  std::to_string(g) + " devices");
    }
    while ((1 << levels_) < g) ++levels_;
    if (job_.kind == CollectiveKind::kAllToAll || job_.kind == CollectiveKind::kPermute) {
      throw std::invalid_argument(std::string("halving_doubling does not implement ") +
                                  CollectiveKindName(job_.kind));
    }
  }

  void Start() override {
    int g = job_.size();
    if (job_.kind == CollectiveKind::kAllReduce) {
      for (int c = 0; c <= g; ++c) bounds_.push_back(job_.total * c / g);
    }
    rounds_ = 0;
    if (job_.kind != CollectiveKind::kAllGather) rounds_ += levels_;
    if (job_.kind != CollectiveKind::kReduceScatter) rounds_ += levels_;
    state_.assign(g, MemberState{});
    if (job_.numerics) {
      work_.resize(g);
      for (int m = 0; m < g; ++m) work_[m] = InitialWorkBuffer(job_, m);
    }
    for (int m = 0; m < g; ++m) Advance(m);
  }

 private:
  struct MemberState {
    int round = 0;                              // Next round to send.
    std::map<int, std::vector<float>> arrived;  // Round -> payload, not yet applied.
    bool sent_current = false;                  // Whether `round` was sent.
    bool done = false;
  };

  std::pair<int64_t, int64_t> Chunk(int c) const {
    if (job_.kind == CollectiveKind::kAllReduce) return {bounds_[c], bounds_[c + 1]};
    return {c * job_.block, (c + 1) * job_.block};
  }

  bool IsReduceRound(int round) const {
    return job_.kind != CollectiveKind::kAllGather && round < levels_;
  }
  // The bit exchanged in `round`.
  int Bit(int round) const {
    if (IsReduceRound(round)) return round;
    int k = job_.kind == CollectiveKind::kAllGather ? round : round - levels_;
    return levels_ - 1 - k;
  }

  // Chunks member m sends in `round`. Reduce round on bit b: those agreeing with m on bits
  // below b and differing on b (the partner's half). Gather round on bit b: those agreeing with
  // m on bits 0..b (what m holds).
  std::vector<int> SendSet(int m, int round) const {
    int b = Bit(round);
    std::vector<int> set;
    for (int c = 0; c < job_.size(); ++c) {
      int low = (1 << b) - 1;
      bool below = (c & low) == (m & low);
      bool on_b = ((c >> b) & 1) == ((m >> b) & 1);
      if (below && (IsReduceRound(round) ? !on_b : on_b)) set.push_back(c);
    }
    return set;
  }

  int64_t Elements(const std::vector<int>& set) const {
    int64_t n = 0;
    for (int c : set) {
      auto [lo, hi] = Chunk(c);
      n += hi - lo;
    }
    return n;
  }

  // Sends the current round if its data is final, then applies arrived rounds in order.
  void Advance(int m) {
    MemberState& s = state_[m];
    while (!s.done) {
      if (s.round == rounds_) {
        Finish(m);
        return;
      }
      int round = s.round;
      if (!s.sent_current) {
        SendRound(m, round);
        s.sent_current = true;
      }
      auto it = s.arrived.find(round);
      if (it == s.arrived.end()) return;
      Apply(m, round, it->second);
      s.arrived.erase(it);
      ++s.round;
      s.sent_current = false;
    }
  }

  void SendRound(int m, int round) {
    int partner = m ^ (1 << Bit(round));
    std::vector<int> set = SendSet(m, round);
    std::vector<float> payload;
    if (job_.numerics) {
      for (int c : set) {
        auto [lo, hi] = Chunk(c);
        payload.insert(payload.end(), work_[m].begin() + lo, work_[m].begin() + hi);
      }
    }
    std::string label;
    if (network_.tracing()) {
      label = job_.label + (IsReduceRound(round) ? " halve " : " double ") +
              std::to_string(round + 1) + "/" + std::to_string(rounds_);
    }
    job_.Send(network_, m, partner, Elements(set), std::move(label),
              [this, partner, round, payload = std::move(payload)]() mutable {
                state_[partner].arrived.emplace(round, std::move(payload));
                Advance(partner);
              });
  }

  // Applies what the partner sent in `round`: its SendSet, seen from m.
  void Apply(int m, int round, const std::vector<float>& payload) {
    if (!job_.numerics) return;
    int partner = m ^ (1 << Bit(round));
    const float* src = payload.data();
    for (int c : SendSet(partner, round)) {
      auto [lo, hi] = Chunk(c);
      if (IsReduceRound(round)) {
        Combine(job_.reduce, job_.dtype, work_[m].data() + lo, src, hi - lo);
      } else {
        std::copy(src, src + (hi - lo), work_[m].begin() + lo);
      }
      src += hi - lo;
    }
  }

  void Finish(int m) {
    state_[m].done = true;
    if (job_.numerics) {
      std::vector<float>& out = (*job_.out)[m];
      if (job_.kind == CollectiveKind::kReduceScatter) {
        out.assign(work_[m].begin() + job_.block * m, work_[m].begin() + job_.block * (m + 1));
      } else {
        out = std::move(work_[m]);
      }
    }
    job_.on_member_done(m);
  }

  Network& network_;
  CollectiveJob& job_;
  int levels_ = 0;
  int rounds_ = 0;
  std::vector<int64_t> bounds_;
  std::vector<MemberState> state_;
  std::vector<std::vector<float>> work_;
};

}  // namespace

std::unique_ptr<CollectiveAlgorithm> MakeHalvingDoublingAlgorithm(Network& network,
                                                                  CollectiveJob& job) {
  return std::make_unique<HalvingDoubling>(network, job);
}

}  // namespace shardsim
