// Transfers between devices over a topology, with links shared by concurrent transfers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "sim/callback.h"
#include "sim/simulator.h"
#include "sim/small_vector.h"
#include "sim/time.h"
#include "sim/units.h"
#include "topology/routing.h"
#include "topology/topology.h"

namespace shardsim {

// Identifies a transfer started on a Network.
using TransferId = int64_t;

// Told of every transfer when it leaves its links: which links it held and for how long (the
// cost models' accounting of how a collective used the network).
class FlowRecorder {
 public:
  virtual ~FlowRecorder() = default;
  // A transfer of `bytes` from `src` (the source given to Network::Start) held every link of
  // `path` (`hops` links) from `start` until `drain`, when its last byte left the source. A
  // link may appear more than once in `path` (a router that folds the network, such as the
  // cost models' translation quotient, maps several hops onto one link).
  virtual void OnFlow(VertexId src, const LinkId* path, int hops, Time start, Time drain,
                      double bytes) = 0;
};

// Moves bytes between vertices of a Topology as a fluid flow model with max-min fair sharing.
//
// Model (chosen over chunked FIFO links; see README "How it works"):
// - A transfer occupies every link of its route at once, at one rate. Concurrent transfers
//   share each link's bandwidth max-min fairly (progressive filling): no link carries more
//   than its bandwidth, and a transfer bottlenecked elsewhere leaves its unused share to
//   others. Rates are recomputed, and completion events moved, only for the transfers
//   connected to a changed link through shared links, so disjoint traffic costs nothing.
// - Latency is added once per hop after the last byte leaves the source: cut-through
//   pipelining with vanishing chunk size. A lone transfer of S bytes over h hops of bandwidth
//   B and latency a takes exactly h*a + S/B (zero store-and-forward term), and k transfers
//   sharing one link each take k*S/B + a.
// - Rate changes are batched: transfers that start or end at one instant trigger a single
//   rebalance, run in an event at that instant.
// - Untraced, a transfer alone on its route costs one event (drain and delivery together); its
//   links are released lazily if another transfer wants one of them earlier.
// Why fluid rather than chunks: collectives on thousands of devices move millions of
// messages; a flow costs one or two events however large it is, while chunks cost one event
// per chunk per hop, and the fair-share rates reproduce the bandwidth split that chunked
// round-robin FIFOs converge to for long messages.
class Network {
 public:
  // `sim`, `topo` and `router` must outlive the network.
  Network(Simulator& sim, const Topology& topo, Router& router);
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Starts moving `bytes` from vertex `src` to vertex `dst` now; `on_delivered` runs when the
  // last byte arrives. `label` names the transfer in traces. src == dst or zero bytes
  // completes at once (next event at the current time).
  TransferId Start(VertexId src, VertexId dst, Bytes bytes, std::string&& label,
                   Callback&& on_delivered);
  // The same, also calling `on_drained` when the last byte left the source (the sender may
  // then start its next message on the same links back to back, as pipelined senders do).
  TransferId Start(VertexId src, VertexId dst, Bytes bytes, std::string&& label,
                   Callback&& on_delivered, Callback&& on_drained);
  // The same, delivering `extra_latency` later (a protocol's per-message cost: it holds no
  // link). `on_drained` may be empty. When `may_split`, the topology's CommSpec asks for
  // multipath and the transfer is large enough, it moves as equal parts over the router's
  // MinimalRoutes, delivered (and drained) when every part is.
  TransferId Start(VertexId src, VertexId dst, Bytes bytes, std::string&& label,
                   Callback&& on_delivered, Callback&& on_drained, Time extra_latency,
                   bool may_split = true);

  // Number of transfers started.
  int64_t transfers_started() const { return next_id_; }
  // Number of transfers holding links. Untraced, a transfer that was alone on its route holds
  // them until its delivery (released lazily) rather than until its last byte left.
  int64_t active_transfers() const { return active_; }
  // Total bytes that crossed directed link `link`, counted when each transfer releases it
  // (see active_transfers()).
  double link_bytes(LinkId link) const { return links_.empty() ? 0 : links_[link].bytes; }
  // The topology.
  const Topology& topology() const { return topo_; }
  // Links on the route from `a` to `b` (0 when a == b).
  int Hops(VertexId a, VertexId b) {
    return a == b ? 0 : static_cast<int>(router_.Route(a, b).size());
  }
  // The simulator the transfers run on.
  Simulator& simulator() { return sim_; }
  // Whether the simulation is traced (so transfer labels are worth building).
  bool tracing() const { return sim_.tracing(); }

  // Tells `recorder` (not owned; null: nobody) of every transfer from now on as it leaves its
  // links. Recording changes no timing.
  void set_flow_recorder(FlowRecorder* recorder) { recorder_ = recorder; }

