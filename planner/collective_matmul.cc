#include "planner/collective_matmul.h"

#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "collectives/lowering.h"
#include "collectives/runtime/run_program.h"
#include "collectives/semantics.h"
#include "planner/prefetch.h"

namespace shardsim::planner {
namespace {

// A matmul or einsum read as one 2-D product: x [rows..., K...] @ w [K..., N...] ->
// [rows..., N...], each group of dimensions folded into one by free (row-major) reshapes.
struct ProductForm {
  size_t row_dims = 0;             // Dimensions of x (and the leading ones of the result) kept.
  size_t k_dims = 0;               // Contracted: the last of x (or its first), the first of w
                                   // (or its last).
  size_t n_dims = 0;               // Kept dimensions of w.
  int64_t rows = 1, k = 1, n = 1;  // The folded extents.
  // w is read transposed: stored [N..., K...] (an activation's gradient, g @ w^T).
  bool w_transposed = false;
  // x is read transposed: stored [K..., rows...] (a weight's gradient, x^T @ g, contracting
  // the batch and sequence dimensions both operands lead with).
  bool x_transposed = false;
  // Where w's first contracted and first kept dimensions are, as stored.
  size_t FirstK() const { return w_transposed ? n_dims : 0; }
  size_t FirstN() const { return w_transposed ? 0 : k_dims; }
  // x is the product's second operand and w its first.
  bool swapped = false;
  // Where x's first contracted and first kept dimensions are, as stored.
  size_t FirstXK() const { return x_transposed ? 0 : row_dims; }
  size_t FirstRow() const { return x_transposed ? k_dims : 0; }
};

// Sets `f`'s folded extents from the local shapes of x and w.
ProductForm WithExtents(ProductForm f, const Shape& x, const Shape& w) {
  for (size_t i = 0; i < x.size(); ++i) {
    const bool kept = i >= f.FirstRow() && i < f.FirstRow() + f.row_dims;
    (kept ? f.rows : f.k) *= x[i];
  }
  for (size_t i = 0; i < f.n_dims; ++i) f.n *= w[f.FirstN() + i];
  return f;
}

// The einsum "<a>,<b>-><out>" read as x (letters `a`, local shape `xs`) times w (`b`, `ws`):
// "<rows><ks>,<ks><ns>-><rows><ns>", with w read transposed "<rows><ks>,<ns><ks>-><rows><ns>",
// with x read transposed "<ks><rows>,<ks><ns>-><rows><ns>" (or both), the letter groups
// non-empty and no letter repeated (no batch dimension). Or not.
std::optional<ProductForm> EinsumProduct(const std::string& a, const std::string& b,
                                         const std::string& out, const Shape& xs, const Shape& ws) {
  ProductForm f;
  // The contracted letters: those of b that a has, which must open b (or close it, w read
  // transposed) and close a (or open it, x read transposed).
  size_t k = 0;
  while (k < b.size() && a.find(b[k]) != std::string::npos) ++k;
  if (k == 0) {
    while (k < b.size() && a.find(b[b.size() - 1 - k]) != std::string::npos) ++k;
    f.w_transposed = true;
  }
  if (k == 0 || k >= b.size() || k >= a.size()) return std::nullopt;
  const std::string ks = f.w_transposed ? b.substr(b.size() - k) : b.substr(0, k);
  const std::string ns = f.w_transposed ? b.substr(0, b.size() - k) : b.substr(k);
  std::string rows;
  if (a.substr(a.size() - k) == ks) {
    rows = a.substr(0, a.size() - k);
  } else if (a.substr(0, k) == ks) {
    rows = a.substr(k);
    f.x_transposed = true;
  } else {
    return std::nullopt;
  }
  if (out != rows + ns) return std::nullopt;
  for (char c : ns) {
    if (a.find(c) != std::string::npos) return std::nullopt;
  }
  f.row_dims = rows.size();
  f.k_dims = k;
  f.n_dims = ns.size();
  for (size_t i = 0; i < k; ++i) {
    if (xs[f.FirstXK() + i] != ws[f.FirstK() + i]) return std::nullopt;
  }
  return WithExtents(f, xs, ws);
}

// How a matmul or einsum reads its operands of local shapes `lhs` and `rhs`: as a ProductForm,
// or not. matmul: x [..., K] @ w [K, N]. einsum: as EinsumProduct reads it, x the first
// operand or, where the result leads with the second's kept letters, the second (`swapped`).
// The attention's "btd,dhk->bthk" and "bthk,hkd->btd" are products, and so are an activation's
// gradient "bthk,dhk->btd" (w transposed) and a weight's "bthk,btd->dhk" (swapped, x
// transposed: the activation's transpose times the gradient).
std::optional<ProductForm> PlainProduct(const OpSpec& op, const Shape& lhs, const Shape& rhs) {
  if (op.kind == OpKind::kMatmul) {
    if (rhs.size() != 2 || lhs.size() < 2 || lhs.back() != rhs[0]) return std::nullopt;
    ProductForm f;
    f.row_dims = lhs.size() - 1;
    f.k_dims = 1;
    f.n_dims = 1;
    return WithExtents(f, lhs, rhs);
  }
  if (op.kind != OpKind::kEinsum) return std::nullopt;
  std::string s;
  for (char c : op.spec) {
    if (c != ' ') s += c;
  }
  const size_t comma = s.find(','), arrow = s.find("->");
  if (comma == std::string::npos || arrow == std::string::npos) return std::nullopt;
  const std::string a = s.substr(0, comma), b = s.substr(comma + 1, arrow - comma - 1),
                    out = s.substr(arrow + 2);
  if (a.size() != lhs.size() || b.size() != rhs.size()) return std::nullopt;
  if (std::set<char>(a.begin(), a.end()).size() != a.size() ||
      std::set<char>(b.begin(), b.end()).size() != b.size()) {
    return std::nullopt;
  }
  if (std::optional<ProductForm> f = EinsumProduct(a, b, out, lhs, rhs)) return f;
  std::optional<ProductForm> f = EinsumProduct(b, a, out, rhs, lhs);
  if (f) f->swapped = true;
  return f;
}

// The variant `mode` gives a loop whose travelling block has `extent` rows or columns to split.
// Bidirectional (and auto) fall back to one way where the block has an odd extent.
std::string VariantOf(CollectiveMatmulMode mode, int64_t extent) {
  if (mode == CollectiveMatmulMode::kUnidirectional || extent % 2 != 0) return "unidirectional";
  return "bidirectional";
}

// One gather-and-product pair as a program of its own: x (its local shape, replicated) and the
// gathered operand's local block w (split over the gather's axes along `axis`), run blocking
// (all_gather then matmul) or as the allgather_matmul `variant`.
struct Pair {
  Shape x, w;                   // Local shapes of the operand kept whole and of the gathered block.
  DType dtype = DType::kF32;    // The gathered block's.
  DType x_dtype = DType::kF32;  // The other operand's.
  std::vector<std::string> axes;
  int64_t axis = 0;
  bool gather_rhs = true;
  // A product and the psum_scatter of it along `axis` instead (x [M, K] @ w [K, N], both local
  // and replicated, partial sums over `axes`).
  bool scatter = false;
  // Everything that determines the time, for the cache.
  std::string Key(const std::string& variant) const {
    std::string k = FormatShape(x) + FormatShape(w) + DTypeName(dtype) + DTypeName(x_dtype) +
                    std::to_string(axis) + (gather_rhs ? "r" : "l") + (scatter ? "s" : "g") +
                    variant;
    for (const std::string& a : axes) k += "," + a;
    return k;
  }
};

// One op of a rewrite, with why it is there and its type ("f32[64,64]").
using Rewritten = std::pair<OpSpec, std::pair<std::string, std::string>>;

// The free reshape of `in` to `shape`, writing `out`, that stands where `product` stood (its
// key and where) around a loop: x's rows before (`suffix` "/rows"), w's contracted and kept
// dimensions before ("/cols"), or the result back after ("/unrows").
Rewritten Reshape(const OpSpec& product, const std::string& suffix, const std::string& in,
                  const std::string& out, Shape shape, std::string reason, std::string type) {
  OpSpec reshape;
  reshape.kind = OpKind::kReshape;
  reshape.name = product.name + suffix;
  reshape.key = product.key;
  reshape.in = {in};
  reshape.out = {out};
  reshape.shape = std::move(shape);
  reshape.where = product.where;
  return {reshape, {std::move(reason), std::move(type)}};
}

// The permutation of a rank-`rank` array that moves dimension `d` to the front, the others
// keeping their order (transpose's `axes`: result dimension i is input dimension axes[i]).
std::vector<int64_t> Leading(int64_t d, size_t rank) {
  std::vector<int64_t> axes = {d};
  for (int64_t i = 0; i < static_cast<int64_t>(rank); ++i) {
    if (i != d) axes.push_back(i);
  }
  return axes;
}

// The permutation undoing Leading(d, rank).
std::vector<int64_t> Trailing(int64_t d, size_t rank) {
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < static_cast<int64_t>(rank); ++i)
    axes.push_back(i < d ? i + 1 : i == d ? 0 : i);
  return axes;
}

// `shape` permuted by transpose `axes`.
Shape Permuted(const Shape& shape, const std::vector<int64_t>& axes) {
  Shape out;
  for (int64_t a : axes) out.push_back(shape[static_cast<size_t>(a)]);
  return out;
}

// How x of local shape `x` (rows first, `row_dims` of them), gathered along `axis`, travels:
// its rows (loop axis 0) when `axis` is a row dimension, that dimension moved to the front
// first (`lead`) when one before it is not 1 on the device (the sequence, two sequences a
// device); its columns (loop axis 1) when x is 2-D and gathered along K. Loop axis -1: neither.
struct TravellingX {
  int64_t loop_axis = -1;
  int64_t lead = -1;
};
TravellingX TravelOf(const Shape& x, size_t row_dims, int64_t axis) {
  TravellingX t;
  if (axis < static_cast<int64_t>(row_dims)) {
    t.loop_axis = 0;
    for (int64_t i = 0; i < axis; ++i) {
      if (x[static_cast<size_t>(i)] != 1) t.lead = axis;
    }
  }
  if (x.size() == 2 && axis == 1) t.loop_axis = 1;
  return t;
}

// "tp" or "fsdp, tp": a collective's axes for a reason.
std::string AxesText(const std::vector<std::string>& axes) {
  std::string text;
  for (const std::string& a : axes) text += (text.empty() ? "" : ", ") + a;
  return text;
}

Time PairTime(const Pair& pair, const std::string& variant, const Machine& machine,
              const Mesh& mesh, CollectiveCostModel& collectives) {
  ProgramSpec p;
  p.mesh_axes = mesh.axes();
  p.mesh_devices = mesh.devices();
  const int n = mesh.GroupSize([&] {
    std::vector<int> axes;
    for (const std::string& a : pair.axes) axes.push_back(mesh.AxisIndex(a));
    return axes;
  }());
  ArraySpec kept{"kept", pair.x, pair.x_dtype, {}, PartitionSpec{}, ""};
  kept.sharding.dims.resize(pair.x.size());
  ArraySpec block{"block", pair.w, pair.dtype, {}, PartitionSpec{}, ""};
  block.sharding.dims.resize(pair.w.size());
  if (!pair.scatter) {
    block.shape[static_cast<size_t>(pair.axis)] *= n;
    block.sharding.dims[static_cast<size_t>(pair.axis)] = pair.axes;
  }
  p.arrays = {kept, block};
  const std::string lhs = pair.gather_rhs ? "kept" : "block";
  const std::string rhs = pair.gather_rhs ? "block" : "kept";
  if (pair.scatter) {
    OpSpec op;
    op.in = {"kept", "block"};
    op.out = {"y"};
    if (variant == "blocking") {
      op.kind = OpKind::kMatmul;
      op.out = {"product"};
      OpSpec scatter;
      scatter.kind = OpKind::kPsumScatter;
      scatter.in = {"product"};
      scatter.out = {"y"};
      scatter.axis_name = pair.axes;
      scatter.scatter_dimension = pair.axis;
      scatter.tiled = true;
      p.ops = {op, scatter};
    } else {
      op.kind = OpKind::kMatmulReduceScatter;
      op.axis_name = pair.axes;
      op.scatter_dimension = pair.axis;
      op.variant = variant;
      p.ops = {op};
    }
  } else if (variant == "blocking") {
    OpSpec gather;
    gather.kind = OpKind::kAllGather;
    gather.in = {"block"};
    gather.out = {"whole"};
    gather.axis_name = pair.axes;
    gather.axis = pair.axis;
    gather.tiled = true;
    OpSpec product;
    product.kind = OpKind::kMatmul;
    product.in = {pair.gather_rhs ? lhs : "whole", pair.gather_rhs ? "whole" : rhs};
    product.out = {"y"};
    p.ops = {gather, product};
  } else {
    OpSpec cm;
    cm.kind = OpKind::kAllgatherMatmul;
    cm.in = {lhs, rhs};
    cm.out = {"y"};
    cm.axis_name = pair.axes;
    cm.gather = pair.gather_rhs ? "rhs" : "lhs";
    cm.axis = pair.axis;
    cm.variant = variant;
    p.ops = {cm};
  }
  for (size_t i = 0; i < p.ops.size(); ++i) {
    p.ops[i].name = "op" + std::to_string(i);
    p.ops[i].key = "program." + std::to_string(i);
  }
  RunConfig config;
  config.timing = TimingPath::kCached;
  config.collective_model = &collectives;
  return RunProgram(machine, mesh, p, config).end;
}

}  // namespace

