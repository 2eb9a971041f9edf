#include "planner/grad.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "collectives/local_op.h"
#include "collectives/mesh.h"
#include "collectives/semantics.h"
#include "collectives/shard_map.h"
#include "collectives/sharding.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// Each value's type (dtype and shape), as a shape-only array.
using Types = std::unordered_map<std::string, Array>;

// Every name a program uses, and fresh ones beside them.
class Names {
 public:
  explicit Names(const ProgramSpec& program) {
    used_.reserve(2 * (program.arrays.size() + program.ops.size()));  // Backward names too.
    for (const ArraySpec& a : program.arrays) used_.insert(a.name);
    for (const OpSpec& op : program.ops) {
      used_.insert(op.out.begin(), op.out.end());
      used_.insert(op.name);
    }
    for (const OutputSpec& o : program.outputs) used_.insert(o.name);
  }
  // `base` if unused, else base_2, base_3, ...; marked used.
  std::string Fresh(const std::string& base) {
    std::string name = base;
    for (int i = 2; used_.count(name); ++i) name = base + "_" + std::to_string(i);
    used_.insert(name);
    return name;
  }

 private:
  std::unordered_set<std::string> used_;
};

// A mesh of one position: global-program ops do not read the mesh.
const Mesh& OnePosition() {
  static const Mesh kOnePosition({}, {0});
  return kOnePosition;
}

// The shape-only results of `op` on values of `types` (the sharding ops pass their input on);
// a shard_map body's ops see its `mesh` (a collective's result shape reads its group's size).
std::vector<Array> InferTypes(const OpSpec& op, const Types& types,
                              const Mesh& mesh = OnePosition()) {
  std::vector<const Array*> inputs;
  for (const std::string& name : op.in) inputs.push_back(&types.at(name));
  if (op.kind == OpKind::kShardingConstraint || op.kind == OpKind::kReshard ||
      op.kind == OpKind::kDevicePut) {
    return {*inputs.at(0)};
  }
  const OpDef& def = Op(op.kind);
  if (def.stream == OpStream::kCollective && def.takes_axis_name) {
    return {CollectiveResultType(op, inputs, mesh.GroupSize(ResolveCollectiveAxes(op, mesh)))};
  }
  return ApplyLocalOp(op, inputs, mesh, 0);
}

bool IsFloat(const Array& a) { return a.dtype() != DType::kI32; }

// Appends the backward ops of one grad op, each typed as it is written.
class Emitter {
 public:
  // Ops go to `ops` under the grad op's `key`; `scalar_source` names a float scalar value (the
  // grad's of), the shape Constant copies, when first asked. In a shard_map body the ops are
  // typed on its `mesh`.
  Emitter(Types& types, Names& names, std::vector<OpSpec>& ops, std::string key,
          std::function<std::string()> scalar_source, const Mesh& mesh = OnePosition())
      : types_(types),
        names_(names),
        ops_(ops),
        key_(std::move(key)),
        scalar_source_(std::move(scalar_source)),
        mesh_(mesh) {}

  // The type of value `name`.
  const Array& Type(const std::string& name) const { return types_.at(name); }

  // Appends `op`, its outputs named fresh from `base` when unnamed; returns its first output.
  std::string Emit(OpSpec op, const std::string& base) {
    if (op.out.empty()) {
      for (int64_t i = 0, n = OutputCount(op); i < n; ++i) op.out.push_back(names_.Fresh(base));
    }
    op.key = key_;
    op.name = op.out[0];
    std::vector<Array> results;
    try {
      results = InferTypes(op, types_, mesh_);
    } catch (const std::invalid_argument& e) {
      throw std::logic_error(std::string("internal error: grad emitted an op that does not fit: ") +
                             e.what());
    }
    for (size_t i = 0; i < op.out.size(); ++i) types_[op.out[i]] = std::move(results.at(i));
    ops_.push_back(std::move(op));
    return ops_.back().out[0];
  }
  // An op of `kind` on `in` with the attributes already set in `attrs`.
  std::string Op(OpKind kind, std::vector<std::string> in, const std::string& base,
                 OpSpec attrs = {}) {
    attrs.kind = kind;
    attrs.in = std::move(in);
    return Emit(std::move(attrs), base);
  }
  // a (op) scalar.
  std::string Scalar(OpKind kind, const std::string& a, double scalar, const std::string& base) {
    OpSpec op;
    op.scalar = scalar;
    return Op(kind, {a}, base, std::move(op));
  }
  std::string Reshape(const std::string& x, const Shape& shape, const std::string& base) {
    if (Type(x).shape() == shape) return x;
    OpSpec op;
    op.shape = shape;
    return Op(OpKind::kReshape, {x}, base, std::move(op));
  }
  std::string Convert(const std::string& x, DType dtype, const std::string& base) {
    OpSpec op;
    op.dtype = DTypeName(dtype);
    return Op(OpKind::kConvert, {x}, base, std::move(op));
  }
  std::string FullLike(const std::string& x, double value, const std::string& base) {
    OpSpec op;
    op.fill_value = value;
    return Op(OpKind::kFullLike, {x}, base, std::move(op));
  }
  // jnp.einsum; `preferred` its preferred_element_type ("" for none).
  std::string Einsum(const std::string& spec, const std::string& a, const std::string& b,
                     const std::string& base, const std::string& preferred = "") {
    OpSpec op;
    op.spec = spec;
    op.dtype = preferred;
    return Op(OpKind::kEinsum, {a, b}, base, std::move(op));
  }
  std::string Slice(const std::string& x, int64_t start, int64_t size, int64_t axis,
                    const std::string& base) {
    if (start == 0 && size == Type(x).shape().at(static_cast<size_t>(axis))) return x;
    OpSpec op;
    op.start = start;
    op.size = size;
    op.axis = axis;
    return Op(OpKind::kSlice, {x}, base, std::move(op));
  }
  // A scalar of `dtype` holding `value`: full_like of the grad's scalar `of`, converted.
  std::string Constant(DType dtype, double value, const std::string& base) {
    std::string c = FullLike(scalar_source_(), value, base);
    return Type(c).dtype() == dtype ? c : Convert(c, dtype, base);
  }
  // Cotangent `ct` as one of value `target`: same shape (a rule's promise), converted to its
  // dtype where promotion changed it, except that the cotangent of an 8-bit float stays in its
  // wider type (FP8 recipes' gradients: Transformer Engine passes them through its casts, and
  // the backward GEMMs quantize them to f8e5m2 themselves).
  std::string Match(const std::string& ct, const std::string& target, const std::string& base) {
    const Array& c = Type(ct);
    const Array& t = Type(target);
    if (c.shape() != t.shape()) {
      throw std::logic_error("internal error: grad made a cotangent " + c.TypeString() + " for '" +
                             target + "' of type " + t.TypeString());
    }
    const bool keep = c.dtype() == t.dtype() || (IsFloat8(t.dtype()) && c.dtype() != DType::kI32);
    return keep ? ct : Convert(ct, t.dtype(), base);
  }
  // sum(x, axes) (keepdims false).
  std::string Sum(const std::string& x, std::vector<int64_t> axes, const std::string& base) {
    OpSpec op;
    op.axes = std::move(axes);
    return Op(OpKind::kSum, {x}, base, std::move(op));
  }
  // `term`, of the shape `from` broadcasts to, summed over the broadcast dimensions and
  // reshaped to `to` (the transpose of a broadcast): `kept[d]` says whether dimension d of
  // `from` stays (it is also one of `to`'s at its size).
  std::string SumBroadcast(const std::string& term, const std::vector<bool>& kept, const Shape& to,
                           const std::string& base) {
    std::vector<int64_t> axes;
    for (size_t d = 0; d < kept.size(); ++d) {
      if (!kept[d]) axes.push_back(static_cast<int64_t>(d));
    }
    const std::string summed = axes.empty() ? term : Sum(term, axes, base);
    return Reshape(summed, to, base);
  }
  // The broadcast term `term` (an op's result shape) summed down to the shape of `target`
  // (NumPy broadcasting's transpose: the leading dimensions `target` lacks and those where it
  // has 1 are summed).
  std::string SumTo(const std::string& term, const std::string& target, const std::string& base) {
    const Shape& from = Type(term).shape();
    const Shape to = Type(target).shape();
    if (from == to) return term;
    const size_t lead = from.size() - to.size();
    std::vector<bool> kept(from.size());
    for (size_t d = lead; d < from.size(); ++d) kept[d] = to[d - lead] == from[d];
    return SumBroadcast(term, kept, to, base);
  }
  // Appends `op` (outputs named fresh from `base`); returns all its outputs.
  std::vector<std::string> EmitAll(OpSpec op, const std::string& base) {
    Emit(std::move(op), base);
    return ops_.back().out;
  }

