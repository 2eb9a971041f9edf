// Rematerialization (jax.checkpoint on each layer): a backward pass recomputes a layer's
// forward values instead of keeping them alive from the forward pass, trading compute for
// activation memory.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "collectives/program.h"

namespace shardsim::planner {

// Which forward values of a layer its backward keeps (SPEC plan.remat).
enum class RematPolicy {
  kNone,       // Every value the backward reads is kept.
  kSelective,  // The outputs of matmuls (einsum, matmul) are kept; the rest (norms, the
               // attention core, activations, casts) recomputed: Megatron's selective
               // recompute, MaxText's `minimal` (jax.checkpoint_policies dots saveable).
  kFull,       // Only the layer's inputs are kept; its whole forward is recomputed.
  // The layer's inputs and the values the plan names (MaxText's checkpoint names,
  // `plan.remat: {save: [...]}`) are kept, the rest recomputed: MaxText's `custom` policy, and
  // torchtitan's op-level selective AC written as the values it saves.
  kCustom,
};

// How much of a layer's forward `policy` recomputes (and memory it saves): none 0, selective
// 1, full 2; custom 2 (it may recompute as much as full, never more).
int RematRank(RematPolicy policy);

// The name SPEC gives `policy` ("none", "selective", "full"; "custom").
const char* RematPolicyName(RematPolicy policy);

// `policy` as reports name it: its SPEC name, and a custom policy's saved checkpoint names
// ("custom (save query_proj, context)").
std::string RematText(RematPolicy policy, const std::vector<std::string>& save);

// The suffix of a recomputed value's name: value v's recomputation is v + kRematSuffix.
inline constexpr const char* kRematSuffix = "_rc";

// Whether op `name` is a recomputation ApplyRemat inserted.
bool IsRecompute(const std::string& name);

// Rewrites `expanded` (a global program after ExpandGrads, with its passes' [start, end) op
// indices in `pass_starts`, two per grad) so that each backward pass recomputes what `policy`
// does not keep. `segments` lists, per checkpointed layer (and microbatch), the names of the
// values its forward ops make. A value of a segment is kept when the policy keeps it or when
// an op outside the segment's forward reads it in the forward (the layer's output); a value
// that is not kept and that a backward pass reads is recomputed there: just before the pass's
// first op reading any such value of the segment, the segment's forward ops that make them
// (and, recursively, the values they read that are not kept) are repeated with outputs named
// v + kRematSuffix, and the pass reads those instead. So the forward's copies die after their
// last forward reader, and the recompute runs as ordinary ops (sharded, costed and traced like
// the rest). `pass_starts` is updated for the inserted ops. kNone changes nothing; names bound
// twice are never recomputed. Values in `saved` are kept whatever the policy (a custom policy's
// saved or offloaded names); kCustom keeps them and the segments' inputs, as kFull does.
void ApplyRemat(ProgramSpec& expanded, std::vector<size_t>& pass_starts,
                const std::vector<std::vector<std::string>>& segments, RematPolicy policy,
                const std::set<std::string>& saved = {});

}  // namespace shardsim::planner
