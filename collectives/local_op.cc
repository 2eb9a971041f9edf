#include "collectives/local_op.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "collectives/grad_ops.h"
#include "collectives/kernel_support.h"
#include "collectives/local_ops.h"
#include "collectives/nn_ops.h"
#include "collectives/semantics.h"
#include "collectives/shard_map.h"

namespace shardsim {

using kernel::One;
std::vector<Array> ApplyLocalOp(const OpSpec& op, const std::vector<const Array*>& inputs,
                                const Mesh& mesh, int position) {
  auto need = [&](size_t n) {
    if (inputs.size() != n) {
      throw std::invalid_argument(std::string(OpKindName(op.kind)) + " takes " + std::to_string(n) +
                                  " input(s), got " + std::to_string(inputs.size()));
    }
  };
  if (auto binary = BinaryKindOf(op.kind)) {
    if (op.scalar) {
      need(1);
      return One(BinaryScalar(*binary, *inputs[0], *op.scalar));
    }
    need(2);
    return One(Binary(*binary, *inputs[0], *inputs[1]));
  }
  if (IsGradOp(op.kind)) return ApplyGradOp(op, inputs);
  if (IsNnOp(op.kind)) return ApplyNnOp(op, inputs);
  if (op.kind == OpKind::kTakeShard) {
    need(2);
    const std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
    const int64_t blocks = mesh.GroupSize(axes);
    const Shape& table = inputs[0]->shape();
    const int64_t axis = op.axis < 0 ? op.axis + static_cast<int64_t>(table.size()) : op.axis;
    if (axis >= 0 && axis < static_cast<int64_t>(table.size()) &&
        table[static_cast<size_t>(axis)] * blocks != op.size) {
      throw std::invalid_argument("take_shard: " + std::to_string(blocks) + " blocks of " +
                                  std::to_string(table[static_cast<size_t>(axis)]) +
                                  " rows over axis_name do not make a "
                                  "table of size " +
                                  std::to_string(op.size));
    }
    const int64_t block = mesh.IndexInGroup(position, axes);
    return One(TakeShard(*inputs[0], *inputs[1], op.axis, op.size, block));
  }
  if (IsUnary(op.kind)) {
    need(1);
    return One(Unary(op.kind, *inputs[0]));
  }
  if (op.kind == OpKind::kShardMap) return ShardMapResults(op, inputs);
  switch (op.kind) {
    case OpKind::kConvert: {
      need(1);
      std::optional<DType> dtype = ParseDType(op.dtype);
      if (!dtype) throw std::invalid_argument("convert: unknown dtype '" + op.dtype + "'");
      return One(ConvertElementType(*inputs[0], *dtype, op.saturate));
    }
    case OpKind::kCustomCall: {
      std::optional<DType> dtype = ParseDType(op.dtype);
      if (!dtype) throw std::invalid_argument("custom_call: unknown dtype '" + op.dtype + "'");
      for (int64_t d : op.shape) {
        if (d < 0) throw std::invalid_argument("custom_call: shape sizes must be >= 0");
      }
      bool data = !inputs.empty() && inputs[0]->has_data();
      if (!data) return One(Array::ShapeOnly(*dtype, op.shape));
      return One(Array::FromValues(
          *dtype, op.shape, std::vector<float>(static_cast<size_t>(NumElements(op.shape)), 0.0f)));
    }
    case OpKind::kMoveToHost:
    case OpKind::kMoveToDevice:
      // A copy into the other memory: the same values.
      need(1);
      return One(*inputs[0]);
    case OpKind::kShardingConstraint:
    case OpKind::kReshard:
      // On whole arrays (the reference of a global program) a layout change is the identity.
      need(1);
      return One(*inputs[0]);
    case OpKind::kMatmul:
      need(2);
      return One(Matmul(*inputs[0], *inputs[1], ParseDType(op.dtype)));
    case OpKind::kEinsum:
      need(2);
      return One(Einsum(op.spec, *inputs[0], *inputs[1], ParseDType(op.dtype)));
    case OpKind::kReshape:
      need(1);
      return One(Reshape(*inputs[0], op.shape));
    case OpKind::kTranspose:
      need(1);
      return One(Transpose(*inputs[0], op.axes));
    case OpKind::kConcatenate:
      return One(Concatenate(inputs, op.axis));
    case OpKind::kSplit: {
      need(1);
      std::vector<Array> parts = Split(*inputs[0], op.sections, op.axis);
      if (parts.size() != op.out.size()) {
        throw std::invalid_argument("split into " + std::to_string(op.sections) +
                                    " sections needs " + std::to_string(op.sections) +
                                    " output names, got " + std::to_string(op.out.size()));
      }
      return parts;
    }
    case OpKind::kSlice:
      need(1);
      return One(Slice(*inputs[0], op.start, op.size, op.axis));
    case OpKind::kDynamicSlice: {
      need(1);
      std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
      int64_t index = mesh.IndexInGroup(position, axes);
      int64_t m = op.sections;
      int64_t block = ((op.block_scale * index + op.block_offset) % m + m) % m;
      int64_t len = inputs[0]->shape().at(
                        static_cast<size_t>(op.axis < 0 ? op.axis + inputs[0]->rank() : op.axis)) /
                    m;
      return One(SliceAlong(*inputs[0], static_cast<int>(op.axis), block * len, len));
    }
    case OpKind::kDynamicConcat: {
      std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
      int64_t index = mesh.IndexInGroup(position, axes);
      int64_t n = static_cast<int64_t>(inputs.size());
      std::vector<const Array*> ordered(inputs.size());  // Reordered views, not copies.
      for (int64_t s = 0; s < n; ++s) {
        int64_t block = ((index + op.block_scale * s + op.block_offset) % n + n) % n;
        ordered[block] = inputs[s];
      }
      return One(Concatenate(ordered, op.axis));
    }
    case OpKind::kAxisIndex: {
      std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
      int32_t index = static_cast<int32_t>(mesh.IndexInGroup(position, axes));
      return One(Array::FromInts({}, {index}));
    }
    default:
      throw std::invalid_argument(std::string(OpKindName(op.kind)) + " is not a local op");
  }
}

}  // namespace shardsim
