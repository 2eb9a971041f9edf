#include "planner/models/dropless_moe.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "collectives/ir/program_builder.h"
#include "planner/models/logical_rules.h"

namespace shardsim::planner {
namespace {

// Fails unless `whole` splits evenly into the blocks of `axes`.
void CheckSplit(const DroplessMoeLayout& layout, int64_t whole,
                const std::vector<std::string>& axes, const std::string& what) {
  const int64_t blocks = NamedAxesSize(layout.mesh, axes);
  if (whole % blocks != 0) {
    throw std::invalid_argument("dropless MoE: " + what + " (" + std::to_string(whole) +
                                ") does not split into " + std::to_string(blocks) + " blocks");
  }
}

// Ops of the body, built on a ProgramBuilder in mode: manual.
class Body {
 public:
  explicit Body(const std::vector<MeshAxis>& mesh) : pb_(mesh, {}, ProgramMode::kManual) {}

  ProgramBuilder& pb() { return pb_; }

  std::string Add(OpKind kind, std::vector<std::string> in, OpSpec op = {}) {
    op.kind = kind;
    op.in = std::move(in);
    return pb_.Add(std::move(op));
  }
  std::string Reshape(const std::string& x, Shape shape) {
    OpSpec op;
    op.shape = std::move(shape);
    return Add(OpKind::kReshape, {x}, std::move(op));
  }
  std::string Convert(const std::string& x, DType dtype) {
    OpSpec op;
    op.dtype = DTypeName(dtype);
    return Add(OpKind::kConvert, {x}, std::move(op));
  }
  std::string Take(const std::string& x, const std::string& ids, int64_t axis = 0) {
    OpSpec op;
    op.axis = axis;
    return Add(OpKind::kTake, {x, ids}, std::move(op));
  }
  std::string Argsort(const std::string& x) { return Add(OpKind::kArgsort, {x}); }
  // Inclusive prefix sums along `axis`.
  std::string Cumsum(const std::string& x, int64_t axis) {
    OpSpec op;
    op.norm_axis = axis;
    return Add(OpKind::kCumsum, {x}, std::move(op));
  }
  // Exclusive prefix sums along `axis`: where each block starts.
  std::string Starts(const std::string& x, int64_t axis) {
    return Add(OpKind::kSub, {Cumsum(x, axis), x});
  }
  std::string Sum(const std::string& x, int64_t axis) {
    OpSpec op;
    op.axes = {axis};
    return Add(OpKind::kSum, {x}, std::move(op));
  }
  std::string OneHot(const std::string& ids, int64_t classes) {
    OpSpec op;
    op.num_classes = classes;
    op.dtype = "f32";
    return Add(OpKind::kOneHot, {ids}, std::move(op));
  }
  // This device's index along `axes` (i32).
  std::string AxisIndex(const std::vector<std::string>& axes) {
    OpSpec op;
    op.axis_name = axes;
    return Add(OpKind::kAxisIndex, {}, std::move(op));
  }
  // `x` capped at `cap`, elementwise: x - max(x - cap, 0) (there is no elementwise min).
  std::string Min(const std::string& x, double cap) {
    return Add(OpKind::kSub, {x, Scalar(OpKind::kMax, Scalar(OpKind::kSub, x, cap), 0)});
  }
  // `x` op `scalar`, elementwise (kind: a binary op).
  std::string Scalar(OpKind kind, const std::string& x, double scalar) {
    OpSpec op;
    op.scalar = scalar;
    return Add(kind, {x}, std::move(op));
  }
  // `x` cut or padded with zeros at its end to `count` indices along axis 0.
  std::string Resize(const std::string& x, int64_t have, int64_t count) {
    OpSpec op;
    op.axis = 0;
    if (count <= have) {
      if (count == have) return x;
      op.start = 0;
      op.size = count;
      return Add(OpKind::kSlice, {x}, std::move(op));
    }
    op.high = count - have;
    return Add(OpKind::kPad, {x}, std::move(op));
  }
  std::string Full(const std::string& like, double value) {
    OpSpec op;
    op.fill_value = value;
    return Add(OpKind::kFullLike, {like}, std::move(op));
  }
  // `x` repeated `copies` times along a new leading dimension, flattened into its first.
  std::string Repeat(const std::string& x, const Shape& shape, int64_t copies) {
    OpSpec op;
    op.shape = {copies};
    op.shape.insert(op.shape.end(), shape.begin(), shape.end());
    for (size_t d = 0; d < shape.size(); ++d) op.broadcast_dimensions.push_back(1 + d);
    Shape flat = shape;
    flat[0] *= copies;
    return Reshape(Add(OpKind::kBroadcastInDim, {x}, std::move(op)), flat);
  }
  std::string Collective(OpKind kind, const std::string& x, const std::vector<std::string>& axes,
                         OpSpec op = {}) {
    op.axis_name = axes;
    return Add(kind, {x}, std::move(op));
  }
  std::string RaggedDot(const std::string& lhs, const std::string& rhs, const std::string& sizes,
                        int64_t expected_rows) {
    OpSpec op;
    op.expected_rows = expected_rows;
    return Add(OpKind::kRaggedDot, {lhs, rhs, sizes}, std::move(op));
  }

