#include "collectives/collective.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "collectives/array.h"

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

Bytes CollectiveJob::WireBytes(int64_t elements) const {
  const int64_t bytes = BytesOf(elements).count();
  if (wire_factor == 1.0) return Bytes(bytes);
  return Bytes(static_cast<int64_t>(std::ceil(static_cast<double>(bytes) * wire_factor)));
}

TransferId CollectiveJob::Send(Network& network, int from, int to, int64_t elements,
                               std::string&& label, Callback&& on_delivered,
                               Callback&& on_drained) const {
  return network.Start(members[from], members[to], WireBytes(elements), std::move(label),
                       std::move(on_delivered), std::move(on_drained), step_latency, split_routes);
}

std::vector<float> InitialWorkBuffer(const CollectiveJob& job, int member) {
  const std::vector<float>& in = (*job.in)[member];
  if (job.kind != CollectiveKind::kAllGather) return in;
  std::vector<float> work(static_cast<size_t>(job.block) * job.size(), 0.0f);
  std::copy(in.begin(), in.end(), work.begin() + job.block * member);
  return work;
}

namespace {

// dst[i] = f(dst[i], src[i]) for i < n.
template <typename F>
void CombineWith(F f, float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
}

}  // namespace

void Combine(ReduceOp op, DType dtype, float* dst, const float* src, int64_t n) {
  if (dtype == DType::kI32) {
    // Integer words: sums wrap modulo 2^32 (unsigned arithmetic, two's complement as XLA),
    // max/min compare the integers exactly.
    switch (op) {
      case ReduceOp::kSum:
        return CombineWith(
            [](float a, float b) {
              return IntToWord(static_cast<int32_t>(static_cast<uint32_t>(WordToInt(a)) +
                                                    static_cast<uint32_t>(WordToInt(b))));
            },
            dst, src, n);
      case ReduceOp::kMax:
        return CombineWith(
            [](float a, float b) { return IntToWord(std::max(WordToInt(a), WordToInt(b))); }, dst,
            src, n);
      case ReduceOp::kMin:
        return CombineWith(
            [](float a, float b) { return IntToWord(std::min(WordToInt(a), WordToInt(b))); }, dst,
            src, n);
    }
    return;
  }
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      break;
    case ReduceOp::kMax:  // NaN propagates from either side, as XLA's max.
      CombineWith([](float a, float b) { return (a > b || a != a) ? a : b; }, dst, src, n);
      break;
    case ReduceOp::kMin:  // NaN propagates from either side, as XLA's min.
      CombineWith([](float a, float b) { return (a < b || a != a) ? a : b; }, dst, src, n);
      break;
  }
}

}  // namespace shardsim
