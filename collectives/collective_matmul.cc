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

// Which operand of an allgather_matmul travels and along which of its dimensions, and the
// names its expansion gives the arrays it makes.
struct GatherForm {
  bool rhs = true;  // w travels (else x).
  int axis = 0;     // The travelling operand's gathered dimension.

  // The travelling blocks meet the matching blocks of the other operand and the products add
  // up (rhs along its rows, lhs along its columns); otherwise each product is a block of the
  // result (lhs rows, rhs columns).
  bool Contracting() const { return rhs ? axis == 0 : axis == 1; }
  const char* Moving() const { return rhs ? "w" : "x"; }
  const char* Static() const { return rhs ? "x" : "w"; }
  // The halves of a travelling block, split along `axis`.
  const char* FirstHalf() const { return axis == 0 ? "top" : "left"; }
  const char* SecondHalf() const { return axis == 0 ? "bottom" : "right"; }
};

// A bidirectional loop's travelling block, split along the form's axis into halves that go
// round the group in opposite directions: first halves forward, second halves backward.
class Halves {
 public:
  // Splits block `block` of shape `moving` into the halves of step 0; its extent along the
  // form's axis must be even.
  Halves(Expansion& e, const GatherForm& form, const std::string& block, const Shape& moving)
      : e_(e), a_(form.FirstHalf()), b_(form.SecondHalf()) {
    const int64_t k = moving[form.axis];
    Require(k % 2 == 0, std::string("allgather_matmul bidirectional: the ") + form.Moving() +
                            " block's " + std::to_string(k) +
                            (form.axis == 0 ? " rows" : " columns") + " do not split in halves");
    h_ = k / 2;
    first_ = e.Name(a_, 0);
    second_ = e.Name(b_, 0);
    e.Slice(block, first_, 0, h_, form.axis);
    e.Slice(block, second_, h_, h_, form.axis);
  }
  // Sends both halves on after step `s`: the first forward, the second backward.
  void Shift(int s) {
    const std::string na = e_.Name(a_, s + 1), nb = e_.Name(b_, s + 1);
    e_.Shift(first_, na, +1);
    e_.Shift(second_, nb, -1);
    first_ = na;
    second_ = nb;
  }
  const std::string& first() const { return first_; }    // The first half held now.
  const std::string& second() const { return second_; }  // The second half held now.
  const std::string& a() const { return a_; }            // The first halves' name.
  const std::string& b() const { return b_; }            // The second halves' name.
  int64_t extent() const { return h_; }                  // A half's extent along the axis.

 private:
  Expansion& e_;
  std::string a_, b_;
  int64_t h_ = 0;
  std::string first_, second_;
};

// Contracting forms: x[B, K] @ all_gather(w[K/n, F]) (the seed notebook's FSDP matmul) and
// all_gather(x[B, K/n], axis 1) @ w[K, F] (the Scaling Book's A[B_X, D_Y] @ W[D, F_Y]). Step s
// multiplies the block of device i - s with the matching block of the static operand (its
// contracting dimension, dynamically sliced) and accumulates, while the next shift is in
// flight; bidirectional: first halves travel forward, second halves backward.
std::vector<OpSpec> GatherContracting(const OpSpec& op, const GatherForm& form, const Shape& moving,
                                      int n) {
  Expansion e(op);
  const std::string& mn = op.in[form.rhs ? 1 : 0];
  const std::string& sn = op.in[form.rhs ? 0 : 1];
  const std::string& out = op.out[0];
  const int64_t static_axis = form.rhs ? 1 : 0;  // The static operand's contracting dimension.
  auto product = [&](const std::string& block, const std::string& slice, const std::string& to) {
    if (form.rhs) {
      e.Matmul(slice, block, to);
    } else {
      e.Matmul(block, slice, to);
    }
  };
  std::string acc;
  auto accumulate = [&](const std::string& part, int s) {
    if (s == 0) {
      acc = part;
      return;
    }
    std::string sum = s == n - 1 ? out : e.Name("acc", s);
    e.Add(acc, part, sum);
    acc = sum;
  };
  if (op.variant == "unidirectional") {
    std::string blk = mn;
    for (int s = 0; s < n; ++s) {
      std::string slice = e.Name(form.Static(), s);
      e.DynamicSlice(sn, slice, static_axis, n, 1, -s);
      std::string part = n == 1 ? out : e.Name("part", s);
      product(blk, slice, part);
      accumulate(part, s);
      if (s < n - 1) {
        std::string next = e.Name(form.Moving(), s + 1);
        e.Shift(blk, next, +1);
        blk = next;
      }
    }
    return e.Take();
  }
  Halves halves(e, form, mn, moving);
  const std::string& a = halves.a();
  const std::string& b = halves.b();
  for (int s = 0; s < n; ++s) {
    const std::string sa = e.Name(std::string(form.Static()) + "_" + a, s);
    const std::string sb = e.Name(std::string(form.Static()) + "_" + b, s);
    e.DynamicSlice(sn, sa, static_axis, 2 * n, 2, -2 * s);
    e.DynamicSlice(sn, sb, static_axis, 2 * n, 2, 2 * s + 1);
    const std::string pa = e.Name("part_" + a, s), pb = e.Name("part_" + b, s);
    product(halves.first(), sa, pa);
    product(halves.second(), sb, pb);
    std::string both = n == 1 ? out : e.Name("part", s);
    e.Add(pa, pb, both);
    accumulate(both, s);
    if (s < n - 1) halves.Shift(s);
  }
  return e.Take();
}

