// One collective on one group of devices, in the flat form the algorithms work on.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/dtype.h"
#include "sim/simulator.h"
#include "topology/network.h"

namespace shardsim {

struct RaggedPlan;

// The collectives algorithms implement. The executor maps JAX's ops onto them: psum/pmean/
// pmax/pmin -> kAllReduce, psum_scatter -> kReduceScatter, all_gather -> kAllGather,
// all_to_all -> kAllToAll, ppermute -> kPermute.
enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce, kAllToAll, kPermute };

// "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "permute".
const char* CollectiveKindName(CollectiveKind kind);

// How partial values combine.
enum class ReduceOp { kSum, kMax, kMin };

// A contiguous run of elements in a member's flat buffer.
struct Segment {
  int64_t offset = 0;  // First element.
  int64_t length = 0;  // Number of elements.
};

// Combines `n` received elements into `dst` with `op`, as XLA does for `dtype`: floats add in
// float32, and max/min propagate NaN; i32 elements (Array's int32 words) add wrapping modulo
// 2^32 and compare exactly.
void Combine(ReduceOp op, DType dtype, float* dst, const float* src, int64_t n);

// One collective over a group, in flat form. Member m is the m-th device of the group in the
// op's logical order (JAX's axis_index over the named axes). Buffers are flat row-major:
// - kAllGather: in = one block of `block` elements; out = G blocks, member j's at j*block.
// - kReduceScatter: in = G chunks of `block` elements (chunk j contiguous at j*block); out =
//   the reduction of chunk m over all members.
// - kAllReduce: in = out = `total` elements, reduced elementwise over all members.
// - kAllToAll: in = G chunks of `block` (chunk j is for member j); out = G chunks, the one
//   from member j at j*block.
// - kPermute: in = out = `block` elements; member m's block goes to destination[m] (-1: none);
//   members no one sends to get zeros.
struct CollectiveJob {
  CollectiveKind kind = CollectiveKind::kAllReduce;  // What to compute.
  ReduceOp reduce = ReduceOp::kSum;                  // For reductions.
  DType dtype = DType::kF32;                         // Element type: bytes and rounding.
  std::vector<VertexId> members;                     // Device vertex of each member.
  int64_t block = 0;                                 // Elements per block / chunk.
  int64_t total = 0;                                 // kAllReduce: elements per member.
  std::vector<int> destination;                      // kPermute: per member, or -1.
  bool numerics = true;                              // Move and combine real data.
  std::vector<std::vector<float>>* in = nullptr;     // Per member input (numerics only).
  std::vector<std::vector<float>>* out = nullptr;    // Per member output (filled).
  std::string label;                                 // Names transfers in the trace.
  // Called once per member when its output is complete.
  std::function<void(int member)> on_member_done;
  // The protocol's cost per message (NCCL's per-step latency; zero off NCCL machines).
  Time step_latency;
  // Bytes on the wire per payload byte: 1 / the protocol's efficiency (1 off NCCL machines).
  double wire_factor = 1.0;
  // Whether a message may be split over several minimal routes (CommSpec::multipath): a
  // permute's point-to-point messages (see direct.cc); ring steps go to a neighbour.
  bool split_routes = false;
  // kAllToAll as jax.lax.ragged_all_to_all (null: none; not owned): member m sends member j
  // the slices ragged->slices[m * G + j] of its input (rows of ragged->row_elements elements),
  // written at their rows of j's output, which starts as the op's `output` (`out` holds it
  // when the job starts). Only `direct` runs it.
  const RaggedPlan* ragged = nullptr;

  // Number of members.
  int size() const { return static_cast<int>(members.size()); }
  // Bytes of `elements` elements of this dtype.
  Bytes BytesOf(int64_t elements) const { return Bytes(elements * DTypeSize(dtype)); }
  // Bytes a message of `elements` elements puts on the wire: BytesOf scaled by wire_factor.
  Bytes WireBytes(int64_t elements) const;
  // Sends `elements` elements from member `from` to member `to` as one protocol message:
  // WireBytes on the network, delivered step_latency after its last byte arrives.
  TransferId Send(Network& network, int from, int to, int64_t elements, std::string&& label,
                  Callback&& on_delivered, Callback&& on_drained = Callback()) const;
};

// The buffer a member works in, in the output layout: for all-gather, G blocks with its own in
// place (the others zero until they arrive); otherwise a copy of its input (reduce-scatter and
// all-reduce combine into it).
std::vector<float> InitialWorkBuffer(const CollectiveJob& job, int member);

// Runs one collective job. Implementations schedule point-to-point transfers on the Network
// and local combines of the real chunks they carry; one per algorithm file in algorithms/.
class CollectiveAlgorithm {
 public:
  virtual ~CollectiveAlgorithm() = default;
  // Starts the collective now; every member's input is ready. The job, simulator and
  // network must outlive the run.
  virtual void Start() = 0;
};

}  // namespace shardsim
