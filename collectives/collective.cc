#include "collectives/collective.h"

#include <algorithm>

namespace shardsim {

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kPermute:
      return "permute";
  }
  return "collective";
}

std::vector<float> InitialWorkBuffer(const CollectiveJob& job, int member) {
  const std::vector<float>& in = (*job.in)[member];
  if (job.kind != CollectiveKind::kAllGather) return in;
  std::vector<float> work(static_cast<size_t>(job.block) * job.size(), 0.0f);
  std::copy(in.begin(), in.end(), work.begin() + job.block * member);
  return work;
}

void Combine(ReduceOp op, float* dst, const float* src, int64_t n) {
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) dst[i] = std::min(dst[i], src[i]);
      break;
  }
}

}  // namespace shardsim
