#include "collectives/device_put.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardsim {
namespace {

// Copies the box [lo, hi) (global indices) from a block starting at `src_start` of shape
// `src_shape` into a block starting at `dst_start` of shape `dst_shape`, both row-major.
void CopyBox(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, const float* src,
             const Shape& src_shape, const std::vector<int64_t>& src_start, float* dst,
             const Shape& dst_shape, const std::vector<int64_t>& dst_start) {
  const size_t rank = lo.size();
  if (rank == 0) {
    *dst = *src;
    return;
  }
  // Row-major strides of both blocks.
  std::vector<int64_t> src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst_shape[d];
  }
  const int64_t run = hi[rank - 1] - lo[rank - 1];
  std::vector<int64_t> at = lo;  // The current row's global index (last dimension at lo).
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      s += (at[d] - src_start[d]) * src_stride[d];
      t += (at[d] - dst_start[d]) * dst_stride[d];
    }
    std::copy(src + s, src + s + run, dst + t);
    // The next row: an odometer over every dimension but the last.
    size_t d = rank - 1;
    while (d > 0) {
      --d;
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
      if (d == 0) return;
    }
    if (rank == 1) return;
  }
}

class DevicePutTransfers : public CollectiveAlgorithm {
 public:
  DevicePutTransfers(Network& network, CollectiveJob& job, const DevicePutPlan& plan)
      : network_(network), job_(job), plan_(plan) {}

  void Start() override {
    const int s = plan_.sources;
    left_.assign(static_cast<size_t>(job_.size()), 0);
    for (const DevicePutMessage& m : plan_.messages) {
      ++left_[m.from];
      ++left_[s + m.to];
    }
    if (job_.numerics) {
      for (int q = 0; q < plan_.destinations; ++q) {
        (*job_.out)[s + q].assign(static_cast<size_t>(NumElements(plan_.to_block)), 0.0f);
      }
    }
    // Members with nothing to send or receive are done at once.
    for (int m = 0; m < job_.size(); ++m) {
      if (left_[m] == 0) job_.on_member_done(m);
    }
    for (const DevicePutMessage& m : plan_.messages) Send(m);
  }

 private:
  void Send(const DevicePutMessage& m) {
    const int s = plan_.sources;
    // The box, packed in row-major order of its own shape.
    std::vector<float> payload;
    Shape box;
    for (size_t d = 0; d < m.lo.size(); ++d) box.push_back(m.hi[d] - m.lo[d]);
    if (job_.numerics) {
      payload.resize(static_cast<size_t>(m.elements));
      CopyBox(m.lo, m.hi, (*job_.in)[m.from].data(), plan_.from_block, plan_.from_offset[m.from],
              payload.data(), box, m.lo);
    }
    std::string label;
    if (network_.tracing()) {
      label = job_.label + " box " + std::to_string(m.from) + "\xE2\x86\x92" + std::to_string(m.to);
    }
    job_.Send(network_, m.from, s + m.to, m.elements, std::move(label),
              [this, &m, s, box = std::move(box), payload = std::move(payload)]() {
                if (job_.numerics) {
                  CopyBox(m.lo, m.hi, payload.data(), box, m.lo, (*job_.out)[s + m.to].data(),
                          plan_.to_block, plan_.to_offset[m.to]);
                }
                if (--left_[m.from] == 0) job_.on_member_done(m.from);
                if (--left_[s + m.to] == 0) job_.on_member_done(s + m.to);
              });
  }

  Network& network_;
  CollectiveJob& job_;
  const DevicePutPlan& plan_;
  std::vector<int> left_;  // Per member: messages not yet delivered.
};

}  // namespace

DevicePutPlan PlanDevicePut(const Sharding& from, const Sharding& to) {
  if (from.global_shape() != to.global_shape()) {
    throw std::invalid_argument("device_put: the source and destination global shapes differ");
  }
  DevicePutPlan plan;
  plan.sources = from.mesh().size();
  plan.destinations = to.mesh().size();
  plan.from_block = from.LocalShape();
  plan.to_block = to.LocalShape();
  const size_t rank = from.global_shape().size();
  // Source blocks by block index, each with its replicas in position order.
  std::map<std::vector<int64_t>, std::vector<int>> replicas;
  for (int p = 0; p < plan.sources; ++p) {
    plan.from_offset.push_back(from.BlockOffset(p));
    replicas[from.BlockIndex(p)].push_back(p);
  }
  std::map<std::vector<int64_t>, size_t> served;  // Per source block: destinations served.
  for (int q = 0; q < plan.destinations; ++q) {
    plan.to_offset.push_back(to.BlockOffset(q));
    const std::vector<int64_t>& start = plan.to_offset.back();
    for (const auto& [block, holders] : replicas) {
      const std::vector<int64_t>& src = plan.from_offset[holders[0]];
      DevicePutMessage m;
      m.elements = 1;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t lo = std::max(start[d], src[d]);
        const int64_t hi = std::min(start[d] + plan.to_block[d], src[d] + plan.from_block[d]);
        m.lo.push_back(lo);
        m.hi.push_back(hi);
        m.elements *= std::max<int64_t>(0, hi - lo);
      }
      if (m.elements == 0) continue;
      m.from = holders[served[block]++ % holders.size()];
      m.to = q;
      plan.messages.push_back(std::move(m));
    }
  }
  return plan;
}

std::unique_ptr<CollectiveAlgorithm> MakeDevicePutTransfers(Network& network, CollectiveJob& job,
                                                            const DevicePutPlan& plan) {
  if (job.size() != plan.sources + plan.destinations) {
    throw std::logic_error("internal error: a device_put job's members are not its two meshes");
  }
  return std::make_unique<DevicePutTransfers>(network, job, plan);
}

std::vector<Array> ReferenceDevicePut(const Sharding& from, const Sharding& to,
                                      const std::vector<Array>& blocks) {
  const Array global = from.Assemble(blocks);
  std::vector<Array> out;
  for (int q = 0; q < to.mesh().size(); ++q) out.push_back(to.Shard(global, q));
  return out;
}

}  // namespace shardsim
