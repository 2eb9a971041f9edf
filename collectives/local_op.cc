#include "collectives/local_op.h"

#include <stdexcept>
#include <string>

#include "collectives/local_ops.h"
#include "collectives/semantics.h"

namespace shardsim {

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
      return {BinaryScalar(*binary, *inputs[0], *op.scalar)};
    }
    need(2);
    return {Binary(*binary, *inputs[0], *inputs[1])};
  }
  if (auto unary = UnaryKindOf(op.kind)) {
    need(1);
    return {Unary(*unary, *inputs[0])};
  }
  switch (op.kind) {
    case OpKind::kMatmul:
      need(2);
      return {Matmul(*inputs[0], *inputs[1])};
    case OpKind::kEinsum:
      need(2);
      return {Einsum(op.spec, *inputs[0], *inputs[1])};
    case OpKind::kReshape:
      need(1);
      return {Reshape(*inputs[0], op.shape)};
    case OpKind::kTranspose:
      need(1);
      return {Transpose(*inputs[0], op.axes)};
    case OpKind::kConcatenate:
      return {Concatenate(inputs, op.axis)};
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
      return {Slice(*inputs[0], op.start, op.size, op.axis)};
    case OpKind::kAxisIndex: {
      std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
      float index = static_cast<float>(mesh.IndexInGroup(position, axes));
      return {Array::FromValues(DType::kI32, {}, {index})};
    }
    default:
      throw std::invalid_argument(std::string(OpKindName(op.kind)) + " is not a local op");
  }
}

}  // namespace shardsim
