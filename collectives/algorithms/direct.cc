#include "collectives/algorithms/direct.h"

#include <cassert>
#include <string>
#include <utility>
#include <vector>

#include "collectives/ragged_all_to_all.h"

namespace shardsim {
namespace {

class Direct : public CollectiveAlgorithm {
 public:
  Direct(Network& network, CollectiveJob& job) : network_(network), job_(job) {
    // A permute's point-to-point messages may take several routes (CommSpec::multipath). An
    // all-to-all's are left on one: its G (G - 1) messages already load every route, and
    // splitting them multiplies the flows the network shares.
    job_.split_routes = job_.kind == CollectiveKind::kPermute;
  }

  void Start() override {
    int g = job_.size();
    state_.assign(g, MemberState{});
    if (job_.kind == CollectiveKind::kAllReduce) {
      for (int c = 0; c <= g; ++c) bounds_.push_back(job_.total * c / g);
    }
    if (job_.numerics) PrepareBuffers();
    for (int m = 0; m < g; ++m) {
      MemberState& s = state_[m];
      switch (job_.kind) {
        case CollectiveKind::kAllGather:
        case CollectiveKind::kAllToAll:
        case CollectiveKind::kReduceScatter:
          s.expected = g - 1;
          break;
        case CollectiveKind::kAllReduce:
          s.expected = 2 * (g - 1);
          break;
        case CollectiveKind::kPermute:
          s.expected = 0;
          break;
      }
    }
    if (job_.kind == CollectiveKind::kPermute) {
      for (int m = 0; m < g; ++m) {
        int d = job_.destination[m];
        if (d >= 0 && d != m) ++state_[d].expected;
      }
    }
    for (int m = 0; m < g; ++m) SendFirstRound(m);
    for (int m = 0; m < g; ++m) MaybeDone(m);
  }

 private:
  struct MemberState {
    int expected = 0;
    int received = 0;
    int pending_sends = 0;
    int reduced = 0;  // All-reduce: reduce-scatter arrivals combined.
    bool done = false;
  };

  // Element range [lo, hi) of chunk c of the input (reduce-scatter, all-to-all, all-reduce).
  std::pair<int64_t, int64_t> Chunk(int c) const {
    if (job_.kind == CollectiveKind::kAllReduce) return {bounds_[c], bounds_[c + 1]};
    return {c * job_.block, (c + 1) * job_.block};
  }

  void PrepareBuffers() {
    int g = job_.size();
    for (int m = 0; m < g; ++m) {
      const std::vector<float>& in = (*job_.in)[m];
      std::vector<float>& out = (*job_.out)[m];
      switch (job_.kind) {
        case CollectiveKind::kAllGather:
          out.assign(static_cast<size_t>(job_.block) * g, 0.0f);
          std::copy(in.begin(), in.end(), out.begin() + job_.block * m);
          break;
        case CollectiveKind::kReduceScatter:
          out.assign(in.begin() + job_.block * m, in.begin() + job_.block * (m + 1));
          break;
        case CollectiveKind::kAllReduce:
          out = in;
          break;
        case CollectiveKind::kAllToAll:
          if (job_.ragged) {  // `out` holds the op's `output`; a member's own slices land now.
            const int64_t row = job_.ragged->row_elements;
            for (const RaggedSlice& s : job_.ragged->slices[static_cast<size_t>(m) * g + m]) {
              std::copy(in.begin() + s.src_row * row, in.begin() + (s.src_row + s.rows) * row,
                        out.begin() + s.dst_row * row);
            }
            break;
          }
          out.assign(in.size(), 0.0f);
          std::copy(in.begin() + job_.block * m, in.begin() + job_.block * (m + 1),
                    out.begin() + job_.block * m);
          break;
        case CollectiveKind::kPermute:
          out.assign(in.size(), 0.0f);
          if (job_.destination[m] == m) out = in;
          break;
      }
    }
  }

  // Sends elements [lo, hi) of `src` from `from` to `to`; `apply(to, payload)` runs on arrival.
  template <typename Apply>
  void Transfer(int from, int to, int64_t lo, int64_t hi, const std::vector<float>* src,
                const char* what, Apply apply) {
    std::vector<float> payload;
    if (job_.numerics && src) payload.assign(src->begin() + lo, src->begin() + hi);
    std::string label;
    if (network_.tracing()) {
      label = job_.label + " " + what + " " + std::to_string(from) + "\xE2\x86\x92" +
              std::to_string(to);
    }
    ++state_[from].pending_sends;
    job_.Send(network_, from, to, hi - lo, std::move(label),
              [this, from, to, apply, payload = std::move(payload)]() {
                --state_[from].pending_sends;
                apply(to, payload);
                ++state_[to].received;
                MaybeDone(to);
                MaybeDone(from);
              });
  }

