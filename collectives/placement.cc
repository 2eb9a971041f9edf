#include "collectives/placement.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "topology/hierarchical.h"
#include "topology/ring.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// A factor of one torus dimension given to a mesh axis: coordinate c along the piece adds
// c * stride to the physical coordinate along `dim`.
struct Piece {
  int dim = 0;     // Torus dimension.
  int size = 1;    // Factor of the dimension's length.
  int stride = 1;  // Stride of the factor within the dimension's coordinate.
};

// The pieces of each mesh axis, major first; empty pieces for a size-1 axis.
using TorusPlan = std::vector<std::vector<Piece>>;

// The greedy assignment of torus dimensions to mesh axes (see placement.h). It always
// succeeds when the axis sizes multiply to the device count: each axis's size divides the
// product of the dimensions' unassigned parts (the outer axes' sizes times its own), so
// dividing it by its gcd with each part in turn leaves 1.
// `order` lists the torus dimensions in the order they are handed out (DefaultTorusOrder: the
// innermost first).
TorusPlan PlanTorus(const std::vector<MeshAxis>& axes, const std::vector<int>& shape,
                    const std::vector<int>& order) {
  std::vector<int> remaining = shape;       // Unassigned high factor of each dim.
  std::vector<int> taken(shape.size(), 1);  // Product of the factors already taken.
  TorusPlan plan(axes.size());
  for (int a = static_cast<int>(axes.size()) - 1; a >= 0; --a) {
    int need = axes[a].size;
    std::vector<Piece> pieces;  // Collected minor first.
    // From the first dimension of `order` on, the largest factor the axis and the dimension's
    // unassigned part share (the whole part, or the axis's whole need, when one divides the
    // other); a dimension sharing none is left to the outer axes.
    for (size_t i = 0; i < order.size() && need > 1; ++i) {
      const int dim = order[i];
      const int factor = std::gcd(need, remaining[dim]);
      if (factor == 1) continue;
      pieces.push_back(Piece{dim, factor, taken[dim]});
      taken[dim] *= factor;
      remaining[dim] /= factor;
      need /= factor;
    }
    if (need > 1) {
      throw std::logic_error("internal error: mesh axis " + axes[a].name +
                             " found no torus factors left (sizes not the device count?)");
    }
    // Major first: physical order, except that strided factors (high parts of a dimension,
    // whose steps are several hops) go outermost so most steps are single hops.
    std::reverse(pieces.begin(), pieces.end());
    std::stable_partition(pieces.begin(), pieces.end(),
                          [](const Piece& piece) { return piece.stride > 1; });
    plan[a] = std::move(pieces);
  }
  return plan;
}

// Coordinates along `sizes` (major first) of step t of a snake (boustrophedon) walk: every
// step changes one coordinate by one.
std::vector<int> SnakeCoords(int t, const std::vector<int>& sizes) {
  std::vector<int> coords(sizes.size());
  int inner = 1;
  for (int s : sizes) inner *= s;
  for (size_t i = 0; i < sizes.size(); ++i) {
    inner /= sizes[i];
    coords[i] = t / inner;
    t %= inner;
    if (coords[i] % 2 == 1) t = inner - 1 - t;
  }
  return coords;
}

