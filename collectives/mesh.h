// A logical device mesh: named axes over physical devices, and the groups collectives use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardsim {

// One named mesh axis.
struct MeshAxis {
  std::string name;  // "dp", "tp", ...
  int size = 1;      // Devices along it.

  // The same name and size.
  bool operator==(const MeshAxis&) const = default;
};

// "dp=4, tp=2": axes as written on the command line, for messages.
std::string FormatMeshAxes(const std::vector<MeshAxis>& axes);

// The name of the axis a union of meshes (Mesh::Union) adds last: a position's coordinate along
// it is the index of the mesh it belongs to. No run file can name it ('#' is not allowed).
inline constexpr char kMeshPartAxis[] = "#mesh";

// Named axes (first major) and the physical device at each mesh position. A position is the
// row-major linear index of a coordinate over the axes, as in JAX's mesh.devices.flat.
// A union of disjoint meshes (SPEC's `meshes:`) is one Mesh too: its positions are each part's
// positions in turn, its axes every part's axes in turn and then kMeshPartAxis; a position's
// coordinate along another part's axis is 0, and groups never leave a part.
class Mesh {
 public:
  // `devices[p]` is the physical device of position p; devices.size() must be the product
  // of the axis sizes, with distinct entries.
  Mesh(std::vector<MeshAxis> axes, std::vector<int> devices);
  // The union of `parts` (at least one; plain meshes with distinct axis names and devices),
  // called `names`. Throws std::invalid_argument for a shared axis name or device.
  static Mesh Union(std::vector<Mesh> parts, std::vector<std::string> names);

  // The axes, in order.
  const std::vector<MeshAxis>& axes() const { return axes_; }
  // Number of positions (devices in the mesh).
  int size() const { return static_cast<int>(devices_.size()); }
  // Index of the axis called `name`, or -1.
  int AxisIndex(const std::string& name) const;
  // Coordinates of a position, one per axis.
  std::vector<int> Coords(int position) const;
  // Position of coordinates.
  int Position(const std::vector<int>& coords) const;
  // Physical device at a position.
  int device(int position) const { return devices_[position]; }
  // All physical devices by position.
  const std::vector<int>& devices() const { return devices_; }
  // A 64-bit hash of the axis sizes and the devices by position (not the axis names): equal
  // placements hash equal. Caches use it to find a placement before comparing it whole.
  uint64_t fingerprint() const { return fingerprint_; }

  // A union's parts (empty for a plain mesh).
  const std::vector<Mesh>& parts() const { return parts_; }
  // The part `position` belongs to (0 on a plain mesh).
  int PartOf(int position) const;
  // The first position of part `part` (0 on a plain mesh).
  int PartOffset(int part) const { return parts_.empty() ? 0 : part_offset_[part]; }
  // The index in axes() of part `part`'s first axis (0 on a plain mesh).
  int PartFirstAxis(int part) const { return parts_.empty() ? 0 : part_first_axis_[part]; }
  // The part whose axes include axis `axis` (0 on a plain mesh; -1 for kMeshPartAxis).
  int PartOfAxis(int axis) const;
  // The index of the part called `name`, or -1 (always -1 on a plain mesh).
  int PartIndex(const std::string& name) const;
  // The parts' names.
  const std::vector<std::string>& part_names() const { return part_names_; }

  // The collective groups over `axes` (axis indices, in the order the op names them): every
  // group holds the positions that differ only along those axes, ordered by the linear index
  // over `axes` in that order (first major), which is JAX's axis_index over the tuple.
  // Groups are listed in order of their first member's position. On a union, `axes` must lie
  // in one part, whose positions alone form the groups (no axes: every position alone).
  std::vector<std::vector<int>> Groups(const std::vector<int>& axes) const;
  // The index of `position` within its group over `axes` (JAX's axis_index).
  int IndexInGroup(int position, const std::vector<int>& axes) const;
  // Product of the sizes of `axes`.
  int GroupSize(const std::vector<int>& axes) const;

 private:
  std::vector<MeshAxis> axes_;
  std::vector<int> devices_;
  std::vector<int> strides_;
  uint64_t fingerprint_ = 0;
  std::vector<Mesh> parts_;              // A union's parts.
  std::vector<int> part_offset_;         // Per part: its first position.
  std::vector<int> part_first_axis_;     // Per part: the index of its first axis.
  std::vector<std::string> part_names_;  // Per part: its name.
  Mesh() = default;
};

}  // namespace shardsim
