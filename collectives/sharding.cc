#include "collectives/sharding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardsim {
namespace {

// Calls f(local_start, global_start, run) for every contiguous run of a block of `local`
// shape at `offset` inside an array of `global` shape: flat row-major starts, `run` elements.
template <typename F>
void ForEachRun(const Shape& local, const Shape& global, const std::vector<int64_t>& offset, F f) {
  const int rank = static_cast<int>(local.size());
  if (rank == 0) {
    f(0, 0, 1);
    return;
  }
  if (NumElements(local) == 0) return;
  const int64_t run = local[rank - 1];
  std::vector<int64_t> index(rank, 0);  // Local index; the last entry stays 0.
  int64_t local_start = 0;
  while (true) {
    int64_t global_start = 0;
    for (int d = 0; d < rank; ++d) global_start = global_start * global[d] + offset[d] + index[d];
    f(local_start, global_start, run);
    local_start += run;
    int d = rank - 2;
    while (d >= 0 && ++index[d] == local[d]) index[d--] = 0;
    if (d < 0) break;
  }
}

// Relative tolerance for replicas of `dtype`: a few units in the last place.
float ReplicaTolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 8 * std::ldexp(1.0f, -23);
    case DType::kBF16:
      return 8 * std::ldexp(1.0f, -7);
    case DType::kF16:
      return 8 * std::ldexp(1.0f, -10);
    case DType::kF8E4M3:
      return 8 * std::ldexp(1.0f, -3);
    case DType::kF8E5M2:
      return 8 * std::ldexp(1.0f, -2);
    case DType::kI32:
      return 0;
  }
  return 0;
}

// Largest magnitude in an array (0 for NaN-only or empty).
float MaxAbs(const Array& array) {
  float most = 0;
  for (int64_t i = 0; i < array.size(); ++i) most = std::max(most, std::fabs(array.at(i)));
  return most;
}

// Whether two replicas' values agree: equal, both NaN, or closer than `tolerance` times the
// larger block's largest magnitude (so cancellation near zero in a different reduction order
// does not count).
bool SameValues(const Array& a, const Array& b, float tolerance) {
  // Replicas are usually bit-identical: one memcmp pass decides, without the scale's passes.
  if (a.size() == b.size() &&
      std::memcmp(a.data(), b.data(), static_cast<size_t>(a.size()) * sizeof(float)) == 0) {
    return true;
  }
  const float scale = tolerance * std::max(MaxAbs(a), MaxAbs(b));
  for (int64_t i = 0; i < a.size(); ++i) {
    const float x = a.at(i);
    const float y = b.at(i);
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    if (std::fabs(x - y) <= scale) continue;
    return false;
  }
  return true;
}

// "0,1", "0-3,6": sorted devices with runs of three or more joined by '-'.
std::string DeviceList(std::vector<int> devices) {
  std::sort(devices.begin(), devices.end());
  std::string text;
  size_t i = 0;
  while (i < devices.size()) {
    size_t j = i;
    while (j + 1 < devices.size() && devices[j + 1] == devices[j] + 1) ++j;
    if (!text.empty()) text += ",";
    if (j - i >= 2) {
      text += std::to_string(devices[i]) + "-" + std::to_string(devices[j]);
      i = j + 1;
    } else {
      text += std::to_string(devices[i]);
      ++i;
    }
  }
  return text;
}

// `text` centred in `width` columns (cut to fit, ending in "..").
std::string Centre(std::string text, int width) {
  if (static_cast<int>(text.size()) > width) {
    text = width >= 3 ? text.substr(0, width - 2) + ".." : text.substr(0, width);
  }
  const int left = (width - static_cast<int>(text.size())) / 2;
  const int right = width - static_cast<int>(text.size()) - left;
  return std::string(left, ' ') + text + std::string(right, ' ');
}

}  // namespace

Sharding::Sharding(Mesh mesh, PartitionSpec spec, Shape global_shape)
    : mesh_(std::move(mesh)), spec_(std::move(spec)), global_shape_(std::move(global_shape)) {
  ValidatePartitionSpec(spec_, global_shape_, mesh_);
  dim_axes_.resize(global_shape_.size());
  for (size_t d = 0; d < spec_.dims.size(); ++d) {
    for (const std::string& name : spec_.dims[d]) dim_axes_[d].push_back(mesh_.AxisIndex(name));
  }
}

int64_t Sharding::NumBlocks(int dim) const { return mesh_.GroupSize(dim_axes_.at(dim)); }

Shape Sharding::LocalShape() const { return LocalShapeOf(mesh_, spec_, global_shape_); }