 private:
  Types& types_;
  Names& names_;
  std::vector<OpSpec>& ops_;
  std::string key_;
  std::function<std::string()> scalar_source_;
  const Mesh& mesh_;
};

// What a transpose rule sees: the forward op, its outputs' cotangents ("" where none flows),
// which inputs need one, and the emitter for the ops it writes.
struct RuleArgs {
  const OpSpec& op;
  const std::vector<std::string>& cts;
  const std::vector<bool>& needs;
  Emitter& e;
  // The base name of input k's cotangent values ("d_x").
  std::string Base(size_t k) const { return "d_" + op.in.at(k); }
};

// A transpose rule: the cotangent of each input ("" for none: zero or not needed), in the
// input's shape (the caller converts dtypes).
using Rule = std::vector<std::string> (*)(const RuleArgs&);

// add, sub, mul, div, max, with NumPy broadcasting and scalar forms. The terms are of the
// result's shape, then summed to each operand's.
std::vector<std::string> BinaryRule(const RuleArgs& r) {
  const OpSpec& op = r.op;
  Emitter& e = r.e;
  const std::string& g = r.cts[0];
  const bool scalar = op.scalar.has_value();
  std::vector<std::string> d(op.in.size());
  const bool need_a = r.needs[0], need_b = !scalar && r.needs[1];
  switch (op.kind) {
    case OpKind::kAdd:  // d(a + b) = da + db.
      if (need_a) d[0] = g;
      if (need_b) d[1] = g;
      break;
    case OpKind::kSub:  // d(a - b) = da - db.
      if (need_a) d[0] = g;
      if (need_b) d[1] = e.Op(OpKind::kNeg, {g}, r.Base(1));
      break;
    case OpKind::kMul:  // d(ab) = b da + a db.
      if (scalar) {
        d[0] = e.Scalar(OpKind::kMul, g, *op.scalar, r.Base(0));
        break;
      }
      if (need_a) d[0] = e.Op(OpKind::kMul, {g, op.in[1]}, r.Base(0));
      if (need_b) d[1] = e.Op(OpKind::kMul, {g, op.in[0]}, r.Base(1));
      break;
    case OpKind::kDiv: {  // d(a / b) = da / b - (a / b^2) db = (da - y db) / b, y = a / b.
      if (scalar) {
        d[0] = e.Scalar(OpKind::kDiv, g, *op.scalar, r.Base(0));
        break;
      }
      const std::string t = e.Op(OpKind::kDiv, {g, op.in[1]}, r.Base(0));  // g / b.
      if (need_a) d[0] = t;
      if (need_b) {
        d[1] = e.Op(OpKind::kNeg, {e.Op(OpKind::kMul, {t, op.out[0]}, r.Base(1))}, r.Base(1));
      }
      break;
    }
    case OpKind::kMax: {  // g where the operand is the maximum, g / 2 at ties (JAX).
      const std::string b =
          scalar ? e.Constant(e.Type(op.in[0]).dtype(), *op.scalar, r.Base(0)) : op.in[1];
      if (need_a) d[0] = e.Op(OpKind::kMaxGrad, {g, op.in[0], b}, r.Base(0));
      if (need_b) d[1] = e.Op(OpKind::kMaxGrad, {g, b, op.in[0]}, r.Base(1));
      break;
    }
    default:
      throw std::logic_error("internal error: BinaryRule of a non-binary op");
  }
  for (size_t k = 0; k < d.size(); ++k) {
    if (!d[k].empty()) d[k] = e.SumTo(d[k], op.in[k], r.Base(k));
  }
  return d;
}

// The elementwise ops of one input: g f'(x). exp (g y), log (g / x) and neg (-g) are one
// existing op each; the others one unary_grad, which recomputes f' from x in the kernel (XLA
// fuses the same into one loop).
std::vector<std::string> UnaryRule(const RuleArgs& r) {
  const OpSpec& op = r.op;
  const std::string& g = r.cts[0];
  switch (op.kind) {
    case OpKind::kExp:  // exp' = exp = y.
      return {r.e.Op(OpKind::kMul, {g, op.out[0]}, r.Base(0))};
    case OpKind::kLog:  // log' = 1 / x.
      return {r.e.Op(OpKind::kDiv, {g, op.in[0]}, r.Base(0))};
    case OpKind::kNeg:
      return {r.e.Op(OpKind::kNeg, {g}, r.Base(0))};
    default: {
      OpSpec grad;
      grad.fn = OpKindName(op.kind);
      return {r.e.Op(OpKind::kUnaryGrad, {g, op.in[0]}, r.Base(0), std::move(grad))};
    }
  }
}

// convert: the cotangent converted back (Match does it); a linear map otherwise.
std::vector<std::string> ConvertRule(const RuleArgs& r) { return {r.cts[0]}; }

// reshape: reshape back.
std::vector<std::string> ReshapeRule(const RuleArgs& r) {
  return {r.e.Reshape(r.cts[0], r.e.Type(r.op.in[0]).shape(), r.Base(0))};
}

// transpose: by the inverse permutation (out dimension i is in dimension axes[i], so in
// dimension axes[i] is out dimension i). Reversal (empty axes) is its own inverse.
std::vector<std::string> TransposeRule(const RuleArgs& r) {
  OpSpec op;
  const int64_t rank = r.e.Type(r.op.in[0]).rank();
  if (!r.op.axes.empty()) {
    op.axes.resize(r.op.axes.size());
    for (size_t i = 0; i < r.op.axes.size(); ++i) {
      const int64_t a = r.op.axes[i] < 0 ? r.op.axes[i] + rank : r.op.axes[i];
      op.axes[static_cast<size_t>(a)] = static_cast<int64_t>(i);
    }
  }
  return {r.e.Op(OpKind::kTranspose, {r.cts[0]}, r.Base(0), std::move(op))};
}

// concatenate: each input's slice of the cotangent.
std::vector<std::string> ConcatenateRule(const RuleArgs& r) {
  const int64_t rank = r.e.Type(r.op.in[0]).rank();
  const int64_t axis = r.op.axis < 0 ? r.op.axis + rank : r.op.axis;
  std::vector<std::string> d(r.op.in.size());
  int64_t start = 0;
  for (size_t k = 0; k < r.op.in.size(); ++k) {
    const int64_t size = r.e.Type(r.op.in[k]).shape().at(static_cast<size_t>(axis));
    if (r.needs[k]) d[k] = r.e.Slice(r.cts[0], start, size, axis, r.Base(k));
    start += size;
  }
  return d;
}

// split: the parts' cotangents concatenated (zeros for parts without one).
std::vector<std::string> SplitRule(const RuleArgs& r) {
  std::vector<std::string> parts;
  for (size_t j = 0; j < r.op.out.size(); ++j) {
    parts.push_back(r.cts[j].empty() ? r.e.FullLike(r.op.out[j], 0.0, r.Base(0)) : r.cts[j]);
  }
  if (parts.size() == 1) return {parts[0]};
  OpSpec op;
  op.axis = r.op.axis;
  return {r.e.Op(OpKind::kConcatenate, parts, r.Base(0), std::move(op))};
}

