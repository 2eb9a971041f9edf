#include "topology/graph_facts.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/push_relabel_max_flow.hpp>
#include <cassert>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>

#include "topology/hierarchical.h"
#include "topology/ring.h"

namespace shardsim {
namespace {

// ---------------------------------------------------------------------------------------------
// Tori. Shape k_0..k_{n-1}, N = prod k_i devices, b_i the one-way bandwidth of a link along
// dimension i, c_i = 2 if dimension i wraps (each line along i is a ring) else 1 (a line).
//
// Diameter: dimensions are independent under dimension-order routing and the distance is the
// sum of per-dimension distances; a ring of k has eccentricity floor(k/2), a line k-1.
//
// Bisection: a plane cut across dimension i between coordinates k_i/2 - 1 and k_i/2 splits
// each of the L_i = N / k_i lines along i into halves; a line crosses the cut once, a ring
// twice (the middle and the wraparound), so the cut costs c_i * L_i * b_i one way. When k_i is
// odd the halves cannot be planes: half of the lines are cut one position later (a staircase),
// which adds the links, inside that one layer, between the lines cut early and those cut late:
// a bisection of the cross-section (the torus without dimension i, L_i devices) — found by the
// same rule recursively. The weakest cut is the minimum over dimensions:
//   B(dims) = min_i [ c_i * L_i * b_i + (k_i odd ? B(dims \ {i}) : 0) ],  B = 0 when N <= 1.
// E.g. 4x4x4 with wraparound: 2 * 16 * b = 32 links; 4x4 without: 1 * 4 * b = 4 links.
// For even lengths the plane cut is the known minimum bisection of k-ary n-cubes and meshes;
// the tests check the whole rule (odd lengths, mixed wraparound) against exact enumeration.
// ---------------------------------------------------------------------------------------------

struct TorusFigures {
  std::vector<int> shape;
  std::vector<bool> wrap;
  std::vector<double> bandwidth;  // Per dimension, one way per link.
};

// The per-dimension figures, if every link runs along a dimension with one bandwidth per
// dimension (the closed form needs uniform dimensions).
std::optional<TorusFigures> UniformTorus(const Topology& topo) {
  if (!topo.torus() || topo.num_switches() != 0) return std::nullopt;
  TorusFigures t{topo.torus()->shape, topo.torus()->wraparound, {}};
  t.bandwidth.assign(t.shape.size(), -1.0);
  for (const Link& l : topo.links()) {
    if (l.dimension < 0 || l.dimension >= static_cast<int>(t.shape.size())) return std::nullopt;
    double& bw = t.bandwidth[l.dimension];
    if (bw < 0) bw = l.bandwidth.bytes_per_second();
    if (bw != l.bandwidth.bytes_per_second()) return std::nullopt;
  }
  return t;
}

double TorusBisection(const TorusFigures& t, const std::vector<int>& dims) {
  int64_t n = 1;
  for (int d : dims) n *= t.shape[d];
  if (n <= 1) return 0;
  double best = std::numeric_limits<double>::infinity();
  for (int i : dims) {
    const int k = t.shape[i];
    if (k < 2) continue;
    const double lines = static_cast<double>(n / k);
    double cost = (t.wrap[i] ? 2.0 : 1.0) * lines * std::max(t.bandwidth[i], 0.0);
    if (k % 2 == 1) {
      std::vector<int> rest;
      for (int d : dims) {
        if (d != i) rest.push_back(d);
      }
      cost += TorusBisection(t, rest);
    }
    best = std::min(best, cost);
  }
  return best;
}

int TorusDiameter(const std::vector<int>& shape, const std::vector<bool>& wrap) {
  int hops = 0;
  for (size_t d = 0; d < shape.size(); ++d) hops += wrap[d] ? shape[d] / 2 : shape[d] - 1;
  return hops;
}

// ---------------------------------------------------------------------------------------------
// Single switch: N devices, one link of bandwidth b each to a non-blocking switch. Halves of
// floor(N/2) and ceil(N/2) devices: with the switch on the larger side, only the smaller
// half's floor(N/2) links cross, so B = floor(N/2) * b. Diameter 2 (device, switch, device).
// ---------------------------------------------------------------------------------------------

std::optional<double> UniformSwitchBandwidth(const Topology& topo) {
  const int n = topo.num_devices();
  if (topo.num_switches() != 1 || topo.torus()) return std::nullopt;
  if (static_cast<int>(topo.links().size()) != 2 * n || topo.num_physical_links() != n) {
    return std::nullopt;
  }
  const double bw = topo.links().front().bandwidth.bytes_per_second();
  for (const Link& l : topo.links()) {
    bool device_to_switch =
        topo.node(l.src).kind == NodeKind::kDevice && topo.node(l.dst).kind == NodeKind::kSwitch;
    bool switch_to_device =
        topo.node(l.src).kind == NodeKind::kSwitch && topo.node(l.dst).kind == NodeKind::kDevice;
    if (!(device_to_switch || switch_to_device) || l.bandwidth.bytes_per_second() != bw) {
      return std::nullopt;
    }
  }
  for (int d = 0; d < n; ++d) {
    if (topo.out_links(topo.device_vertex(d)).size() != 1) return std::nullopt;
  }
  return bw;
}

// ---------------------------------------------------------------------------------------------
// Fully connected: every pair joined by a duplex link of bandwidth b. Every device of one half
// has a link to every device of the other: B = floor(N/2) * ceil(N/2) * b. Diameter 1.
// ---------------------------------------------------------------------------------------------

std::optional<double> UniformFullyConnectedBandwidth(const Topology& topo) {
  const int64_t n = topo.num_devices();
  if (topo.num_switches() != 0 || n < 2 || topo.torus()) return std::nullopt;
  if (static_cast<int64_t>(topo.links().size()) != n * (n - 1)) return std::nullopt;
  const double bw = topo.links().front().bandwidth.bytes_per_second();
  std::vector<bool> seen(static_cast<size_t>(n * n), false);
  for (const Link& l : topo.links()) {
    const size_t cell = static_cast<size_t>(topo.node(l.src).device * n + topo.node(l.dst).device);
    if (seen[cell] || l.bandwidth.bytes_per_second() != bw) return std::nullopt;
    seen[cell] = true;
  }
  return bw;  // n(n-1) distinct ordered pairs, no self-loops: every pair is linked both ways.
}

// ---------------------------------------------------------------------------------------------
// Fat tree (BuildHierarchical): `nodes` nodes of P GPUs, N = nodes * P; each GPU has NVLink
// bandwidth v to its node's NVSwitch and NIC bandwidth w to its leaf; leaf uplinks equal leaf
// downlinks (non-blocking), so the leaf/spine levels never cut less than the NICs beneath them.
// Any split of the devices into A (floor(N/2)) and B (ceil(N/2)) must carry, per direction,
// min(|A|, |B|) * w through the NICs (placing every leaf and spine on the larger side leaves
// exactly the smaller half's NIC links crossing, and no placement of the switches cuts fewer),
// plus, for each node with GPUs on both sides, the NVLink links of its smaller share. With an
// even number of nodes whole nodes can go to each side: B = (N/2) * w. With an odd number one
// node must be split, its smaller share at least floor(P/2) GPUs:
//   B = floor(N/2) * w + (nodes odd ? floor(P/2) * v : 0)   (one node: floor(P/2) * (w + v)).
// Diameter: 2 hops inside a node (NVSwitch) or under one leaf (NIC, leaf, NIC); 4 across
// leaves (NIC, leaf, spine, leaf, NIC).
// ---------------------------------------------------------------------------------------------

double FatTreeBisection(const HierarchicalParams& p) {
  const int64_t n = static_cast<int64_t>(p.nodes) * p.per_node;
  double bisection = static_cast<double>(n / 2) * p.nic_bandwidth.bytes_per_second();
  if (p.nodes % 2 == 1) {
    bisection += static_cast<double>(p.per_node / 2) * p.nvlink_bandwidth.bytes_per_second();
  }
  return bisection;
}

int FatTreeDiameter(const HierarchicalParams& p) {
  if (static_cast<int64_t>(p.nodes) * p.per_node <= 1) return 0;
  return FatTreeLayout(p).num_leaves() > 1 ? 4 : 2;
}

// ---------------------------------------------------------------------------------------------
// General graphs.
// ---------------------------------------------------------------------------------------------

// Most hops between two devices, by BFS from every device over directed links (any vertex may
// forward). O(N * (V + E)). -1 if some device cannot reach another.
int BfsDiameter(const Topology& topo) {
  const int v_count = topo.num_vertices();
  std::vector<int> dist(v_count);
  std::vector<VertexId> queue(v_count);
  int diameter = 0;
  for (int d = 0; d < topo.num_devices(); ++d) {
    std::fill(dist.begin(), dist.end(), -1);
    size_t head = 0, tail = 0;
    VertexId start = topo.device_vertex(d);
    dist[start] = 0;
    queue[tail++] = start;
    while (head < tail) {
      VertexId v = queue[head++];
      for (LinkId id : topo.out_links(v)) {
        VertexId w = topo.link(id).dst;
        if (dist[w] < 0) {
          dist[w] = dist[v] + 1;
          queue[tail++] = w;
        }
      }
    }
    for (int e = 0; e < topo.num_devices(); ++e) {
      int hops = dist[topo.device_vertex(e)];
      if (hops < 0) return -1;
      diameter = std::max(diameter, hops);
    }
  }
  return diameter;
}

// One-way capacity of a split of the devices, in both directions.
//  - Without switches, the capacity A -> B is the sum of the bandwidths of links from A to B.
//  - With switches, each switch may sit on either side: the capacity is the max flow from a
//    super-source feeding A to a super-sink draining B (max-flow = min-cut), Boost push-relabel
//    on integer bytes/s.
class CutEvaluator {
 public:
  explicit CutEvaluator(const Topology& topo) : topo_(topo), direct_(topo.num_switches() == 0) {
    if (direct_) return;
    const int v_count = topo.num_vertices();
    graph_ = FlowGraph(v_count + 2);
    source_ = v_count;
    sink_ = v_count + 1;
    int64_t total = 0;
    for (const Link& l : topo.links()) {
      int64_t cap = std::llround(l.bandwidth.bytes_per_second());
      total += cap;
      AddEdge(l.src, l.dst, cap);
    }
    infinite_ = total + 1;
    for (int d = 0; d < topo.num_devices(); ++d) {
      from_source_.push_back(AddEdge(source_, topo.device_vertex(d), 0));
      to_sink_.push_back(AddEdge(topo.device_vertex(d), sink_, 0));
    }
  }

