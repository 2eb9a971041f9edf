#include "collectives/ir/op_registry.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim {
namespace {

using A = OpArity;
using S = OpStream;
using C = CollectiveKind;
using R = ReduceOp;

std::vector<OpDef> MakeRegistry() {
  // name, visible, arity, multi-output, stream, collective, reduce, axis_name, keys,
  // elementwise.
  return {
      {OpKind::kPsum, "psum", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kSum, true,
       {}},
      {OpKind::kPmean, "pmean", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kSum, true,
       {}},
      {OpKind::kPmax, "pmax", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kMax, true,
       {}},
      {OpKind::kPmin, "pmin", true, A::kOne, false, S::kCollective, C::kAllReduce, R::kMin, true,
       {}},
      {OpKind::kPsumScatter, "psum_scatter", true, A::kOne, false, S::kCollective,
       C::kReduceScatter, R::kSum, true, {"scatter_dimension", "tiled"}},
      {OpKind::kAllGather, "all_gather", true, A::kOne, false, S::kCollective, C::kAllGather,
       R::kSum, true, {"axis", "tiled"}},
      {OpKind::kAllToAll, "all_to_all", true, A::kOne, false, S::kCollective, C::kAllToAll,
       R::kSum, true, {"split_axis", "concat_axis", "tiled"}},
      {OpKind::kPpermute, "ppermute", true, A::kOne, false, S::kCollective, C::kPermute, R::kSum,
       true, {"perm", "shift"}},
      {OpKind::kAxisIndex, "axis_index", true, A::kNone, false, S::kFree, C::kAllReduce, R::kSum,
       true, {}},
      {OpKind::kMatmul, "matmul", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}},
      {OpKind::kEinsum, "einsum", true, A::kTwo, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"spec"}},
      {OpKind::kAdd, "add", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"scalar"}, true},
      {OpKind::kSub, "sub", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"scalar"}, true},
      {OpKind::kMul, "mul", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"scalar"}, true},
      {OpKind::kDiv, "div", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"scalar"}, true},
      {OpKind::kMax, "max", true, A::kBinary, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"scalar"}, true},
      {OpKind::kRelu, "relu", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kGelu, "gelu", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kExp, "exp", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false, {}, true},
      {OpKind::kTanh, "tanh", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {}, true},
      {OpKind::kNeg, "neg", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false, {}, true},
      // A reshape relabels the same buffer: no kernel runs.
      {OpKind::kReshape, "reshape", true, A::kOne, false, S::kFree, C::kAllReduce, R::kSum, false,
       {"shape"}},
      {OpKind::kTranspose, "transpose", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum,
       false, {"axes"}},
      {OpKind::kConcatenate, "concatenate", true, A::kAtLeastTwo, false, S::kCompute,
       C::kAllReduce, R::kSum, false, {"axis"}},
      {OpKind::kSplit, "split", true, A::kOne, true, S::kCompute, C::kAllReduce, R::kSum, false,
       {"sections", "axis"}},
      {OpKind::kSlice, "slice", true, A::kOne, false, S::kCompute, C::kAllReduce, R::kSum, false,
       {"start", "size", "axis"}},
      {OpKind::kAllgatherMatmul, "allgather_matmul", true, A::kTwo, false, S::kComposite,
       C::kAllGather, R::kSum, true, {"gather", "variant"}},
      {OpKind::kMatmulReduceScatter, "matmul_reduce_scatter", true, A::kTwo, false,
       S::kComposite, C::kReduceScatter, R::kSum, true, {"scatter_dimension", "variant"}},
      // Internal ops of collective matmul loops: XLA fuses the slice into the consuming matmul
      // and writes the concatenation's blocks in place, so neither costs a kernel.
      {OpKind::kDynamicSlice, "dynamic_slice", false, A::kOne, false, S::kFree, C::kAllReduce,
       R::kSum, true, {}},
      {OpKind::kDynamicConcat, "dynamic_concat", false, A::kAtLeastTwo, false, S::kFree,
       C::kAllReduce, R::kSum, true, {}},
  };
}

}  // namespace

const std::vector<OpDef>& OpRegistry() {
  static const std::vector<OpDef> registry = [] {
    std::vector<OpDef> r = MakeRegistry();
    // The table is indexed by OpKind: entry i must be kind i.
    for (size_t i = 0; i < r.size(); ++i) {
      if (static_cast<size_t>(r[i].kind) != i) {
        throw std::logic_error("internal error: op registry out of OpKind order at " +
                               std::string(r[i].name));
      }
    }
    return r;
  }();
  return registry;
}

const OpDef& Op(OpKind kind) {
  const std::vector<OpDef>& r = OpRegistry();
  size_t i = static_cast<size_t>(kind);
  if (i >= r.size()) throw std::logic_error("internal error: OpKind without a registry entry");
  return r[i];
}

const OpDef* FindOp(std::string_view name) {
  for (const OpDef& def : OpRegistry()) {
    if (def.user_visible && name == def.name) return &def;
  }
  return nullptr;
}

std::vector<std::string> UserOpNames() {
  std::vector<std::string> names;
  for (const OpDef& def : OpRegistry()) {
    if (def.user_visible) names.emplace_back(def.name);
  }
  return names;
}

std::vector<std::string> OpKeys(OpKind kind) {
  const OpDef& def = Op(kind);
  std::vector<std::string> keys = {"op"};
  if (def.arity != OpArity::kNone) keys.push_back("in");
  keys.insert(keys.end(), {"out", "name", "where"});
  if (def.takes_axis_name) keys.push_back("axis_name");
  keys.insert(keys.end(), def.keys.begin(), def.keys.end());
  if (def.stream == OpStream::kCollective || def.stream == OpStream::kComposite) {
    keys.push_back("algorithm");
  }
  return keys;
}

std::vector<std::string> AllOpKeys() {
  std::vector<std::string> all;
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    for (std::string& key : OpKeys(def.kind)) {
      if (std::find(all.begin(), all.end(), key) == all.end()) all.push_back(std::move(key));
    }
  }
  return all;
}

std::string CheckArity(const OpSpec& op) {
  const OpDef& def = Op(op.kind);
  const size_t n = op.in.size();
  const std::string name = def.name;
  switch (def.arity) {
    case OpArity::kNone:
      return n == 0 ? "" : name + " takes no input, got " + std::to_string(n);
    case OpArity::kOne:
      return n == 1 ? "" : name + " takes one input, got " + std::to_string(n);
    case OpArity::kTwo:
      return n == 2 ? ""
                    : name + " takes 2 inputs (in: [a, b]), got " + std::to_string(n);
    case OpArity::kBinary:
      if (n == 2 && op.scalar) return "scalar applies only with one input (in: a, scalar: 1.0)";
      if (n == 2 || (n == 1 && op.scalar)) return "";
      return name + " takes in: [a, b], or in: a with scalar:, got " + std::to_string(n) +
             " input" + (n == 1 ? "" : "s") + (op.scalar ? "" : " and no scalar");
    case OpArity::kAtLeastTwo:
      return n >= 2 ? "" : name + " takes at least 2 inputs, got " + std::to_string(n);
  }
  return "";
}

}  // namespace shardsim