// The devices of a torus plan, by mesh position.
std::vector<int> PlaceOnTorus(const std::vector<MeshAxis>& axes, const std::vector<int>& shape,
                              const TorusPlan& plan) {
  // A device's index (TorusIndex) is linear in its coordinates, and each coordinate a sum of
  // the pieces' terms, so each mesh axis adds the index of its own part of the coordinates:
  // tabulated per axis, then summed per position (a pod's mesh has 8,960).
  std::vector<std::vector<int>> term(axes.size());
  std::vector<int> phys(shape.size());
  for (size_t a = 0; a < axes.size(); ++a) {
    std::vector<int> sizes;
    for (const Piece& piece : plan[a]) sizes.push_back(piece.size);
    term[a].resize(static_cast<size_t>(axes[a].size));
    for (int c = 0; c < axes[a].size; ++c) {
      const std::vector<int> coords = SnakeCoords(c, sizes);
      std::fill(phys.begin(), phys.end(), 0);
      for (size_t j = 0; j < plan[a].size(); ++j) {
        phys[plan[a][j].dim] += coords[j] * plan[a][j].stride;
      }
      term[a][c] = TorusIndex(shape, phys);
    }
  }
  int total = 1;
  for (const MeshAxis& axis : axes) total *= axis.size;
  std::vector<int> devices(total);
  for (int p = 0; p < total; ++p) {
    int rest = p;
    for (size_t a = axes.size(); a-- > 0;) {
      devices[p] += term[a][rest % axes[a].size];
      rest /= axes[a].size;
    }
  }
  return devices;
}

// Whether the row-major device order is in use.
bool IsIdentity(const std::vector<int>& devices) {
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] != static_cast<int>(i)) return false;
  }
  return true;
}

// Hops between two devices on a torus (shortest way round on wrapping dimensions; forward
// only on a one-way ring).
int TorusHops(const TorusShape& torus, bool one_way, int a, int b) {
  const std::vector<int> ca = TorusCoords(torus.shape, a);
  const std::vector<int> cb = TorusCoords(torus.shape, b);
  int hops = 0;
  for (size_t d = 0; d < torus.shape.size(); ++d) {
    const int k = torus.shape[d];
    const int diff = std::abs(ca[d] - cb[d]);
    if (one_way) {
      hops += ((cb[d] - ca[d]) % k + k) % k;
    } else if (torus.wraparound[d]) {
      hops += std::min(diff, k - diff);
    } else {
      hops += diff;
    }
  }
  return hops;
}

// The most hops between consecutive members of any group along mesh axis `a`.
int MaxConsecutiveHops(const Mesh& mesh, const Topology& topo, int a) {
  const bool one_way = IsOneWayRing(topo);
  int most = 0;
  for (const std::vector<int>& group : mesh.Groups({a})) {
    for (size_t i = 1; i < group.size(); ++i) {
      most = std::max(most, TorusHops(*topo.torus(), one_way, mesh.device(group[i - 1]),
                                      mesh.device(group[i])));
    }
  }
  return most;
}

// "dp: neighbours 1 hop apart, tp: up to 3 hops apart" from the actual devices.
std::string DescribeTorusHops(const Mesh& mesh, const Topology& topo) {
  std::string text;
  for (size_t a = 0; a < mesh.axes().size(); ++a) {
    if (!text.empty()) text += ", ";
    const MeshAxis& axis = mesh.axes()[a];
    text += axis.name + ": ";
    if (axis.size == 1) {
      text += "size 1";
      continue;
    }
    const int hops = MaxConsecutiveHops(mesh, topo, static_cast<int>(a));
    text += hops == 1 ? "consecutive members 1 hop apart"
                      : "consecutive members up to " + std::to_string(hops) + " hops apart";
  }
  return text;
}

// Whether `piece` lies along a multi-slice machine's slices (DCN, not a torus dimension).
bool AlongSlices(const Piece& piece, const TorusShape& torus) {
  return torus.dcn_slices && piece.dim == 0;
}

// "1 (4, wraps)" or "0 (factor 2 of 4)" (a torus dimension), "slices (2, DCN)".
std::string DescribePiece(const Piece& piece, const TorusShape& torus) {
  const int length = torus.shape[piece.dim];
  std::string text = AlongSlices(piece, torus) ? "slices (" : std::to_string(piece.dim) + " (";
  if (piece.size == length) {
    text += std::to_string(length) + (AlongSlices(piece, torus)     ? ", DCN"
                                      : torus.wraparound[piece.dim] ? ", wraps"
                                                                    : ", line");
  } else {
    text += "factor " + std::to_string(piece.size) + " of " + std::to_string(length);
    if (piece.stride > 1) text += ", stride " + std::to_string(piece.stride);
    if (AlongSlices(piece, torus)) text += ", DCN";
  }
  return text + ")";
}

