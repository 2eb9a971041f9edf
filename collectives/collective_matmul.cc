#include "collectives/collective_matmul.h"

#include <stdexcept>
#include <string>

namespace shardsim {
namespace {

// Builds the op list of one expansion.
class Expansion {
 public:
  explicit Expansion(const OpSpec& op) : op_(op), prefix_(op.name + "/") {}

  std::string Name(const std::string& what, int step = -1) const {
    return prefix_ + what + (step >= 0 ? std::to_string(step) : "");
  }

  OpSpec Base(OpKind kind, std::vector<std::string> in, std::string out) {
    OpSpec o;
    o.kind = kind;
    o.in = std::move(in);
    o.out = {out};
    o.name = out == op_.out[0] ? op_.name : out;
    o.key = op_.key;
    o.axis_name = op_.axis_name;
    return o;
  }

  void Matmul(const std::string& a, const std::string& b, const std::string& out) {
    OpSpec o = Base(OpKind::kMatmul, {a, b}, out);
    o.axis_name.clear();
    ops_.push_back(o);
  }
  void Add(const std::string& a, const std::string& b, const std::string& out) {
    OpSpec o = Base(OpKind::kAdd, {a, b}, out);
    o.axis_name.clear();
    ops_.push_back(o);
  }
  void Shift(const std::string& in, const std::string& out, int k) {
    OpSpec o = Base(OpKind::kPpermute, {in}, out);
    o.shift = k;
    ops_.push_back(o);
  }
  void DynamicSlice(const std::string& in, const std::string& out, int64_t axis, int64_t sections,
                    int64_t scale, int64_t offset) {
    OpSpec o = Base(OpKind::kDynamicSlice, {in}, out);
    o.axis = axis;
    o.sections = sections;
    o.block_scale = scale;
    o.block_offset = offset;
    ops_.push_back(o);
  }
  void DynamicConcat(std::vector<std::string> in, const std::string& out, int64_t axis,
                     int64_t scale) {
    OpSpec o = Base(OpKind::kDynamicConcat, std::move(in), out);
    o.axis = axis;
    o.block_scale = scale;
    ops_.push_back(o);
  }
  void Slice(const std::string& in, const std::string& out, int64_t start, int64_t size,
             int64_t axis) {
    OpSpec o = Base(OpKind::kSlice, {in}, out);
    o.fused = true;  // A view of the operand: the ppermute and matmul read it in place.
    o.axis_name.clear();
    o.start = start;
    o.size = size;
    o.axis = axis;
    ops_.push_back(o);
  }
  // Reshapes and concatenations that place result blocks: in-place writes in XLA.
  void Local(OpKind kind, std::vector<std::string> in, const std::string& out, Shape shape = {},
             int64_t axis = 0) {
    OpSpec o = Base(kind, std::move(in), out);
    o.fused = true;
    o.axis_name.clear();
    o.shape = std::move(shape);
    o.axis = axis;
    ops_.push_back(o);
  }
  void Collective(OpKind kind, const std::string& in, const std::string& out, int64_t dim) {
    OpSpec o = Base(kind, {in}, out);
    o.tiled = true;
    o.axis = dim;
    o.scatter_dimension = dim;
    o.algorithm = op_.algorithm;
    ops_.push_back(o);
  }

  std::vector<OpSpec> Take() { return std::move(ops_); }