 private:
  ProgramBuilder pb_;
};

}  // namespace

PartitionSpec DroplessTokenSpec(const DroplessMoeLayout& layout) {
  PartitionSpec spec;
  spec.dims = {layout.batch_axes, layout.length_axes, {}};
  return spec;
}

PartitionSpec DroplessWeightSpec(const DroplessMoeLayout& layout, bool down) {
  PartitionSpec spec;
  spec.dims = {layout.expert_axes, layout.embed_axes, layout.mlp_axes};
  if (down) std::swap(spec.dims[1], spec.dims[2]);
  return spec;
}

std::vector<std::string> DroplessDispatchAxes(const DroplessMoeLayout& layout) {
  std::vector<std::string> axes;
  if (layout.tokens_replicated) return axes;
  for (const std::string& a : layout.expert_axes) {
    for (const auto* split : {&layout.batch_axes, &layout.length_axes}) {
      if (std::find(split->begin(), split->end(), a) != split->end()) axes.push_back(a);
    }
  }
  return axes;
}

bool DroplessBounded(const DroplessMoeLayout& layout) {
  return !layout.tokens_replicated && layout.buffer_factor > 0 &&
         layout.buffer_factor <
             static_cast<double>(NamedAxesSize(layout.mesh, DroplessDispatchAxes(layout)));
}

ProgramSpec DroplessMoeBody(const DroplessMoeLayout& layout) {
  CheckSplit(layout, layout.batch, layout.batch_axes, "the batch");
  CheckSplit(layout, layout.length, layout.length_axes, "the sequence");
  CheckSplit(layout, layout.experts, layout.expert_axes, "the experts");
  CheckSplit(layout, layout.d_ff, layout.mlp_axes, "the experts' MLP width");
  CheckSplit(layout, layout.d_model, layout.embed_axes, "the experts' d_model");
  if (layout.tokens_replicated) {
    for (const std::string& a : layout.expert_axes) {
      for (const auto* split : {&layout.batch_axes, &layout.length_axes}) {
        if (std::find(split->begin(), split->end(), a) != split->end()) {
          throw std::invalid_argument(
              "dropless MoE: tokens replicated over the expert axes are "
              "split over '" +
              a + "'");
        }
      }
    }
  }
  const int64_t d = layout.d_model;
  const int64_t k = layout.top_k;
  const int64_t n = layout.batch / NamedAxesSize(layout.mesh, layout.batch_axes) * layout.length /
                    NamedAxesSize(layout.mesh, layout.length_axes);  // This device's tokens.
  const int64_t rows = n * k;  // Their copies, one per choice.
  const int64_t group = NamedAxesSize(layout.mesh, layout.expert_axes);
  const int64_t local_experts = layout.experts / group;
  const std::vector<std::string>& ep = layout.expert_axes;
  // The dispatch group: the expert axes that split the tokens; over the others (`held`) its
  // members hold the same tokens, and each member of such a replica set sends only the copies
  // bound for the experts of its own column (the members that share its coordinates there).
  const std::vector<std::string> peers_axes = DroplessDispatchAxes(layout);
  std::vector<std::string> held;
  for (const std::string& a : ep) {
    if (std::find(peers_axes.begin(), peers_axes.end(), a) == peers_axes.end()) held.push_back(a);
  }
  if (!layout.tokens_replicated && group > 1 && peers_axes.empty()) {
    throw std::invalid_argument(
        "dropless MoE: the tokens are split over none of the expert axes (hold them whole: "
        "tokens_replicated)");
  }
  const int64_t peers = NamedAxesSize(layout.mesh, peers_axes);
  const int64_t replicas = group / peers;  // Members holding the same tokens.
  // Receive buffer rows: rows * peers holds every peer's rows (the worst case); balanced, a
  // member receives rows / replicas (each peer's rows spread over the group's experts).
  const int64_t balanced_rows = rows / replicas;
  int64_t buffer_rows = rows * peers;
  if (DroplessBounded(layout)) {
    buffer_rows = std::clamp<int64_t>(
        static_cast<int64_t>(std::ceil(layout.buffer_factor * static_cast<double>(balanced_rows))),
        1, rows * peers);
  }

  Body b(layout.mesh);
  const PartitionSpec tokens = DroplessTokenSpec(layout);
  const Shape token_shape = {layout.batch, layout.length, d};
  const Shape choice_shape = {layout.batch, layout.length, k};
  const std::string x = b.pb().Input("x", token_shape, layout.dtype, tokens);
  const std::string choice = b.pb().Input("choice", choice_shape, DType::kI32, tokens);
  const std::string gates = b.pb().Input("gates", choice_shape, layout.dtype, tokens);
  const Shape in_shape = {layout.experts, d, layout.d_ff};
  const Shape out_shape = {layout.experts, layout.d_ff, d};
  std::string w_gate;
  if (layout.gated) {
    w_gate = b.pb().Input("w_gate", in_shape, layout.dtype, DroplessWeightSpec(layout, false));
  }
  std::string w_up =
      b.pb().Input("w_up", in_shape, layout.dtype, DroplessWeightSpec(layout, false));
  std::string w_down =
      b.pb().Input("w_down", out_shape, layout.dtype, DroplessWeightSpec(layout, true));
  // FSDP: each weight gathered whole along d_model (its transpose scatters the gradient).
  if (!layout.embed_axes.empty()) {
    auto gather = [&](const std::string& w, int64_t axis) {
      OpSpec op;
      op.axis = axis;
      op.tiled = true;
      return b.Collective(OpKind::kAllGather, w, layout.embed_axes, std::move(op));
    };
    if (layout.gated) w_gate = gather(w_gate, 1);
    w_up = gather(w_up, 1);
    w_down = gather(w_down, 2);
  }

  // Each token's k copies (copy j of token i at row i k + j), sorted by expert (stably).
  const std::string copies = b.Reshape(b.Add(OpKind::kBroadcastInDim, {b.Reshape(x, {n, d})},
                                             [&] {
                                               OpSpec op;
                                               op.shape = {n, k, d};
                                               op.broadcast_dimensions = {0, 2};
                                               return op;
                                             }()),
                                       {rows, d});
  const std::string expert = b.Reshape(choice, {rows});
  const std::string order = b.Argsort(expert);
  const std::string sorted = b.Take(copies, order);
  // Rows routed to each expert.
  const std::string counts = b.Sum(b.OneHot(expert, layout.experts), 0);  // [experts] f32

  std::string grouped = sorted;  // The rows this device's experts run, grouped by expert.
  std::string sizes;             // Rows of each local expert.
  std::string regroup;           // The order that grouped them (dispatch only).
  std::string send, recv, input_offsets, output_offsets;
  std::string mine;            // Tokens replicated: 1 for each sorted copy this device runs.
  std::string start;           // Tokens replicated: where this device's copies start, sorted.
  std::string recv_starts;     // Bounded buffers: where each member's rows start in this one's.
  std::string dropped;         // Bounded buffers: the copies this device routed that did not fit.
  int64_t back_pair_rows = 0;  // The return's rows a pair, timing only (0: balanced).
  // Each sorted copy's index (0, 1, ...), and `x` of one value per copy moved into [0, rows).
  auto iota = [&] { return b.Starts(b.Full(b.Convert(expert, DType::kF32), 1), 0); };
  auto clamp_rows = [&](const std::string& x) {
    return b.Min(b.Scalar(OpKind::kMax, x, 0), static_cast<double>(rows - 1));
  };
  // The first expert of member `me` of the expert group (f32).
  auto first_expert = [&](const std::string& me) {
    return b.Scalar(OpKind::kMul, b.Convert(me, DType::kF32), static_cast<double>(local_experts));
  };
  if (group == 1) {
    sizes = b.Convert(counts, DType::kI32);
  } else if (layout.tokens_replicated) {
    // Every member holds the same copies, sorted by expert: this one's experts' copies are the
    // run starting at `start`, after the copies of the experts before its first; moved to the
    // front, they are the grouped matmuls' rows.
    const std::string me = b.AxisIndex(ep);
    const std::string first = first_expert(me);
    const std::string local = b.Convert(
        b.Add(OpKind::kSub, {b.Convert(b.Take(expert, order), DType::kF32), first}), DType::kI32);
    const std::string hot = b.OneHot(local, local_experts);  // [rows, local experts]
    mine = b.Sum(hot, 1);
    sizes = b.Convert(b.Sum(hot, 0), DType::kI32);
    start = b.Add(OpKind::kBroadcastInDim,
                  {b.Take(b.Starts(counts, 0), b.Convert(first, DType::kI32))}, [&] {
                    OpSpec op;
                    op.shape = {rows};
                    return op;
                  }());
    grouped =
        b.Take(sorted, b.Convert(clamp_rows(b.Add(OpKind::kAdd, {iota(), start})), DType::kI32));
  } else {
    // The dispatch's sizes and offsets, all from the routing counts of every peer, gathered
    // (MaxText's all_shards_group_sizes): [from, block, local expert], a block being a member
    // of the whole expert group. With tokens held whole over some expert axes, each peer also
    // sends the block it is (its column's blocks are the ones this member's peers hold), and
    // `column` picks those blocks out of a [.., group, ..] value along `axis`.
    OpSpec gather;
    gather.axis = 0;
    const std::string my_counts = b.Convert(counts, DType::kI32);
    std::string gathered, blocks;
    if (held.empty()) {
      gathered = b.Collective(OpKind::kAllGather, my_counts, peers_axes, gather);
    } else {
      OpSpec concat;
      concat.axis = 0;
      const std::string payload = b.Add(
          OpKind::kConcatenate, {my_counts, b.Reshape(b.AxisIndex(ep), {1})}, std::move(concat));
      const std::string all = b.Collective(OpKind::kAllGather, payload, peers_axes, gather);
      auto columns = [&](int64_t first, int64_t size) {
        OpSpec slice;
        slice.axis = 1;
        slice.start = first;
        slice.size = size;
        return b.Add(OpKind::kSlice, {all}, std::move(slice));
      };
      gathered = columns(0, layout.experts);
      blocks = b.Reshape(columns(layout.experts, 1), {peers});
    }
    auto column = [&](const std::string& x, int64_t axis) {
      return held.empty() ? x : b.Take(x, blocks, axis);
    };
    const std::string per = b.Reshape(gathered, {peers, group, local_experts});
    // Rows from each peer to each peer (the blocks of this column), and this member's place.
    const std::string sent = column(b.Sum(per, 2), 1);  // [from, to]
    const std::string me = b.AxisIndex(peers_axes);
    const std::string my_block = held.empty() ? me : b.AxisIndex(ep);
    // This member's sorted copies: each block's run starts after the blocks before it.
    const std::string per_block = b.Sum(b.Reshape(my_counts, {group, local_experts}), 1);
    send = column(per_block, 0);  // [to]
    input_offsets = column(b.Starts(per_block, 0), 0);
    recv = b.Take(sent, me, 1);  // [from]
    output_offsets = b.Take(b.Starts(sent, 0), me);
    // What each peer sends this member, per local expert, in the order its rows arrive: peer
    // by peer, each peer's rows sorted by expert.
    const std::string arriving = b.Reshape(b.Take(per, my_block, 1), {peers * local_experts});
    // The buffers hold the worst case, every peer's rows (MaxText's ragged_buffer_factor -1),
    // or `buffer` rows when bounded.
    const bool bounded = DroplessBounded(layout);
    std::string buffer;
    if (!bounded) {
      buffer = b.Repeat(b.Full(sorted, 0), {rows, d}, peers);
    } else {
      buffer = b.Resize(b.Full(sorted, 0), rows, buffer_rows);
      // Of each message, the rows that land inside the receiver's buffer: with the message at
      // `offset` (moved to the buffer's end if past it: a message of no rows may start there,
      // not beyond) of `size` rows, size - max(offset + size - buffer, 0). The sender reckons
      // from where its rows land, the receiver from where each peer's rows start in its
      // buffer (after those of the peers before it): the same counts.
      const double end = static_cast<double>(buffer_rows);
      auto fits = [&](const std::string& size, const std::string& offset) {
        const std::string over = b.Scalar(
            OpKind::kMax, b.Scalar(OpKind::kSub, b.Add(OpKind::kAdd, {offset, size}), end), 0);
        return b.Add(OpKind::kSub, {size, over});
      };
      output_offsets = b.Min(output_offsets, end);
      recv_starts = b.Min(b.Starts(recv, 0), end);
      const std::string announced = send;
      send = fits(send, output_offsets);
      recv = fits(recv, recv_starts);
      // Devices that hold the same tokens and send the same column's copies (those the tokens
      // and the expert axes are not split over) count the same drops: each counts its share,
      // so the counts sum to the copies dropped.
      int64_t copies = 1;
      for (const MeshAxis& axis : layout.mesh) copies *= axis.size;
      copies /= NamedAxesSize(layout.mesh, layout.batch_axes) *
                NamedAxesSize(layout.mesh, layout.length_axes) * replicas;
      dropped = b.Reshape(
          b.Scalar(OpKind::kMul,
                   b.Sum(b.Convert(b.Add(OpKind::kSub, {announced, send}), DType::kF32), 0),
                   1.0 / static_cast<double>(copies)),
          {1});
    }
    // Timing only (no routing data), each pair moves its balanced share: rows / group of a
    // member's copies (a column's share of them, spread over its peers).
    const int64_t pair_rows =
        held.empty() ? 0 : std::max<int64_t>(1, std::min(balanced_rows, buffer_rows) / peers);
    const std::string received = b.Add(
        OpKind::kRaggedAllToAll, {sorted, buffer, input_offsets, send, output_offsets, recv}, [&] {
          OpSpec op;
          op.axis_name = peers_axes;
          op.expected_rows = pair_rows;
          return op;
        }());
    // Each received row's local expert, from the counts rather than sent beside the rows
    // (MaxText's local_permute): the local ids 0, 1, ... of each peer's runs, repeated as many
    // times as it sends rows to each, cut at the buffer's end; the rows past them (no row
    // received) take the last id, and sort after the real rows, being last in the buffer.
    const int64_t buffer_held = bounded ? buffer_rows : rows * peers;
    const std::string ids =
        b.Reshape(b.Starts(b.Full(b.Reshape(arriving, {peers, local_experts}), 1), 1),
                  {peers * local_experts});
    regroup = b.Argsort(b.Add(OpKind::kRepeat, {ids, arriving}, [&] {
      OpSpec op;
      op.axis = 0;
      op.total_repeat_length = buffer_held;
      return op;
    }()));
    grouped = b.Take(received, regroup);
    // Each local expert's rows: its runs from every peer, cut where the buffer ends (a run
    // starting at s of c rows keeps min(s + c, held) - min(s, held)).
    std::string kept = arriving;
    if (bounded) {
      const std::string starts = b.Starts(arriving, 0);
      kept =
          b.Add(OpKind::kSub,
                {b.Min(b.Add(OpKind::kAdd, {starts, arriving}), static_cast<double>(buffer_held)),
                 b.Min(starts, static_cast<double>(buffer_held))});
    }
    sizes = b.Sum(b.Reshape(kept, {peers, local_experts}), 0);
    back_pair_rows = pair_rows;
  }

  // The experts' MLPs over their rows: buffer_rows held, `rows` of them filled when balanced
  // (all of them, when the buffer is smaller); tokens replicated: rows / group of the rows.
  const int64_t expected = group == 1                 ? 0
                           : layout.tokens_replicated ? std::max<int64_t>(1, rows / group)
                                                      : std::min(balanced_rows, buffer_rows);
  std::string hidden = b.RaggedDot(grouped, w_up, sizes, expected);
  if (layout.gated) {
    hidden =
        b.Add(OpKind::kMul,
              {b.Add(layout.activation, {b.RaggedDot(grouped, w_gate, sizes, expected)}), hidden});
  } else {
    hidden = b.Add(layout.activation, {hidden});
  }
  std::string out = b.RaggedDot(hidden, w_down, sizes, expected);
  if (group > 1 && layout.tokens_replicated) {
    // Back to the sorted copies' places: row i of the result is copy start + i; copies of
    // other members' experts get zeros here (theirs come with the psum below).
    out = b.Take(out, b.Convert(clamp_rows(b.Add(OpKind::kSub, {iota(), start})), DType::kI32));
    out = b.Add(OpKind::kMul, {out, b.Reshape(b.Convert(mine, layout.dtype), {rows, 1})});
  } else if (group > 1) {
    // Back in arrival order, then each row returned to where it came from.
    out = b.Take(out, b.Argsort(regroup));
    // Where each member's rows sit here (`recv` holds the rows received, not those announced,
    // when the buffer is bounded).
    const std::string back_input = recv_starts.empty() ? b.Starts(recv, 0) : recv_starts;
    OpSpec a2a;
    a2a.tiled = true;
    const std::string back_output = b.Collective(OpKind::kAllToAll, input_offsets, peers_axes, a2a);
    out = b.Add(OpKind::kRaggedAllToAll,
                {out, b.Full(sorted, 0), back_input, recv, back_output, send}, [&] {
                  OpSpec op;
                  op.axis_name = peers_axes;
                  op.expected_rows = back_pair_rows;
                  return op;
                }());
  }
  // Unsorted to the copies' order, weighted by the gates and summed over each token's k.
  out = b.Take(out, b.Argsort(order));
  out = b.Add(OpKind::kMul, {out, b.Reshape(gates, {rows, 1})});
  out = b.Sum(b.Reshape(out, {n, k, d}), 1);
  // The MLP width split over mlp_axes leaves partial sums, and so do experts split over
  // axes that hold the same tokens.
  std::vector<std::string> partial = layout.mlp_axes;
  if (group > 1) partial.insert(partial.begin(), held.begin(), held.end());
  if (!partial.empty()) out = b.Collective(OpKind::kPsum, out, partial);
  const int64_t local_batch = layout.batch / NamedAxesSize(layout.mesh, layout.batch_axes);
  out = b.Reshape(out, {local_batch, n / local_batch, d});
  b.pb().Output(out, tokens);
  if (!dropped.empty()) {
    PartitionSpec every;
    every.dims = {{}};
    for (const MeshAxis& axis : layout.mesh) every.dims[0].push_back(axis.name);
    b.pb().Output(dropped, every);
  }
  return std::move(b.pb()).Build();
}

}  // namespace shardsim::planner
