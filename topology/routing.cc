#include "topology/routing.h"

#include <algorithm>
#include <boost/graph/dijkstra_shortest_paths.hpp>
#include <boost/property_map/function_property_map.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>

#include "topology/hierarchical.h"
#include "topology/ring.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

// Dimension-order routing on a torus, mesh or ring.
class TorusRouter : public Router {
 public:
  explicit TorusRouter(const Topology& topo)
      : topo_(topo),
        shape_(topo.torus()->shape),
        wrap_(topo.torus()->wraparound),
        one_way_(IsOneWayRing(topo)),
        rank_(static_cast<int>(shape_.size())) {
    // Per device and dimension: its coordinate, and the link one step - and + (or -1).
    // Coordinates come from the device index (torus.h layout), not Node::coords, so a torus
    // put together by hand without coordinates routes too.
    int n = topo.num_devices();
    vertex_device_.resize(topo.num_vertices());
    for (VertexId v = 0; v < topo.num_vertices(); ++v) vertex_device_[v] = topo.node(v).device;
    link_dst_device_.resize(topo.links().size());
    for (size_t l = 0; l < topo.links().size(); ++l) {
      link_dst_device_[l] = vertex_device_[topo.links()[l].dst];
    }
    coords_.resize(static_cast<size_t>(n) * rank_);
    step_.assign(static_cast<size_t>(n) * rank_ * 2, -1);
    for (int dev = 0; dev < n; ++dev) {
      std::vector<int> at = TorusCoords(shape_, dev);
      for (int d = 0; d < rank_; ++d) {
        coords_[static_cast<size_t>(dev) * rank_ + d] = at[d];
        for (int dir = 0; dir < 2; ++dir) {
          std::vector<int> next = at;
          next[d] = (at[d] + (dir ? 1 : -1) + shape_[d]) % shape_[d];
          std::optional<LinkId> link =
              topo.FindLink(topo.device_vertex(dev), topo.device_vertex(TorusIndex(shape_, next)));
          if (link) step_[(static_cast<size_t>(dev) * rank_ + d) * 2 + dir] = *link;
        }
      }
    }
  }

  std::vector<std::vector<LinkId>> MinimalRoutes(VertexId src, VertexId dst) override {
    std::vector<std::vector<LinkId>> routes = {Route(src, dst)};
    const int from = vertex_device_[src], to = vertex_device_[dst];
    if (from < 0 || to < 0 || one_way_) return routes;
    // Per dimension: its signed steps (the default way), and whether the other way ties.
    std::vector<int> moving, steps(rank_);
    std::vector<bool> tie(rank_, false);
    for (int d = 0; d < rank_; ++d) {
      const int k = shape_[d];
      int s = coords_[static_cast<size_t>(to) * rank_ + d] -
              coords_[static_cast<size_t>(from) * rank_ + d];
      if (wrap_[d]) {
        const int forward = s < 0 ? s + k : s;
        const int backward = k - forward;
        s = (forward == 0 || forward <= backward) ? forward : -backward;
        tie[d] = forward != 0 && forward == backward;
      }
      steps[d] = s;
      if (s != 0) moving.push_back(d);
    }
    const int m = static_cast<int>(moving.size());
    int ties = 0;
    for (int d : moving) ties += tie[d] ? 1 : 0;
    constexpr size_t kMaxRoutes = 8;
    for (int rotation = 0; rotation < m; ++rotation) {
      for (int flips = 0; flips < (1 << ties); ++flips) {
        if (rotation == 0 && flips == 0) continue;  // Route's own.
        if (routes.size() >= kMaxRoutes) return routes;
        std::vector<LinkId> route;
        int current = from, tie_index = 0;
        for (int i = 0; i < m; ++i) {
          const int d = moving[(rotation + i) % m];
          int s = steps[d];
          if (tie[d] && (flips >> tie_index++) % 2 == 1) s = -s;
          const int dir = s > 0 ? 1 : 0;
          for (int j = 0; j < std::abs(s); ++j) {
            const LinkId link = step_[(static_cast<size_t>(current) * rank_ + d) * 2 + dir];
            if (link < 0) throw std::logic_error("torus neighbours must be linked");
            route.push_back(link);
            current = link_dst_device_[link];
          }
        }
        // A dimension of 2 that wraps ties both ways onto one link: the same route again.
        if (std::find(routes.begin(), routes.end(), route) == routes.end()) {
          routes.push_back(std::move(route));
        }
      }
    }
    return routes;
  }