// slice: the cotangent padded with zeros back to the input's extent (JAX pads).
std::vector<std::string> SliceRule(const RuleArgs& r) {
  const Shape& shape = r.e.Type(r.op.in[0]).shape();
  const int64_t axis = r.op.axis < 0 ? r.op.axis + static_cast<int64_t>(shape.size()) : r.op.axis;
  OpSpec op;
  op.axis = axis;
  op.low = r.op.start;
  op.high = shape.at(static_cast<size_t>(axis)) - r.op.start - r.op.size;
  if (op.low == 0 && op.high == 0) return {r.cts[0]};
  return {r.e.Op(OpKind::kPad, {r.cts[0]}, r.Base(0), std::move(op))};
}

// pad: the slice the input filled.
std::vector<std::string> PadRule(const RuleArgs& r) {
  const Shape& shape = r.e.Type(r.op.in[0]).shape();
  const int64_t axis = r.op.axis < 0 ? r.op.axis + static_cast<int64_t>(shape.size()) : r.op.axis;
  return {r.e.Slice(r.cts[0], r.op.low, shape.at(static_cast<size_t>(axis)), axis, r.Base(0))};
}

// sharding_constraint, reshard: the same op on the cotangent, so the sharding carries into
// the backward pass (JAX's transpose of both).
std::vector<std::string> ShardingRule(const RuleArgs& r) {
  OpSpec op;
  op.sharding = r.op.sharding;
  return {r.e.Op(r.op.kind, {r.cts[0]}, r.Base(0), std::move(op))};
}

// device_put: the cotangent goes back to the primal's mesh and layout (JAX's transpose of
// device_put), moved as real transfers like the forward's.
std::vector<std::string> DevicePutRule(const RuleArgs& r) {
  OpSpec op;
  op.like = r.op.in[0];
  return {r.e.Op(OpKind::kDevicePut, {r.cts[0]}, r.Base(0), std::move(op))};
}

// move_to_host, move_to_device: the value is unchanged, so the cotangent passes through; it
// stays in device memory, where the backward ops that make and read it run.
std::vector<std::string> MoveRule(const RuleArgs& r) { return {r.cts[0]}; }

// full_like: its value does not depend on its input's.
std::vector<std::string> ConstantRule(const RuleArgs& r) { return {""}; }

// The letters of a two-operand einsum spec, explicit (NumPy's implicit output: the letters seen
// once, sorted).
struct EinsumLetters {
  std::string a, b, out;
};

EinsumLetters ParseLetters(const std::string& spec) {
  std::string s;
  for (char c : spec) {
    if (c != ' ') s += c;
  }
  EinsumLetters l;
  const size_t arrow = s.find("->");
  const std::string lhs = s.substr(0, arrow);
  const size_t comma = lhs.find(',');
  l.a = lhs.substr(0, comma);
  l.b = lhs.substr(comma + 1);
  if (arrow != std::string::npos) {
    l.out = s.substr(arrow + 2);
  } else {
    const std::string all = l.a + l.b;
    for (char c : all) {
      if (std::count(all.begin(), all.end(), c) == 1) l.out += c;
    }
    std::sort(l.out.begin(), l.out.end());
  }
  return l;
}

// The cotangent of operand `which` of einsum(letters, a, b) from the result's cotangent g: the
// einsum of g with the other operand onto the operand's letters (those of its letters summed
// away on their own, in neither the other operand nor the result, come back by broadcasting).
// With `preferred` (the forward's preferred_element_type, "" for none) and an 8-bit float
// other operand, the backward GEMM runs in FP8 too, as Transformer Engine's hybrid recipe
// does: g quantized to f8e5m2 (fused into the kernel that makes it, free), the product
// accumulated into g's type.
std::string EinsumOperandGrad(Emitter& e, const EinsumLetters& l, const std::string& a,
                              const std::string& b, const std::string& g, int which,
                              const std::string& base, const std::string& preferred = "") {
  const std::string& own = which == 0 ? l.a : l.b;
  const std::string& other = which == 0 ? l.b : l.a;
  const std::string& operand = which == 0 ? a : b;
  const std::string& partner = which == 0 ? b : a;
  std::string kept;
  std::vector<int64_t> dims;
  for (size_t d = 0; d < own.size(); ++d) {
    if (l.out.find(own[d]) != std::string::npos || other.find(own[d]) != std::string::npos) {
      kept += own[d];
      dims.push_back(static_cast<int64_t>(d));
    }
  }
  std::string grad = g, result_type;
  if (!preferred.empty() && IsFloat8(e.Type(partner).dtype())) {
    OpSpec quantize;
    quantize.dtype = DTypeName(DType::kF8E5M2);
    quantize.fused = true;
    quantize.saturate = true;
    grad = e.Op(OpKind::kConvert, {g}, g + "_q", std::move(quantize));
    result_type = DTypeName(e.Type(g).dtype());
  }
  std::string d = e.Einsum(l.out + "," + other + "->" + kept, grad, partner, base, result_type);
  if (kept.size() == own.size()) return d;
  OpSpec op;
  op.shape = e.Type(operand).shape();
  op.broadcast_dimensions = dims;
  return e.Op(OpKind::kBroadcastInDim, {d}, base, std::move(op));
}

// einsum: each operand's cotangent is an einsum of g and the other operand.
std::vector<std::string> EinsumRule(const RuleArgs& r) {
  const EinsumLetters l = ParseLetters(r.op.spec);
  std::vector<std::string> d(2);
  for (int k = 0; k < 2; ++k) {
    if (r.needs[k]) {
      d[k] = EinsumOperandGrad(r.e, l, r.op.in[0], r.op.in[1], r.cts[0], k, r.Base(k), r.op.dtype);
    }
  }
  return d;
}

// matmul as the einsum it is (NumPy's matmul: vectors, broadcast batch dimensions). A batch
// dimension of size 1 that broadcasts against a larger one is reshaped away first (einsum
// letters do not broadcast) and its cotangent reshaped back, which sums over it.
std::vector<std::string> MatmulRule(const RuleArgs& r) {
  Emitter& e = r.e;
  const Shape& sa = e.Type(r.op.in[0]).shape();
  const Shape& sb = e.Type(r.op.in[1]).shape();
  const bool a_vector = sa.size() == 1, b_vector = sb.size() == 1;
  const size_t batch_a = a_vector ? 0 : sa.size() - 2, batch_b = b_vector ? 0 : sb.size() - 2;
  const size_t batch = std::max(batch_a, batch_b);
  const Shape& so = e.Type(r.op.out[0]).shape();
  // Letters: batch dimensions 'A', 'B', ... (aligned at the right), then m, k, n.
  auto operand = [&](const Shape& s, size_t own_batch, bool vector, bool lhs, Shape& kept) {
    std::string letters;
    for (size_t i = 0; i < own_batch; ++i) {
      const size_t at = batch - own_batch + i;
      if (s[i] == 1 && so[at] != 1) continue;  // Broadcast: reshaped away.
      letters += static_cast<char>('A' + at);
      kept.push_back(s[i]);
    }
    if (vector) {
      letters += 'k';
    } else {
      letters += lhs ? "mk" : "kn";
    }
    kept.insert(kept.end(), s.end() - (vector ? 1 : 2), s.end());
    return letters;
  };
  Shape kept_a, kept_b;
  EinsumLetters l;
  l.a = operand(sa, batch_a, a_vector, true, kept_a);
  l.b = operand(sb, batch_b, b_vector, false, kept_b);
  for (size_t i = 0; i < batch; ++i) l.out += static_cast<char>('A' + i);
  if (!a_vector) l.out += 'm';
  if (!b_vector) l.out += 'n';
  const std::string a = e.Reshape(r.op.in[0], kept_a, r.Base(0));
  const std::string b = e.Reshape(r.op.in[1], kept_b, r.Base(1));
  std::vector<std::string> d(2);
  for (int k = 0; k < 2; ++k) {
    if (!r.needs[k]) continue;
    d[k] = EinsumOperandGrad(e, l, a, b, r.cts[0], k, r.Base(k), r.op.dtype);
    d[k] = e.Reshape(d[k], k == 0 ? sa : sb, r.Base(k));
  }
  return d;
}