std::string DescribeTorusPlan(const std::vector<MeshAxis>& axes, const TorusPlan& plan,
                              const TorusShape& torus) {
  std::string text;
  for (size_t a = 0; a < axes.size(); ++a) {
    if (!text.empty()) text += ", ";
    text += axes[a].name + " -> ";
    const std::vector<Piece>& pieces = plan[a];
    if (pieces.empty()) {
      text += "(size 1)";
    } else if (pieces.size() == 1) {
      text += (AlongSlices(pieces[0], torus) ? "" : "torus dim ") + DescribePiece(pieces[0], torus);
    } else {
      text += "torus dims ";
      for (size_t j = 0; j < pieces.size(); ++j) {
        if (j > 0) text += " x ";
        text += DescribePiece(pieces[j], torus);
      }
      text += " in snake order";
    }
  }
  return text;
}

// "dp across nodes, tp inside nodes (NVLink)" from the actual devices.
std::string DescribeNodes(const Mesh& mesh, int per_node) {
  std::string text;
  for (size_t a = 0; a < mesh.axes().size(); ++a) {
    if (!text.empty()) text += ", ";
    const MeshAxis& axis = mesh.axes()[a];
    if (axis.size == 1) {
      text += axis.name + " (size 1)";
      continue;
    }
    bool inside = true;
    bool across = true;
    int most_per_node = 1;
    for (const std::vector<int>& group : mesh.Groups({static_cast<int>(a)})) {
      std::vector<int> nodes;
      for (int p : group) nodes.push_back(mesh.device(p) / per_node);
      std::sort(nodes.begin(), nodes.end());
      if (nodes.front() != nodes.back()) inside = false;
      int run = 1;
      for (size_t i = 1; i < nodes.size(); ++i) {
        run = nodes[i] == nodes[i - 1] ? run + 1 : 1;
        most_per_node = std::max(most_per_node, run);
      }
    }
    across = most_per_node == 1;
    if (inside) {
      text += axis.name + " inside nodes (NVLink)";
    } else if (across) {
      text += axis.name + " across nodes";
    } else {
      text +=
          axis.name + " spans nodes (up to " + std::to_string(most_per_node) + " members per node)";
    }
  }
  return text;
}

}  // namespace

std::vector<int> DefaultTorusOrder(int dims) {
  std::vector<int> order(static_cast<size_t>(dims));
  for (int i = 0; i < dims; ++i) order[static_cast<size_t>(i)] = dims - 1 - i;
  return order;
}

namespace {

// Fails unless `axes` use exactly the machine's devices.
void CheckWholeMachine(const std::vector<MeshAxis>& axes, const Topology& topo) {
  int64_t total = 1;
  for (const MeshAxis& axis : axes) {
    if (axis.size < 1) {
      throw std::invalid_argument("mesh axis '" + axis.name + "' has size " +
                                  std::to_string(axis.size) + "; sizes must be at least 1");
    }
    total *= axis.size;
    if (total > topo.num_devices()) break;
  }
  if (total != topo.num_devices()) {
    throw std::invalid_argument(
        "mesh " + FormatMeshAxes(axes) + " has " + (total > topo.num_devices() ? "more" : "fewer") +
        " positions than the hardware's " + std::to_string(topo.num_devices()) +
        " devices; the default placement uses every device (give mesh.devices to use a "
        "subset)");
  }
}

}  // namespace

