// Dropless mixture of experts (MaxText's sparse_matmul path with megablox and ragged_all_to_all,
// capacity_factor -1): the shard_map body that sends every token's top-k copies to the
// devices holding their experts, runs each expert's MLP as grouped matmuls (ragged_dot) over
// exactly the rows routed to it, and brings the results back. No token is dropped; how many
// rows each message and each group carries is decided by the routing, so imbalance changes
// the time where the data is real. A bounded receive buffer (buffer_factor) drops the rows
// that overflow it instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/partition_spec.h"
#include "collectives/program.h"

namespace shardsim::planner {

// What a dropless MoE region is built from: the tokens' and the experts' shapes and how the
// mesh splits them (the region's in_specs).
struct DroplessMoeLayout {
  std::vector<MeshAxis> mesh;         // The global program's mesh axes.
  int64_t batch = 1;                  // Sequences of the tokens [batch, length, d_model] (global).
  int64_t length = 1;                 // Tokens per sequence.
  int64_t d_model = 1;                // Token width.
  int64_t d_ff = 1;                   // One expert's MLP width.
  int64_t experts = 1;                // Routed experts.
  int64_t top_k = 1;                  // Experts each token is sent to.
  bool gated = true;                  // SwiGLU (gate and up projections) or one up projection.
  OpKind activation = OpKind::kSilu;  // silu (SwiGLU), gelu or relu.
  DType dtype = DType::kF32;          // The tokens', gates' and weights' type.
  std::vector<std::string> batch_axes;   // Axes splitting the tokens' batch dimension.
  std::vector<std::string> length_axes;  // Axes splitting their length dimension.
  std::vector<std::string> expert_axes;  // Axes splitting the experts (the dispatch group).
  std::vector<std::string> mlp_axes;     // Axes splitting each expert's MLP width.
  std::vector<std::string> embed_axes;   // Axes splitting the weights' d_model (gathered).
  // Rows of each device's receive buffer, as a multiple of the rows it routes (what it receives
  // when routing is balanced), rounded up (MaxText's ragged_buffer_factor). Rows that would land
  // past it are not sent: those copies are dropped (their expert adds nothing to the token).
  // <= 0, or at least the group size: the worst case, every member's rows (nothing dropped).
  double buffer_factor = -1;
  // The tokens are split over none of the expert axes but held whole by every member of an
  // expert group (a decode step whose batch is too small to split over them): each device runs
  // its own experts over the copies routed to them, and the partial outputs are summed over
  // the expert axes (a psum, no all-to-all), as small-batch MoE decoding does.
  // Without it, the expert axes the batch and length axes name split the tokens and the
  // dispatch runs over them (DroplessDispatchAxes); over the other expert axes the members
  // hold the same tokens, each sends only the copies bound for its own column of the expert
  // group (the members that share its coordinates along those axes), and the outputs are
  // summed over them.
  bool tokens_replicated = false;
};

// The in_spec of the tokens, of the top-k choices and gates ([batch, length, top_k]) and the
// out_spec of the result: batch over batch_axes, length over length_axes.
PartitionSpec DroplessTokenSpec(const DroplessMoeLayout& layout);
// The in_spec of an expert weight [experts, d_model, d_ff] (`down`: [experts, d_ff, d_model]).
PartitionSpec DroplessWeightSpec(const DroplessMoeLayout& layout, bool down);

// The shard_map body (mode: manual) on layout.mesh. Its arrays, in this order: x [batch,
// length, d_model], choice [batch, length, top_k] i32 (each token's experts), gates [batch,
// length, top_k] (their weights), then the experts' weights gate (when gated), up and down. Its
// first output, y [batch, length, d_model], is sum_j gates[j] * expert_{choice[j]}(x) over the
// copies kept; with bounded buffers (DroplessBounded) a second, f32 [devices] (one per device,
// split over every mesh axis), counts the copies each device routed that did not fit, divided
// by the devices that hold the same tokens: its sum is the copies dropped. Throws
// std::invalid_argument when the layout does not divide.
ProgramSpec DroplessMoeBody(const DroplessMoeLayout& layout);

// The name the model builder gives the second output of a bounded dropless region (followed
// by the layer), which MoeDroppedFraction reads.
inline constexpr char kDroppedCopiesName[] = "moe_dropped";

// The expert axes that split the region's tokens (those its dispatch runs over): every expert
// axis the batch or length axes name; none when the tokens are replicated.
std::vector<std::string> DroplessDispatchAxes(const DroplessMoeLayout& layout);

// Whether the body's receive buffers are bounded (buffer_factor below the expert group's size),
// so that it may drop copies and has its second output.
bool DroplessBounded(const DroplessMoeLayout& layout);

}  // namespace shardsim::planner
