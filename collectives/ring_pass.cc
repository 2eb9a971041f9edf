#include "collectives/ring_pass.h"

#include <cassert>
#include <utility>

namespace shardsim {

RingPass::RingPass(Network& network, const CollectiveJob& job, Mode mode,
                   std::vector<std::vector<int>> rings, ChunkLayout layout, const ChunkCount& count,
                   std::vector<std::vector<float>>* work,
                   std::function<void(int member)> on_member_done)
    : network_(network),
      job_(job),
      mode_(mode),
      rings_(std::move(rings)),
      layout_(std::move(layout)),
      work_(work),
      on_member_done_(std::move(on_member_done)),
      positions_(job.size()) {
  for (size_t i = 0; i < rings_.size(); ++i) {
    ring_offset_.push_back(static_cast<int>(chunk_elements_.size()));
    for (size_t r = 0; r < rings_[i].size(); ++r) {
      Position& p = positions_[rings_[i][r]];
      p.ring = static_cast<int>(i);
      p.index = static_cast<int>(r);
      chunk_elements_.push_back(count(static_cast<int>(i), static_cast<int>(r)));
    }
  }
}

int64_t RingPass::ChunkElements(int ring, int index) const {
  return chunk_elements_[ring_offset_[ring] + index];
}

void RingPass::StartAll() {
  for (const std::vector<int>& ring : rings_) {
    for (int member : ring) StartMember(member);
  }
}

void RingPass::StartMember(int member) {
  Position& p = positions_[member];
  assert(!p.started);
  p.started = true;
  int n = static_cast<int>(rings_[p.ring].size());
  if (n == 1) {
    on_member_done_(member);
    return;
  }
  Send(member, 0);
  // Arrivals that came early, in step order (a ring delivers steps in order).
  std::vector<std::pair<int, std::vector<float>>> held;
  held.swap(p.held);
  for (auto& [step, payload] : held) Handle(member, step, payload);
}

void RingPass::Send(int member, int step) {
  const Position& p = positions_[member];
  const std::vector<int>& ring = rings_[p.ring];
  int n = static_cast<int>(ring.size());
  // Reduce-scatter forwards the partial of chunk (r - s - 1); all-gather the chunk (r - s).
  // back is in [0, n - 1] and index in [0, n): no division needed (this runs per transfer).
  int back = mode_ == Mode::kReduceScatter ? step + 1 : step;
  int chunk = p.index - back;
  if (chunk < 0) chunk += n;
  int next = ring[p.index + 1 == n ? 0 : p.index + 1];
  std::string label;
  if (network_.tracing()) {
    label = job_.label + " step " + std::to_string(step + 1) + "/" + std::to_string(n - 1);
  }
  if (!job_.numerics || !work_) {  // Timing only: no payload to carry.
    job_.Send(network_, member, next, ChunkElements(p.ring, chunk), std::move(label),
              [this, next, step] { Arrive(next, step, {}); });
    return;
  }
  std::vector<float> payload;
  const std::vector<float>& buf = (*work_)[member];
  payload.reserve(static_cast<size_t>(ChunkElements(p.ring, chunk)));
  layout_(p.ring, chunk, &scratch_);
  for (const Segment& s : scratch_) {
    payload.insert(payload.end(), buf.begin() + s.offset, buf.begin() + s.offset + s.length);
  }
  job_.Send(network_, member, next, ChunkElements(p.ring, chunk), std::move(label),
            [this, next, step, payload = std::move(payload)]() mutable {
              Arrive(next, step, std::move(payload));
            });
}

void RingPass::Arrive(int member, int step, std::vector<float> payload) {
  Position& p = positions_[member];
  if (!p.started) {
    p.held.emplace_back(step, std::move(payload));
    return;
  }
  Handle(member, step, payload);
}

void RingPass::Handle(int member, int step, const std::vector<float>& payload) {
  Position& p = positions_[member];
  int n = static_cast<int>(rings_[p.ring].size());
  // The chunk the predecessor sent at `step`, seen from this position: (r - 1 - back).
  int back = mode_ == Mode::kReduceScatter ? step + 1 : step;
  int chunk = p.index - 1 - back;  // In [-n, n).
  if (chunk < 0) chunk += n;
  if (job_.numerics && work_) {
    std::vector<float>& buf = (*work_)[member];
    const float* src = payload.data();
    layout_(p.ring, chunk, &scratch_);
    for (const Segment& s : scratch_) {
      if (mode_ == Mode::kReduceScatter) {
        Combine(job_.reduce, job_.dtype, buf.data() + s.offset, src, s.length);
      } else {
        std::copy(src, src + s.length, buf.begin() + s.offset);
      }
      src += s.length;
    }
  }
  ++p.processed;
  if (step + 1 < n - 1) Send(member, step + 1);
  if (p.processed == n - 1) on_member_done_(member);
}

}  // namespace shardsim