  const std::vector<LinkId>& Route(VertexId src, VertexId dst) override {
    route_.clear();
    int current = vertex_device_[src];
    const int target_device = vertex_device_[dst];
    if (current < 0 || target_device < 0) throw std::logic_error("torus routes join devices");
    const int* target = &coords_[static_cast<size_t>(target_device) * rank_];
    for (int d = 0; d < rank_; ++d) {
      const int k = shape_[d];
      // Signed number of unit steps along dimension d.
      // steps is in (-k, k): no division needed (this runs for every transfer).
      int steps = target[d] - coords_[static_cast<size_t>(current) * rank_ + d];
      if (one_way_ || wrap_[d]) {
        const int forward = steps < 0 ? steps + k : steps;  // Steps going +.
        const int backward = k - forward;                   // Steps going - (forward > 0).
        steps = (one_way_ || forward == 0 || forward <= backward) ? forward : -backward;
      }
      const int dir = steps > 0 ? 1 : 0;
      for (int i = 0; i < std::abs(steps); ++i) {
        LinkId link = step_[(static_cast<size_t>(current) * rank_ + d) * 2 + dir];
        if (link < 0) throw std::logic_error("torus neighbours must be linked");
        route_.push_back(link);
        current = link_dst_device_[link];
      }
    }
    if (current != target_device) throw std::logic_error("a torus route ended off its target");
    return route_;
  }

 private:
  const Topology& topo_;
  std::vector<int> shape_;
  std::vector<bool> wrap_;
  bool one_way_;
  int rank_;
  std::vector<int> vertex_device_;    // Device index of each vertex (-1: switch).
  std::vector<int> link_dst_device_;  // Device a link leads to.
  std::vector<int> coords_;
  std::vector<LinkId> step_;
  std::vector<LinkId> route_;
};

// Dijkstra from each source on first use, cached.
class ShortestPathRouter : public Router {
 public:
  explicit ShortestPathRouter(const Topology& topo)
      : topo_(topo), trees_(topo.num_vertices()), weight_(topo.links().size()) {
    // Weight in picoseconds: latency + the time 1 MiB takes at the link's bandwidth.
    for (size_t i = 0; i < weight_.size(); ++i) {
      const Link& l = topo.links()[i];
      weight_[i] = l.latency.picoseconds() + l.bandwidth.TransferTime(Bytes::MiB(1)).picoseconds();
    }
  }

  const std::vector<LinkId>& Route(VertexId src, VertexId dst) override {
    route_.clear();
    if (src == dst) return route_;
    const std::vector<LinkId>& pred = Tree(src);
    for (VertexId v = dst; v != src;) {
      LinkId id = pred[v];
      if (id < 0) throw std::logic_error("destination unreachable");
      route_.push_back(id);
      v = topo_.link(id).src;
    }
    std::reverse(route_.begin(), route_.end());
    return route_;
  }

 private:
  // Records, for every vertex, the link over which Dijkstra last improved it.
  struct RecordLink : public boost::default_dijkstra_visitor {
    std::vector<LinkId>* pred;
    template <class Edge, class Graph>
    void edge_relaxed(Edge e, const Graph& g) const {
      (*pred)[boost::target(e, g)] = g[e];
    }
  };

  const std::vector<LinkId>& Tree(VertexId src) {
    std::vector<LinkId>& pred = trees_[src];
    if (!pred.empty()) return pred;
    const TopologyGraph& g = topo_.graph();
    pred.assign(topo_.num_vertices(), -1);
    std::vector<int64_t> distance(topo_.num_vertices(), std::numeric_limits<int64_t>::max());
    const std::vector<int64_t>& weights = weight_;
    auto weight_map = boost::make_function_property_map<TopologyGraph::edge_descriptor>(
        [&g, &weights](TopologyGraph::edge_descriptor e) { return weights[g[e]]; });
    RecordLink visitor;
    visitor.pred = &pred;
    boost::dijkstra_shortest_paths(g, static_cast<TopologyGraph::vertex_descriptor>(src),
                                   boost::weight_map(weight_map)
                                       .distance_map(boost::make_iterator_property_map(
                                           distance.begin(), boost::get(boost::vertex_index, g)))
                                       .visitor(visitor));
    return pred;
  }

  const Topology& topo_;
  std::vector<std::vector<LinkId>> trees_;  // Per source; empty until computed.
  std::vector<int64_t> weight_;             // Per LinkId, picoseconds.
  std::vector<LinkId> route_;
};