Shape Sharding::LocalShapeOf(const Mesh& mesh, const PartitionSpec& spec,
                             const Shape& global_shape) {
  Shape local = global_shape;
  for (size_t d = 0; d < spec.dims.size() && d < local.size(); ++d) {
    for (const std::string& name : spec.dims[d]) {
      local[d] /= mesh.axes()[static_cast<size_t>(mesh.AxisIndex(name))].size;
    }
  }
  return local;
}

std::vector<int64_t> Sharding::BlockIndex(int position) const {
  std::vector<int64_t> index(global_shape_.size(), 0);
  for (size_t d = 0; d < index.size(); ++d) {
    index[d] = mesh_.IndexInGroup(position, dim_axes_[d]);
  }
  return index;
}

std::vector<int64_t> Sharding::BlockOffset(int position) const {
  std::vector<int64_t> offset = BlockIndex(position);
  const Shape local = LocalShape();
  for (size_t d = 0; d < offset.size(); ++d) offset[d] *= local[d];
  return offset;
}

std::vector<int> Sharding::ShardedAxes() const {
  std::vector<int> axes;
  for (const std::vector<int>& dim : dim_axes_) axes.insert(axes.end(), dim.begin(), dim.end());
  std::sort(axes.begin(), axes.end());
  return axes;
}

Array Sharding::Shard(const Array& global, int position) const {
  if (global.shape() != global_shape_) {
    throw std::invalid_argument("cannot shard an array of shape " + FormatShape(global.shape()) +
                                " with a sharding of shape " + FormatShape(global_shape_));
  }
  const Shape local = LocalShape();
  if (!global.has_data()) return Array::ShapeOnly(global.dtype(), local);
  std::vector<float> values(static_cast<size_t>(NumElements(local)));
  const float* src = global.data();
  ForEachRun(local, global_shape_, BlockOffset(position),
             [&](int64_t local_start, int64_t global_start, int64_t run) {
               std::memcpy(values.data() + local_start, src + global_start,
                           static_cast<size_t>(run) * sizeof(float));
             });
  return Array::FromValues(global.dtype(), local, std::move(values));
}

Array Sharding::Assemble(const std::vector<Array>& locals_by_position,
                         std::string* mismatch_axis) const {
  if (mismatch_axis != nullptr) mismatch_axis->clear();
  if (static_cast<int>(locals_by_position.size()) != mesh_.size()) {
    throw std::invalid_argument("assembling needs one block per mesh position (" +
                                std::to_string(mesh_.size()) + "), got " +
                                std::to_string(locals_by_position.size()));
  }
  const Shape local = LocalShape();
  const DType dtype = locals_by_position.empty() ? DType::kF32 : locals_by_position[0].dtype();
  bool all_data = true;
  for (size_t p = 0; p < locals_by_position.size(); ++p) {
    const Array& block = locals_by_position[p];
    if (block.shape() != local) {
      throw std::invalid_argument("the block at mesh position " + std::to_string(p) +
                                  " has shape " + FormatShape(block.shape()) + ", expected " +
                                  FormatShape(local) + " for " + GlobalType(dtype) + " sharded " +
                                  FormatPartitionSpec(spec_));
    }
    if (block.dtype() != dtype) {
      throw std::invalid_argument("the block at mesh position " + std::to_string(p) + " is " +
                                  DTypeName(block.dtype()) + ", the others " + DTypeName(dtype));
    }
    all_data = all_data && block.has_data();
  }
  if (!all_data) return Array::ShapeOnly(dtype, global_shape_);

  // Replica check: every position equals its predecessor along each axis the spec does not
  // name, which chains every replica to the one at coordinate 0.
  const std::vector<int> sharded = ShardedAxes();
  const float tolerance = ReplicaTolerance(dtype);
  for (int p = 0; p < mesh_.size(); ++p) {
    const std::vector<int> coords = mesh_.Coords(p);
    for (size_t a = 0; a < coords.size(); ++a) {
      if (coords[a] == 0 || std::binary_search(sharded.begin(), sharded.end(), static_cast<int>(a)))
        continue;
      std::vector<int> previous = coords;
      --previous[a];
      const int q = mesh_.Position(previous);
      if (SameValues(locals_by_position[p], locals_by_position[q], tolerance)) continue;
      const std::string& name = mesh_.axes()[a].name;
      if (mismatch_axis == nullptr) {
        throw std::invalid_argument(
            "values differ along mesh axis '" + name + "' (devices " +
            std::to_string(mesh_.device(q)) + " and " + std::to_string(mesh_.device(p)) +
            " hold different blocks), which " + FormatPartitionSpec(spec_) + " leaves replicated");
      }
      if (mismatch_axis->empty()) *mismatch_axis = name;
    }
  }

  std::vector<float> values(static_cast<size_t>(NumElements(global_shape_)));
  for (int p = 0; p < mesh_.size(); ++p) {
    const std::vector<int> coords = mesh_.Coords(p);
    bool first_replica = true;
    for (size_t a = 0; a < coords.size(); ++a) {
      if (coords[a] != 0 &&
          !std::binary_search(sharded.begin(), sharded.end(), static_cast<int>(a))) {
        first_replica = false;
      }
    }
    if (!first_replica) continue;
    const float* src = locals_by_position[p].data();
    ForEachRun(local, global_shape_, BlockOffset(p),
               [&](int64_t local_start, int64_t global_start, int64_t run) {
                 std::memcpy(values.data() + global_start, src + local_start,
                             static_cast<size_t>(run) * sizeof(float));
               });
  }
  return Array::FromValues(dtype, global_shape_, std::move(values));
}

