// jax.lax.ragged_all_to_all: its type rule, the point-to-point messages it makes from real
// index data, the message sizes assumed when there is no data, and its reference result.
//
// ragged_all_to_all(operand [N, ...], output [M, ...], input_offsets [K], send_sizes [K],
//                   output_offsets [K], recv_sizes [K]; axis_name) -> [M, ...]
// (JAX's argument order; the four index vectors are i32, K a multiple of the group size G,
// spd = K / G slices per peer). Member m sends, for every slice i, rows
// operand[input_offsets[i] : + send_sizes[i]] to member i / spd, which writes them at rows
// output_offsets[i] of its result (offsets are the sender's view of the receiver's buffer);
// every other row of the result keeps `output`'s value. recv_sizes[j] on the receiver is the
// size it expects of slice j from member j / spd, and must equal what that member sends
// (jnp.all(send_sizes == all_to_all(recv_sizes)), JAX's precondition).
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/array.h"
#include "collectives/mesh.h"
#include "collectives/program.h"

namespace shardsim {

// One slice a member sends: rows [src_row, src_row + rows) of its operand, written at rows
// [dst_row, dst_row + rows) of the receiver's result.
struct RaggedSlice {
  int64_t src_row = 0;  // First operand row.
  int64_t rows = 0;     // Rows sent.
  int64_t dst_row = 0;  // First result row on the receiver.
};

// The messages of one group, read from its members' index vectors.
struct RaggedPlan {
  int members = 0;           // G.
  int64_t row_elements = 1;  // Elements per leading-axis row (the product of the rest).
  // slices[from * G + to]: what `from` sends `to`, in slice order (from == to: a local copy).
  std::vector<std::vector<RaggedSlice>> slices;
  // Elements member `from` sends member `to`.
  int64_t Elements(int from, int to) const;
};

// Elements of one leading-axis row of an array of `shape` (the product of the other sizes).
int64_t RaggedRowElements(const Shape& shape);

// Checks the six inputs' types for a group of `group_size` and returns the result's shape
// (output's). Throws std::invalid_argument: operand and output of different dtypes or row
// shapes, rank 0, index vectors not i32 of one length K, K not a multiple of the group size.
Shape RaggedAllToAllShape(const std::vector<const Array*>& inputs, int group_size);

// The messages of a group whose member m holds `inputs[m]` (the six arrays, with data).
// Throws std::invalid_argument for a slice outside the operand or the receiver's output, a
// negative size, or a receiver whose recv_sizes disagree with what is sent to it.
RaggedPlan PlanRaggedAllToAll(const std::vector<std::vector<const Array*>>& inputs);

// Rows each member is taken to send each member (itself included) when the index data is not
// known (timing-only runs): the op's expected_rows where it gives them (a sender that routes
// only some of its rows through the op: a dropless MoE column's), else a balanced routing that
// fills the smaller of the two buffers, min(N, M) / G rows per pair. Routing skew makes real
// runs slower; runs with data price the real sizes.
int64_t BalancedRaggedRows(const Shape& operand, const Shape& output, int group_size,
                           int64_t expected_rows = 0);
// The elements of those rows: the block each pair moves in a timing-only run (the all_to_all
// of blocks of this size).
int64_t BalancedRaggedBlock(const Shape& operand, const Shape& output, int group_size,
                            int64_t expected_rows = 0);

// The reference result on `mesh`, following JAX's definition step by step (the receiver's
// offsets are an all_to_all of the senders' output_offsets): inputs_by_position[p] holds the
// six arrays of position p. Throws std::invalid_argument as PlanRaggedAllToAll does.
std::vector<Array> ReferenceRaggedAllToAll(
    const OpSpec& op, const Mesh& mesh, const std::vector<std::vector<Array>>& inputs_by_position);

}  // namespace shardsim