// An axis of a rank-`rank` value in [0, rank).
int64_t Axis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

// Which dimensions of x (rank `rank`) a reduction over `axes` keeps (empty axes: none).
std::vector<bool> KeptByReduction(const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<bool> kept(static_cast<size_t>(rank), !axes.empty());
  for (int64_t a : axes) kept[static_cast<size_t>(Axis(a, rank))] = false;
  return kept;
}

// g of a reduction's result shape broadcast back over x's (the transpose of a sum): the kept
// dimensions map in order, or every dimension with keepdims (the reduced ones of size 1).
std::string BroadcastBack(Emitter& e, const std::string& g, const OpSpec& op,
                          const std::string& base) {
  const Shape& xs = e.Type(op.in[0]).shape();
  const std::vector<bool> kept = KeptByReduction(op.axes, static_cast<int64_t>(xs.size()));
  OpSpec b;
  b.shape = xs;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (kept[d] || op.keepdims) b.broadcast_dimensions.push_back(static_cast<int64_t>(d));
  }
  return e.Op(OpKind::kBroadcastInDim, {g}, base, std::move(b));
}

// sum: g broadcast back (each element of x adds into one result element).
std::vector<std::string> SumRule(const RuleArgs& r) {
  return {BroadcastBack(r.e, r.cts[0], r.op, r.Base(0))};
}

// mean: g / count broadcast back (divided on the smaller, reduced shape).
std::vector<std::string> MeanRule(const RuleArgs& r) {
  const Shape& xs = r.e.Type(r.op.in[0]).shape();
  const std::vector<bool> kept = KeptByReduction(r.op.axes, static_cast<int64_t>(xs.size()));
  double count = 1;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (!kept[d]) count *= static_cast<double>(xs[d]);
  }
  const std::string share = r.e.Scalar(OpKind::kDiv, r.cts[0], count, r.Base(0));
  return {BroadcastBack(r.e, share, r.op, r.Base(0))};
}

// cumsum along axis a: x_j adds into every y_i with i >= j, so dx_j = sum_{i >= j} g_i, the
// cumsum of g the other way (a reverse cumsum's transpose is a forward one). Summed directly,
// not as the total minus the prefix, which cancels the small terms beside a large one.
std::vector<std::string> CumsumRule(const RuleArgs& r) {
  OpSpec cumsum;
  cumsum.norm_axis = r.op.norm_axis;
  cumsum.reverse = !r.op.reverse;
  return {r.e.Op(OpKind::kCumsum, {r.cts[0]}, r.Base(0), std::move(cumsum))};
}

// reduce_max: g split among the maxima (reduce_max_grad, with the reduction's attributes).
std::vector<std::string> ReduceMaxRule(const RuleArgs& r) {
  OpSpec op;
  op.axes = r.op.axes;
  op.keepdims = r.op.keepdims;
  return {r.e.Op(OpKind::kReduceMaxGrad, {r.cts[0], r.op.in[0]}, r.Base(0), std::move(op))};
}

// softmax, log_softmax: their derivative ops, from the forward result y.
std::vector<std::string> SoftmaxRule(const RuleArgs& r) {
  OpSpec op;
  op.norm_axis = r.op.norm_axis;
  const OpKind kind =
      r.op.kind == OpKind::kSoftmax ? OpKind::kSoftmaxGrad : OpKind::kLogSoftmaxGrad;
  return {r.e.Op(kind, {r.cts[0], r.op.out[0]}, r.Base(0), std::move(op))};
}

// rms_norm, layer_norm: [dx, g xhat] from their derivative op; the scale's cotangent is g xhat
// summed over every axis but the normalized one.
std::vector<std::string> NormRule(const RuleArgs& r) {
  OpSpec op;
  op.norm_axis = r.op.norm_axis;
  op.eps = r.op.eps;
  const OpKind kind = r.op.kind == OpKind::kRmsNorm ? OpKind::kRmsNormGrad : OpKind::kLayerNormGrad;
  op.kind = kind;
  op.in = {r.cts[0], r.op.in[0], r.op.in[1]};
  const std::vector<std::string> out = r.e.EmitAll(std::move(op), r.Base(0));
  std::vector<std::string> d = {out[0], ""};
  if (r.needs[1]) {
    const int64_t rank = r.e.Type(r.op.in[0]).rank();
    std::vector<int64_t> axes;
    for (int64_t a = 0; a < rank; ++a) {
      if (a != Axis(r.op.norm_axis, rank)) axes.push_back(a);
    }
    d[1] = axes.empty() ? out[1] : r.e.Sum(out[1], axes, r.Base(1));
  }
  return d;
}

// take: g's slices added into the table's rows (take_grad); the ids get none.
std::vector<std::string> TakeRule(const RuleArgs& r) {
  const Shape& table = r.e.Type(r.op.in[0]).shape();
  OpSpec op;
  op.axis = Axis(r.op.axis, static_cast<int64_t>(table.size()));
  op.size = table.at(static_cast<size_t>(op.axis));
  return {r.e.Op(OpKind::kTakeGrad, {r.cts[0], r.op.in[1]}, r.Base(0), std::move(op)), ""};
}

// repeat: output slice i is a's slice idx_i, idx = repeat(iota, repeats): g's slices added into
// the slices they copied (take_grad, as take's); the counts get none. iota is the exclusive
// prefix sum of ones beside the counts.
std::vector<std::string> RepeatRule(const RuleArgs& r) {
  const Shape& a = r.e.Type(r.op.in[0]).shape();
  const std::string& repeats = r.op.in[1];
  OpSpec one;
  one.fill_value = 1;
  const std::string ones = r.e.Op(OpKind::kFullLike, {repeats}, "ones", std::move(one));
  OpSpec along;
  along.norm_axis = 0;
  const std::string iota = r.e.Op(
      OpKind::kSub, {r.e.Op(OpKind::kCumsum, {ones}, "count", std::move(along)), ones}, "iota");
  OpSpec repeat;
  repeat.total_repeat_length = r.op.total_repeat_length;
  const std::string idx = r.e.Op(OpKind::kRepeat, {iota, repeats}, "idx", std::move(repeat));
  OpSpec op;
  op.axis = Axis(r.op.axis, static_cast<int64_t>(a.size()));
  op.size = a.at(static_cast<size_t>(op.axis));
  return {r.e.Op(OpKind::kTakeGrad, {r.cts[0], idx}, r.Base(0), std::move(op)), ""};
}

// cross_entropy: g / N (softmax - onehot) for the logits; the labels get none.
std::vector<std::string> CrossEntropyRule(const RuleArgs& r) {
  return {r.e.Op(OpKind::kCrossEntropyGrad, {r.cts[0], r.op.in[0], r.op.in[1]}, r.Base(0)), ""};
}

// top_k: the values' cotangent scattered back to the positions the indices name.
std::vector<std::string> TopKRule(const RuleArgs& r) {
  if (r.cts[0].empty()) return {""};  // Only the (integer) indices were read.
  OpSpec op;
  op.size = r.e.Type(r.op.in[0]).shape().back();
  return {r.e.Op(OpKind::kTopKGrad, {r.cts[0], r.op.out[1]}, r.Base(0), std::move(op))};
}

// attention: [dq, dk, dv] from one attention_grad (the backward pass recomputes the
// probabilities, as FlashAttention's does).
std::vector<std::string> AttentionRule(const RuleArgs& r) {
  OpSpec op;
  op.kind = OpKind::kAttentionGrad;
  op.causal = r.op.causal;
  op.kernel = r.op.kernel;
  op.in = {r.cts[0], r.op.in[0], r.op.in[1], r.op.in[2]};
  return r.e.EmitAll(std::move(op), r.Base(0));
}

