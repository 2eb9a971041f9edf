#include "collectives/ragged_all_to_all.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "collectives/semantics.h"

namespace shardsim {
namespace {

// The input names in JAX's order, for messages.
constexpr const char* kInputNames[6] = {"operand",    "output",         "input_offsets",
                                        "send_sizes", "output_offsets", "recv_sizes"};

}  // namespace

int64_t RaggedRowElements(const Shape& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

int64_t RaggedPlan::Elements(int from, int to) const {
  int64_t rows = 0;
  for (const RaggedSlice& s : slices[static_cast<size_t>(from) * members + to]) rows += s.rows;
  return rows * row_elements;
}

Shape RaggedAllToAllShape(const std::vector<const Array*>& inputs, int group_size) {
  if (inputs.size() != 6) {
    throw std::invalid_argument(
        "takes 6 inputs (operand, output, input_offsets, send_sizes, "
        "output_offsets, recv_sizes), got " +
        std::to_string(inputs.size()));
  }
  const Array& operand = *inputs[0];
  const Array& output = *inputs[1];
  if (operand.rank() == 0 || output.rank() == 0) {
    throw std::invalid_argument("operand and output need a leading (ragged) axis, got " +
                                operand.TypeString() + " and " + output.TypeString());
  }
  if (operand.dtype() != output.dtype() ||
      !std::equal(operand.shape().begin() + 1, operand.shape().end(), output.shape().begin() + 1,
                  output.shape().end())) {
    throw std::invalid_argument("operand " + operand.TypeString() + " and output " +
                                output.TypeString() +
                                " must have one dtype and equal shapes after the leading axis");
  }
  const int64_t k = inputs[2]->rank() == 1 ? inputs[2]->shape()[0] : -1;
  for (int i = 2; i < 6; ++i) {
    const Array& index = *inputs[i];
    if (index.dtype() != DType::kI32 || index.rank() != 1 || index.shape()[0] != k) {
      throw std::invalid_argument(std::string(kInputNames[i]) +
                                  " must be i32[K] like input_offsets (K slices), got " +
                                  index.TypeString() + " beside " + inputs[2]->TypeString());
    }
  }
  if (k % group_size != 0) {
    throw std::invalid_argument("the " + std::to_string(k) +
                                " slices of input_offsets do not divide among the " +
                                std::to_string(group_size) + " members of the group");
  }
  return output.shape();
}

RaggedPlan PlanRaggedAllToAll(const std::vector<std::vector<const Array*>>& inputs) {
  RaggedPlan plan;
  const int g = static_cast<int>(inputs.size());
  plan.members = g;
  plan.row_elements = RaggedRowElements(inputs[0][0]->shape());
  plan.slices.assign(static_cast<size_t>(g) * g, {});
  const int64_t k = inputs[0][2]->shape()[0];
  const int64_t spd = k / g;
  for (int from = 0; from < g; ++from) {
    const std::vector<const Array*>& mine = inputs[from];
    const int64_t n = mine[0]->shape()[0];
    for (int64_t i = 0; i < k; ++i) {
      const int to = static_cast<int>(i / spd);
      RaggedSlice s{mine[2]->IntAt(i), mine[3]->IntAt(i), mine[4]->IntAt(i)};
      const int64_t m = inputs[to][1]->shape()[0];
      const std::string slice = "member " + std::to_string(from) + "'s slice " + std::to_string(i) +
                                " (to member " + std::to_string(to) + ")";
      if (s.rows < 0) {
        throw std::invalid_argument(slice + " has send_sizes " + std::to_string(s.rows) + " < 0");
      }
      if (s.src_row < 0 || s.src_row + s.rows > n) {
        throw std::invalid_argument(slice + " reads operand rows [" + std::to_string(s.src_row) +
                                    ", " + std::to_string(s.src_row + s.rows) + ") of " +
                                    std::to_string(n));
      }
      if (s.dst_row < 0 || s.dst_row + s.rows > m) {
        throw std::invalid_argument(slice + " writes output rows [" + std::to_string(s.dst_row) +
                                    ", " + std::to_string(s.dst_row + s.rows) + ") of " +
                                    std::to_string(m) + " on member " + std::to_string(to));
      }
      // The receiver's recv_sizes entry for this slice: from `from`, the (i % spd)-th.
      const int64_t expected = inputs[to][5]->IntAt(from * spd + i % spd);
      if (expected != s.rows) {
        throw std::invalid_argument(slice + " sends " + std::to_string(s.rows) +
                                    " rows, but member " + std::to_string(to) +
                                    "'s recv_sizes expects " + std::to_string(expected));
      }
      plan.slices[static_cast<size_t>(from) * g + to].push_back(s);
    }
  }
  // No two slices write the same row of a receiver: the result would depend on which message
  // lands last (JAX leaves it undefined).
  for (int to = 0; to < g; ++to) {
    std::vector<std::pair<int64_t, int64_t>> rows;  // [start, end) written.
    for (int from = 0; from < g; ++from) {
      for (const RaggedSlice& s : plan.slices[static_cast<size_t>(from) * g + to]) {
        if (s.rows > 0) rows.push_back({s.dst_row, s.dst_row + s.rows});
      }
    }
    std::sort(rows.begin(), rows.end());
    for (size_t i = 1; i < rows.size(); ++i) {
      if (rows[i].first < rows[i - 1].second) {
        throw std::invalid_argument(
            "two slices write rows [" + std::to_string(rows[i].first) + ", " +
            std::to_string(std::min(rows[i].second, rows[i - 1].second)) + ") of member " +
            std::to_string(to) + "'s output (output_offsets overlap)");
      }
    }
  }
  return plan;
}

int64_t BalancedRaggedRows(const Shape& operand, const Shape& output, int group_size,
                           int64_t expected_rows) {
  if (expected_rows > 0) return expected_rows;
  return std::min(operand[0], output[0]) / group_size;
}

int64_t BalancedRaggedBlock(const Shape& operand, const Shape& output, int group_size,
                            int64_t expected_rows) {
  return BalancedRaggedRows(operand, output, group_size, expected_rows) *
         RaggedRowElements(operand);
}

std::vector<Array> ReferenceRaggedAllToAll(
    const OpSpec& op, const Mesh& mesh, const std::vector<std::vector<Array>>& inputs_by_position) {
  std::vector<Array> out(inputs_by_position.size());
  for (const std::vector<int>& group : mesh.Groups(ResolveCollectiveAxes(op, mesh))) {
    const int n = static_cast<int>(group.size());
    std::vector<std::vector<const Array*>> views(n);
    for (int m = 0; m < n; ++m) {
      for (const Array& a : inputs_by_position[group[m]]) views[m].push_back(&a);
    }
    RaggedAllToAllShape(views[0], n);
    // Checks sizes and bounds; the result is then computed from JAX's definition directly.
    PlanRaggedAllToAll(views);
    const int64_t k = views[0][2]->shape()[0];
    const int64_t spd = k / n;
    const int64_t row = RaggedRowElements(views[0][0]->shape());
    for (int r = 0; r < n; ++r) {
      const Array& output = *views[r][1];
      std::vector<float> result = output.values();
      // output_offsets_ = all_to_all(output_offsets, tiled): entry i on the receiver is entry
      // r * spd + i % spd of member i / spd's output_offsets.
      for (int64_t i = 0; i < k; ++i) {
        const int src = static_cast<int>(i / spd);
        const int64_t j = r * spd + i % spd;  // The sender's slice index.
        const int64_t at = views[src][4]->IntAt(j);
        const int64_t rows = views[r][5]->IntAt(i);
        const int64_t from = views[src][2]->IntAt(j);
        const float* data = views[src][0]->data();
        std::copy(data + from * row, data + (from + rows) * row, result.begin() + at * row);
      }
      out[group[r]] = Array::FromWords(output.dtype(), output.shape(), std::move(result));
    }
  }
  return out;
}

}  // namespace shardsim