  // Components of at most this many links find their bottlenecks by a scan, larger ones from a
  // heap (Rebalance): ring steps on a pod rebalance tens of links at a time.
  static constexpr size_t kScanLinks = 128;
  // Sets that bound (0: always the heap). Rates and times are the same either way (tested).
  void set_scan_links(size_t links) { scan_links_ = links; }

  // Trace process id of a vertex: devices first (pid = device index), then switches.
  int32_t ProcessOf(VertexId v) const { return topo_.process_ids()[v]; }

 private:
  // The last route asked for from each source (Router::Route is a function of its ends), with
  // the latency its hops add: a collective's members send to the same peers step after step.
  struct RouteMemo {
    VertexId dst = -1;  // -1: none yet.
    SmallVector<LinkId, 4> path;
    Time latency;  // The hops' latencies, and the net latency if it crosses a NIC link.
  };
  // The route from `src` to `dst` (src != dst), from the memo or the router.
  const RouteMemo& MemoRoute(VertexId src, VertexId dst);
  // The latency of `route`'s hops (RouteMemo::latency).
  Time RouteLatency(const LinkId* route, int hops) const;
  // Starts one flow of transfer `id` from `src` on `route` (`hops` links) whose hops add
  // `route_latency`.
  void StartFlow(TransferId id, VertexId src, const LinkId* route, int hops, Time route_latency,
                 Bytes bytes, std::string&& label, Callback&& on_delivered, Callback&& on_drained,
                 Time extra_latency);
  // Starts transfer `id` from `src` as equal parts over `routes`, delivered when every part
  // is.
  void StartSplit(TransferId id, VertexId src, const std::vector<std::vector<LinkId>>& routes,
                  Bytes bytes, const std::string& label, Callback on_delivered, Callback on_drained,
                  Time extra_latency);

  // What rate computation and link bookkeeping touch for every transfer. Progressive filling
  // reads the path, then (SetRate) the rate and drain event: they come first.
  struct Flow {
    SmallVector<LinkId, 4> path;  // Route, first hop first.
    double rate = 0;              // Bytes per picosecond.
    EventId drain_event;
    double total = 0;        // Bytes of the whole transfer.
    double remaining = 0;    // Bytes still to leave the source.
    int64_t updated_ps = 0;  // When `remaining` was last brought up to date.
    int64_t drain_ps = 0;    // When the last byte leaves (at the current rate).
    int64_t event_ps = 0;    // When drain_event fires: at or before drain_ps.
    Time latency;
    bool lazy = false;         // Alone since admission: one event drains and delivers it.
    bool active = false;       // Holds its links.
    bool wants_drain = false;  // Has an on_drained callback.
    bool slots_valid = false;  // FlowEnds::link_slots is written; else every slot is 0.
  };
  // What a transfer needs only when it starts and ends (kept apart so the hot state of many
  // flows in flight stays in cache).
  struct FlowEnds {
    // Per hop of the path: the index of this flow's entry in that link's `flows`, so that
    // removal is O(1) (read only when the flow leaves a shared link or another one's removal
    // moves its entry; kept here, out of the hot Flow). Only if Flow::slots_valid.
    SmallVector<int32_t, 4> link_slots;
    Callback on_delivered;
    Callback on_drained;  // Optional.
    std::string label;
    Time start;
    TransferId id = 0;
    VertexId src = 0;  // The source given to Start (FlowRecorder::OnFlow).
  };
  // What every transfer touches, in one cache line per link.
  struct alignas(64) LinkState {
    double capacity = 0;  // Bytes per picosecond.
    double bytes = 0;     // Bytes carried so far.
    Time latency;         // The link's latency (copied here: read per transfer).
    // Active flow slots on this link, in the order progressive filling visits them. Removal
    // moves the last entry into the freed place (as SmallVector::erase does). Plain slots
    // (4 bytes) keep the lists that progressive filling walks compact; which hop of its path
    // a moved flow is on is found on its (short) path.
    SmallVector<int32_t, 3> flows;
  };
  // What only rebalancing and tracing touch.
  struct LinkScratch {
    double residual = 0;      // Progressive filling: capacity not yet handed out.
    int32_t unfrozen = 0;     // Progressive filling: flows without a rate yet.
    uint32_t mark = 0;        // Component search epoch.
    double traced_util = -1;  // Last utilization reported to the trace.
    int32_t order = 0;        // Progressive filling: position in the component's link list.
    int32_t heap_pos = -1;    // Progressive filling: index in fill_heap_ (or fill_scan_), or -1.
    bool touched = false;     // Progressive filling: in fill_touched_ this round.
  };
  // Progressive filling's candidate bottleneck: a link with unfrozen flows and its fair share.
  struct FillEntry {
    double share;   // residual / unfrozen of `link`.
    int32_t order;  // The link's position in the component: breaks ties in share.
    LinkId link;
  };