// ragged_dot: d lhs = ragged_dot(g, rhs with k and n swapped, group_sizes) (rows past the groups
// get zeros, as their results were zeros); d rhs = ragged_dot_rhs_grad(lhs, g, group_sizes);
// the (integer) group sizes get none.
std::vector<std::string> RaggedDotRule(const RuleArgs& r) {
  std::vector<std::string> d(3);
  if (r.needs[0]) {
    OpSpec swap;
    swap.axes = {0, 2, 1};
    const std::string rhs_t =
        r.e.Op(OpKind::kTranspose, {r.op.in[1]}, r.op.in[1] + "_t", std::move(swap));
    OpSpec dot;
    dot.expected_rows = r.op.expected_rows;  // The cotangent's rows are the result's.
    d[0] = r.e.Op(OpKind::kRaggedDot, {r.cts[0], rhs_t, r.op.in[2]}, r.Base(0), std::move(dot));
  }
  if (r.needs[1]) {
    OpSpec grad;
    grad.expected_rows = r.op.expected_rows;
    d[1] = r.e.Op(OpKind::kRaggedDotRhsGrad, {r.op.in[0], r.cts[0], r.op.in[2]}, r.Base(1),
                  std::move(grad));
  }
  return d;
}

// broadcast_in_dim: g summed over the dimensions the broadcast made (new ones, and those the
// input had as 1), then reshaped to the input.
std::vector<std::string> BroadcastInDimRule(const RuleArgs& r) {
  const Shape& xs = r.e.Type(r.op.in[0]).shape();
  const Shape& os = r.e.Type(r.op.out[0]).shape();
  std::vector<bool> kept(os.size(), false);
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t d = static_cast<size_t>(r.op.broadcast_dimensions[i]);
    kept[d] = xs[i] == os[d];
  }
  return {r.e.SumBroadcast(r.cts[0], kept, xs, r.Base(0))};
}

// The collectives of shard_map bodies. Each device's local value is a variable of its own (the
// body's outputs leave the region by their out specs, and the region's transpose divides a
// replicated output's cotangent among its copies: ExpandRegion), so each collective is a
// linear map across the group's members and its transpose is the adjoint map: JAX's rules
// without shard_map's replication rewrite.

// The adjoint of a collective over the same axes, on the cotangent:
// - psum, pmean: every member's result sums (averages) every member's input, so the adjoint
//   sums (averages) the cotangents the same way;
// - all_gather: each member's block reaches every member, so its cotangent is the sum of every
//   member's cotangent of that block: psum_scatter along the gathered axis (tiled alike);
// - psum_scatter: each member's input block j is summed into member j's result, so member j's
//   cotangent goes back to every member's block j: all_gather along the scattered axis;
// - all_to_all: a permutation of blocks; its inverse splits along the concatenated axis and
//   concatenates along the split one;
// - ppermute: the inverse permutation (each pair reversed, or the shift the other way); members
//   no pair sends to held zeros, which take no cotangent.
std::vector<std::string> CollectiveRule(const RuleArgs& r) {
  const OpSpec& f = r.op;
  OpSpec op;
  op.kind = f.kind;
  op.axis_name = f.axis_name;
  op.tiled = f.tiled;
  switch (f.kind) {
    case OpKind::kAllGather:
      op.kind = OpKind::kPsumScatter;
      op.scatter_dimension = f.axis;
      break;
    case OpKind::kPsumScatter:
      op.kind = OpKind::kAllGather;
      op.axis = f.scatter_dimension;
      break;
    case OpKind::kAllToAll:
      op.split_axis = f.concat_axis;
      op.concat_axis = f.split_axis;
      break;
    case OpKind::kPpermute:
      if (f.shift) op.shift = -*f.shift;
      for (const auto& [src, dst] : f.perm) op.perm.push_back({dst, src});
      break;
    default:  // psum, pmean.
      break;
  }
  const OpKind kind = op.kind;
  return {r.e.Op(kind, {r.cts[0]}, r.Base(0), std::move(op))};
}

// ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
// the rows each member sent come back from where they landed (JAX's transpose): a
// ragged_all_to_all of the cotangent into zeros, each member reading at the offsets its rows
// were written to (the senders' output_offsets, exchanged by an all_to_all), sending what it
// received and receiving what it sent, written at the offsets they were read from (the
// input_offsets, exchanged likewise). The output buffer's cotangent is the cotangent where no
// row landed: g - g * (the same dispatch of ones).
std::vector<std::string> RaggedAllToAllRule(const RuleArgs& r) {
  const OpSpec& f = r.op;
  Emitter& e = r.e;
  std::vector<std::string> d(6);
  auto exchange = [&](const std::string& offsets) {
    OpSpec op;
    op.axis_name = f.axis_name;
    op.tiled = true;
    return e.Op(OpKind::kAllToAll, {offsets}, offsets + "_back", std::move(op));
  };
  auto dispatch = [&](const std::vector<std::string>& in, const std::string& base) {
    OpSpec op;
    op.axis_name = f.axis_name;
    return e.Op(OpKind::kRaggedAllToAll, in, base, std::move(op));
  };
  if (r.needs[0]) {
    d[0] = dispatch({r.cts[0], e.FullLike(f.in[0], 0.0, r.Base(0)), exchange(f.in[4]), f.in[5],
                     exchange(f.in[2]), f.in[3]},
                    r.Base(0));
  }
  if (r.needs[1]) {
    const std::string landed =
        dispatch({e.FullLike(f.in[0], 1.0, r.Base(1)), e.FullLike(f.in[1], 0.0, r.Base(1)), f.in[2],
                  f.in[3], f.in[4], f.in[5]},
                 r.Base(1));
    d[1] = e.Op(OpKind::kSub, {r.cts[0], e.Op(OpKind::kMul, {r.cts[0], landed}, r.Base(1))},
                r.Base(1));
  }
  return d;
}

// The transpose rule of each op kind that has one.
const Rule* FindRule(OpKind kind) {
  static const std::map<OpKind, Rule> kRules = {
      {OpKind::kAdd, BinaryRule},
      {OpKind::kSub, BinaryRule},
      {OpKind::kMul, BinaryRule},
      {OpKind::kDiv, BinaryRule},
      {OpKind::kMax, BinaryRule},
      {OpKind::kRelu, UnaryRule},
      {OpKind::kGelu, UnaryRule},
      {OpKind::kSilu, UnaryRule},
      {OpKind::kExp, UnaryRule},
      {OpKind::kLog, UnaryRule},
      {OpKind::kTanh, UnaryRule},
      {OpKind::kNeg, UnaryRule},
      {OpKind::kSqrt, UnaryRule},
      {OpKind::kRsqrt, UnaryRule},
      {OpKind::kSquare, UnaryRule},
      {OpKind::kAbs, UnaryRule},
      {OpKind::kSin, UnaryRule},
      {OpKind::kCos, UnaryRule},
      {OpKind::kConvert, ConvertRule},
      {OpKind::kReshape, ReshapeRule},
      {OpKind::kTranspose, TransposeRule},
      {OpKind::kConcatenate, ConcatenateRule},
      {OpKind::kSplit, SplitRule},
      {OpKind::kSlice, SliceRule},
      {OpKind::kPad, PadRule},
      {OpKind::kMatmul, MatmulRule},
      {OpKind::kEinsum, EinsumRule},
      {OpKind::kShardingConstraint, ShardingRule},
      {OpKind::kReshard, ShardingRule},
      {OpKind::kDevicePut, DevicePutRule},
      {OpKind::kMoveToHost, MoveRule},
      {OpKind::kMoveToDevice, MoveRule},
      {OpKind::kFullLike, ConstantRule},
      {OpKind::kBroadcastInDim, BroadcastInDimRule},
      {OpKind::kSum, SumRule},
      {OpKind::kCumsum, CumsumRule},
      {OpKind::kMean, MeanRule},
      {OpKind::kReduceMax, ReduceMaxRule},
      {OpKind::kSoftmax, SoftmaxRule},
      {OpKind::kLogSoftmax, SoftmaxRule},
      {OpKind::kRmsNorm, NormRule},
      {OpKind::kLayerNorm, NormRule},
      {OpKind::kTake, TakeRule},
      {OpKind::kRepeat, RepeatRule},
      {OpKind::kCrossEntropy, CrossEntropyRule},
      {OpKind::kTopK, TopKRule},
      {OpKind::kAttention, AttentionRule},
      {OpKind::kRaggedDot, RaggedDotRule},
      {OpKind::kPsum, CollectiveRule},
      {OpKind::kPmean, CollectiveRule},
      {OpKind::kAllGather, CollectiveRule},
      {OpKind::kPsumScatter, CollectiveRule},
      {OpKind::kAllToAll, CollectiveRule},
      {OpKind::kPpermute, CollectiveRule},
      {OpKind::kRaggedAllToAll, RaggedAllToAllRule},
  };
  auto it = kRules.find(kind);
  return it == kRules.end() ? nullptr : &it->second;
}