  // Capacity from the devices with in_a[d] true to the others, B/s.
  double Capacity(const std::vector<bool>& in_a) {
    if (direct_) {
      double sum = 0;
      for (const Link& l : topo_.links()) {
        if (in_a[topo_.node(l.src).device] && !in_a[topo_.node(l.dst).device]) {
          sum += l.bandwidth.bytes_per_second();
        }
      }
      return sum;
    }
    auto capacity = boost::get(boost::edge_capacity, graph_);
    for (size_t d = 0; d < in_a.size(); ++d) {
      capacity[from_source_[d]] = in_a[d] ? infinite_ : 0;
      capacity[to_sink_[d]] = in_a[d] ? 0 : infinite_;
    }
    return static_cast<double>(boost::push_relabel_max_flow(graph_, source_, sink_));
  }

  // The smaller of the two directions of a split.
  double WeakerDirection(std::vector<bool> in_a) {
    double forward = Capacity(in_a);
    in_a.flip();
    return std::min(forward, Capacity(in_a));
  }

 private:
  using FlowTraits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
  using FlowGraph = boost::adjacency_list<
      boost::vecS, boost::vecS, boost::directedS, boost::no_property,
      boost::property<
          boost::edge_capacity_t, int64_t,
          boost::property<boost::edge_residual_capacity_t, int64_t,
                          boost::property<boost::edge_reverse_t, FlowTraits::edge_descriptor>>>>;
  using FlowEdge = FlowTraits::edge_descriptor;

