// Host offload of saved activations (MaxText's remat_policy "custom" with values set to
// "offload", XLA's host offloading): a value the backward pass needs is copied to host memory
// as soon as the forward makes it, freeing its HBM, and copied back a layer before the backward
// reads it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/program.h"
#include "planner/remat.h"

namespace shardsim::planner {

// The names MaxText's decoder layer gives its checkpointable values (jax.ad_checkpoint's
// checkpoint_name; the keys of its custom remat policy), the names plan.offload takes.
const std::vector<std::string>& CheckpointNames();

// Whether remat `policy` keeps the layer value checkpoint `name` names anyway, so that offloading
// it saves no recompute: every policy keeps the layer's input, none and selective the
// projections (matmul outputs), only none the attention's output; custom the names in `save`.
bool RematKeeps(RematPolicy policy, const std::string& name,
                const std::vector<std::string>& save = {});

// Rewrites `expanded` (a global program after ExpandGrads and ApplyRemat, its passes' [start,
// end) op indices in `pass_starts`) so that each value of `offloaded` (per segment, in forward
// order: the values of one layer and microbatch) lives in host memory between its forward and
// backward uses. The value is copied to host memory (move_to_host, output v + "_host", a
// number added where the program binds that name) just after the op making it; the backward ops
// reading it read v + "_dev" (likewise) instead, copied back by a
// move_to_device placed before the first backward reader of the segment whose backward runs
// just before this one's (a layer ahead, as XLA's scheduler prefetches), or at the start of
// its backward pass when none runs before. Forward readers keep reading v, which dies after
// the last of them and its copy. Values no backward op reads are left alone. `pass_starts` is
// updated for the inserted ops.
void ApplyOffload(ProgramSpec& expanded, std::vector<size_t>& pass_starts,
                  const std::vector<std::vector<std::string>>& offloaded);

}  // namespace shardsim::planner