// A program's ops in single-assignment form.
struct Renamed {
  std::vector<OpSpec> ops;
  // The first `aliases` ops are the aliases of rebound arrays: the only readers of the arrays'
  // own versions, which share their names with the arrays' last bindings.
  size_t aliases = 0;
};

// The program in single-assignment form: where a name is bound more than once, every binding
// but the last takes a fresh name and the ops reading it follow; an array rebound later is read
// through a free reshape alias made first (an array keeps its name).
Renamed SingleAssignment(const ProgramSpec& program, Names& names) {
  std::unordered_map<std::string, size_t> last_def;  // Name -> 1 + the last op binding it.
  for (size_t i = 0; i < program.ops.size(); ++i) {
    for (const std::string& name : program.ops[i].out) last_def[name] = i + 1;
  }
  std::unordered_map<std::string, std::string> binding;
  Renamed renamed;
  std::vector<OpSpec>& ops = renamed.ops;
  for (const ArraySpec& a : program.arrays) {
    if (!last_def.count(a.name)) continue;
    OpSpec alias;
    alias.kind = OpKind::kReshape;
    alias.in = {a.name};
    alias.shape = a.shape;
    alias.out = {names.Fresh(a.name)};
    alias.name = alias.out[0];
    alias.key = "arrays." + a.name;
    binding[a.name] = alias.out[0];
    ops.push_back(std::move(alias));
  }
  renamed.aliases = ops.size();
  auto bound = [&](const std::string& name) {
    auto it = binding.find(name);
    return it == binding.end() ? name : it->second;
  };
  for (size_t i = 0; i < program.ops.size(); ++i) {
    OpSpec op = program.ops[i];
    for (std::string& name : op.in) name = bound(name);
    if (!op.of.empty()) op.of = bound(op.of);
    for (std::string& name : op.wrt) name = bound(name);
    for (std::string& name : op.out) {
      const std::string written = name;
      if (last_def.at(written) != i + 1) name = names.Fresh(written);
      binding[written] = name;
    }
    ops.push_back(std::move(op));
  }
  return renamed;
}

// Whether some name is bound twice (by two ops, or an array and an op).
bool Rebinds(const ProgramSpec& program) {
  std::unordered_set<std::string> bound;
  for (const ArraySpec& a : program.arrays) bound.insert(a.name);
  for (const OpSpec& op : program.ops) {
    for (const std::string& name : op.out) {
      if (!bound.insert(name).second) return true;
    }
  }
  return false;
}

// The float values of `ops` (from index `first` on) that depend on one of `from`, and those.
std::unordered_set<std::string> Varies(const std::vector<OpSpec>& ops, size_t first,
                                       std::unordered_set<std::string> from, const Types& types) {
  for (size_t i = first; i < ops.size(); ++i) {
    const OpSpec& op = ops[i];
    const bool depends = std::any_of(op.in.begin(), op.in.end(),
                                     [&](const std::string& v) { return from.count(v) > 0; });
    if (!depends) continue;
    for (const std::string& v : op.out) {
      if (IsFloat(types.at(v))) from.insert(v);
    }
  }
  return from;
}

// The transpose of a shard_map op of the program: (op index, its outputs' cotangents, which
// inputs need one) -> the inputs' cotangents.
using RegionRule = std::function<std::vector<std::string>(size_t, const std::vector<std::string>&,
                                                          const std::vector<bool>&)>;

// Reverse mode over `ops` from index `first` on, seeded with the cotangents in `ct`: through the
// ops on a path from a `varies` value to a seeded one only, each op's rule in reverse (a
// shard_map's `region`), cotangents of a value read several times accumulated with add into
// `ct`. An op on the path without a rule is refused at `key` (the path leads to `of`).
void Backpropagate(const std::vector<OpSpec>& ops, size_t first,
                   const std::unordered_set<std::string>& varies,
                   std::unordered_map<std::string, std::string>& ct, Emitter& e,
                   const std::string& key, const std::string& of, const RegionRule& region) {
  std::unordered_set<std::string> needed;
  for (const auto& [v, c] : ct) needed.insert(v);
  std::vector<size_t> path;  // In reverse program order.
  for (size_t i = ops.size(); i-- > first;) {
    const OpSpec& op = ops[i];
    if (std::none_of(op.out.begin(), op.out.end(),
                     [&](const std::string& v) { return needed.count(v) > 0; })) {
      continue;
    }
    path.push_back(i);
    for (const std::string& v : op.in) {
      if (varies.count(v)) needed.insert(v);
    }
  }
  for (size_t i : path) {
    const OpSpec& op = ops[i];
    std::vector<std::string> cts(op.out.size());
    bool any = false;
    for (size_t j = 0; j < op.out.size(); ++j) {
      auto it = ct.find(op.out[j]);
      if (it != ct.end()) cts[j] = it->second, any = true;
    }
    if (!any) continue;  // Only zero cotangents reach it.
    std::vector<bool> needs(op.in.size());
    for (size_t k = 0; k < op.in.size(); ++k) needs[k] = varies.count(op.in[k]) > 0;
    std::vector<std::string> d;
    if (op.kind == OpKind::kShardMap && region) {
      d = region(i, cts, needs);
    } else {
      const Rule* rule = FindRule(op.kind);
      if (!rule) {
        throw SpecError(key, "grad: " + std::string(OpKindName(op.kind)) + " '" + op.name + "' (" +
                                 op.key + ") lies on the path to '" + of +
                                 "' but has no derivative rule");
      }
      d = (*rule)(RuleArgs{op, cts, needs, e});
    }
    for (size_t k = 0; k < op.in.size(); ++k) {
      if (!needs[k] || k >= d.size() || d[k].empty()) continue;
      const std::string& v = op.in[k];
      const std::string c = e.Match(d[k], v, "d_" + v);
      auto it = ct.find(v);
      ct[v] = it == ct.end() ? c : e.Op(OpKind::kAdd, {it->second, c}, "d_" + v);
    }
  }
}

// Expands the grad ops of a program, op by op.
class Expander {
 public:
  // Expands `program`'s grad ops, naming new values apart from `names`.
  Expander(const ProgramSpec& program, Names& names) : out_(WithoutOps(program)), names_(names) {
    types_.reserve(3 * (program.arrays.size() + program.ops.size()));  // Backward values too.
    for (const ArraySpec& a : program.arrays) types_[a.name] = Array::ShapeOnly(a.dtype, a.shape);
  }

  // The program with `renamed` (its ops, single-assignment) and every grad op expanded.
  ProgramSpec Run(Renamed renamed, std::vector<size_t>* pass_starts) {
    aliases_ = renamed.aliases;
    out_.ops.reserve(renamed.ops.size());
    for (OpSpec& op : renamed.ops) {
      if (op.kind == OpKind::kGrad) {
        if (pass_starts) pass_starts->push_back(out_.ops.size());
        Expand(op);
        if (pass_starts) pass_starts->push_back(out_.ops.size());
        continue;
      }
      std::vector<Array> results;
      try {
        results = InferTypes(op, types_);
      } catch (const std::invalid_argument& e) {
        throw SpecError(op.key, e.what());
      }
      for (size_t i = 0; i < op.out.size(); ++i) types_[op.out[i]] = std::move(results.at(i));
      out_.ops.push_back(std::move(op));
    }
    return std::move(out_);
  }