 private:
  const OpSpec& op_;
  std::string prefix_;
  std::vector<OpSpec> ops_;
};

void Require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// allgather_matmul of lhs along its contracting dimension (all_gather(x[B, K/n], axis 1) @
// w[K, F], the Scaling Book's A[B_X, D_Y] @ W[D, F_Y]): the column blocks of x travel; step s
// multiplies the block of device i - s with the matching row block of w and accumulates.
// Bidirectional: left halves of the blocks travel forward, right halves backward.
std::vector<OpSpec> GatherLhsContracting(const OpSpec& op, const Shape& x, const Shape& w, int n) {
  Expansion e(op);
  const std::string& xn = op.in[0];
  const std::string& wn = op.in[1];
  const std::string& out = op.out[0];
  Require(x[1] * n == w[0], "allgather_matmul (gather lhs, axis 1): all_gather(x" + FormatShape(x) +
                                ", axis 1) over " + std::to_string(n) + " devices has " +
                                std::to_string(x[1] * n) + " columns; w" + FormatShape(w) +
                                " has " + std::to_string(w[0]) + " rows");
  if (op.variant == "blocking") {
    e.Collective(OpKind::kAllGather, xn, e.Name("x_full"), 1);
    e.Matmul(e.Name("x_full"), wn, out);
    return e.Take();
  }
  auto accumulate = [&](std::string* acc, const std::string& part, int s) {
    if (s == 0) {
      *acc = part;
      return;
    }
    std::string sum = s == n - 1 ? out : e.Name("acc", s);
    e.Add(*acc, part, sum);
    *acc = sum;
  };
  std::string acc;
  if (op.variant == "unidirectional") {
    std::string blk = xn;
    for (int s = 0; s < n; ++s) {
      std::string ws = e.Name("w", s);
      e.DynamicSlice(wn, ws, 0, n, 1, -s);
      std::string part = n == 1 ? out : e.Name("part", s);
      e.Matmul(blk, ws, part);
      accumulate(&acc, part, s);
      if (s < n - 1) {
        std::string next = e.Name("x", s + 1);
        e.Shift(blk, next, +1);
        blk = next;
      }
    }
    return e.Take();
  }
  Require(x[1] % 2 == 0, "allgather_matmul bidirectional: the x block's " + std::to_string(x[1]) +
                             " columns do not split in halves");
  const int64_t h = x[1] / 2;
  std::string left = e.Name("left", 0), right = e.Name("right", 0);
  e.Slice(xn, left, 0, h, 1);
  e.Slice(xn, right, h, h, 1);
  for (int s = 0; s < n; ++s) {
    std::string wl = e.Name("w_left", s), wr = e.Name("w_right", s);
    e.DynamicSlice(wn, wl, 0, 2 * n, 2, -2 * s);
    e.DynamicSlice(wn, wr, 0, 2 * n, 2, 2 * s + 1);
    std::string pl = e.Name("part_left", s), pr = e.Name("part_right", s);
    e.Matmul(left, wl, pl);
    e.Matmul(right, wr, pr);
    std::string both = n == 1 ? out : e.Name("part", s);
    e.Add(pl, pr, both);
    accumulate(&acc, both, s);
    if (s < n - 1) {
      std::string nl = e.Name("left", s + 1), nr = e.Name("right", s + 1);
      e.Shift(left, nl, +1);
      e.Shift(right, nr, -1);
      left = nl;
      right = nr;
    }
  }
  return e.Take();
}

// allgather_matmul of rhs along its free dimension (x[B, K] @ all_gather(w[K, F/n], axis 1)):
// the column blocks of w travel; each step's product is a column block of the result, placed
// by a dynamic concatenation. Bidirectional: left halves of the blocks forward, right halves
// backward, interleaved back into whole blocks.
std::vector<OpSpec> GatherRhsFree(const OpSpec& op, const Shape& x, const Shape& w, int n) {
  Expansion e(op);
  const std::string& xn = op.in[0];
  const std::string& wn = op.in[1];
  const std::string& out = op.out[0];
  Require(x[1] == w[0], "allgather_matmul (gather rhs, axis 1): inner dimensions differ: x" +
                            FormatShape(x) + " @ w" + FormatShape(w));
  if (op.variant == "blocking") {
    e.Collective(OpKind::kAllGather, wn, e.Name("w_full"), 1);
    e.Matmul(xn, e.Name("w_full"), out);
    return e.Take();
  }
  if (op.variant == "unidirectional") {
    std::string blk = wn;
    std::vector<std::string> parts;
    for (int s = 0; s < n; ++s) {
      parts.push_back(e.Name("columns", s));
      e.Matmul(xn, blk, parts.back());
      if (s < n - 1) {
        std::string next = e.Name("w", s + 1);
        e.Shift(blk, next, +1);
        blk = next;
      }
    }
    e.DynamicConcat(parts, out, 1, -1);  // Step s holds the block of device i - s.
    return e.Take();
  }
  Require(w[1] % 2 == 0, "allgather_matmul bidirectional: the w block's " + std::to_string(w[1]) +
                             " columns do not split in halves");
  const int64_t h = w[1] / 2;
  std::string left = e.Name("left", 0), right = e.Name("right", 0);
  e.Slice(wn, left, 0, h, 1);
  e.Slice(wn, right, h, h, 1);
  std::vector<std::string> lefts, rights;
  for (int s = 0; s < n; ++s) {
    lefts.push_back(e.Name("columns_left", s));
    rights.push_back(e.Name("columns_right", s));
    e.Matmul(xn, left, lefts.back());
    e.Matmul(xn, right, rights.back());
    if (s < n - 1) {
      std::string nl = e.Name("left", s + 1), nr = e.Name("right", s + 1);
      e.Shift(left, nl, +1);
      e.Shift(right, nr, -1);
      left = nl;
      right = nr;
    }
  }
  // Left halves came from devices i - s, right halves from i + s: [B, n, h] each, side by
  // side along the last dimension, back into whole column blocks.
  const int64_t b = x[0];
  e.DynamicConcat(lefts, e.Name("lefts"), 1, -1);
  e.DynamicConcat(rights, e.Name("rights"), 1, +1);
  e.Local(OpKind::kReshape, {e.Name("lefts")}, e.Name("lefts3"), {b, n, h});
  e.Local(OpKind::kReshape, {e.Name("rights")}, e.Name("rights3"), {b, n, h});
  e.Local(OpKind::kConcatenate, {e.Name("lefts3"), e.Name("rights3")}, e.Name("blocks3"), {}, 2);
  e.Local(OpKind::kReshape, {e.Name("blocks3")}, out, {b, n * 2 * h});
  return e.Take();
}

std::vector<OpSpec> AllgatherMatmul(const OpSpec& op, const Shape& x, const Shape& w, int n) {
  Expansion e(op);
  const std::string& xn = op.in[0];
  const std::string& wn = op.in[1];
  const std::string& out = op.out[0];
  bool rhs = op.gather == "rhs";
  Require(x.size() == 2 && w.size() == 2,
          "allgather_matmul takes 2-D operands, got " + FormatShape(x) + " and " + FormatShape(w));
  Require(op.axis == 0 || op.axis == 1,
          "allgather_matmul: axis (the gathered operand's dimension) must be 0 or 1, got " +
              std::to_string(op.axis));
  if (op.axis == 1) return rhs ? GatherRhsFree(op, x, w, n) : GatherLhsContracting(op, x, w, n);
  if (rhs) {
    Require(x[1] == w[0] * n, "allgather_matmul (gather rhs): x" + FormatShape(x) + " needs " +
                                  std::to_string(w[0] * n) + " columns to meet all_gather(w" +
                                  FormatShape(w) + ") over " + std::to_string(n) + " devices");
  } else {
    Require(x[1] == w[0], "allgather_matmul (gather lhs): inner dimensions differ: x" +
                              FormatShape(x) + " @ w" + FormatShape(w));
  }
  if (op.variant == "blocking") {
    std::string gathered = e.Name(rhs ? "w_full" : "x_full");
    e.Collective(OpKind::kAllGather, rhs ? wn : xn, gathered, 0);
    if (rhs) {
      e.Matmul(xn, gathered, out);
    } else {
      e.Matmul(gathered, wn, out);
    }
    return e.Take();
  }
  bool bidi = op.variant == "bidirectional";
  if (rhs) {
    if (!bidi) {
      std::string blk = wn, acc;
      for (int s = 0; s < n; ++s) {
        std::string xs = e.Name("x", s);
        e.DynamicSlice(xn, xs, 1, n, 1, -s);
        std::string part = n == 1 ? out : e.Name("part", s);
        e.Matmul(xs, blk, part);
        if (s > 0) {
          std::string sum = s == n - 1 ? out : e.Name("acc", s);
          e.Add(acc, part, sum);
          acc = sum;
        } else {
          acc = part;
        }
        if (s < n - 1) {
          std::string next = e.Name("w", s + 1);
          e.Shift(blk, next, +1);
          blk = next;
        }
      }
      return e.Take();
    }
    Require(w[0] % 2 == 0, "allgather_matmul bidirectional: the w block's " + std::to_string(w[0]) +
                               " rows do not split in halves");
    int64_t h = w[0] / 2;
    std::string top = e.Name("top", 0), bot = e.Name("bottom", 0), acc;
    e.Slice(wn, top, 0, h, 0);
    e.Slice(wn, bot, h, h, 0);
    for (int s = 0; s < n; ++s) {
      std::string xt = e.Name("x_top", s), xb = e.Name("x_bottom", s);
      e.DynamicSlice(xn, xt, 1, 2 * n, 2, -2 * s);
      e.DynamicSlice(xn, xb, 1, 2 * n, 2, 2 * s + 1);
      std::string pt = e.Name("part_top", s), pb = e.Name("part_bottom", s);
      e.Matmul(xt, top, pt);
      e.Matmul(xb, bot, pb);
      std::string both = (s == 0 && n == 1) ? out : e.Name("part", s);
      e.Add(pt, pb, both);
      if (s > 0) {
        std::string sum = s == n - 1 ? out : e.Name("acc", s);
        e.Add(acc, both, sum);
        acc = sum;
      } else {
        acc = both;
      }
      if (s < n - 1) {
        std::string nt = e.Name("top", s + 1), nb = e.Name("bottom", s + 1);
        e.Shift(top, nt, +1);
        e.Shift(bot, nb, -1);
        top = nt;
        bot = nb;
      }
    }
    return e.Take();
  }
  // Gather lhs: row blocks of x travel; each product is a row block of the result.
  if (!bidi) {
    std::string blk = xn;
    std::vector<std::string> parts;
    for (int s = 0; s < n; ++s) {
      parts.push_back(e.Name("rows", s));
      e.Matmul(blk, wn, parts.back());
      if (s < n - 1) {
        std::string next = e.Name("x", s + 1);
        e.Shift(blk, next, +1);
        blk = next;
      }
    }
    e.DynamicConcat(parts, out, 0, -1);  // Step s holds the block of device i - s.
    return e.Take();
  }
  Require(x[0] % 2 == 0, "allgather_matmul bidirectional: the x block's " + std::to_string(x[0]) +
                             " rows do not split in halves");
  int64_t h = x[0] / 2;
  std::string top = e.Name("top", 0), bot = e.Name("bottom", 0);
  e.Slice(xn, top, 0, h, 0);
  e.Slice(xn, bot, h, h, 0);
  std::vector<std::string> tops, bots;
  for (int s = 0; s < n; ++s) {
    tops.push_back(e.Name("rows_top", s));
    bots.push_back(e.Name("rows_bottom", s));
    e.Matmul(top, wn, tops.back());
    e.Matmul(bot, wn, bots.back());
    if (s < n - 1) {
      std::string nt = e.Name("top", s + 1), nb = e.Name("bottom", s + 1);
      e.Shift(top, nt, +1);
      e.Shift(bot, nb, -1);
      top = nt;
      bot = nb;
    }
  }
  // Top halves came from devices i - s, bottom halves from i + s; interleave them back into
  // whole row blocks: [n, h, F] and [n, h, F] side by side along rows.
  int64_t f = w[1];
  e.DynamicConcat(tops, e.Name("tops"), 0, -1);
  e.DynamicConcat(bots, e.Name("bottoms"), 0, +1);
  e.Local(OpKind::kReshape, {e.Name("tops")}, e.Name("tops3"), {n, h, f});
  e.Local(OpKind::kReshape, {e.Name("bottoms")}, e.Name("bottoms3"), {n, h, f});
  e.Local(OpKind::kConcatenate, {e.Name("tops3"), e.Name("bottoms3")}, e.Name("blocks3"), {}, 1);
  e.Local(OpKind::kReshape, {e.Name("blocks3")}, out, {n * 2 * h, f});
  return e.Take();
}

std::vector<OpSpec> MatmulReduceScatter(const OpSpec& op, const Shape& x, const Shape& w, int n) {
  Expansion e(op);
  const std::string& xn = op.in[0];
  const std::string& wn = op.in[1];
  const std::string& out = op.out[0];
  Require(x.size() == 2 && w.size() == 2, "matmul_reduce_scatter takes 2-D operands, got " +
                                              FormatShape(x) + " and " + FormatShape(w));
  Require(x[1] == w[0], "matmul_reduce_scatter: inner dimensions differ: x" + FormatShape(x) +
                            " @ w" + FormatShape(w));
  int64_t d = op.scatter_dimension < 0 ? op.scatter_dimension + 2 : op.scatter_dimension;
  Require(d == 0 || d == 1, "matmul_reduce_scatter: scatter_dimension must be 0 or 1");
  int64_t extent = d == 0 ? x[0] : w[1];
  bool bidi = op.variant == "bidirectional";
  int64_t pieces = bidi ? 2 * n : n;
  Require(extent % pieces == 0, "matmul_reduce_scatter: dimension " + std::to_string(d) +
                                    " of the product (" + std::to_string(extent) +
                                    ") does not split into " + std::to_string(pieces) +
                                    (bidi ? " half-blocks" : " blocks"));
  if (n == 1) {  // Nothing to scatter: the product is the result.
    e.Matmul(xn, wn, out);
    return e.Take();
  }
  if (op.variant == "blocking") {
    e.Matmul(xn, wn, e.Name("product"));
    e.Collective(OpKind::kPsumScatter, e.Name("product"), out, d);
    return e.Take();
  }
  // The block of the product a step computes: rows of x (d = 0) or columns of w (d = 1).
  auto partial = [&](const std::string& slice_name, int64_t sections, int64_t scale, int64_t offset,
                     const std::string& product) {
    if (d == 0) {
      e.DynamicSlice(xn, slice_name, 0, sections, scale, offset);
      e.Matmul(slice_name, wn, product);
    } else {
      e.DynamicSlice(wn, slice_name, 1, sections, scale, offset);
      e.Matmul(xn, slice_name, product);
    }
  };
  if (!bidi) {
    std::string acc;
    for (int s = 0; s < n; ++s) {
      std::string part = e.Name("part", s);
      partial(e.Name("slice", s), n, 1, -s - 1, part);
      std::string sum = s == n - 1 ? out : e.Name("acc", s);
      if (s == 0) {
        acc = part;
      } else {
        e.Add(e.Name("recv", s), part, sum);
        acc = sum;
      }
      if (s < n - 1) e.Shift(acc, e.Name("recv", s + 1), +1);
    }
    return e.Take();
  }
  std::string at, ab;
  for (int s = 0; s < n; ++s) {
    std::string pt = e.Name("part_top", s), pb = e.Name("part_bottom", s);
    // Top half of block i - s - 1 (index 2(i - s - 1) of 2n), bottom half of block i + s + 1
    // (index 2(i + s + 1) + 1).
    partial(e.Name("slice_top", s), 2 * n, 2, -2 * s - 2, pt);
    partial(e.Name("slice_bottom", s), 2 * n, 2, 2 * s + 3, pb);
    if (s == 0) {
      at = pt;
      ab = pb;
    } else {
      std::string st = e.Name("acc_top", s), sb = e.Name("acc_bottom", s);
      e.Add(e.Name("recv_top", s), pt, st);
      e.Add(e.Name("recv_bottom", s), pb, sb);
      at = st;
      ab = sb;
    }
    if (s < n - 1) {
      e.Shift(at, e.Name("recv_top", s + 1), +1);
      e.Shift(ab, e.Name("recv_bottom", s + 1), -1);
    }
  }
  e.Local(OpKind::kConcatenate, {at, ab}, out, {}, d);
  return e.Take();
}

}  // namespace

std::vector<OpSpec> ExpandCollectiveMatmul(const OpSpec& op, const Shape& x, const Shape& w,
                                           int n) {
  if (op.in.size() != 2) throw std::invalid_argument("takes two inputs [x, w]");
  if (op.variant != "blocking" && op.variant != "unidirectional" && op.variant != "bidirectional") {
    throw std::invalid_argument("variant must be blocking, unidirectional or bidirectional");
  }
  if (op.kind == OpKind::kAllgatherMatmul) {
    if (op.gather != "lhs" && op.gather != "rhs") {
      throw std::invalid_argument("gather must be lhs or rhs");
    }
    return AllgatherMatmul(op, x, w, n);
  }
  return MatmulReduceScatter(op, x, w, n);
}

}  // namespace shardsim
