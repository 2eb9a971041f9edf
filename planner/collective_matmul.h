// Collective matmuls chosen by the partitioner: an all-gather whose only reader is a matmul
// becomes one allgather_matmul, whose ppermute loop overlaps each block's transfer with the
// product of the block before (the seed notebook's collective matmul; XLA's windowed einsum,
// `xla_tpu_enable_windowed_einsum_for_all_gather`). Plans ask for it with `collective_matmul`.
#pragma once

#include <string>

#include "collectives/mesh.h"
#include "planner/partitioner.h"

namespace shardsim::planner {

// What `collective_matmul:` asks of a plan.
enum class CollectiveMatmulMode {
  kOff,             // Gathers stay blocking collectives.
  kUnidirectional,  // Blocks travel one way round the group.
  // Half of each block each way (both directions of every link); one way where a travelling
  // block has an odd number of rows (or columns) to halve.
  kBidirectional,
  // Per gather (or scatter), the faster of blocking and kBidirectional's loop, each timed alone
  // on the machine; a weight's gather, and a weight gradient's scatter, stay blocking where the
  // step prefetches weights (FuseCollectiveMatmuls' weights_prefetched). A search listing
  // [off, auto] compares whole steps.
  kAuto,
};

// The SPEC name of a mode ("off", "unidirectional", "bidirectional", "auto").
const char* CollectiveMatmulModeName(CollectiveMatmulMode mode);
// Parses a mode name; false for an unknown one.
bool ParseCollectiveMatmulMode(const std::string& name, CollectiveMatmulMode* mode);

// Rewrites `partitioned` (a manual program on `mesh`) in place: each tiled all_gather whose
// result one matmul or einsum reads (or several, below), and nothing else (no output), fuses with
// it into an allgather_matmul of the forms it has (collective_matmul.h), the product read as x
// [rows..., K...] @ w [K..., N...] with each group folded by free reshapes (an operand read
// transposed, w stored [N..., K...] or x [K..., rows...], is turned by a fused transpose of
// its local block first: XLA's dot reads it in place):
// - the gathered value is w (a weight: FSDP's embed, gathered along its first contracted
//   dimension, or along its first kept one);
// - or it is x, gathered along a row dimension every one before which is 1 on the device
//   (its rows travel), or, x 2-D, along K;
// the product's first operand being x (a product read with its operands the other way round,
// and an x read transposed that would travel, keep their gathers). A gathered x that several
// such products read (sequence parallelism's q, k and v) fuses with all of them into one loop
// over their weights side by side (fused concatenation and slices).
// An einsum counts when its spec is such a product ("btd,df->btf", "btd,dhk->bthk",
// "btf,df->btd"). Likewise each tiled psum_scatter of such a product, read by nothing else,
// becomes one matmul_reduce_scatter, scattered along the rows or the first kept dimension; the
// product may also be a weight's gradient, x read transposed ("btd,btf->df", or with the
// operands the other way round, "btf,btd->df": FSDP's gradient reduce-scatters). A product
// with a result dtype of its own (FP8's) keeps its collectives: the loops compute in the
// operands' dtype.
// The rewritten op keeps the matmul's name (the first product's, for several) and output (its
// result sliced, for several); its reason names the fused collective. kAuto
// times each pair both ways as a program of its own on `machine`, collectives from `collectives`
// (both required for it; equal pairs are timed once). With `weights_prefetched` (the step's weight
// collectives are issued a layer ahead: PrefetchWeightCollectives), kAuto leaves a weight's gather
// (WeightOpsOf) blocking: prefetching overlaps it with the layer before, where the loop could
// overlap it only with its own product, which the loop lengthens; and likewise a weight
// gradient's scatter, which nothing reads until the optimizer, so that it overlaps the rest of
// the backward. Returns how many it fused.
int FuseCollectiveMatmuls(PartitionResult& partitioned, const Mesh& mesh, CollectiveMatmulMode mode,
                          const Machine* machine = nullptr,
                          CollectiveCostModel* collectives = nullptr,
                          bool weights_prefetched = false);

}  // namespace shardsim::planner