// Structural routing on a fat tree built by BuildHierarchical.
class FatTreeRouter : public Router {
 public:
  FatTreeRouter(const Topology& topo, const HierarchicalParams& params)
      : layout_(params), fallback_(topo) {
    const int n = layout_.num_devices();
    to_switch_.assign(n, -1);
    from_switch_.assign(n, -1);
    to_leaf_.assign(n, -1);
    from_leaf_.assign(n, -1);
    up_.assign(static_cast<size_t>(layout_.num_leaves()) * params.spines, -1);
    down_.assign(up_.size(), -1);
    const VertexId first_leaf = layout_.Leaf(0);
    const VertexId first_spine = layout_.Leaf(layout_.num_leaves() - 1) + 1;
    for (LinkId id = 0; id < static_cast<LinkId>(topo.links().size()); ++id) {
      const Link& l = topo.link(id);
      if (l.src < n) {
        (l.kind == LinkKind::kNvlink ? to_switch_ : to_leaf_)[l.src] = id;
      } else if (l.dst < n) {
        (l.kind == LinkKind::kNvlink ? from_switch_ : from_leaf_)[l.dst] = id;
      } else if (l.src < first_spine) {  // Leaf -> spine.
        up_[static_cast<size_t>(l.src - first_leaf) * params.spines + (l.dst - first_spine)] = id;
      } else {  // Spine -> leaf.
        down_[static_cast<size_t>(l.dst - first_leaf) * params.spines + (l.src - first_spine)] = id;
      }
    }
  }

  const std::vector<LinkId>& Route(VertexId src, VertexId dst) override {
    const int n = layout_.num_devices();
    if (src >= n || dst >= n) return fallback_.Route(src, dst);  // A switch endpoint.
    route_.clear();
    if (src == dst) return route_;
    const int src_node = layout_.NodeOf(src);
    const int dst_node = layout_.NodeOf(dst);
    if (src_node == dst_node) {
      // Inside a node: NVLink through the node's NVSwitch, never the NICs.
      route_ = {to_switch_[src], from_switch_[dst]};
      return route_;
    }
    const int src_leaf = layout_.LeafOfNode(src_node);
    const int dst_leaf = layout_.LeafOfNode(dst_node);
    route_.push_back(to_leaf_[src]);
    if (src_leaf != dst_leaf) {
      // ECMP-like: spread node pairs over the spines deterministically.
      const int spines = layout_.params().spines;
      const int spine = (src_node + dst_node) % spines;
      route_.push_back(up_[static_cast<size_t>(src_leaf) * spines + spine]);
      route_.push_back(down_[static_cast<size_t>(dst_leaf) * spines + spine]);
    }
    route_.push_back(from_leaf_[dst]);
    return route_;
  }

 private:
  FatTreeLayout layout_;
  ShortestPathRouter fallback_;
  std::vector<LinkId> to_switch_, from_switch_;  // Per device: NVLink up and down.
  std::vector<LinkId> to_leaf_, from_leaf_;      // Per device: NIC up and down.
  std::vector<LinkId> up_, down_;                // Per (leaf, spine): fabric up and down.
  std::vector<LinkId> route_;
};

// Several slices joined by DCN (multi_slice.h): inside a slice dimension-order routing (the
// slice coordinate never changes, so dimension 0 takes no step); between slices chip -> DCN
// switch -> chip.
class MultiSliceRouter : public Router {
 public:
  explicit MultiSliceRouter(const Topology& topo)
      : topo_(topo), torus_(topo), per_slice_(topo.num_devices() / topo.torus()->shape[0]) {
    const int n = topo.num_devices();
    up_.assign(n, -1);
    down_.assign(n, -1);
    for (LinkId l = 0; l < static_cast<LinkId>(topo.links().size()); ++l) {
      const Link& link = topo.links()[l];
      if (link.kind != LinkKind::kDcn) continue;
      const int from = topo.node(link.src).device, to = topo.node(link.dst).device;
      if (from >= 0) up_[from] = l;
      if (to >= 0) down_[to] = l;
    }
  }

  const std::vector<LinkId>& Route(VertexId src, VertexId dst) override {
    const int from = topo_.node(src).device, to = topo_.node(dst).device;
    if (from < 0 || to < 0) throw std::logic_error("multi-slice routes join devices");
    if (from / per_slice_ == to / per_slice_) return torus_.Route(src, dst);
    if (up_[from] < 0 || down_[to] < 0) throw std::logic_error("every chip has a DCN link");
    route_ = {up_[from], down_[to]};
    return route_;
  }

 private:
  const Topology& topo_;
  TorusRouter torus_;
  int per_slice_;
  std::vector<LinkId> up_, down_;  // Per device: its DCN link to the switch and back.
  std::vector<LinkId> route_;
};

}  // namespace

std::unique_ptr<Router> MakeRouter(const Topology& topo) {
  if (topo.torus() && topo.torus()->dcn_slices) return std::make_unique<MultiSliceRouter>(topo);
  if (topo.torus() && topo.num_switches() == 0) return std::make_unique<TorusRouter>(topo);
  if (std::optional<HierarchicalParams> params = RecognizeHierarchical(topo)) {
    return std::make_unique<FatTreeRouter>(topo, *params);
  }
  return MakeShortestPathRouter(topo);
}

std::unique_ptr<Router> MakeShortestPathRouter(const Topology& topo) {
  return std::make_unique<ShortestPathRouter>(topo);
}

}  // namespace shardsim
