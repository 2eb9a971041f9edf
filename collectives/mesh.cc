#include "collectives/mesh.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/fnv_hash.h"

namespace shardsim {
Mesh::Mesh(std::vector<MeshAxis> axes, std::vector<int> devices)
    : axes_(std::move(axes)), devices_(std::move(devices)) {
  std::set<std::string> names;
  int64_t product = 1;
  for (const MeshAxis& axis : axes_) {
    if (axis.name.empty()) throw std::invalid_argument("a mesh axis has an empty name");
    if (!names.insert(axis.name).second) {
      throw std::invalid_argument("mesh axis '" + axis.name + "' is named twice");
    }
    if (axis.size < 1) {
      throw std::invalid_argument("mesh axis '" + axis.name + "' has size " +
                                  std::to_string(axis.size) + "; sizes must be at least 1");
    }
    product *= axis.size;
    if (product > (int64_t{1} << 30)) {
      throw std::invalid_argument("mesh " + FormatMeshAxes(axes_) + " has too many positions");
    }
  }
  if (static_cast<int64_t>(devices_.size()) != product) {
    throw std::invalid_argument("mesh " + FormatMeshAxes(axes_) + " has " +
                                std::to_string(product) + " positions but " +
                                std::to_string(devices_.size()) + " devices are given");
  }
  std::vector<char> seen;
  for (size_t p = 0; p < devices_.size(); ++p) {
    if (devices_[p] < 0) {
      throw std::invalid_argument("mesh device " + std::to_string(devices_[p]) + " at position " +
                                  std::to_string(p) + " is negative");
    }
    const auto d = static_cast<size_t>(devices_[p]);
    if (d >= seen.size()) seen.resize(std::max(d + 1, 2 * seen.size()), 0);
    if (std::exchange(seen[d], 1)) {
      throw std::invalid_argument("mesh device " + std::to_string(devices_[p]) +
                                  " appears twice (again at position " + std::to_string(p) + ")");
    }
  }
  strides_.assign(axes_.size(), 1);
  for (int i = static_cast<int>(axes_.size()) - 2; i >= 0; --i) {
    strides_[i] = strides_[i + 1] * axes_[i + 1].size;
  }
  // The sizes, a separator, then the devices.
  FnvHash h;
  for (const MeshAxis& axis : axes_) h.Mix(static_cast<uint64_t>(axis.size));
  h.Mix(~uint64_t{0});
  for (int d : devices_) h.Mix(static_cast<uint64_t>(d));
  fingerprint_ = h.value();
}

Mesh Mesh::Union(std::vector<Mesh> parts, std::vector<std::string> names) {
  if (parts.empty()) throw std::invalid_argument("a union of meshes needs at least one mesh");
  if (names.size() != parts.size()) {
    throw std::invalid_argument("a union of meshes needs one name per mesh");
  }
  Mesh u;
  std::set<std::string> axis_names;
  std::set<int> devices;
  FnvHash h;  // Over the parts' fingerprints.
  for (const Mesh& part : parts) {
    if (!part.parts_.empty()) throw std::invalid_argument("a union's part is itself a union");
    u.part_offset_.push_back(static_cast<int>(u.devices_.size()));
    u.part_first_axis_.push_back(static_cast<int>(u.axes_.size()));
    for (const MeshAxis& axis : part.axes_) {
      if (!axis_names.insert(axis.name).second) {
        throw std::invalid_argument("mesh axis '" + axis.name + "' is in two meshes");
      }
      u.axes_.push_back(axis);
    }
    for (int d : part.devices_) {
      if (!devices.insert(d).second) {
        throw std::invalid_argument("device " + std::to_string(d) + " is in two meshes");
      }
      u.devices_.push_back(d);
    }
    h.Mix(part.fingerprint_);
  }
  u.axes_.push_back(MeshAxis{kMeshPartAxis, static_cast<int>(parts.size())});
  u.strides_.assign(u.axes_.size(), 0);
  u.fingerprint_ = h.value();
  u.parts_ = std::move(parts);
  u.part_names_ = std::move(names);
  return u;
}

int Mesh::PartIndex(const std::string& name) const {
  for (size_t i = 0; i < part_names_.size(); ++i) {
    if (part_names_[i] == name) return static_cast<int>(i);
  }
  return -1;
}

int Mesh::PartOf(int position) const {
  if (parts_.empty()) return 0;
  if (position < 0 || position >= size()) {
    throw std::invalid_argument("mesh position " + std::to_string(position) +
                                " is out of range [0, " + std::to_string(size()) + ")");
  }
  return static_cast<int>(std::upper_bound(part_offset_.begin(), part_offset_.end(), position) -
                          part_offset_.begin()) -
         1;
}

int Mesh::PartOfAxis(int axis) const {
  if (parts_.empty()) return 0;
  if (axis == static_cast<int>(axes_.size()) - 1) return -1;
  return static_cast<int>(std::upper_bound(part_first_axis_.begin(), part_first_axis_.end(), axis) -
                          part_first_axis_.begin()) -
         1;
}

int Mesh::AxisIndex(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> Mesh::Coords(int position) const {
  if (position < 0 || position >= size()) {
    throw std::invalid_argument("mesh position " + std::to_string(position) +
                                " is out of range [0, " + std::to_string(size()) + ")");
  }
  if (!parts_.empty()) {
    const int part = PartOf(position);
    std::vector<int> coords(axes_.size(), 0);
    const std::vector<int> local = parts_[part].Coords(position - part_offset_[part]);
    std::copy(local.begin(), local.end(), coords.begin() + part_first_axis_[part]);
    coords.back() = part;
    return coords;
  }
  std::vector<int> coords(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) {
    coords[i] = position / strides_[i] % axes_[i].size;
  }
  return coords;
}

int Mesh::Position(const std::vector<int>& coords) const {
  if (coords.size() != axes_.size()) {
    throw std::invalid_argument("mesh coordinates have " + std::to_string(coords.size()) +
                                " entries; the mesh has " + std::to_string(axes_.size()) + " axes");
  }
  if (!parts_.empty()) {
    const int part = coords.back();
    if (part < 0 || part >= static_cast<int>(parts_.size())) {
      throw std::invalid_argument("mesh index " + std::to_string(part) + " is out of range");
    }
    const Mesh& m = parts_[part];
    const auto first = coords.begin() + part_first_axis_[part];
    return part_offset_[part] +
           m.Position(std::vector<int>(first, first + static_cast<long>(m.axes_.size())));
  }
  int position = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].size) {
      throw std::invalid_argument("coordinate " + std::to_string(coords[i]) +
                                  " is out of range for mesh axis '" + axes_[i].name +
                                  "' of size " + std::to_string(axes_[i].size));
    }
    position += coords[i] * strides_[i];
  }
  return position;
}