std::vector<int> TorusPlacement(const std::vector<MeshAxis>& axes, const Topology& topo,
                                const std::vector<int>& torus_order) {
  if (!topo.torus().has_value()) {
    throw std::invalid_argument("torus_order needs a torus (or ring) topology");
  }
  const std::vector<int>& shape = topo.torus()->shape;
  std::vector<int> sorted = torus_order;
  std::sort(sorted.begin(), sorted.end());
  bool permutation = sorted.size() == shape.size();
  for (size_t i = 0; i < sorted.size() && permutation; ++i) {
    permutation = sorted[i] == static_cast<int>(i);
  }
  if (!permutation) {
    throw std::invalid_argument("torus_order must list each of the torus's " +
                                std::to_string(shape.size()) + " dimensions (0.." +
                                std::to_string(shape.size() - 1) + ") once");
  }
  CheckWholeMachine(axes, topo);
  return PlaceOnTorus(axes, shape, PlanTorus(axes, shape, torus_order));
}

std::string TorusOrderText(const std::vector<int>& torus_order) {
  std::string text;
  for (int d : torus_order) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return "torus_order [" + text + "]";
}

std::vector<int> DefaultPlacement(const std::vector<MeshAxis>& axes, const Topology& topo) {
  if (topo.torus().has_value()) {
    return TorusPlacement(axes, topo,
                          DefaultTorusOrder(static_cast<int>(topo.torus()->shape.size())));
  }
  CheckWholeMachine(axes, topo);
  std::vector<int> devices(topo.num_devices());
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

void ValidateMeshDevices(const Mesh& mesh, const Topology& topo) {
  for (int p = 0; p < mesh.size(); ++p) {
    if (mesh.device(p) >= topo.num_devices()) {
      throw std::invalid_argument("mesh device " + std::to_string(mesh.device(p)) + " (position " +
                                  std::to_string(p) +
                                  ") does not exist: the hardware has devices 0.." +
                                  std::to_string(topo.num_devices() - 1));
    }
  }
}

namespace {

// DescribePlacement of a plain mesh; `given` says where devices not in the default order came
// from ("devices as given by mesh.devices").
std::string DescribePlainPlacement(const Mesh& mesh, const Topology& topo,
                                   const std::string& given) {
  ValidateMeshDevices(mesh, topo);
  const bool whole_machine = mesh.size() == topo.num_devices();
  const bool is_default = whole_machine && mesh.devices() == DefaultPlacement(mesh.axes(), topo);
  if (topo.torus().has_value()) {
    const TorusShape& torus = *topo.torus();
    const std::vector<int> first = DefaultTorusOrder(static_cast<int>(torus.shape.size()));
    if (is_default)
      return DescribeTorusPlan(mesh.axes(), PlanTorus(mesh.axes(), torus.shape, first), torus);
    // Another order of handing out the torus dimensions (TorusPlacement) is described as such.
    std::vector<int> order = first;
    std::sort(order.begin(), order.end());
    do {
      if (whole_machine && order != first &&
          mesh.devices() == TorusPlacement(mesh.axes(), topo, order)) {
        return DescribeTorusPlan(mesh.axes(), PlanTorus(mesh.axes(), torus.shape, order), torus) +
               " (" + TorusOrderText(order) + ")";
      }
    } while (std::next_permutation(order.begin(), order.end()));
    return given + " (" + DescribeTorusHops(mesh, topo) + ")";
  }
  const std::string order = IsIdentity(mesh.devices()) ? "row-major device order" : given;
  if (const std::optional<HierarchicalParams> params = RecognizeHierarchical(topo)) {
    return DescribeNodes(mesh, params->per_node) + " (" + order + ")";
  }
  if (topo.num_switches() == 1) return order + ", all devices behind one switch";
  return order;
}

}  // namespace

std::string DescribePlacement(const Mesh& mesh, const Topology& topo) {
  if (mesh.parts().empty()) {
    return DescribePlainPlacement(mesh, topo, "devices as given by mesh.devices");
  }
  // Several meshes, each in turn: a mesh's devices are its `devices:` or the lowest free ones
  // (PlaceProgramMesh).
  std::string text;
  for (size_t k = 0; k < mesh.parts().size(); ++k) {
    text += (k ? "; " : "") + mesh.part_names()[k] + ": " +
            DescribePlainPlacement(mesh.parts()[k], topo, "devices as placed");
  }
  return text;
}

}  // namespace shardsim