std::string Sharding::GlobalType(DType dtype) const {
  std::string text = std::string(DTypeName(dtype)) + "[";
  for (size_t d = 0; d < global_shape_.size(); ++d) {
    if (d > 0) text += ",";
    text += std::to_string(global_shape_[d]);
    const std::vector<int>& axes = dim_axes_[d];
    if (axes.empty()) continue;
    text += "@";
    if (axes.size() > 1) text += "(";
    for (size_t i = 0; i < axes.size(); ++i) {
      if (i > 0) text += ",";
      text += mesh_.axes()[axes[i]].name;
    }
    if (axes.size() > 1) text += ")";
  }
  return text + "]";
}

std::string Sharding::LocalType(DType dtype) const {
  std::string text = std::string(DTypeName(dtype)) + FormatShape(LocalShape());
  const std::vector<int> axes = ShardedAxes();
  if (axes.empty()) return text;
  text += "{";
  for (size_t i = 0; i < axes.size(); ++i) {
    if (i > 0) text += ",";
    text += mesh_.axes()[axes[i]].name;
  }
  return text + "}";
}

std::string VisualizeSharding(const Sharding& sharding, const std::string& device_prefix,
                              int max_width) {
  const int rank = static_cast<int>(sharding.global_shape().size());
  if (rank != 1 && rank != 2) {
    throw std::invalid_argument(
        "a sharding grid is drawn for 1D and 2D arrays only; this "
        "array has rank " +
        std::to_string(rank));
  }
  const int rows = rank == 2 ? static_cast<int>(sharding.NumBlocks(0)) : 1;
  const int cols = static_cast<int>(sharding.NumBlocks(rank - 1));
  std::vector<std::vector<int>> cell_devices(static_cast<size_t>(rows) * cols);
  const Mesh& mesh = sharding.mesh();
  for (int p = 0; p < mesh.size(); ++p) {
    const std::vector<int64_t> index = sharding.BlockIndex(p);
    const int64_t row = rank == 2 ? index[0] : 0;
    cell_devices[row * cols + index[rank - 1]].push_back(mesh.device(p));
  }
  // Equal blocks make equal cells; shrink them to fit max_width, dropping the prefix and
  // then cutting labels when they no longer fit.
  auto make_labels = [&](const std::string& prefix, int* widest) {
    std::vector<std::string> labels;
    *widest = 0;
    for (const std::vector<int>& devices : cell_devices) {
      labels.push_back(prefix + DeviceList(devices));
      *widest = std::max(*widest, static_cast<int>(labels.back().size()));
    }
    return labels;
  };
  int widest = 0;
  std::vector<std::string> labels = make_labels(device_prefix, &widest);
  int width = std::max(widest + 4, 9);
  if (cols * (width + 1) + 1 > max_width) {
    width = std::max(1, (max_width - 1) / cols - 1);
    if (widest + 2 > width) labels = make_labels("", &widest);
  }
  const int height = rank == 2 ? 3 : 1;

  std::string border = "+";
  for (int c = 0; c < cols; ++c) border += std::string(width, '-') + "+";
  border += "\n";
  std::string grid = border;
  for (int r = 0; r < rows; ++r) {
    for (int line = 0; line < height; ++line) {
      grid += "|";
      for (int c = 0; c < cols; ++c) {
        grid +=
            (line == height / 2 ? Centre(labels[r * cols + c], width) : std::string(width, ' ')) +
            "|";
      }
      grid += "\n";
    }
    grid += border;
  }
  return grid;
}

}  // namespace shardsim
