#include "collectives/program.h"

#include <array>
#include <utility>

namespace shardsim {
namespace {

constexpr std::array<std::pair<OpKind, const char*>, 28> kOpNames = {{
    {OpKind::kPsum, "psum"},
    {OpKind::kPmean, "pmean"},
    {OpKind::kPmax, "pmax"},
    {OpKind::kPmin, "pmin"},
    {OpKind::kPsumScatter, "psum_scatter"},
    {OpKind::kAllGather, "all_gather"},
    {OpKind::kAllToAll, "all_to_all"},
    {OpKind::kPpermute, "ppermute"},
    {OpKind::kAxisIndex, "axis_index"},
    {OpKind::kMatmul, "matmul"},
    {OpKind::kEinsum, "einsum"},
    {OpKind::kAdd, "add"},
    {OpKind::kSub, "sub"},
    {OpKind::kMul, "mul"},
    {OpKind::kDiv, "div"},
    {OpKind::kMax, "max"},
    {OpKind::kRelu, "relu"},
    {OpKind::kGelu, "gelu"},
    {OpKind::kExp, "exp"},
    {OpKind::kTanh, "tanh"},
    {OpKind::kNeg, "neg"},
    {OpKind::kReshape, "reshape"},
    {OpKind::kTranspose, "transpose"},
    {OpKind::kConcatenate, "concatenate"},
    {OpKind::kSplit, "split"},
    {OpKind::kSlice, "slice"},
    {OpKind::kAllgatherMatmul, "allgather_matmul"},
    {OpKind::kMatmulReduceScatter, "matmul_reduce_scatter"},
}};

}  // namespace

const char* OpKindName(OpKind kind) {
  for (const auto& [k, name] : kOpNames) {
    if (k == kind) return name;
  }
  if (kind == OpKind::kDynamicSlice) return "dynamic_slice";
  if (kind == OpKind::kDynamicConcat) return "dynamic_concat";
  return "op";
}

std::optional<OpKind> ParseOpKind(const std::string& name) {
  for (const auto& [k, n] : kOpNames) {
    if (name == n) return k;
  }
  return std::nullopt;
}

std::vector<std::string> OpKindNames() {
  std::vector<std::string> names;
  for (const auto& [k, n] : kOpNames) names.emplace_back(n);
  return names;
}

bool IsCollective(OpKind kind) {
  switch (kind) {
    case OpKind::kPsum:
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
    case OpKind::kPsumScatter:
    case OpKind::kAllGather:
    case OpKind::kAllToAll:
    case OpKind::kPpermute:
    case OpKind::kAllgatherMatmul:
    case OpKind::kMatmulReduceScatter:
      return true;
    default:
      return false;
  }
}

}  // namespace shardsim