 private:
  // Replaces grad op `grad` by its backward ops.
  void Expand(const OpSpec& grad) {
    const Array& of = types_.at(grad.of);
    if (of.rank() != 0 || !IsFloat(of)) {
      throw SpecError(grad.key + ".of", "grad needs a float scalar of: (jax.grad's output), but '" +
                                            grad.of + "' is " + of.TypeString());
    }
    for (size_t i = 0; i < grad.wrt.size(); ++i) {
      const Array& w = types_.at(grad.wrt[i]);
      if (!IsFloat(w)) {
        throw SpecError(grad.key + ".wrt." + std::to_string(i),
                        "grad differentiates float values only, but '" + grad.wrt[i] + "' is " +
                            w.TypeString());
      }
    }
    // The backward pass: seed 1 at `of`, each op's rule in reverse, cotangents accumulated.
    std::unordered_set<std::string> varies =
        Varies(out_.ops, aliases_, {grad.wrt.begin(), grad.wrt.end()}, types_);
    std::vector<OpSpec> backward;
    Emitter e(types_, names_, backward, grad.key, [&grad] { return grad.of; });
    std::unordered_map<std::string, std::string> ct;
    if (varies.count(grad.of)) ct[grad.of] = e.FullLike(grad.of, 1.0, "d_" + grad.of);
    Backpropagate(
        out_.ops, aliases_, varies, ct, e, grad.key, grad.of,
        [&](size_t i, const std::vector<std::string>& cts, const std::vector<bool>& needs) {
          return ExpandRegion(i, cts, needs, e, grad.key);
        });
    // Each gradient under its output name: the value computed last takes the name; a second
    // output of the same value (a wrt named twice) is a free reshape of the first.
    std::map<std::string, std::string> taken;  // Cotangent value -> the output it became.
    for (size_t i = 0; i < grad.wrt.size(); ++i) {
      auto it = ct.find(grad.wrt[i]);
      const std::string c = it != ct.end() ? it->second : e.FullLike(grad.wrt[i], 0.0, grad.out[i]);
      auto done = taken.find(c);
      if (done != taken.end()) {
        OpSpec alias;
        alias.kind = OpKind::kReshape;
        alias.in = {done->second};
        alias.shape = types_.at(done->second).shape();
        alias.out = {grad.out[i]};
        e.Emit(std::move(alias), grad.out[i]);
        continue;
      }
      types_[grad.out[i]] = types_.at(c);
      types_.erase(c);
      taken[c] = grad.out[i];
    }
    // The ops renamed in one pass (a pass per gradient was quadratic: 720 weights of an
    // 80-layer step times its 9,000 backward ops). The outputs' names are bound by no other
    // op (Names gave the cotangents other names), so renaming all at once is renaming in turn.
    std::unordered_map<std::string, std::string> renamed(taken.begin(), taken.end());
    auto rename = [&](std::string& name) {
      if (auto it = renamed.find(name); it != renamed.end()) name = it->second;
    };
    for (OpSpec& op : backward) {
      for (std::string& name : op.in) rename(name);
      for (std::string& name : op.out) rename(name);
      rename(op.name);
      out_.ops.push_back(std::move(op));
    }
  }