  void SendFirstRound(int m) {
    int g = job_.size();
    const std::vector<float>* in = job_.numerics ? &(*job_.in)[m] : nullptr;
    for (int i = 1; i < g; ++i) {
      int peer = (m + i) % g;
      switch (job_.kind) {
        case CollectiveKind::kAllGather:
          Transfer(m, peer, 0, job_.block, in, "block", [this, m](int to, const auto& p) {
            if (job_.numerics) {
              std::copy(p.begin(), p.end(), (*job_.out)[to].begin() + job_.block * m);
            }
          });
          break;
        case CollectiveKind::kAllToAll: {
          if (job_.ragged) {
            SendRaggedSlices(m, peer);
            break;
          }
          auto [lo, hi] = Chunk(peer);
          Transfer(m, peer, lo, hi, in, "chunk", [this, m](int to, const auto& p) {
            if (job_.numerics) {
              std::copy(p.begin(), p.end(), (*job_.out)[to].begin() + job_.block * m);
            }
          });
          break;
        }
        case CollectiveKind::kReduceScatter: {
          auto [lo, hi] = Chunk(peer);
          Transfer(m, peer, lo, hi, in, "chunk", [this](int to, const auto& p) {
            if (job_.numerics) {
              Combine(job_.reduce, job_.dtype, (*job_.out)[to].data(), p.data(),
                      static_cast<int64_t>(p.size()));
            }
          });
          break;
        }
        case CollectiveKind::kAllReduce: {
          auto [lo, hi] = Chunk(peer);
          Transfer(m, peer, lo, hi, in, "reduce", [this, lo](int to, const auto& p) {
            if (job_.numerics) {
              Combine(job_.reduce, job_.dtype, (*job_.out)[to].data() + lo, p.data(),
                      static_cast<int64_t>(p.size()));
            }
            if (++state_[to].reduced == job_.size() - 1) SendReducedChunk(to);
          });
          break;
        }
        case CollectiveKind::kPermute:
          break;
      }
    }
    if (job_.kind == CollectiveKind::kAllReduce && g == 1) SendReducedChunk(m);
    if (job_.kind == CollectiveKind::kPermute) {
      int d = job_.destination[m];
      if (d >= 0 && d != m) {
        Transfer(m, d, 0, job_.block, in, "block", [this](int to, const auto& p) {
          if (job_.numerics) (*job_.out)[to] = p;
        });
      }
    }
  }

  // ragged_all_to_all: the slices `from` sends `to`, packed into one message in slice order
  // and written at their rows of `to`'s output on arrival.
  void SendRaggedSlices(int from, int to) {
    const RaggedPlan& plan = *job_.ragged;
    const int64_t row = plan.row_elements;
    const std::vector<RaggedSlice>& slices =
        plan.slices[static_cast<size_t>(from) * job_.size() + to];
    const std::vector<float>& in = (*job_.in)[from];
    std::vector<float> packed;
    packed.reserve(static_cast<size_t>(plan.Elements(from, to)));
    for (const RaggedSlice& s : slices) {
      packed.insert(packed.end(), in.begin() + s.src_row * row,
                    in.begin() + (s.src_row + s.rows) * row);
    }
    Transfer(from, to, 0, static_cast<int64_t>(packed.size()), &packed, "slices",
             [this, &slices, row](int dst, const auto& p) {
               auto at = p.begin();
               for (const RaggedSlice& s : slices) {
                 std::copy(at, at + s.rows * row, (*job_.out)[dst].begin() + s.dst_row * row);
                 at += s.rows * row;
               }
             });
  }

  // All-reduce, second round: member m's chunk m is fully reduced; send it to every peer.
  void SendReducedChunk(int m) {
    int g = job_.size();
    auto [lo, hi] = Chunk(m);
    const std::vector<float>* out = job_.numerics ? &(*job_.out)[m] : nullptr;
    for (int i = 1; i < g; ++i) {
      int peer = (m + i) % g;
      Transfer(m, peer, lo, hi, out, "gather", [this, lo](int to, const auto& p) {
        if (job_.numerics) std::copy(p.begin(), p.end(), (*job_.out)[to].begin() + lo);
      });
    }
  }

  void MaybeDone(int m) {
    MemberState& s = state_[m];
    if (s.done || s.received < s.expected) return;
    // A permute's sender is done once its block was delivered (like collective-permute-done,
    // which waits for its send and its receive); other kinds once all their data is in.
    if (job_.kind == CollectiveKind::kPermute && s.pending_sends > 0) return;
    s.done = true;
    job_.on_member_done(m);
  }

  Network& network_;
  CollectiveJob& job_;
  std::vector<MemberState> state_;
  std::vector<int64_t> bounds_;
};

}  // namespace

std::unique_ptr<CollectiveAlgorithm> MakeDirectAlgorithm(Network& network, CollectiveJob& job) {
  return std::make_unique<Direct>(network, job);
}

}  // namespace shardsim
