#include "collectives/semantics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collectives/ragged_all_to_all.h"

namespace shardsim {
namespace {

// ---- Messages -------------------------------------------------------------------------

[[noreturn]] void Fail(const OpSpec& op, const std::string& what) {
  throw std::invalid_argument(std::string(OpKindName(op.kind)) + ": " + what);
}

// "f32[6,4]", or "[6,4]" when the dtype is unknown.
std::string Describe(const Shape& shape, std::optional<DType> dtype) {
  return (dtype ? std::string(DTypeName(*dtype)) : std::string()) + FormatShape(shape);
}

// "axis dp" or "axes (dp, tp)".
std::string AxesPhrase(const OpSpec& op) {
  if (op.axis_name.size() == 1) return "axis " + op.axis_name[0];
  std::string s = "axes (";
  for (size_t i = 0; i < op.axis_name.size(); ++i) {
    if (i > 0) s += ", ";
    s += op.axis_name[i];
  }
  return s + ")";
}

// "the 4 devices of axis dp".
std::string DevicesOf(const OpSpec& op, int n) {
  return "the " + std::to_string(n) + (n == 1 ? " device of " : " devices of ") + AxesPhrase(op);
}

// A possibly negative axis parameter, checked against `rank` and made non-negative.
int CanonicalAxis(const OpSpec& op, const std::string& param, int64_t axis, int rank,
                  const std::string& type) {
  if (axis < -rank || axis >= rank) {
    std::string range = rank == 0
                            ? std::string("it has no dimensions")
                            : "expected " + std::to_string(-rank) + ".." + std::to_string(rank - 1);
    Fail(op,
         param + " " + std::to_string(axis) + " is out of range for " + type + " (" + range + ")");
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

bool HasReference(OpKind kind) {
  return kind == OpKind::kAxisIndex || (IsCollective(kind) && kind != OpKind::kAllgatherMatmul &&
                                        kind != OpKind::kMatmulReduceScatter);
}

// ---- Row-major block helpers ------------------------------------------------------------

// A shape seen as [outer, dim, inner] around `axis`.
struct Around {
  int64_t outer = 1, dim = 1, inner = 1;
};

Around AroundAxis(const Shape& shape, int axis) {
  Around a;
  for (int d = 0; d < axis; ++d) a.outer *= shape[d];
  a.dim = shape[axis];
  for (size_t d = axis + 1; d < shape.size(); ++d) a.inner *= shape[d];
  return a;
}

// Elements [start, start + len) along `axis` of a row-major block of `shape`.
template <typename T>
std::vector<T> SliceAxis(const T* x, const Shape& shape, int axis, int64_t start, int64_t len) {
  Around a = AroundAxis(shape, axis);
  std::vector<T> out(static_cast<size_t>(a.outer * len * a.inner));
  for (int64_t o = 0; o < a.outer; ++o) {
    std::copy_n(x + (o * a.dim + start) * a.inner, len * a.inner, out.begin() + o * len * a.inner);
  }
  return out;
}

// Concatenates equally shaped row-major blocks (each of `block_shape`) along `axis`.
std::vector<float> ConcatAxis(const std::vector<std::vector<float>>& blocks,
                              const Shape& block_shape, int axis) {
  Around a = AroundAxis(block_shape, axis);
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int64_t run = a.dim * a.inner;
  std::vector<float> out(static_cast<size_t>(a.outer * n * run));
  for (int64_t o = 0; o < a.outer; ++o) {
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(blocks[j].begin() + o * run, run, out.begin() + (o * n + j) * run);
    }
  }
  return out;
}

std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Elementwise sum over the group's blocks, in group-index order, in double.
std::vector<double> GroupSum(const std::vector<Array>& inputs, const std::vector<int>& group) {
  std::vector<double> acc(static_cast<size_t>(inputs[group[0]].size()), 0.0);
  for (int p : group) {
    const float* x = inputs[p].data();
    for (size_t e = 0; e < acc.size(); ++e) acc[e] += static_cast<double>(x[e]);
  }
  return acc;
}

// Elementwise int32 sum over the group's i32 blocks, wrapping modulo 2^32 like XLA's
// two's-complement adds (in unsigned arithmetic, where wrapping is defined).
std::vector<int32_t> GroupIntSum(const std::vector<Array>& inputs, const std::vector<int>& group) {
  std::vector<uint32_t> acc(static_cast<size_t>(inputs[group[0]].size()), 0u);
  for (int p : group) {
    const float* x = inputs[p].data();
    for (size_t e = 0; e < acc.size(); ++e) acc[e] += static_cast<uint32_t>(WordToInt(x[e]));
  }
  return std::vector<int32_t>(acc.begin(), acc.end());
}

// Elementwise max (or min) over the group's blocks; NaN propagates, as in XLA. Compares
// integers as integers.
std::vector<float> GroupExtreme(const std::vector<Array>& inputs, const std::vector<int>& group,
                                bool is_max) {
  std::vector<float> acc = inputs[group[0]].values();
  const bool ints = inputs[group[0]].dtype() == DType::kI32;
  for (size_t m = 1; m < group.size(); ++m) {
    const float* x = inputs[group[m]].data();
    for (size_t e = 0; e < acc.size(); ++e) {
      float a = acc[e], b = x[e];
      if (ints) {
        int32_t ia = WordToInt(a), ib = WordToInt(b);
        acc[e] = IntToWord(is_max ? std::max(ia, ib) : std::min(ia, ib));
      } else if (std::isnan(a) || std::isnan(b)) {
        acc[e] = std::nanf("");
      } else {
        acc[e] = is_max ? std::max(a, b) : std::min(a, b);
      }
    }
  }
  return acc;
}

}  // namespace

std::vector<int> ResolveCollectiveAxes(const OpSpec& op, const Mesh& mesh) {
  if (op.axis_name.empty()) Fail(op, "axis_name is empty; name at least one mesh axis");
  std::vector<int> axes;
  for (const std::string& name : op.axis_name) {
    int index = mesh.AxisIndex(name);
    if (index < 0) {
      std::string known;
      for (const MeshAxis& a : mesh.axes()) known += (known.empty() ? "" : ", ") + a.name;
      Fail(op, "unknown mesh axis '" + name + "' in axis_name (the mesh has " + known + ")");
    }
    if (std::find(axes.begin(), axes.end(), index) != axes.end()) {
      Fail(op, "axis '" + name + "' appears twice in axis_name");
    }
    axes.push_back(index);
  }
  return axes;
}

Shape CollectiveOutputShape(const OpSpec& op, const Shape& input, int group_size,
                            std::optional<DType> dtype) {
  if (!HasReference(op.kind)) Fail(op, "not a collective with reference semantics");
  if (group_size < 1) Fail(op, "group size " + std::to_string(group_size) + " is not positive");
  const int n = group_size;
  const int rank = static_cast<int>(input.size());
  const std::string type = Describe(input, dtype);
  Shape out = input;
  switch (op.kind) {
    case OpKind::kPsum:
    case OpKind::kPmean:
    case OpKind::kPmax:
    case OpKind::kPmin:
    case OpKind::kPpermute:
      return out;
    case OpKind::kAxisIndex:
      return Shape{};
    case OpKind::kPsumScatter: {
      int d = CanonicalAxis(op, "scatter_dimension", op.scatter_dimension, rank, type);
      if (op.tiled) {
        if (input[d] % n != 0) {
          Fail(op, "dimension " + std::to_string(d) + " of " + type + " does not divide by " +
                       DevicesOf(op, n));
        }
        out[d] = input[d] / n;
      } else {
        if (input[d] != n) {
          Fail(op, "tiled=false needs dimension " + std::to_string(d) + " of " + type +
                       " to equal " + DevicesOf(op, n) +
                       " (it is removed); use tiled: true to split it into chunks");
        }
        out.erase(out.begin() + d);
      }
      return out;
    }
    case OpKind::kAllGather: {
      if (op.tiled) {
        int a = CanonicalAxis(op, "axis", op.axis, rank, type);
        out[a] = input[a] * n;
      } else {
        // The stacked axis is a new one: `axis` indexes the output's rank + 1 dimensions.
        int a =
            CanonicalAxis(op, "axis", op.axis, rank + 1, type + " (tiled=false stacks a new axis)");
        out.insert(out.begin() + a, n);
      }
      return out;
    }
    case OpKind::kAllToAll: {
      int s = CanonicalAxis(op, "split_axis", op.split_axis, rank, type);
      int c = CanonicalAxis(op, "concat_axis", op.concat_axis, rank, type);
      if (op.tiled) {
        if (input[s] % n != 0) {
          Fail(op, "split_axis dimension " + std::to_string(s) + " of " + type +
                       " does not divide by " + DevicesOf(op, n));
        }
        out[s] = input[s] / n;
        out[c] = out[c] * n;
      } else {
        if (input[s] != n) {
          Fail(op, "tiled=false needs split_axis dimension " + std::to_string(s) + " of " + type +
                       " to equal " + DevicesOf(op, n) +
                       " (it is removed and a new axis of that size appears at concat_axis);"
                       " use tiled: true to split it into chunks");
        }
        out.erase(out.begin() + s);
        out.insert(out.begin() + c, n);
      }
      return out;
    }
    default:
      break;
  }
  Fail(op, "not a collective with reference semantics");
}

std::vector<int> ResolvePermutation(const OpSpec& op, const Mesh& mesh) {
  if (op.kind != OpKind::kPpermute) Fail(op, "ResolvePermutation needs a ppermute op");
  const std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
  const int n = mesh.GroupSize(axes);
  std::vector<int> dest(static_cast<size_t>(n), -1);
  if (op.shift.has_value()) {
    if (!op.perm.empty()) Fail(op, "give either perm or shift, not both");
    const int k = ((*op.shift % n) + n) % n;
    for (int g = 0; g < n; ++g) dest[g] = (g + k) % n;
    return dest;
  }
  // perm integers are linear indices over the named axes in mesh order (see the header).
  std::vector<int> mesh_order = axes;
  std::sort(mesh_order.begin(), mesh_order.end());
  auto to_group_index = [&](int p) {
    std::vector<int> coord(mesh.axes().size(), 0);
    for (auto it = mesh_order.rbegin(); it != mesh_order.rend(); ++it) {
      const int size = mesh.axes()[*it].size;
      coord[*it] = p % size;
      p /= size;
    }
    int g = 0;
    for (int a : axes) g = g * mesh.axes()[a].size + coord[a];
    return g;
  };
  std::vector<bool> seen_src(n, false), seen_dst(n, false);
  for (const auto& [src, dst] : op.perm) {
    for (int v : {src, dst}) {
      if (v < 0 || v >= n) {
        Fail(op, "perm index " + std::to_string(v) + " is out of range for " + DevicesOf(op, n) +
                     " (expected 0.." + std::to_string(n - 1) + ")");
      }
    }
    if (seen_src[src]) Fail(op, "source " + std::to_string(src) + " appears twice in perm");
    if (seen_dst[dst]) {
      Fail(op, "destination " + std::to_string(dst) + " appears twice in perm");
    }
    seen_src[src] = seen_dst[dst] = true;
    dest[to_group_index(src)] = to_group_index(dst);
  }
  return dest;
}

DType CollectiveOutputDType(const OpSpec& op, DType input) {
  if (op.kind == OpKind::kAxisIndex) return DType::kI32;
  if (op.kind == OpKind::kPmean && input == DType::kI32) return DType::kF32;
  return input;
}

Array CollectiveResultType(const OpSpec& op, const std::vector<const Array*>& inputs,
                           int group_size) {
  if (op.kind == OpKind::kRaggedAllToAll) {
    return Array::ShapeOnly(inputs.at(0)->dtype(), RaggedAllToAllShape(inputs, group_size));
  }
  const Array& in = *inputs.at(0);
  return Array::ShapeOnly(CollectiveOutputDType(op, in.dtype()),
                          CollectiveOutputShape(op, in.shape(), group_size, in.dtype()));
}

std::vector<Array> ReferenceCollective(const OpSpec& op, const Mesh& mesh,
                                       const std::vector<Array>& inputs) {
  if (!HasReference(op.kind)) Fail(op, "not a collective with reference semantics");
  const std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
  const int positions = mesh.size();
  const auto wrong_count = [&] {
    Fail(op, "expected one input block per mesh position (" + std::to_string(positions) +
                 "), got " + std::to_string(inputs.size()));
  };

  if (op.kind == OpKind::kAxisIndex) {
    if (!inputs.empty() && static_cast<int>(inputs.size()) != positions) wrong_count();
    std::vector<Array> out;
    out.reserve(positions);
    for (int p = 0; p < positions; ++p) {
      out.push_back(Array::FromInts(Shape{}, {static_cast<int32_t>(mesh.IndexInGroup(p, axes))}));
    }
    return out;
  }

  if (static_cast<int>(inputs.size()) != positions) wrong_count();
  const Array& first = inputs[0];
  for (int p = 1; p < positions; ++p) {
    if (inputs[p].shape() != first.shape() || inputs[p].dtype() != first.dtype()) {
      Fail(op, "local blocks differ in type: " + first.TypeString() + " at position 0, " +
                   inputs[p].TypeString() + " at position " + std::to_string(p));
    }
    if (inputs[p].has_data() != first.has_data()) {
      Fail(op, "position " + std::to_string(p) + (inputs[p].has_data() ? " has" : " lacks") +
                   " data while position 0 " + (first.has_data() ? "has" : "lacks") + " it");
    }
  }
  const DType dtype = first.dtype();
  const Shape& in_shape = first.shape();
  const std::vector<std::vector<int>> groups = mesh.Groups(axes);
  const int n = static_cast<int>(groups.front().size());
  const Shape out_shape = CollectiveOutputShape(op, in_shape, n, dtype);
  if (!first.has_data()) {
    return std::vector<Array>(positions,
                              Array::ShapeOnly(CollectiveOutputDType(op, dtype), out_shape));
  }

  std::vector<Array> out(positions);
  const int rank = static_cast<int>(in_shape.size());
  std::vector<int> dest;
  if (op.kind == OpKind::kPpermute) dest = ResolvePermutation(op, mesh);

  for (const std::vector<int>& group : groups) {
    switch (op.kind) {
      case OpKind::kPsum:
      case OpKind::kPmean: {
        if (dtype == DType::kI32) {  // Wrapping int32 sum; pmean divides it in float32.
          std::vector<int32_t> sum = GroupIntSum(inputs, group);
          Array result;
          if (op.kind == OpKind::kPsum) {
            result = Array::FromInts(out_shape, sum);
          } else {
            std::vector<float> mean(sum.size());
            for (size_t e = 0; e < sum.size(); ++e) {
              mean[e] = static_cast<float>(sum[e]) / static_cast<float>(n);
            }
            result = Array::FromValues(DType::kF32, out_shape, std::move(mean));
          }
          for (int p : group) out[p] = result;
          break;
        }
        std::vector<double> sum = GroupSum(inputs, group);
        if (op.kind == OpKind::kPmean) {
          for (double& v : sum) v /= n;
        }
        Array result = Array::FromValues(dtype, out_shape, ToFloat(sum));
        for (int p : group) out[p] = result;
        break;
      }
      case OpKind::kPmax:
      case OpKind::kPmin: {
        Array result = Array::FromValues(dtype, out_shape,
                                         GroupExtreme(inputs, group, op.kind == OpKind::kPmax));
        for (int p : group) out[p] = result;
        break;
      }
      case OpKind::kPsumScatter: {
        const int d = static_cast<int>(op.scatter_dimension < 0 ? op.scatter_dimension + rank
                                                                : op.scatter_dimension);
        const int64_t chunk = in_shape[d] / n;
        if (dtype == DType::kI32) {
          const std::vector<int32_t> sum = GroupIntSum(inputs, group);
          for (int i = 0; i < n; ++i) {
            out[group[i]] =
                Array::FromInts(out_shape, SliceAxis(sum.data(), in_shape, d, i * chunk, chunk));
          }
          break;
        }
        const std::vector<double> sum = GroupSum(inputs, group);
        for (int i = 0; i < n; ++i) {
          out[group[i]] = Array::FromValues(
              dtype, out_shape, ToFloat(SliceAxis(sum.data(), in_shape, d, i * chunk, chunk)));
        }
        break;
      }
      case OpKind::kAllGather: {
        std::vector<std::vector<float>> blocks;
        for (int p : group) blocks.push_back(inputs[p].values());
        Shape block_shape = in_shape;
        int a;
        if (op.tiled) {
          a = static_cast<int>(op.axis < 0 ? op.axis + rank : op.axis);
        } else {
          a = static_cast<int>(op.axis < 0 ? op.axis + rank + 1 : op.axis);
          block_shape.insert(block_shape.begin() + a, 1);  // Stacking = concat of [.., 1, ..].
        }
        Array result = Array::FromValues(dtype, out_shape, ConcatAxis(blocks, block_shape, a));
        for (int p : group) out[p] = result;
        break;
      }
      case OpKind::kAllToAll: {
        const int s = static_cast<int>(op.split_axis < 0 ? op.split_axis + rank : op.split_axis);
        const int c = static_cast<int>(op.concat_axis < 0 ? op.concat_axis + rank : op.concat_axis);
        const int64_t chunk = in_shape[s] / n;
        // The shape of one received chunk, laid out for concatenation along c.
        Shape piece_shape = in_shape;
        if (op.tiled) {
          piece_shape[s] = chunk;
        } else {
          piece_shape.erase(piece_shape.begin() + s);      // chunk == 1: drop the split axis,
          piece_shape.insert(piece_shape.begin() + c, 1);  // then stack at concat_axis.
        }
        for (int i = 0; i < n; ++i) {
          std::vector<std::vector<float>> pieces;
          for (int j = 0; j < n; ++j) {
            pieces.push_back(SliceAxis(inputs[group[j]].data(), in_shape, s, i * chunk, chunk));
          }
          out[group[i]] = Array::FromValues(dtype, out_shape, ConcatAxis(pieces, piece_shape, c));
        }
        break;
      }
      case OpKind::kPpermute: {
        for (int p : group) out[p] = Array(dtype, out_shape);  // Zeros where nothing arrives.
        for (int g = 0; g < n; ++g) {
          if (dest[g] >= 0) out[group[dest[g]]] = inputs[group[g]];
        }
        break;
      }
      default:
        Fail(op, "not a collective with reference semantics");
    }
  }
  return out;
}

}  // namespace shardsim
