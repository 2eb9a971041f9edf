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

bool DroplessBounded(const DroplessMoeLayout& layout) {
  return !layout.tokens_replicated && layout.buffer_factor > 0 &&
         layout.buffer_factor < static_cast<double>(NamedAxesSize(layout.mesh, layout.expert_axes));
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
  // Receive buffer rows: rows * group holds every member's rows (the worst case).
  int64_t buffer_rows = rows * group;
  if (DroplessBounded(layout)) {
    buffer_rows = std::clamp<int64_t>(
        static_cast<int64_t>(std::ceil(layout.buffer_factor * static_cast<double>(rows))), 1,
        rows * group);
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
  std::string mine;         // Tokens replicated: 1 for each sorted copy this device runs.
  std::string start;        // Tokens replicated: where this device's copies start, sorted.
  std::string recv_starts;  // Bounded buffers: where each member's rows start in this one's.
  std::string dropped;      // Bounded buffers: the copies this device routed that did not fit.
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
    // The dispatch's sizes and offsets, all from the routing counts of every member of the
    // expert group, gathered (MaxText's all_shards_group_sizes): [from, to, local expert].
    // Rows to each member (its experts' counts), where they start here, how many come from
    // each member, and where this member's rows land in each receiver's buffer (after those of
    // the members before it).
    OpSpec gather;
    gather.axis = 0;
    const std::string per =
        b.Reshape(b.Collective(OpKind::kAllGather, b.Convert(counts, DType::kI32), ep, gather),
                  {group, group, local_experts});
    const std::string sent = b.Sum(per, 2);  // [from, to]
    const std::string me = b.AxisIndex(ep);
    send = b.Take(sent, me);  // [to]
    input_offsets = b.Starts(send, 0);
    recv = b.Take(sent, me, 1);  // [from]
    output_offsets = b.Take(b.Starts(sent, 0), me);
    // What each member sends this one, per local expert, in the order its rows arrive: member
    // by member, each member's rows sorted by expert.
    const std::string arriving = b.Reshape(b.Take(per, me, 1), {group * local_experts});
    // The buffers hold the worst case, every member's rows (MaxText's ragged_buffer_factor -1),
    // or `buffer` rows when bounded.
    const bool bounded = DroplessBounded(layout);
    std::string buffer;
    if (!bounded) {
      buffer = b.Repeat(b.Full(sorted, 0), {rows, d}, group);
    } else {
      buffer = b.Resize(b.Full(sorted, 0), rows, buffer_rows);
      // Of each message, the rows that land inside the receiver's buffer: with the message at
      // `offset` (moved to the buffer's end if past it: a message of no rows may start there,
      // not beyond) of `size` rows, size - max(offset + size - buffer, 0). The sender reckons
      // from where its rows land, the receiver from where each member's rows start in its
      // buffer (after those of the members before it): the same counts.
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
      // Devices that hold the same tokens (those the tokens are not split over) count the
      // same drops: each counts its share, so the counts sum to the copies dropped.
      int64_t copies = 1;
      for (const MeshAxis& axis : layout.mesh) copies *= axis.size;
      copies /= NamedAxesSize(layout.mesh, layout.batch_axes) *
                NamedAxesSize(layout.mesh, layout.length_axes);
      dropped = b.Reshape(
          b.Scalar(OpKind::kMul,
                   b.Sum(b.Convert(b.Add(OpKind::kSub, {announced, send}), DType::kF32), 0),
                   1.0 / static_cast<double>(copies)),
          {1});
    }
    const std::string received = b.Add(
        OpKind::kRaggedAllToAll, {sorted, buffer, input_offsets, send, output_offsets, recv}, [&] {
          OpSpec op;
          op.axis_name = ep;
          return op;
        }());
    // Each received row's local expert, from the counts rather than sent beside the rows
    // (MaxText's local_permute): the local ids 0, 1, ... of each member's runs, repeated as
    // many times as it sends rows to each, cut at the buffer's end; the rows past them (no
    // row received) take the last id, and sort after the real rows, being last in the buffer.
    const int64_t held = bounded ? buffer_rows : rows * group;
    const std::string ids =
        b.Reshape(b.Starts(b.Full(b.Reshape(arriving, {group, local_experts}), 1), 1),
                  {group * local_experts});
    regroup = b.Argsort(b.Add(OpKind::kRepeat, {ids, arriving}, [&] {
      OpSpec op;
      op.axis = 0;
      op.total_repeat_length = held;
      return op;
    }()));
    grouped = b.Take(received, regroup);
    // Each local expert's rows: its runs from every member, cut where the buffer ends (a run
    // starting at s of c rows keeps min(s + c, held) - min(s, held)).
    std::string kept = arriving;
    if (bounded) {
      const std::string starts = b.Starts(arriving, 0);
      kept = b.Add(OpKind::kSub,
                   {b.Min(b.Add(OpKind::kAdd, {starts, arriving}), static_cast<double>(held)),
                    b.Min(starts, static_cast<double>(held))});
    }
    sizes = b.Sum(b.Reshape(kept, {group, local_experts}), 0);
  }

  // The experts' MLPs over their rows: buffer_rows held, `rows` of them filled when balanced
  // (all of them, when the buffer is smaller); tokens replicated: rows / group of the rows.
  const int64_t expected = group == 1                 ? 0
                           : layout.tokens_replicated ? std::max<int64_t>(1, rows / group)
                                                      : std::min(rows, buffer_rows);
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
    const std::string back_output = b.Collective(OpKind::kAllToAll, input_offsets, ep, a2a);
    out = b.Add(OpKind::kRaggedAllToAll,
                {out, b.Full(sorted, 0), back_input, recv, back_output, send}, [&] {
                  OpSpec op;
                  op.axis_name = ep;
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
  if (group > 1 && layout.tokens_replicated) {
    partial.insert(partial.begin(), ep.begin(), ep.end());
  }
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