int Mesh::GroupSize(const std::vector<int>& axes) const {
  int product = 1;
  for (int a : axes) {
    if (a < 0 || a >= static_cast<int>(axes_.size())) {
      throw std::invalid_argument("mesh axis index " + std::to_string(a) + " is out of range");
    }
    product *= axes_[a].size;
  }
  return product;
}

std::vector<std::vector<int>> Mesh::Groups(const std::vector<int>& axes) const {
  if (!parts_.empty()) {
    std::vector<std::vector<int>> groups;
    if (axes.empty()) {
      for (int p = 0; p < size(); ++p) groups.push_back({p});
      return groups;
    }
    GroupSize(axes);  // Checks the axis indices.
    const int part = PartOfAxis(axes[0]);
    std::vector<int> local;
    for (int a : axes) {
      if (part < 0 || PartOfAxis(a) != part) {
        throw std::invalid_argument("mesh axes of a group must lie in one mesh, got '" +
                                    axes_[axes[0]].name + "' and '" + axes_[a].name + "'");
      }
      local.push_back(a - part_first_axis_[part]);
    }
    groups = parts_[part].Groups(local);
    for (std::vector<int>& group : groups) {
      for (int& p : group) p += part_offset_[part];
    }
    return groups;
  }
  const int group_size = GroupSize(axes);
  std::vector<bool> in_group(axes_.size(), false);
  for (int a : axes) {
    if (in_group[a]) {
      throw std::invalid_argument("mesh axis '" + axes_[a].name + "' is named twice");
    }
    in_group[a] = true;
  }
  // Offset of each group member from the group's first member, in group order: the linear
  // index over `axes` (first major) decomposed into coordinates.
  std::vector<int> offsets(group_size, 0);
  for (int k = 0; k < group_size; ++k) {
    int rest = k;
    for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i) {
      const int a = axes[i];
      offsets[k] += rest % axes_[a].size * strides_[a];
      rest /= axes_[a].size;
    }
  }
  // A group's first member has coordinate 0 along every axis of `axes`; it is also the
  // group's smallest position, so scanning positions in order lists groups in that order.
  std::vector<std::vector<int>> groups;
  for (int p = 0; p < size(); ++p) {
    bool first = true;
    for (int a : axes) {
      if (p / strides_[a] % axes_[a].size != 0) {
        first = false;
        break;
      }
    }
    if (!first) continue;
    std::vector<int> group(group_size);
    for (int k = 0; k < group_size; ++k) group[k] = p + offsets[k];
    groups.push_back(std::move(group));
  }
  return groups;
}

int Mesh::IndexInGroup(int position, const std::vector<int>& axes) const {
  const std::vector<int> coords = Coords(position);
  GroupSize(axes);  // Checks the axis indices.
  int index = 0;
  for (int a : axes) index = index * axes_[a].size + coords[a];
  return index;
}

std::string FormatMeshAxes(const std::vector<MeshAxis>& axes) {
  std::string text;
  for (const MeshAxis& axis : axes) {
    if (!text.empty()) text += ", ";
    text += axis.name + "=" + std::to_string(axis.size);
  }
  return text;
}

}  // namespace shardsim
