// Token routing of a mixture-of-experts layer with a fixed expert capacity (GShard, Lepikhin et
// al. 2020; MaxText's "dropping" MoE): each token's top-k expert choices take the next free
// slot of their expert within the token's group; an expert holds `capacity` slots per group and
// the assignments that find it full are dropped. The result is the dense dispatch mask
// [groups..., S, E, C] (1 where token s fills slot c of expert e), which einsums turn into the
// experts' inputs ("gsec,gsm->egcm") and, weighted by the gates, back into the layer's output
// ("gsec,egcm->gsm"). The mask depends on the (integer) choices only, so no gradient flows
// through it, as in JAX.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/array.h"
#include "collectives/local_ops.h"
#include "collectives/program.h"

namespace shardsim {

// Which assignments take an expert's slots first.
enum class RoutePriority {
  kToken,   // Token by token in order, each token's k choices in turn (MaxText's cumsum).
  kChoice,  // Every token's first choice in token order, then every second choice (GShard).
};

// moe_route(indices [G..., S, k] i32) -> the dispatch mask [G..., S, experts, capacity] in
// `dtype`. Each group (the leading dimensions) routes its S tokens alone. Throws
// std::invalid_argument ("moe_route: ...") for rank < 2, float indices, experts or capacity
// < 1, or an index outside [0, experts).
Array MoeRoute(const Array& indices, int64_t experts, int64_t capacity, RoutePriority priority,
               DType dtype);

// The priority a moe_route op's `priority` attribute names.
RoutePriority RoutePriorityOf(const OpSpec& op);

// The result dtype of one_hot and moe_route: their `dtype` attribute. Throws
// std::invalid_argument for an unknown one.
DType MaskDType(const OpSpec& op);

// moe_route's cost: one count per assignment (FLOPs); the indices read, the mask written whole
// (zeros included).
OpCost MoeRouteCost(const std::vector<const Array*>& inputs,
                    const std::vector<const Array*>& outputs);

// The share of the assignments (G S k of `indices`' shape) that moe_route's mask `dispatch`
// dropped: 1 - ones / assignments.
double DroppedFraction(const Array& dispatch, const Shape& indices);

}  // namespace shardsim