// Free forms: all_gather(x[B/n, K]) @ w[K, F] (rows of x travel) and x[B, K] @
// all_gather(w[K, F/n], axis 1) (columns of w travel). Each step's product is a block of the
// result along the same dimension, placed by a dynamic concatenation (step s holds the block
// of device i - s); bidirectional: first halves travel forward, second halves backward, and
// are interleaved back into whole blocks.
std::vector<OpSpec> GatherFree(const OpSpec& op, const GatherForm& form, const Shape& x,
                               const Shape& w, int n) {
  Expansion e(op);
  const std::string& mn = op.in[form.rhs ? 1 : 0];
  const std::string& sn = op.in[form.rhs ? 0 : 1];
  const std::string& out = op.out[0];
  const char* blocks = form.axis == 0 ? "rows" : "columns";
  auto product = [&](const std::string& block, const std::string& to) {
    if (form.rhs) {
      e.Matmul(sn, block, to);
    } else {
      e.Matmul(block, sn, to);
    }
  };
  if (op.variant == "unidirectional") {
    std::string blk = mn;
    std::vector<std::string> parts;
    for (int s = 0; s < n; ++s) {
      parts.push_back(e.Name(blocks, s));
      product(blk, parts.back());
      if (s < n - 1) {
        std::string next = e.Name(form.Moving(), s + 1);
        e.Shift(blk, next, +1);
        blk = next;
      }
    }
    e.DynamicConcat(parts, out, form.axis, -1);
    return e.Take();
  }
  Halves halves(e, form, mn, form.rhs ? w : x);
  const std::string& a = halves.a();
  const std::string& b = halves.b();
  const int64_t h = halves.extent();
  std::vector<std::string> firsts, seconds;
  for (int s = 0; s < n; ++s) {
    firsts.push_back(e.Name(std::string(blocks) + "_" + a, s));
    seconds.push_back(e.Name(std::string(blocks) + "_" + b, s));
    product(halves.first(), firsts.back());
    product(halves.second(), seconds.back());
    if (s < n - 1) halves.Shift(s);
  }
  // First halves came from devices i - s, second halves from i + s: n blocks of h along the
  // gathered dimension each, set side by side along a new one and merged back.
  e.DynamicConcat(firsts, e.Name(a + "s"), form.axis, -1);
  e.DynamicConcat(seconds, e.Name(b + "s"), form.axis, +1);
  const Shape split = form.axis == 0 ? Shape{n, h, w[1]} : Shape{x[0], n, h};
  const Shape whole = form.axis == 0 ? Shape{n * 2 * h, w[1]} : Shape{x[0], n * 2 * h};
  e.Local(OpKind::kReshape, {e.Name(a + "s")}, e.Name(a + "s3"), split);
  e.Local(OpKind::kReshape, {e.Name(b + "s")}, e.Name(b + "s3"), split);
  e.Local(OpKind::kConcatenate, {e.Name(a + "s3"), e.Name(b + "s3")}, e.Name("blocks3"), {},
          form.axis + 1);
  e.Local(OpKind::kReshape, {e.Name("blocks3")}, out, whole);
  return e.Take();
}

std::vector<OpSpec> AllgatherMatmul(const OpSpec& op, const Shape& x, const Shape& w, int n) {
  Require(x.size() == 2 && w.size() == 2,
          "allgather_matmul takes 2-D operands, got " + FormatShape(x) + " and " + FormatShape(w));
  Require(op.axis == 0 || op.axis == 1,
          "allgather_matmul: axis (the gathered operand's dimension) must be 0 or 1, got " +
              std::to_string(op.axis));
  const GatherForm form{op.gather == "rhs", static_cast<int>(op.axis)};
  if (form.rhs && form.axis == 0) {
    Require(x[1] == w[0] * n, "allgather_matmul (gather rhs): x" + FormatShape(x) + " needs " +
                                  std::to_string(w[0] * n) + " columns to meet all_gather(w" +
                                  FormatShape(w) + ") over " + std::to_string(n) + " devices");
  } else if (!form.rhs && form.axis == 1) {
    Require(x[1] * n == w[0], "allgather_matmul (gather lhs, axis 1): all_gather(x" +
                                  FormatShape(x) + ", axis 1) over " + std::to_string(n) +
                                  " devices has " + std::to_string(x[1] * n) + " columns; w" +
                                  FormatShape(w) + " has " + std::to_string(w[0]) + " rows");
  } else {
    Require(x[1] == w[0], std::string("allgather_matmul (gather ") + (form.rhs ? "rhs" : "lhs") +
                              (form.axis == 1 ? ", axis 1" : "") + "): inner dimensions differ: x" +
                              FormatShape(x) + " @ w" + FormatShape(w));
  }
  if (op.variant == "blocking") {
    Expansion e(op);
    const std::string gathered = e.Name(std::string(form.Moving()) + "_full");
    e.Collective(OpKind::kAllGather, op.in[form.rhs ? 1 : 0], gathered, form.axis);
    if (form.rhs) {
      e.Matmul(op.in[0], gathered, op.out[0]);
    } else {
      e.Matmul(gathered, op.in[1], op.out[0]);
    }
    return e.Take();
  }
  return form.Contracting() ? GatherContracting(op, form, form.rhs ? w : x, n)
                            : GatherFree(op, form, x, w, n);
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