const char* CollectiveMatmulModeName(CollectiveMatmulMode mode) {
  switch (mode) {
    case CollectiveMatmulMode::kOff:
      return "off";
    case CollectiveMatmulMode::kUnidirectional:
      return "unidirectional";
    case CollectiveMatmulMode::kBidirectional:
      return "bidirectional";
    case CollectiveMatmulMode::kAuto:
      return "auto";
  }
  return "off";
}

bool ParseCollectiveMatmulMode(const std::string& name, CollectiveMatmulMode* mode) {
  for (CollectiveMatmulMode m :
       {CollectiveMatmulMode::kOff, CollectiveMatmulMode::kUnidirectional,
        CollectiveMatmulMode::kBidirectional, CollectiveMatmulMode::kAuto}) {
    if (name == CollectiveMatmulModeName(m)) {
      *mode = m;
      return true;
    }
  }
  return false;
}

int FuseCollectiveMatmuls(PartitionResult& partitioned, const Mesh& mesh, CollectiveMatmulMode mode,
                          const Machine* machine, CollectiveCostModel* collectives,
                          bool weights_prefetched) {
  if (mode == CollectiveMatmulMode::kOff) return 0;
  if (mode == CollectiveMatmulMode::kAuto && (!machine || !collectives)) {
    throw std::logic_error("internal error: collective_matmul auto needs a machine to time on");
  }
  std::map<std::string, Time> timed;  // Pair::Key -> time.
  auto time_of = [&](const Pair& pair, const std::string& variant) {
    auto [it, fresh_key] = timed.try_emplace(pair.Key(variant));
    if (fresh_key) it->second = PairTime(pair, variant, *machine, mesh, *collectives);
    return it->second;
  };
  ProgramSpec& program = partitioned.program;
  const LoweredProgram lowered = LowerProgram(mesh, program);
  // Each program op's local input types (the first lowered op it became).
  std::vector<std::vector<Array>> in_types(program.ops.size());
  std::vector<char> seen(program.ops.size(), 0);
  for (const LoweredOp& op : lowered.ops) {
    if (seen[op.source]) continue;
    seen[op.source] = 1;
    for (int v : op.in_values) in_types[op.source].push_back(lowered.values[v]);
  }
  std::set<std::string> names, outputs;
  for (const ArraySpec& a : program.arrays) names.insert(a.name);
  for (const OpSpec& op : program.ops) names.insert(op.out.begin(), op.out.end());
  for (const OutputSpec& o : program.outputs) outputs.insert(o.name);
  // Per op index: the op that reads each binding of a name, until it is bound again.
  std::map<std::string, std::vector<size_t>> readers_of_binding;  // By "name@binder".
  std::map<std::string, size_t> binder;
  std::map<std::string, int> bindings;  // How many ops bind each name.
  // Per op: the op whose binding its first input reads (-1: an array or none).
  std::vector<int64_t> first_in_binder(program.ops.size(), -1);
  for (size_t i = 0; i < program.ops.size(); ++i) {
    if (!program.ops[i].in.empty()) {
      auto it = binder.find(program.ops[i].in[0]);
      if (it != binder.end()) first_in_binder[i] = static_cast<int64_t>(it->second);
    }
    for (const std::string& in : program.ops[i].in) {
      auto it = binder.find(in);
      const std::string key =
          in + "@" + (it == binder.end() ? "input" : std::to_string(it->second));
      readers_of_binding[key].push_back(i);
    }
    for (const std::string& out : program.ops[i].out) {
      binder[out] = i;
      ++bindings[out];
    }
  }
  auto fresh = [&](const std::string& base) {
    std::string name = base;
    for (int i = 2; names.count(name); ++i) name = base + "_" + std::to_string(i);
    names.insert(name);
    return name;
  };

  // Appends to `ops` a fused transpose of `v` by `axes` (empty: reversed), named by `product`
  // and `suffix`, writing `out` (empty: a fresh name from v and `fresh_suffix`); `why` and
  // `type` are its reason and type. It takes no time: XLA's dot reads an operand in place
  // whatever order its dimensions are stored in, and its layout assignment lays the dot's
  // operand and result out as the loop wants them; a view in the memory model (no buffer of
  // its own: the one it turns lives until it dies). v takes the transpose's name.
  auto fused_transpose = [&](const OpSpec& product, const std::string& suffix,
                             std::vector<int64_t> axes, const std::string& out,
                             const std::string& fresh_suffix, std::string why, std::string type,
                             std::vector<Rewritten>& ops, std::string& v) {
    OpSpec t;
    t.kind = OpKind::kTranspose;
    t.name = product.name + suffix;
    t.key = product.key;
    t.in = {v};
    t.out = {out.empty() ? fresh(v + fresh_suffix) : out};
    t.axes = std::move(axes);
    t.where = product.where;
    t.fused = true;
    ops.push_back({t, {std::move(why), std::move(type)}});
    v = t.out[0];
  };

  // Turns `v` (the product's operand `name`, read transposed, folded to the transpose of the
  // 2-D `shape`) into `shape` (`suffix` "/turn" for w, "/turn_x" for x).
  auto turn = [&](const OpSpec& product, const std::string& name, const std::string& suffix,
                  const Shape& shape, std::vector<Rewritten>& ops, std::string& v) {
    fused_transpose(product, suffix, {}, "", "/t",
                    name + " read transposed: its local block turned for the collective matmul",
                    FormatShape(shape) + " per device", ops, v);
  };

  // Permutes `v` (of local shape `shape`) by `axes`, writing `out` (empty: a fresh name): a row
  // dimension of an activation moved to the front, so that its blocks are whole rows of the
  // loop (as Megatron's sequence-first [s, b, h] layout has them), or moved back after it.
  auto permute = [&](const OpSpec& product, const std::string& suffix, const Shape& shape,
                     const std::vector<int64_t>& axes, const std::string& out, std::string why,
                     std::vector<Rewritten>& ops, std::string& v) {
    fused_transpose(product, suffix, axes, out, "/lead", std::move(why),
                    FormatShape(Permuted(shape, axes)) + " per device", ops, v);
  };

  // Folds `product`'s x [rows..., K...] (or, read transposed, [K..., rows...]) into [rows, k]
  // ahead of its loop: a free reshape appended to `ops` when x has more than two dimensions,
  // and a turn when transposed. x takes the last op's name.
  auto fold_x_2d = [&](const OpSpec& product, const ProductForm& form, size_t rank,
                       std::vector<Rewritten>& ops, std::string& x) {
    const std::string name = x;
    if (rank > 2) {
      const Shape stored = form.x_transposed ? Shape{form.k, form.rows} : Shape{form.rows, form.k};
      ops.push_back(
          Reshape(product, "/rows", x, fresh(product.out[0] + "/rows"), stored,
                  (form.x_transposed ? "the contracted and kept dimensions of " : "the rows of ") +
                      name + " for the collective matmul",
                  FormatShape(stored) + " per device"));
      x = ops.back().first.out[0];
    }
    if (form.x_transposed) turn(product, name, "/turn_x", {form.rows, form.k}, ops, x);
  };
  // Unfolds the loop's 2-D result `folded` of `product` into `result` of shape `back` (its row
  // dimensions, then its kept ones) by a free reshape; with a row dimension `lead` moved to the
  // front for the loop (>= 0), into that order first, then moved back by a fused transpose.
  // `type` is the result's.
  auto unfold = [&](const OpSpec& product, const std::string& folded, const std::string& result,
                    const Shape& back, int64_t lead, const std::string& type,
                    std::vector<Rewritten>& ops) {
    if (lead < 0) {
      ops.push_back(Reshape(product, "/unrows", folded, result, back,
                            "the collective matmul's rows back", type));
      return;
    }
    const Shape ahead = Permuted(back, Leading(lead, back.size()));
    ops.push_back(Reshape(product, "/unrows", folded, fresh(result + "/lead"), ahead,
                          "the collective matmul's rows back", FormatShape(ahead) + " per device"));
    std::string y = ops.back().first.out[0];
    permute(product, "/unlead", ahead, Trailing(lead, back.size()), result,
            "the collective matmul's dimension " + std::to_string(lead) + " back in place", ops, y);
    ops.back().second.second = type;
  };

  // Makes `x` (gathered along its row dimension `lead` when >= 0 is moved to the front, else
  // along rows already leading) the loop's travelling block of rows, `block` ([rows / n, k]):
  // the fused transpose, then a free reshape when x has more than two dimensions.
  auto travel_rows = [&](const OpSpec& product, const Shape& lhs, int64_t lead, int n,
                         const Shape& block, std::vector<Rewritten>& ops, std::string& x) {
    const std::string name = x;
    if (lead >= 0) {
      Shape local = lhs;
      local[static_cast<size_t>(lead)] /= n;
      permute(product, "/lead", local, Leading(lead, lhs.size()), "",
              "the rows of " + name + " gathered along its dimension " + std::to_string(lead) +
                  " in front for the collective matmul",
              ops, x);
    }
    if (lhs.size() > 2) {
      ops.push_back(Reshape(product, "/rows", x, fresh(name + "/rows"), block,
                            "the rows of " + name + " for the collective matmul",
                            FormatShape(block) + " per device"));
      x = ops.back().first.out[0];
    }
  };

  // Makes `w` (the product's operand `name`, or its local block) the loop's [K, N] `shape`:
  // stored [K..., N...], a free reshape when it has more dimensions; stored [N..., K...] (read
  // transposed), a free reshape to [N, K] then a turn.
  auto fold_w_2d = [&](const OpSpec& product, const std::string name, const Shape& shape,
                       bool reshape, bool transposed, std::vector<Rewritten>& ops, std::string& w) {
    const Shape stored = transposed ? Shape{shape[1], shape[0]} : shape;
    if (reshape) {
      ops.push_back(
          Reshape(product, "/cols", w, fresh(w + "/2d"), stored,
                  "the contracted and kept dimensions of " + name + " for the collective matmul",
                  FormatShape(stored) + " per device"));
      w = ops.back().first.out[0];
    }
    if (transposed) turn(product, name, "/turn", shape, ops, w);
  };

  // The allgather_matmul of `x` and `w` into `out` in `product`'s place (its name, key and
  // where), fused with `gather` (its axes and algorithm).
  auto gather_loop = [&](const OpSpec& product, const OpSpec& gather, std::string x, std::string w,
                         std::string out, bool gather_rhs, int64_t loop_axis,
                         const std::string& variant) {
    OpSpec cm;
    cm.kind = OpKind::kAllgatherMatmul;
    cm.name = product.name;
    cm.key = product.key;
    cm.in = {std::move(x), std::move(w)};
    cm.out = {std::move(out)};
    cm.axis_name = gather.axis_name;
    cm.gather = gather_rhs ? "rhs" : "lhs";
    cm.axis = loop_axis;
    cm.variant = variant;
    cm.algorithm = gather.algorithm;
    cm.where = product.where;
    return cm;
  };

  const std::vector<char> weight_ops =
      weights_prefetched ? WeightOpsOf(program) : std::vector<char>(program.ops.size(), 0);
  std::vector<char> drop(program.ops.size(), 0);
  // Replacements: op index -> the ops (with reasons and types) that take its place.
  std::map<size_t, std::vector<Rewritten>> replace;
  // Ops moved before a replaced op (their places dropped): replaced op index -> theirs.
  std::map<size_t, std::vector<size_t>> hoist;
  // Several products reading one gathered activation x (sequence parallelism's q, k and v
  // projections; its MLP's gate and up): their weights, each folded to [K, N_i], side by side
  // as one [K, sum N_i] by a fused concatenation (XLA's loop runs each dot on its own weight,
  // in place), one allgather_matmul in the first product's place, and each product's result
  // a fused slice of its columns, unfolded. Each product must read x as stored, rows first,
  // and its weight as bound where the first runs; nothing between the first and it may read
  // or bind its result. True when fused.
  auto fuse_shared = [&](size_t g, const std::vector<size_t>& readers) {
    const OpSpec& gather = program.ops[g];
    const std::string& v = gather.out[0];
    std::vector<ProductForm> forms;
    for (size_t c : readers) {
      if (drop[c] || replace.count(c)) return false;
      const OpSpec& p = program.ops[c];
      if (p.in.size() != 2 || p.in[0] != v || p.in[1] == v || p.out.size() != 1 ||
          p.where != gather.where || in_types[c].size() != 2 || !p.dtype.empty()) {
        return false;
      }
      const std::optional<ProductForm> form =
          PlainProduct(p, in_types[c][0].shape(), in_types[c][1].shape());
      if (!form || form->swapped || form->x_transposed) return false;
      if (!forms.empty() &&
          (form->row_dims != forms[0].row_dims || form->k_dims != forms[0].k_dims ||
           in_types[c][1].dtype() != in_types[readers[0]][1].dtype())) {
        return false;
      }
      forms.push_back(*form);
    }
    const size_t first = readers.front(), last = readers.back();
    for (size_t i = g + 1; i < last; ++i) {
      for (const std::string& o : program.ops[i].out) {
        if (o == gather.in[0]) return false;
      }
    }
    // A later product's weight made between the first and it (its compute-dtype copy, cast
    // from the parameter just before it) is made before the first instead: an op reading only
    // arrays no op binds, whose result nothing between reads or binds.
    std::vector<size_t> moved;
    auto movable = [&](size_t i) {
      const OpSpec& op = program.ops[i];
      if (drop[i] || replace.count(i) || op.out.size() != 1 || IsCollective(op.kind) ||
          op.where != program.ops[first].where || bindings[op.out[0]] != 1) {
        return false;
      }
      for (const std::string& in : op.in) {
        if (binder.count(in) || !names.count(in)) return false;
      }
      for (size_t j = first; j < i; ++j) {
        for (const std::string& in : program.ops[j].in) {
          if (in == op.out[0]) return false;
        }
        for (const std::string& o : program.ops[j].out) {
          if (o == op.out[0]) return false;
        }
      }
      return true;
    };
    for (size_t r = 1; r < readers.size(); ++r) {
      const OpSpec& p = program.ops[readers[r]];
      for (size_t i = first; i < readers[r]; ++i) {
        for (const std::string& o : program.ops[i].out) {
          if (o == p.in[1] && i > first && movable(i)) {
            moved.push_back(i);
            continue;
          }
          if (o == p.in[1] || (i > first && o == p.out[0])) return false;
        }
        for (const std::string& in : program.ops[i].in) {
          if (i > first && in == p.out[0]) return false;
        }
      }
    }
    const OpSpec& lead_product = program.ops[first];
    const ProductForm& form = forms[0];
    const Shape& lhs = in_types[first][0].shape();
    const int64_t axis =
        gather.axis < 0 ? gather.axis + static_cast<int64_t>(lhs.size()) : gather.axis;
    const auto [loop_axis, lead] = TravelOf(lhs, form.row_dims, axis);
    if (loop_axis < 0) return false;
    const int n = mesh.GroupSize(ResolveCollectiveAxes(gather, mesh));
    if (n <= 1) return false;
    int64_t columns = 0;
    for (const ProductForm& f : forms) columns += f.n;
    const Shape x2 = {form.rows, form.k};
    Shape block = x2;
    block[static_cast<size_t>(loop_axis)] /= n;
    const std::string variant = VariantOf(mode, block[static_cast<size_t>(loop_axis)]);
    std::string priced;
    if (mode == CollectiveMatmulMode::kAuto) {
      Pair pair;
      pair.x = {form.k, columns};
      pair.w = block;
      pair.dtype = in_types[g][0].dtype();
      pair.x_dtype = in_types[first][1].dtype();
      pair.axes = gather.axis_name;
      pair.axis = loop_axis;
      pair.gather_rhs = false;
      const Time blocking = time_of(pair, "blocking");
      const Time loop = time_of(pair, variant);
      if (loop >= blocking) return false;
      priced = ", " + FormatTime(loop) + " against " + FormatTime(blocking) + " blocking";
    }
    std::vector<Rewritten> ops;
    std::string x = gather.in[0];
    travel_rows(lead_product, lhs, lead, n, block, ops, x);
    OpSpec side;
    side.kind = OpKind::kConcatenate;
    side.name = lead_product.name + "/weights";
    side.key = lead_product.key;
    side.axis = 1;
    side.where = lead_product.where;
    side.fused = true;
    std::string products;
    for (size_t r = 0; r < readers.size(); ++r) {
      const OpSpec& p = program.ops[readers[r]];
      std::string w = p.in[1];
      fold_w_2d(p, w, {forms[r].k, forms[r].n}, in_types[readers[r]][1].shape().size() > 2,
                forms[r].w_transposed, ops, w);
      side.in.push_back(w);
      products += (products.empty() ? "" : ", ") + p.name;
    }
    side.out = {fresh(lead_product.out[0] + "/weights")};
    ops.push_back({side,
                   {"the weights of " + products + " side by side for one collective matmul",
                    FormatShape({form.k, columns}) + " per device"}});
    const OpSpec cm = gather_loop(lead_product, gather, x, side.out[0],
                                  fresh(lead_product.out[0] + "/all"), false, loop_axis, variant);
    const std::string gather_reason =
        partitioned.reasons.size() > g ? partitioned.reasons[g] : std::string();
    ops.push_back(
        {cm,
         {"collective matmul (" + cm.variant + priced + "): " + products +
              " fused with the all_gather of " + gather.in[0] + " over " +
              AxesText(gather.axis_name) + (gather_reason.empty() ? "" : "; " + gather_reason),
          FormatShape({form.rows, columns}) + " per device"}});
    int64_t offset = 0;
    for (size_t r = 0; r < readers.size(); ++r) {
      const OpSpec& p = program.ops[readers[r]];
      const std::string& type =
          partitioned.types.size() > readers[r] ? partitioned.types[readers[r]] : "";
      const bool folded = forms[r].row_dims + forms[r].n_dims != 2;
      OpSpec cut;
      cut.kind = OpKind::kSlice;
      cut.name = p.name + "/columns";
      cut.key = p.key;
      cut.in = {cm.out[0]};
      cut.out = {folded ? fresh(p.out[0] + "/2d") : p.out[0]};
      cut.start = offset;
      cut.size = forms[r].n;
      cut.axis = 1;
      cut.where = p.where;
      cut.fused = true;
      offset += forms[r].n;
      ops.push_back({cut,
                     {"the columns of " + p.name + " in the collective matmul's result",
                      folded ? FormatShape({form.rows, forms[r].n}) + " per device" : type}});
      if (!folded) continue;
      const Shape& rhs = in_types[readers[r]][1].shape();
      Shape back(lhs.begin(), lhs.begin() + static_cast<int64_t>(form.row_dims));
      const auto first_n = rhs.begin() + static_cast<int64_t>(forms[r].FirstN());
      back.insert(back.end(), first_n, first_n + static_cast<int64_t>(forms[r].n_dims));
      unfold(p, cut.out[0], p.out[0], back, lead, type, ops);
    }
    drop[g] = 1;
    for (size_t r = 1; r < readers.size(); ++r) drop[readers[r]] = 1;
    std::sort(moved.begin(), moved.end());
    moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
    for (size_t i : moved) drop[i] = 1;
    hoist[first] = std::move(moved);
    replace[first] = std::move(ops);
    return true;
  };

  int fused = 0;
  for (size_t g = 0; g < program.ops.size(); ++g) {
    const OpSpec& gather = program.ops[g];
    if (gather.kind != OpKind::kAllGather || !gather.tiled || gather.out.size() != 1) continue;
    if (mode == CollectiveMatmulMode::kAuto && weights_prefetched && weight_ops[g]) continue;
    const std::string& v = gather.out[0];
    if (outputs.count(v) || binder.at(v) != g) continue;  // Read at the end, or bound again.
    const std::vector<size_t>& readers = readers_of_binding[v + "@" + std::to_string(g)];
    if (readers.size() > 1) {
      if (fuse_shared(g, readers)) ++fused;
      continue;
    }
    if (readers.size() != 1 || drop[readers[0]] || replace.count(readers[0])) continue;
    const size_t c = readers[0];
    const OpSpec& consumer = program.ops[c];
    if (consumer.in.size() != 2 || consumer.in[0] == consumer.in[1] || consumer.out.size() != 1 ||
        consumer.where != gather.where || in_types[c].size() != 2 || !consumer.dtype.empty()) {
      continue;
    }
    const Shape& lhs = in_types[c][0].shape();
    const Shape& rhs = in_types[c][1].shape();
    const std::optional<ProductForm> form = PlainProduct(consumer, lhs, rhs);
    if (!form || form->swapped) continue;
    // The gathered block must still be bound as the gather read it when the product runs.
    bool rebound = false;
    for (size_t i = g + 1; i < c && !rebound; ++i) {
      for (const std::string& o : program.ops[i].out) rebound = rebound || o == gather.in[0];
    }
    if (rebound) continue;
    const bool gather_rhs = consumer.in[1] == v;
    if (!gather_rhs && form->x_transposed) continue;  // x travels as stored [rows, K] only.
    const Shape& gathered = gather_rhs ? rhs : lhs;
    const int64_t axis =
        gather.axis < 0 ? gather.axis + static_cast<int64_t>(gathered.size()) : gather.axis;
    // The loop's axis of the gathered operand, folded: w's first contracted dimension (its
    // blocks are whole rows of w [K, N]) or its first kept one (whole columns); x's rows or
    // columns as TravelOf says.
    int64_t loop_axis = -1;
    int64_t lead = -1;  // x's row dimension moved to the front, or none.
    if (gather_rhs) {
      if (axis == static_cast<int64_t>(form->FirstK())) loop_axis = 0;
      if (axis == static_cast<int64_t>(form->FirstN())) loop_axis = 1;
    } else {
      const TravellingX t = TravelOf(lhs, form->row_dims, axis);
      loop_axis = t.loop_axis;
      lead = t.lead;
    }
    if (loop_axis < 0) continue;
    const int n = mesh.GroupSize(ResolveCollectiveAxes(gather, mesh));
    if (n <= 1) continue;
    const Shape x2 = {form->rows, form->k};  // x as the loop sees it.
    const Shape w2 = {form->k, form->n};
    // The travelling block: w's rows or columns (K / n or N / n), x's rows or columns.
    const int64_t extent = (gather_rhs ? w2 : x2)[static_cast<size_t>(loop_axis)] / n;
    const std::string variant = VariantOf(mode, extent);
    // The gathered operand's local block, folded as the loop takes it.
    Shape block = gather_rhs ? w2 : x2;
    block[static_cast<size_t>(loop_axis)] /= n;
    std::string priced;
    if (mode == CollectiveMatmulMode::kAuto) {
      Pair pair;
      pair.x = gather_rhs ? x2 : w2;
      pair.w = block;
      pair.dtype = in_types[g][0].dtype();
      pair.x_dtype = in_types[c][gather_rhs ? 0 : 1].dtype();
      pair.axes = gather.axis_name;
      pair.axis = loop_axis;
      pair.gather_rhs = gather_rhs;
      const Time blocking = time_of(pair, "blocking");
      const Time loop = time_of(pair, variant);
      if (loop >= blocking) continue;
      priced = ", " + FormatTime(loop) + " against " + FormatTime(blocking) + " blocking";
    }

    std::vector<Rewritten> ops;
    const std::string& type = partitioned.types.size() > c ? partitioned.types[c] : "";
    std::string x = gather_rhs ? consumer.in[0] : gather.in[0];
    std::string w = gather_rhs ? gather.in[0] : consumer.in[1];
    std::string out = consumer.out[0];
    // Folded: x into rows (its kept dimensions, or a contraction over several; read
    // transposed, turned), w into [K, N] (a contraction or kept columns over several
    // dimensions; read transposed, its local block turned).
    // The loop's result [rows, N] is unfolded after it unless the product's is 2-D already.
    const bool folded = form->row_dims + form->n_dims != 2;
    if (folded) out = fresh(consumer.out[0] + "/2d");
    const bool fold_w = rhs.size() > 2;
    if (gather_rhs) {
      fold_x_2d(consumer, *form, lhs.size(), ops, x);
    } else {
      travel_rows(consumer, lhs, lead, n, block, ops, x);  // x travels.
    }
    fold_w_2d(consumer, w, gather_rhs ? block : w2, fold_w, form->w_transposed, ops, w);
    const OpSpec cm = gather_loop(consumer, gather, x, w, out, gather_rhs, loop_axis, variant);
    const std::string gather_reason =
        partitioned.reasons.size() > g ? partitioned.reasons[g] : std::string();
    ops.push_back(
        {cm,
         {"collective matmul (" + cm.variant + priced + "): " + OpKindName(consumer.kind) +
              " fused with the all_gather of " + gather.in[0] + " over " +
              AxesText(gather.axis_name) + (gather_reason.empty() ? "" : "; " + gather_reason),
          folded ? FormatShape({form->rows, form->n}) + " per device" : type}});
    if (folded) {
      const auto first_row = lhs.begin() + static_cast<int64_t>(form->FirstRow());
      Shape back(first_row, first_row + static_cast<int64_t>(form->row_dims));
      const auto first_n = rhs.begin() + static_cast<int64_t>(form->FirstN());
      back.insert(back.end(), first_n, first_n + static_cast<int64_t>(form->n_dims));
      unfold(consumer, out, consumer.out[0], back, lead, type, ops);
    }
    drop[g] = 1;
    replace[c] = std::move(ops);
    ++fused;
  }
  // Reduce-scatters: a tiled psum_scatter whose input one plain product makes, and nothing else
  // reads, fuses with it into a matmul_reduce_scatter in the product's place, its partial
  // products summed block by block as they travel. The scatter runs along the product's rows
  // (leading dimensions folded into rows: dimension 0, or a later one when every dimension
  // before it is 1 on the device) or its columns.
  for (size_t s = 0; s < program.ops.size(); ++s) {
    const OpSpec& scatter = program.ops[s];
    if (scatter.kind != OpKind::kPsumScatter || !scatter.tiled || scatter.out.size() != 1 ||
        in_types[s].size() != 1) {
      continue;
    }
    const std::string& v = scatter.in[0];
    if (first_in_binder[s] < 0) continue;
    const size_t c = static_cast<size_t>(first_in_binder[s]);
    // Not fused when that binding of v is also an output (the last binding of its name).
    if (outputs.count(v) && binder.at(v) == c) continue;
    if (drop[c] || replace.count(c)) continue;
    const std::vector<size_t>& readers = readers_of_binding[v + "@" + std::to_string(c)];
    if (readers.size() != 1 || readers[0] != s) continue;
    const OpSpec& product = program.ops[c];
    if (product.in.size() != 2 || product.out.size() != 1 || product.where != scatter.where ||
        in_types[c].size() != 2 || !product.dtype.empty()) {
      continue;
    }
    const std::optional<ProductForm> form =
        PlainProduct(product, in_types[c][0].shape(), in_types[c][1].shape());
    if (!form) continue;
    // A weight's gradient (x read transposed: the contraction runs over the tokens both
    // operands lead with) is read by nothing until the optimizer: in a scheduled step its
    // blocking scatter overlaps the rest of the backward, which auto leaves to it, as it leaves
    // prefetched weight gathers.
    if (mode == CollectiveMatmulMode::kAuto && weights_prefetched && form->x_transposed) continue;
    // x and w, the product's operands as the loop reads them.
    const size_t xi = form->swapped ? 1 : 0;
    const Shape& lhs = in_types[c][xi].shape();
    const Shape& rhs = in_types[c][1 - xi].shape();
    // The scatter's result is defined where the product was: nothing in between may read or
    // bind its name, nor bind the product's operands.
    bool clash = false;
    for (size_t i = c + 1; i < s && !clash; ++i) {
      for (const std::string& in : program.ops[i].in) clash = clash || in == scatter.out[0];
      for (const std::string& o : program.ops[i].out) {
        clash = clash || o == scatter.out[0] || o == product.in[0] || o == product.in[1];
      }
    }
    if (clash) continue;
    // The product's local result [rows..., N...].
    const Shape& made = in_types[s][0].shape();
    const int64_t rank = static_cast<int64_t>(made.size());
    const int64_t d = scatter.scatter_dimension < 0 ? scatter.scatter_dimension + rank
                                                    : scatter.scatter_dimension;
    const int64_t row_dims = static_cast<int64_t>(form->row_dims);
    // Whole blocks of the folded rows (every row dimension before d is 1 on the device) or of
    // the folded columns (d the first kept dimension of w).
    bool leading_ones = true;
    for (int64_t i = 0; i < d && i < row_dims; ++i) leading_ones = leading_ones && made[i] == 1;
    if (d < 0 || d >= rank || d > row_dims) continue;
    // A later row dimension with more than one index before it (the sequence, two sequences a
    // device) is moved to the front of x first, and of the result back after.
    const int64_t lead = d < row_dims && !leading_ones ? d : -1;
    if (lead >= 0 && form->x_transposed) continue;
    const int64_t folded_dim = d == row_dims ? 1 : 0;
    const int n = mesh.GroupSize(ResolveCollectiveAxes(scatter, mesh));
    if (n <= 1) continue;
    const int64_t rows = form->rows;
    const int64_t extent = (folded_dim == 0 ? rows : form->n);
    if (extent % n != 0) continue;
    const std::string variant = VariantOf(mode, extent / n);
    std::string priced;
    if (mode == CollectiveMatmulMode::kAuto) {
      Pair pair;
      pair.scatter = true;
      pair.x = {rows, form->k};
      pair.w = {form->k, form->n};
      pair.dtype = in_types[c][1 - xi].dtype();
      pair.x_dtype = in_types[c][xi].dtype();
      pair.axes = scatter.axis_name;
      pair.axis = folded_dim;
      const Time blocking = time_of(pair, "blocking");
      const Time loop = time_of(pair, variant);
      if (loop >= blocking) continue;
      priced = ", " + FormatTime(loop) + " against " + FormatTime(blocking) + " blocking";
    }
    std::vector<Rewritten> ops;
    const std::string& type = partitioned.types.size() > s ? partitioned.types[s] : "";
    std::string x = product.in[xi];
    std::string w = product.in[1 - xi];
    std::string out = scatter.out[0];
    // The loop's result [rows, N] is unfolded after it unless the product's is 2-D already.
    const bool fold = made.size() != 2;
    if (fold) out = fresh(scatter.out[0] + "/2d");
    const bool fold_w = rhs.size() > 2;
    if (lead >= 0) {
      permute(product, "/lead", lhs, Leading(lead, lhs.size()), "",
              "the rows of " + x + " to be scattered along its dimension " + std::to_string(lead) +
                  " in front for the collective matmul",
              ops, x);
    }
    fold_x_2d(product, *form, lhs.size(), ops, x);
    fold_w_2d(product, w, {form->k, form->n}, fold_w, form->w_transposed, ops, w);
    OpSpec cm;
    cm.kind = OpKind::kMatmulReduceScatter;
    cm.name = product.name;
    cm.key = product.key;
    cm.in = {x, w};
    cm.out = {out};
    cm.axis_name = scatter.axis_name;
    cm.scatter_dimension = folded_dim;
    cm.variant = variant;
    cm.algorithm = scatter.algorithm;
    cm.where = product.where;
    const std::string scatter_reason =
        partitioned.reasons.size() > s ? partitioned.reasons[s] : std::string();
    Shape result = made;
    result[static_cast<size_t>(d)] /= n;
    ops.push_back(
        {cm,
         {"collective matmul (" + cm.variant + priced + "): " + OpKindName(product.kind) +
              " fused with the psum_scatter of its result over " + AxesText(scatter.axis_name) +
              (scatter_reason.empty() ? "" : "; " + scatter_reason),
          fold
              ? FormatShape(folded_dim == 0 ? Shape{rows / n, form->n} : Shape{rows, form->n / n}) +
                    " per device"
              : type}});
    if (fold) unfold(product, out, scatter.out[0], result, lead, type, ops);
    drop[s] = 1;
    replace[c] = std::move(ops);
    ++fused;
  }
  if (fused == 0) return 0;
  ProgramSpec rewritten = program;
  rewritten.ops.clear();
  std::vector<std::string> reasons, types;
  for (size_t i = 0; i < program.ops.size(); ++i) {
    if (drop[i]) continue;
    auto it = replace.find(i);
    if (it == replace.end()) {
      rewritten.ops.push_back(std::move(program.ops[i]));
      reasons.push_back(i < partitioned.reasons.size() ? partitioned.reasons[i] : "");
      types.push_back(i < partitioned.types.size() ? partitioned.types[i] : "");
      continue;
    }
    auto moved = hoist.find(i);
    if (moved != hoist.end()) {
      for (size_t j : moved->second) {  // Later than i: not moved from yet.
        rewritten.ops.push_back(program.ops[j]);
        reasons.push_back(j < partitioned.reasons.size() ? partitioned.reasons[j] : "");
        types.push_back(j < partitioned.types.size() ? partitioned.types[j] : "");
      }
    }
    for (auto& [op, why] : it->second) {
      rewritten.ops.push_back(std::move(op));
      reasons.push_back(why.first);
      types.push_back(why.second);
    }
  }
  partitioned.program = std::move(rewritten);
  partitioned.reasons = std::move(reasons);
  partitioned.types = std::move(types);
  return fused;
}

}  // namespace shardsim::planner