  // The transpose of shard_map op `index` of out_ (JAX's shard_map transpose without the
  // replication rewrite): a shard_map region of the body's backward pass. Its inputs are the
  // outputs' cotangents, laid out by their out specs; an output an out spec replicates along
  // mesh axes has one copy a device along them, so each copy takes its cotangent divided by
  // their number (the copies are equal: the replication check). Reverse mode runs over the
  // body's ops with its collectives' adjoints; an input's cotangent is psummed over the axes its
  // in_spec replicates it along (every copy of the input fed the body), and leaves by its
  // in_spec. What the backward ops read of the forward body is saved, as JAX's partial
  // evaluation saves residuals: the forward region gains an output per residual (laid out over
  // every mesh axis, so no byte moves), read by the backward region as an input; inputs of the
  // forward region the backward reads are passed to it again. Returns the inputs' cotangents
  // ("" where none flows).
  std::vector<std::string> ExpandRegion(size_t index, const std::vector<std::string>& cts,
                                        const std::vector<bool>& needs, Emitter& e,
                                        const std::string& key) {
    const OpSpec forward = out_.ops[index];
    const Mesh mesh = ShardMapMesh(*forward.body);
    // The body's arrays, typed (an array typed_by_input takes its input's type), and the
    // local type of every value of the body.
    std::vector<ArraySpec> arrays = forward.body->arrays;
    Types local;
    for (size_t i = 0; i < arrays.size(); ++i) {
      ArraySpec& a = arrays[i];
      if (a.typed_by_input) {
        const Array& t = types_.at(forward.in.at(i));
        a.shape = t.shape();
        a.dtype = t.dtype();
        a.typed_by_input = false;
      }
      local[a.name] = Array::ShapeOnly(a.dtype, Sharding(mesh, a.sharding, a.shape).LocalShape());
    }
    // A body that binds a name twice is differentiated in single-assignment form, which the
    // forward region then runs too: the same values under names bound once. An input (a body
    // array, named only inside the body) that an op rebinds is renamed apart first, so its
    // cotangent is its own and not the later value's.
    std::shared_ptr<const ProgramSpec> single = forward.body;
    Names names(*single);
    if (Rebinds(*single)) {
      ProgramSpec copy = *single;
      for (size_t i = 0; i < arrays.size(); ++i) {
        const std::string old_name = arrays[i].name;
        size_t bind = copy.ops.size();  // The first op binding the input's name.
        for (size_t k = 0; k < copy.ops.size() && bind == copy.ops.size(); ++k) {
          const std::vector<std::string>& out = copy.ops[k].out;
          if (std::find(out.begin(), out.end(), old_name) != out.end()) bind = k;
        }
        if (bind == copy.ops.size()) continue;
        const std::string fresh = names.Fresh(old_name + "_in");
        for (size_t k = 0; k <= bind; ++k) {
          std::replace(copy.ops[k].in.begin(), copy.ops[k].in.end(), old_name, fresh);
        }
        copy.arrays[i].name = fresh;
        arrays[i].name = fresh;
        local[fresh] = local.at(old_name);
        local.erase(old_name);
      }
      Renamed renamed = SingleAssignment(copy, names);
      copy.ops = std::move(renamed.ops);
      single = std::make_shared<const ProgramSpec>(std::move(copy));
    }
    const ProgramSpec& body = *single;
    std::unordered_set<std::string> made;  // Values the forward body's ops make.
    for (const OpSpec& op : body.ops) {
      std::vector<Array> results = InferTypes(op, local, mesh);
      for (size_t i = 0; i < op.out.size(); ++i) {
        local[op.out[i]] = std::move(results.at(i));
        made.insert(op.out[i]);
      }
    }
    auto replicated_along = [&](const PartitionSpec& spec) {
      std::vector<MeshAxis> axes;
      for (const MeshAxis& m : body.mesh_axes) {
        bool named = false;
        for (const std::vector<std::string>& dim : spec.dims) {
          named = named || std::find(dim.begin(), dim.end(), m.name) != dim.end();
        }
        // Size-1 axes too: a cotangent seeded by an out_spec naming one varies along it for
        // the replication check, and a psum over a group of one costs nothing.
        if (!named) axes.push_back(m);
      }
      return axes;
    };
    const std::string prefix = key + "." + kShardMapBody + ".";
    std::vector<OpSpec> backward;
    std::vector<ArraySpec> extra;       // The backward region's other inputs: cotangents, ...
    std::vector<std::string> extra_in;  // ... and the global values they are.
    std::string scalar;                 // A float scalar input, made when a rule wants one.
    Emitter be(
        local, names, backward, key,
        [&] {
          if (scalar.empty()) {
            ArraySpec a;
            a.name = names.Fresh("zero");
            a.dtype = DType::kF32;
            local[a.name] = Array::ShapeOnly(a.dtype, {});
            scalar = a.name;
            extra.push_back(std::move(a));
            extra_in.push_back(e.Constant(DType::kF32, 0.0, "zero"));
          }
          return scalar;
        },
        mesh);
    // Seeds: each output's cotangent, a share per copy.
    std::unordered_set<std::string> from;
    for (size_t i = 0; i < arrays.size(); ++i) {
      if (needs[i]) from.insert(arrays[i].name);
    }
    const std::unordered_set<std::string> varies = Varies(body.ops, 0, from, local);
    std::unordered_map<std::string, std::string> ct;
    for (size_t j = 0; j < body.outputs.size(); ++j) {
      const OutputSpec& o = body.outputs[j];
      if (cts[j].empty() || !varies.count(o.name)) continue;
      const Array& t = types_.at(cts[j]);
      ArraySpec a;
      a.name = names.Fresh("ct_" + o.name);
      a.shape = t.shape();
      a.dtype = t.dtype();
      a.sharding = o.spec;
      local[a.name] = Array::ShapeOnly(a.dtype, Sharding(mesh, a.sharding, a.shape).LocalShape());
      std::string seed = a.name;
      extra.push_back(std::move(a));
      extra_in.push_back(cts[j]);
      int64_t copies = 1;
      for (const MeshAxis& m : replicated_along(o.spec)) copies *= m.size;
      if (copies > 1) {
        seed = be.Scalar(OpKind::kMul, seed, 1.0 / static_cast<double>(copies), "ct_" + o.name);
      }
      auto it = ct.find(o.name);
      ct[o.name] = it == ct.end() ? seed : be.Op(OpKind::kAdd, {it->second, seed}, "ct_" + o.name);
    }
    Backpropagate(body.ops, 0, varies, ct, be, key, forward.out.at(0), nullptr);
    // The inputs' cotangents, summed over their copies.
    ProgramSpec bwd;
    bwd.mode = ProgramMode::kManual;
    bwd.mesh_axes = body.mesh_axes;
    std::vector<std::string> d(forward.in.size());
    std::vector<std::string> results;
    for (size_t i = 0; i < arrays.size(); ++i) {
      auto it = ct.find(arrays[i].name);
      if (!needs[i] || it == ct.end()) continue;
      std::string c = it->second;
      const std::vector<MeshAxis> axes = replicated_along(arrays[i].sharding);
      if (!axes.empty()) {
        OpSpec psum;
        for (const MeshAxis& m : axes) psum.axis_name.push_back(m.name);
        c = be.Op(OpKind::kPsum, {c}, "d_" + arrays[i].name, std::move(psum));
      }
      OutputSpec o;
      o.name = c;
      o.spec = arrays[i].sharding;
      o.key = prefix + "outputs." + c;
      bwd.outputs.push_back(std::move(o));
      d[i] = names_.Fresh("d_" + forward.in[i]);
      results.push_back(d[i]);
    }
    if (results.empty()) return d;
    // What the backward ops read: the forward region's inputs again, and residuals.
    std::set<std::string> read;
    for (const OpSpec& op : backward) read.insert(op.in.begin(), op.in.end());
    std::vector<std::string> in;
    for (size_t i = 0; i < arrays.size(); ++i) {
      if (!read.count(arrays[i].name)) continue;
      bwd.arrays.push_back(arrays[i]);
      in.push_back(forward.in[i]);
    }
    ProgramSpec saving = body;
    PartitionSpec everywhere;  // Dimension 0 over every mesh axis: each device's own block.
    everywhere.dims.emplace_back();
    for (const MeshAxis& m : body.mesh_axes) everywhere.dims[0].push_back(m.name);
    std::vector<OpSpec> unpack;  // Residuals that left under other names, back to their own.
    OpSpec saver = out_.ops[index];
    for (const std::string& v : read) {
      if (!made.count(v)) continue;
      const Array& t = local.at(v);
      std::string saved = v;
      // A scalar leaves as a [1] block; a value that leaves the region already leaves again
      // under a name of its own (a region's outputs are assembled by name). Both reshapes are
      // free views.
      const bool leaves = std::any_of(body.outputs.begin(), body.outputs.end(),
                                      [&](const OutputSpec& o) { return o.name == v; });
      if (t.rank() == 0 || leaves) {
        OpSpec pack;
        pack.kind = OpKind::kReshape;
        pack.in = {v};
        pack.shape = t.rank() == 0 ? Shape{1} : t.shape();
        pack.out = {names.Fresh(v + "_saved")};
        pack.name = pack.out[0];
        pack.key = forward.key + "." + kShardMapBody + ".residuals";
        saved = pack.out[0];
        saving.ops.push_back(std::move(pack));
        OpSpec back;
        back.kind = OpKind::kReshape;
        back.in = {saved};
        back.shape = t.shape();
        back.out = {v};
        back.name = v;
        back.key = prefix + "residuals";
        unpack.push_back(std::move(back));
      }
      Shape shape = t.rank() == 0 ? Shape{1} : t.shape();
      shape[0] *= mesh.size();
      OutputSpec o;
      o.name = saved;
      o.spec = everywhere;
      o.key = forward.key + "." + kShardMapBody + ".outputs." + saved;
      saving.outputs.push_back(o);
      const std::string global = names_.Fresh(forward.name + "_" + v);
      saver.out.push_back(global);
      types_[global] = Array::ShapeOnly(t.dtype(), shape);
      ArraySpec a;
      a.name = saved;
      a.shape = shape;
      a.dtype = t.dtype();
      a.sharding = everywhere;
      bwd.arrays.push_back(std::move(a));
      in.push_back(global);
    }
    if (saving.outputs.size() > body.outputs.size() || single != forward.body) {
      saver.body = std::make_shared<const ProgramSpec>(std::move(saving));
      out_.ops[index] = std::move(saver);
    }
    for (size_t k = 0; k < extra.size(); ++k) {
      bwd.arrays.push_back(std::move(extra[k]));
      in.push_back(extra_in[k]);
    }
    bwd.ops = std::move(unpack);
    for (OpSpec& op : backward) {
      op.key = prefix + "program." + std::to_string(bwd.ops.size());
      bwd.ops.push_back(std::move(op));
    }
    OpSpec region;
    region.kind = OpKind::kShardMap;
    region.in = std::move(in);
    region.out = results;
    region.body = std::make_shared<const ProgramSpec>(std::move(bwd));
    e.Emit(std::move(region), results[0]);
    return d;
  }

  ProgramSpec out_;
  Types types_;
  Names& names_;
  size_t aliases_ = 0;  // Leading alias ops of rebound arrays (Renamed::aliases).
};

}  // namespace

ProgramSpec ExpandGrads(const ProgramSpec& program, std::vector<size_t>* pass_starts) {
  auto grad = std::find_if(program.ops.begin(), program.ops.end(),
                           [](const OpSpec& op) { return op.kind == OpKind::kGrad; });
  if (grad == program.ops.end()) return program;
  if (program.mode == ProgramMode::kManual) {
    throw SpecError(grad->key + ".op",
                    "grad works on global arrays: it needs mode: explicit or auto");
  }
  Names names(program);
  Renamed renamed = Rebinds(program) ? SingleAssignment(program, names) : Renamed{program.ops, 0};
  return Expander(program, names).Run(std::move(renamed), pass_starts);
}

std::vector<int> PassOfOps(size_t n, const std::vector<size_t>& pass_starts) {
  std::vector<int> pass_of(n, -1);
  for (size_t k = 0; k + 1 < pass_starts.size(); k += 2) {
    for (size_t i = pass_starts[k]; i < pass_starts[k + 1] && i < n; ++i) {
      pass_of[i] = static_cast<int>(k / 2);
    }
  }
  return pass_of;
}

}  // namespace shardsim::planner
