#include "planner/value_sharding.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim::planner {

ValueSharding Replicated(int rank) {
  ValueSharding s;
  s.dims.resize(static_cast<size_t>(rank));
  return s;
}

ValueSharding FromSpec(const PartitionSpec& spec, int rank, const std::vector<MeshAxis>& axes) {
  if (static_cast<int>(spec.dims.size()) > rank) {
    throw std::invalid_argument(FormatPartitionSpec(spec) + " has more entries than the " +
                                std::to_string(rank) + " dimensions of the value");
  }
  ValueSharding s = Replicated(rank);
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    for (const std::string& name : spec.dims[d]) {
      auto it =
          std::find_if(axes.begin(), axes.end(), [&](const MeshAxis& a) { return a.name == name; });
      if (it == axes.end()) throw std::invalid_argument("'" + name + "' is not a mesh axis");
      s.dims[d].push_back(static_cast<int>(it - axes.begin()));
    }
  }
  return s;
}

PartitionSpec ToSpec(const ValueSharding& sharding, const std::vector<MeshAxis>& axes) {
  PartitionSpec spec;
  for (const std::vector<int>& dim : sharding.dims) {
    std::vector<std::string> names;
    for (int a : dim) names.push_back(axes.at(static_cast<size_t>(a)).name);
    spec.dims.push_back(std::move(names));
  }
  while (!spec.dims.empty() && spec.dims.back().empty()) spec.dims.pop_back();
  return spec;
}

std::vector<int> SplitAxes(const ValueSharding& sharding) {
  std::vector<int> used;
  for (const std::vector<int>& dim : sharding.dims) used.insert(used.end(), dim.begin(), dim.end());
  std::sort(used.begin(), used.end());
  return used;
}

std::vector<std::string> AxisNames(const std::vector<int>& ids, const std::vector<MeshAxis>& axes) {
  std::vector<std::string> names;
  for (int a : ids) names.push_back(axes.at(static_cast<size_t>(a)).name);
  return names;
}

Shape LocalShape(const Shape& shape, const ValueSharding& sharding,
                 const std::vector<MeshAxis>& axes) {
  Shape local = shape;
  for (size_t d = 0; d < sharding.dims.size() && d < local.size(); ++d) {
    int64_t blocks = 1;
    for (int a : sharding.dims[d]) blocks *= axes.at(static_cast<size_t>(a)).size;
    if (local[d] % blocks != 0) {
      throw std::invalid_argument("dimension " + std::to_string(d) + " of size " +
                                  std::to_string(local[d]) + " does not divide into " +
                                  std::to_string(blocks) + " blocks");
    }
    local[d] /= blocks;
  }
  return local;
}

std::string FormatType(DType dtype, const Shape& shape, const ValueSharding& sharding,
                       const std::vector<MeshAxis>& axes) {
  std::string text = std::string(DTypeName(dtype)) + "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d) text += ",";
    text += std::to_string(shape[d]);
    const std::vector<int>& dim = d < sharding.dims.size() ? sharding.dims[d] : std::vector<int>{};
    if (dim.size() == 1) text += "@" + axes.at(static_cast<size_t>(dim[0])).name;
    if (dim.size() > 1) {
      text += "@(";
      for (size_t i = 0; i < dim.size(); ++i) {
        text += (i ? "," : "") + axes.at(static_cast<size_t>(dim[i])).name;
      }
      text += ")";
    }
  }
  text += "]";
  if (!sharding.partial.empty()) {
    text += "{partial: ";
    for (size_t i = 0; i < sharding.partial.size(); ++i) {
      text += (i ? "," : "") + axes.at(static_cast<size_t>(sharding.partial[i])).name;
    }
    text += "}";
  }
  return text;
}

}  // namespace shardsim::planner