  int32_t AllocateFlow();
  void Admit(int32_t f);
  void Drain(int32_t f);
  // Before another flow joins `link`: a lazy flow there that already drained gives up its
  // links; one still sending becomes an ordinary flow with a drain event.
  void SettleLazy(LinkId link);
  // Removes a drained flow from its links (links still shared go to scratch_links_).
  void ReleaseLinks(int32_t f);
  // Removes flow `f` from `on_link`, the flows of hop `hop` of its path, in O(1); `on_link`
  // holds other flows too.
  void RemoveFromSharedLink(int32_t f, int32_t hop, SmallVector<int32_t, 3>& on_link);
  // The one event of a lazy flow: releases its links if still held, and delivers.
  void FinishLazy(int32_t f);
  // Queues links whose flows changed; one rebalance runs at the current time for all of them.
  void MarkDirty(const LinkId* first, const LinkId* last);
  // Recomputes max-min fair rates of all flows connected to `seed_links`.
  void Rebalance(const std::vector<LinkId>& seed_links);
  // Progressive filling's min-heap of FillEntry by (share, order): see Rebalance.
  static bool FillBefore(const FillEntry& a, const FillEntry& b) {
    return a.share < b.share || (a.share == b.share && a.order < b.order);
  }
  // Restore the heap order after fill_heap_[i] became smaller (up) or larger (down).
  void FillSiftUp(size_t i);
  void FillSiftDown(size_t i);
  // Puts `e` at heap index `i` and records the index in its link's scratch.
  void FillPlace(size_t i, const FillEntry& e);
  // Gives link `link` (in the heap) its new share, or removes it if it has no unfrozen flow.
  void FillUpdate(LinkId link);
  void SetRate(int32_t f, double rate);
  void ScheduleDrain(int32_t f);
  // Schedules flow f's drain event at its drain_ps (ScheduleDrain, SettleLazy, a re-arm).
  void ArmDrain(int32_t f);
  // When a flow's last byte leaves at its current rate; throws std::overflow_error beyond the
  // range of Time.
  int64_t DrainTime(const Flow& flow) const;
  // DrainTime's error, apart so that its string building stays out of the hot path.
  [[noreturn, gnu::cold, gnu::noinline]] static void ThrowDrainOutOfRange(const Flow& flow);
  // Sizes and fills the per-link and per-vertex state, at the first transfer: a network no
  // transfer crosses (a run whose collectives a cost model times) never pays for it.
  void MakeLinkState();
  void DeclareTraceProcesses();
  int32_t TrackOf(LinkId link, bool receive_side);
  void TraceUtilization(LinkId link);

  Simulator& sim_;
  const Topology& topo_;
  Router& router_;
  std::vector<Flow> flows_;
  // By flow slot: epoch_ while in the component being rebalanced, epoch_ + 1 once frozen by
  // progressive filling. Apart from Flow so the scans of long link lists stay in cache.
  std::vector<uint32_t> flow_stamp_;
  std::vector<FlowEnds> ends_;  // By flow slot, like flows_.
  std::vector<int32_t> free_flows_;
  std::vector<LinkState> links_;  // Per link (MakeLinkState), like scratch_.
  std::vector<LinkScratch> scratch_;
  TransferId next_id_ = 0;
  Time net_latency_;                   // CommSpec::net_latency: added to transfers over a NIC link.
  bool multipath_ = false;             // CommSpec::multipath.
  Bytes multipath_min_bytes_;          // CommSpec::multipath_min_bytes.
  std::vector<RouteMemo> route_memo_;  // By source vertex.
  std::vector<int32_t> declared_tracks_;  // Per link and side: declared tid, or 0.
  int64_t active_ = 0;
  int64_t busy_links_ = 0;  // Links with at least one active flow.
  uint32_t epoch_ = 0;
  std::vector<LinkId> scratch_links_;
  std::vector<LinkId> dirty_links_;
  bool rebalance_pending_ = false;
  std::vector<LinkId> comp_links_;    // Rebalance: the component's links.
  std::vector<FillEntry> fill_heap_;  // Rebalance: candidate bottlenecks.
  // Rebalance, small components: one entry per link that had unfrozen flows, in component
  // order (LinkScratch::heap_pos its index; link -1 once its flows are all frozen), scanned.
  std::vector<FillEntry> fill_scan_;
  size_t scan_links_ = kScanLinks;    // Rebalance: the largest component scanned.
  std::vector<LinkId> fill_touched_;  // Rebalance: links whose share changed this round.
  FlowRecorder* recorder_ = nullptr;
};

}  // namespace shardsim