  FlowEdge AddEdge(int u, int v, int64_t cap) {
    FlowEdge e = boost::add_edge(u, v, graph_).first;
    FlowEdge r = boost::add_edge(v, u, graph_).first;
    boost::put(boost::edge_capacity, graph_, e, cap);
    boost::put(boost::edge_capacity, graph_, r, 0);
    boost::put(boost::edge_reverse, graph_, e, r);
    boost::put(boost::edge_reverse, graph_, r, e);
    return e;
  }

  const Topology& topo_;
  bool direct_;
  FlowGraph graph_;
  int source_ = 0, sink_ = 0;
  int64_t infinite_ = 0;
  std::vector<FlowEdge> from_source_, to_sink_;
};

// Devices in BFS order from `start`, following links both ways through any vertex.
std::vector<int> BfsDeviceOrder(const Topology& topo, const std::vector<std::vector<VertexId>>& adj,
                                VertexId start) {
  std::vector<bool> seen(topo.num_vertices(), false);
  std::vector<int> order;
  std::deque<VertexId> queue = {start};
  seen[start] = true;
  while (!queue.empty()) {
    VertexId v = queue.front();
    queue.pop_front();
    if (topo.node(v).kind == NodeKind::kDevice) order.push_back(topo.node(v).device);
    for (VertexId w : adj[v]) {
      if (!seen[w]) {
        seen[w] = true;
        queue.push_back(w);
      }
    }
  }
  // Devices not reached (a disconnected graph) go last, in index order.
  std::vector<bool> listed(topo.num_devices(), false);
  for (int d : order) listed[d] = true;
  for (int d = 0; d < topo.num_devices(); ++d) {
    if (!listed[d]) order.push_back(d);
  }
  return order;
}

// The best of a few structured splits: an upper bound on the bisection. Candidates: devices
// by index (first half / second half), interleaved (even / odd), BFS order from device 0, and
// BFS order from the device BFS reaches last (a peripheral device).
double CandidateBisection(const Topology& topo, int& candidates) {
  const int n = topo.num_devices();
  const int half = n / 2;
  std::vector<std::vector<VertexId>> adj(topo.num_vertices());
  for (const Link& l : topo.links()) {
    adj[l.src].push_back(l.dst);
    adj[l.dst].push_back(l.src);
  }
  std::vector<std::vector<int>> orders;
  std::vector<int> by_index(n);
  for (int d = 0; d < n; ++d) by_index[d] = d;
  orders.push_back(by_index);
  std::vector<int> interleaved;
  for (int d = 0; d < n; d += 2) interleaved.push_back(d);
  for (int d = 1; d < n; d += 2) interleaved.push_back(d);
  orders.push_back(interleaved);
  std::vector<int> bfs = BfsDeviceOrder(topo, adj, topo.device_vertex(0));
  orders.push_back(bfs);
  orders.push_back(BfsDeviceOrder(topo, adj, topo.device_vertex(bfs.back())));
  CutEvaluator cuts(topo);
  double best = std::numeric_limits<double>::infinity();
  for (const std::vector<int>& order : orders) {
    std::vector<bool> in_a(n, false);
    for (int i = 0; i < half; ++i) in_a[order[i]] = true;
    best = std::min(best, cuts.WeakerDirection(in_a));
  }
  candidates = static_cast<int>(orders.size());
  return best;
}

}  // namespace

Bandwidth ExactBisection(const Topology& topo) {
  const int n = topo.num_devices();
  assert(n <= kMaxExactBisectionDevices && "exact enumeration is for small graphs");
  if (n <= 1) return Bandwidth();
  const int half = n / 2;
  CutEvaluator cuts(topo);
  double best = std::numeric_limits<double>::infinity();
  // Every subset of `half` devices as A (Gosper's method walks the masks with `half` bits set).
  // With n even, A's complement is also enumerated, so one direction per subset suffices.
  const uint32_t limit = 1u << n;
  for (uint32_t mask = (1u << half) - 1; mask < limit;) {
    std::vector<bool> in_a(n);
    for (int d = 0; d < n; ++d) in_a[d] = (mask >> d) & 1u;
    best = std::min(best, n % 2 == 0 ? cuts.Capacity(in_a) : cuts.WeakerDirection(in_a));
    const uint32_t low = mask & -mask;
    const uint32_t ripple = mask + low;
    mask = (((ripple ^ mask) >> 2) / low) | ripple;
  }
  return Bandwidth::BytesPerSecond(best);
}

GraphFacts ComputeFacts(const Topology& topo) {
  GraphFacts facts;
  facts.devices = topo.num_devices();
  facts.switches = topo.num_switches();
  facts.physical_links = topo.num_physical_links();
  const int n = topo.num_devices();
  if (topo.torus()) facts.wraparound = topo.torus()->wraparound;

  if (IsOneWayRing(topo)) {
    // A one-way ring split into two arcs: exactly one link leads from each arc to the other.
    facts.diameter = n - 1;
    facts.bisection = topo.links().front().bandwidth;
    facts.bisection_method = "closed form: one-way ring";
    return facts;
  }
  if (std::optional<TorusFigures> torus = UniformTorus(topo)) {
    std::vector<int> dims(torus->shape.size());
    for (size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<int>(d);
    facts.diameter = TorusDiameter(torus->shape, torus->wrap);
    facts.bisection = Bandwidth::BytesPerSecond(TorusBisection(*torus, dims));
    facts.bisection_method = "closed form: torus";
    return facts;
  }
  if (std::optional<double> bw = UniformSwitchBandwidth(topo)) {
    facts.diameter = n >= 2 ? 2 : 0;
    facts.bisection = Bandwidth::BytesPerSecond(static_cast<double>(n / 2) * *bw);
    facts.bisection_method = "closed form: switch";
    return facts;
  }
  if (std::optional<double> bw = UniformFullyConnectedBandwidth(topo)) {
    facts.diameter = 1;
    facts.bisection = Bandwidth::BytesPerSecond(static_cast<double>(n / 2) * ((n + 1) / 2) * *bw);
    facts.bisection_method = "closed form: fully connected";
    return facts;
  }
  if (std::optional<HierarchicalParams> tree = RecognizeHierarchical(topo)) {
    facts.diameter = FatTreeDiameter(*tree);
    facts.bisection = Bandwidth::BytesPerSecond(FatTreeBisection(*tree));
    facts.bisection_method = "closed form: fat tree";
    return facts;
  }
  facts.diameter = BfsDiameter(topo);
  if (n <= kMaxExactBisectionDevices) {
    facts.bisection = ExactBisection(topo);
    facts.bisection_method = "exact enumeration";
  } else {
    int candidates = 0;
    facts.bisection = Bandwidth::BytesPerSecond(CandidateBisection(topo, candidates));
    facts.bisection_method =
        "upper bound: best of " + std::to_string(candidates) + " candidate cuts";
  }
  return facts;
}

}  // namespace shardsim
