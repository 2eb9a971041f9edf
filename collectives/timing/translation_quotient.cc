#include "collectives/timing/translation_quotient.h"

#include <stdexcept>

#include "topology/torus.h"

namespace shardsim {

std::optional<LinkId> TranslatedLink(const Topology& topo, LinkId link,
                                     const std::vector<int>& by) {
  const std::vector<int>& shape = topo.torus()->shape;
  const std::vector<bool>& wrap = topo.torus()->wraparound;
  const Link& l = topo.link(link);
  const std::vector<int>& src = topo.node(l.src).coords;
  const std::vector<int>& dst = topo.node(l.dst).coords;
  if (src.size() != shape.size() || dst.size() != shape.size()) return std::nullopt;
  // The moved ends' device indices (TorusIndex: row-major), without copying coordinates.
  int from_index = 0, to_index = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    int from = src[d] + by[d], to = dst[d] + by[d];
    if (wrap[d]) {
      from = ((from % shape[d]) + shape[d]) % shape[d];
      to = ((to % shape[d]) + shape[d]) % shape[d];
    } else if (from < 0 || from >= shape[d] || to < 0 || to >= shape[d]) {
      return std::nullopt;
    }
    from_index = from_index * shape[d] + from;
    to_index = to_index * shape[d] + to;
  }
  const VertexId from = topo.device_vertex(from_index);
  const VertexId to = topo.device_vertex(to_index);
  std::optional<LinkId> moved;
  for (LinkId m : topo.out_links(from)) {
    const Link& candidate = topo.link(m);
    if (candidate.dst == to && candidate.dimension == l.dimension &&
        candidate.direction == l.direction) {
      if (moved) return std::nullopt;  // Parallel links: which one is meant is unclear.
      moved = m;
    }
  }
  return moved;
}

std::optional<TranslationQuotient> FindTranslationQuotient(
    const Topology& topo, const Mesh& mesh, const std::vector<std::vector<int>>& groups) {
  if (!topo.torus() || topo.num_switches() != 0 || groups.size() < 2) return std::nullopt;
  const std::vector<int>& shape = topo.torus()->shape;
  const std::vector<bool>& wrap = topo.torus()->wraparound;
  const int rank = static_cast<int>(shape.size());
  const int devices = topo.num_devices();
  // Which group and member each device is (-1: none), and every device's coordinates.
  std::vector<int> group_of(devices, -1), member_of(devices, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t m = 0; m < groups[g].size(); ++m) {
      group_of[mesh.device(groups[g][m])] = static_cast<int>(g);
      member_of[mesh.device(groups[g][m])] = static_cast<int>(m);
    }
  }
  std::vector<int> stride(rank, 1);
  for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * shape[d + 1];
  // Device `device` moved by `k` along dimension `d` (row-major indices, TorusIndex).
  auto moved = [&](int device, int d, int k) {
    const int c = device / stride[d] % shape[d];
    return device + ((c + k) % shape[d] - c) * stride[d];
  };
  TranslationQuotient q;
  q.step = shape;
  for (int d = 0; d < rank; ++d) {
    if (!wrap[d]) continue;  // Also false for lengths 1 and 2 (HasWraparoundLink).
    // The symmetries along d form a subgroup of Z_length: multiples of its least step, a
    // divisor of the length.
    for (int k = 1; k < shape[d]; ++k) {
      if (shape[d] % k != 0) continue;
      bool symmetric = true;
      for (size_t g = 0; g < groups.size() && symmetric; ++g) {
        const int target = group_of[moved(mesh.device(groups[g][0]), d, k)];
        if (target < 0) {
          symmetric = false;
          break;
        }
        for (size_t m = 0; m < groups[g].size(); ++m) {
          const int to = moved(mesh.device(groups[g][m]), d, k);
          if (group_of[to] != target || member_of[to] != static_cast<int>(m)) {
            symmetric = false;
            break;
          }
        }
      }
      if (symmetric) {
        q.step[d] = k;
        break;
      }
    }
    q.order *= shape[d] / q.step[d];
  }
  if (q.order == 1) return std::nullopt;
  // Ports, and each link's representative, checked alike in everything the fluid model reads.
  const size_t links = topo.links().size();
  q.ports = 2 * rank;
  q.port.assign(links, -1);
  q.out.assign(static_cast<size_t>(topo.num_vertices()) * q.ports, -1);
  for (LinkId l = 0; l < static_cast<LinkId>(links); ++l) {
    const Link& link = topo.link(l);
    if (link.dimension < 0 || link.dimension >= rank || link.direction == 0) return std::nullopt;
    q.port[l] = 2 * link.dimension + (link.direction > 0 ? 1 : 0);
    LinkId& slot = q.out[static_cast<size_t>(link.src) * q.ports + q.port[l]];
    if (slot >= 0) return std::nullopt;  // Parallel links: which one a translate is is unclear.
    slot = l;
  }
  q.representative.assign(links, -1);
  std::vector<int> back(rank);
  for (LinkId l = 0; l < static_cast<LinkId>(links); ++l) {
    const Link& link = topo.link(l);
    const std::vector<int>& from = topo.node(link.src).coords;
    if (from.size() != shape.size()) return std::nullopt;
    for (int d = 0; d < rank; ++d) back[d] = -(from[d] - from[d] % q.step[d]);
    const std::optional<LinkId> r = TranslatedLink(topo, l, back);
    if (!r) return std::nullopt;
    const Link& rep = topo.link(*r);
    if (rep.bandwidth != link.bandwidth || rep.latency != link.latency || rep.kind != link.kind) {
      return std::nullopt;
    }
    q.representative[l] = *r;
  }
  // The simulated groups, and every group's source and translation.
  q.source.assign(groups.size(), -1);
  q.shift.assign(groups.size(), std::vector<int>(rank));
  for (size_t g = 0; g < groups.size(); ++g) {
    const int first = mesh.device(groups[g][0]);
    int home = first;
    for (int d = 0; d < rank; ++d) {
      const int c = first / stride[d] % shape[d];
      q.shift[g][d] = c - c % q.step[d];
      home -= q.shift[g][d] * stride[d];
    }
    if (home == first) q.simulated.push_back(static_cast<int>(g));
    q.source[g] = group_of[home];
    if (q.source[g] < 0 || member_of[home] != 0) {
      throw std::logic_error(
          "a translation symmetry maps a group's first member off every group's first member");
    }
  }
  return q;
}

const std::vector<LinkId>& QuotientRouter::Route(VertexId src, VertexId dst) {
  const std::vector<LinkId>& route = inner_.Route(src, dst);
  route_.resize(route.size());
  for (size_t h = 0; h < route.size(); ++h) route_[h] = quotient_.representative[route[h]];
  return route_;
}

std::vector<std::vector<LinkId>> QuotientRouter::MinimalRoutes(VertexId src, VertexId dst) {
  std::vector<std::vector<LinkId>> routes = inner_.MinimalRoutes(src, dst);
  for (std::vector<LinkId>& route : routes) {
    for (LinkId& l : route) l = quotient_.representative[l];
  }
  return routes;
}

}  // namespace shardsim
