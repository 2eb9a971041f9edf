#include "topology/network.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>

namespace shardsim {
namespace {

// Bandwidth in bytes per picosecond, the unit of flow rates.
double BytesPerPs(Bandwidth bw) { return bw.bytes_per_second() * 1e-12; }

std::string FormatUtilName(const std::string& track) { return "util " + track; }

}  // namespace

Network::Network(Simulator& sim, const Topology& topo, Router& router)
    : sim_(sim), topo_(topo), router_(router) {
  const CommSpec& comm = topo.comm();
  net_latency_ = comm.net_latency;
  multipath_ = comm.multipath;
  multipath_min_bytes_ = comm.multipath_min_bytes;
  if (sim_.tracing()) DeclareTraceProcesses();
}

void Network::MakeLinkState() {
  links_.resize(topo_.links().size());
  scratch_.resize(topo_.links().size());
  route_memo_.resize(topo_.num_vertices());
  declared_tracks_.assign(2 * topo_.links().size(), 0);
  // The collective library reaches a fraction of the line rate of NVLink and NIC links
  // (CommSpec; 1 on machines without one).
  const CommSpec& comm = topo_.comm();
  for (size_t i = 0; i < links_.size(); ++i) {
    const Link& link = topo_.links()[i];
    const double efficiency = link.kind == LinkKind::kNvlink ? comm.nvlink_efficiency
                              : link.kind == LinkKind::kNic  ? comm.nic_efficiency
                                                             : 1.0;
    links_[i].capacity = BytesPerPs(link.bandwidth) * efficiency;
    links_[i].latency = link.latency;
  }
}

void Network::DeclareTraceProcesses() {
  const std::string& platform =
      topo_.device_spec().platform.empty() ? std::string("DEV") : topo_.device_spec().platform;
  for (VertexId v = 0; v < topo_.num_vertices(); ++v) {
    const Node& n = topo_.node(v);
    // JAX's profiler names device processes "/device:TPU:0"; switches follow the devices.
    std::string name = n.kind == NodeKind::kDevice
                           ? "/device:" + platform + ":" + std::to_string(n.device)
                           : "/switch:" + n.name;
    sim_.DeclareProcess(topo_.process_ids()[v], name, topo_.process_ids()[v]);
  }
}

int32_t Network::TrackOf(LinkId link, bool receive_side) {
  // Send tracks: tid 1 + link id on the sending vertex; receive tracks: after all send tracks,
  // on the receiving vertex. tid 0 is left for a device's compute stream.
  int32_t tid = 1 + link + (receive_side ? static_cast<int32_t>(links_.size()) : 0);
  int32_t& declared = declared_tracks_[2 * link + (receive_side ? 1 : 0)];
  if (!declared) {
    const Link& l = topo_.link(link);
    std::string name =
        receive_side
            ? std::string(LinkKindName(l.kind)) + " recv \xE2\x86\x90 " + topo_.node(l.src).name
            : std::string(LinkKindName(l.kind)) + " \xE2\x86\x92 " + topo_.node(l.dst).name;
    sim_.DeclareThread(topo_.process_ids()[receive_side ? l.dst : l.src], tid, name, tid);
    declared = tid;
  }
  return tid;
}

int32_t Network::AllocateFlow() {
  if (!free_flows_.empty()) {
    int32_t f = free_flows_.back();
    free_flows_.pop_back();
    return f;
  }
  flows_.emplace_back();
  ends_.emplace_back();
  flow_stamp_.push_back(0);
  return static_cast<int32_t>(flows_.size() - 1);
}

TransferId Network::Start(VertexId src, VertexId dst, Bytes bytes, std::string&& label,
                          Callback&& on_delivered) {
  return Start(src, dst, bytes, std::move(label), std::move(on_delivered), Callback());
}

TransferId Network::Start(VertexId src, VertexId dst, Bytes bytes, std::string&& label,
                          Callback&& on_delivered, Callback&& on_drained) {
  return Start(src, dst, bytes, std::move(label), std::move(on_delivered), std::move(on_drained),
               Time());
}

TransferId Network::Start(VertexId src, VertexId dst, Bytes bytes, std::string&& label,
                          Callback&& on_delivered, Callback&& on_drained, Time extra_latency,
                          bool may_split) {
  TransferId id = next_id_++;
  if (links_.empty() && !topo_.links().empty()) MakeLinkState();
  if (src == dst || bytes.count() == 0) {
    if (on_drained) sim_.Schedule(Time(), std::move(on_drained));
    // An empty message between two devices still pays its protocol's cost.
    sim_.Schedule(src == dst ? Time() : extra_latency, std::move(on_delivered));
    return id;
  }
  if (may_split && multipath_ && bytes >= multipath_min_bytes_) {
    std::vector<std::vector<LinkId>> routes = router_.MinimalRoutes(src, dst);
    if (routes.size() > 1) {
      StartSplit(id, src, routes, bytes, label, std::move(on_delivered), std::move(on_drained),
                 extra_latency);
      return id;
    }
  }
  const RouteMemo& route = MemoRoute(src, dst);
  StartFlow(id, src, route.path.begin(), route.path.size(), route.latency, bytes, std::move(label),
            std::move(on_delivered), std::move(on_drained), extra_latency);
  return id;
}

const Network::RouteMemo& Network::MemoRoute(VertexId src, VertexId dst) {
  RouteMemo& memo = route_memo_[src];
  if (memo.dst == dst) return memo;
  const std::vector<LinkId>& route = router_.Route(src, dst);
  if (route.empty()) throw std::logic_error("no route between two vertices");
  memo.dst = dst;
  memo.path.assign(route.data(), route.data() + route.size());
  memo.latency = RouteLatency(route.data(), static_cast<int>(route.size()));
  return memo;
}

Time Network::RouteLatency(const LinkId* route, int hops) const {
  Time latency;
  for (int h = 0; h < hops; ++h) latency += links_[route[h]].latency;
  if (net_latency_ > Time()) {
    for (int h = 0; h < hops; ++h) {
      if (topo_.link(route[h]).kind == LinkKind::kNic) {
        latency += net_latency_;
        break;
      }
    }
  }
  return latency;
}

void Network::StartSplit(TransferId id, VertexId src,
                         const std::vector<std::vector<LinkId>>& routes, Bytes bytes,
                         const std::string& label, Callback on_delivered, Callback on_drained,
                         Time extra_latency) {
  // Every part delivered (drained) delivers (drains) the whole.
  struct Join {
    int delivered = 0, drained = 0, parts = 0;
    Callback on_delivered, on_drained;
  };
  auto join = std::make_shared<Join>();
  const int parts = static_cast<int>(routes.size());
  join->parts = parts;
  join->on_delivered = std::move(on_delivered);
  const bool wants_drain = static_cast<bool>(on_drained);
  join->on_drained = std::move(on_drained);
  const int64_t total = bytes.count();
  for (int i = 0; i < parts; ++i) {
    const Bytes part(total * (i + 1) / parts - total * i / parts);
    std::string part_label;
    if (tracing()) {
      part_label = label + " (path " + std::to_string(i + 1) + "/" + std::to_string(parts) + ")";
    }
    Callback drained;
    if (wants_drain) {
      drained = [join] {
        if (++join->drained == join->parts) join->on_drained();
      };
    }
    // Each part is a flow of its own in traces: the first keeps the transfer's id.
    const std::vector<LinkId>& route = routes[i];
    if (route.empty()) throw std::logic_error("no route between two vertices");
    const int hops = static_cast<int>(route.size());
    StartFlow(
        i == 0 ? id : next_id_++, src, route.data(), hops, RouteLatency(route.data(), hops), part,
        std::move(part_label),
        [join] {
          if (++join->delivered == join->parts) join->on_delivered();
        },
        std::move(drained), extra_latency);
  }
}

void Network::StartFlow(TransferId id, VertexId src, const LinkId* route, int hops,
                        Time route_latency, Bytes bytes, std::string&& label,
                        Callback&& on_delivered, Callback&& on_drained, Time extra_latency) {
  if (bytes.count() == 0) {
    if (on_drained) sim_.Schedule(Time(), std::move(on_drained));
    sim_.Schedule(extra_latency, std::move(on_delivered));
    return;
  }
  int32_t f = AllocateFlow();
  Flow& flow = flows_[f];
  flow.path.assign(route, route + hops);
  flow.total = static_cast<double>(bytes.count());
  flow.remaining = flow.total;
  flow.rate = 0;
  flow.updated_ps = sim_.Now().picoseconds();
  flow.latency = extra_latency + route_latency;
  FlowEnds& ends = ends_[f];
  ends.id = id;
  ends.src = src;
  ends.start = sim_.Now();
  ends.on_delivered = std::move(on_delivered);
  flow.wants_drain = static_cast<bool>(on_drained);
  ends.on_drained = std::move(on_drained);
  ends.label = std::move(label);
  flow.active = true;
  ++active_;
  Admit(f);
}

void Network::Admit(int32_t f) {
  Flow& flow = flows_[f];
  bool alone = true;
  double bottleneck = std::numeric_limits<double>::infinity();
  // A flow alone on its links sits first in each list and is never moved (removal moves the
  // last entry to a lower index), so its slots all stay 0 and are not written: the cold
  // FlowEnds stays out of the lone-flow path. Slots are written from the first shared link
  // on (those before it were empty: slot 0).
  SmallVector<int32_t, 4>& slots = ends_[f].link_slots;
  for (int32_t hop = 0; hop < flow.path.size(); ++hop) {
    const LinkId l = flow.path[hop];
    SmallVector<int32_t, 3>& on_link = links_[l].flows;
    if (!on_link.empty()) SettleLazy(l);
    bottleneck = std::min(bottleneck, links_[l].capacity);
    if (on_link.empty()) {
      ++busy_links_;
    } else if (alone) {
      alone = false;
      slots.clear();
      for (int32_t h = 0; h < hop; ++h) slots.push_back(0);
    }
    if (!alone) slots.push_back(on_link.size());
    on_link.push_back(f);
  }
  flow.slots_valid = !alone;
  if (!alone) {
    MarkDirty(flow.path.begin(), flow.path.end());
    return;
  }
  // The flow's component is itself: its max-min fair rate is its bottleneck capacity.
  if (sim_.tracing() || flow.wants_drain) {  // Needs an event at the drain itself.
    SetRate(f, bottleneck);
    for (LinkId l : flow.path) TraceUtilization(l);
    return;
  }
  // Untraced, a lone flow costs one event: drain and delivery together, at drain + latency.
  // Its links are released lazily (SettleLazy) if another flow wants one of them before then.
  flow.rate = bottleneck;
  flow.updated_ps = sim_.Now().picoseconds();
  flow.lazy = true;
  flow.drain_ps = DrainTime(flow);
  flow.drain_event = sim_.ScheduleAt(Time::Picoseconds(flow.drain_ps) + flow.latency,
                                     [this, f] { FinishLazy(f); });
}

void Network::SettleLazy(LinkId link) {
  // A lazy flow is alone on its links, so at most one is found here.
  const SmallVector<int32_t, 3>& on_link = links_[link].flows;
  if (on_link.size() != 1 || !flows_[on_link[0]].lazy) return;
  int32_t f = on_link[0];
  Flow& flow = flows_[f];
  int64_t now = sim_.Now().picoseconds();
  if (flow.drain_ps <= now) {
    // Already drained: free its links now; its delivery event stays.
    ReleaseLinks(f);
    return;
  }
  // Still sending: from now on it may share, so it becomes an ordinary flow that drains at
  // the same time unless the rebalance about to run changes its rate.
  flow.lazy = false;
  sim_.Cancel(flow.drain_event);
  flow.remaining -= flow.rate * static_cast<double>(now - flow.updated_ps);
  flow.updated_ps = now;
  ArmDrain(f);
}

void Network::ReleaseLinks(int32_t f) {
  Flow& flow = flows_[f];
  flow.active = false;
  --active_;
  scratch_links_.clear();
  if (recorder_) {
    // Lazy and ordinary flows alike hold drain_ps, the instant their last byte left.
    recorder_->OnFlow(ends_[f].src, flow.path.begin(), flow.path.size(), ends_[f].start,
                      Time::Picoseconds(flow.drain_ps), flow.total);
  }
  const double total = flow.total;
  for (int32_t hop = 0; hop < flow.path.size(); ++hop) {
    const LinkId l = flow.path[hop];
    LinkState& link = links_[l];
    link.bytes += total;
    if (link.flows.size() == 1) {
      // Alone (the common case on rings): no need to read the slot from the cold FlowEnds.
      if (link.flows[0] != f) throw std::logic_error("a flow is missing from a link it crosses");
      link.flows.pop_back();
      --busy_links_;
      continue;
    }
    RemoveFromSharedLink(f, hop, link.flows);
    scratch_links_.push_back(l);
  }
}

void Network::RemoveFromSharedLink(int32_t f, int32_t hop, SmallVector<int32_t, 3>& on_link) {
  const int32_t i = flows_[f].slots_valid ? ends_[f].link_slots[hop] : 0;
  if (i < 0 || i >= on_link.size() || on_link[i] != f) {
    throw std::logic_error("a flow's index in a link's flow list is stale");
  }
  // This hop's slot is spent: the search below must not take it for a later hop of the same
  // flow on the same link whose entry moves here.
  if (flows_[f].slots_valid) ends_[f].link_slots[hop] = -1;
  // Swap with the last entry, the order SmallVector::erase leaves: the order progressive
  // filling follows depends only on the sequence of additions and removals.
  const int32_t moved = on_link.back();
  on_link.pop_back();
  if (i == on_link.size()) return;
  on_link[i] = moved;
  const LinkId link = flows_[f].path[hop];
  const Flow& other = flows_[moved];
  // A moved entry was last and not first, so it never belongs to a flow admitted alone.
  if (!other.slots_valid) throw std::logic_error("a lone flow's list entry was moved");
  // The moved entry is the hop of `other` on this link whose slot was the last one (a path
  // may cross one link more than once: see FlowRecorder).
  const int32_t was = on_link.size();
  SmallVector<int32_t, 4>& slots = ends_[moved].link_slots;
  for (int32_t h = 0; h < other.path.size(); ++h) {
    if (other.path[h] == link && slots[h] == was) {
      slots[h] = i;
      return;
    }
  }
  throw std::logic_error("a flow on a link does not cross it");
}

void Network::FinishLazy(int32_t f) {
  Flow& flow = flows_[f];
  if (flow.active) ReleaseLinks(f);
  flow.lazy = false;
  flow.drain_event = EventId{};
  Callback deliver = std::move(ends_[f].on_delivered);
  free_flows_.push_back(f);
  deliver();
}

void Network::MarkDirty(const LinkId* first, const LinkId* last) {
  // Many transfers start (or drain) at the same instant in a collective step. Rebalancing once
  // after all of them, in an event at the current time, costs one progressive filling instead
  // of one per transfer; no time passes in between, so no rate is wrong for any duration.
  dirty_links_.insert(dirty_links_.end(), first, last);
  if (rebalance_pending_) return;
  rebalance_pending_ = true;
  sim_.Schedule(Time(), [this] {
    rebalance_pending_ = false;
    std::vector<LinkId> seeds;
    seeds.swap(dirty_links_);
    Rebalance(seeds);
    seeds.clear();
    if (dirty_links_.empty()) dirty_links_.swap(seeds);  // Keep the capacity.
  });
}

void Network::SetRate(int32_t f, double rate) {
  Flow& flow = flows_[f];
  if (rate == flow.rate && flow.drain_event) return;
  int64_t now = sim_.Now().picoseconds();
  flow.remaining -= flow.rate * static_cast<double>(now - flow.updated_ps);
  if (flow.remaining < 0) flow.remaining = 0;
  flow.updated_ps = now;
  flow.rate = rate;
  if (flow.drain_event) {
    // A drain that moves later keeps its event, which re-arms itself when it fires (Drain):
    // cancelled events stay in the heap until their time, so under contention, where every
    // rebalance moves many drains, cancelling piles them up (tens of thousands in a 512-chip
    // ring pass). Only a drain that moves before the pending event needs a new one.
    flow.drain_ps = DrainTime(flow);
    if (flow.drain_ps >= flow.event_ps) return;
    sim_.Cancel(flow.drain_event);
    ArmDrain(f);
    return;
  }
  ScheduleDrain(f);
}

int64_t Network::DrainTime(const Flow& flow) const {
  const double quotient = flow.remaining / flow.rate;  // Picoseconds, >= 0.
  // Time is int64 picoseconds (about 106 days): a drain beyond that cannot be represented.
  const double left = static_cast<double>(Time::Max().picoseconds() - flow.updated_ps) / 2;
  if (!(quotient <= left)) ThrowDrainOutOfRange(flow);
  // Round the drain up to a whole picosecond so no byte is delivered early: std::ceil of the
  // quotient, through the integer conversion (below 2^62 here; exact: a quotient of 2^52 or
  // more is already whole), which costs a few instructions where std::ceil without SSE4.1
  // costs thirty.
  int64_t ps = static_cast<int64_t>(quotient);
  if (static_cast<double>(ps) < quotient) ++ps;
  return flow.updated_ps + ps;
}

void Network::ThrowDrainOutOfRange(const Flow& flow) {
  throw TimeRangeError("a transfer of " + FormatBytes(Bytes(static_cast<int64_t>(flow.total))) +
                       " at " + FormatBandwidth(Bandwidth::BytesPerSecond(flow.rate * 1e12)) +
                       " would end beyond the simulator's time range (about 53 days)");
}

void Network::ScheduleDrain(int32_t f) {
  Flow& flow = flows_[f];
  flow.drain_ps = DrainTime(flow);
  ArmDrain(f);
}

void Network::ArmDrain(int32_t f) {
  Flow& flow = flows_[f];
  flow.event_ps = flow.drain_ps;
  flow.drain_event = sim_.ScheduleAt(Time::Picoseconds(flow.drain_ps), [this, f] { Drain(f); });
}

void Network::Drain(int32_t f) {
  Flow& flow = flows_[f];
  Time now = sim_.Now();
  if (flow.drain_ps > now.picoseconds()) {  // The drain moved later (SetRate): re-arm.
    ArmDrain(f);
    return;
  }
  flow.drain_event = EventId{};
  ReleaseLinks(f);
  if (sim_.tracing()) {
    const FlowEnds& ends = ends_[f];
    uint64_t flow_id = static_cast<uint64_t>(ends.id) + 1;
    for (int32_t i = 0; i < flow.path.size(); ++i) {
      LinkId l = flow.path[i];
      SliceRecord s;
      s.pid = topo_.process_ids()[topo_.link(l).src];
      s.tid = TrackOf(l, /*receive_side=*/false);
      s.name = ends.label;
      s.category = "transfer";
      s.start = ends.start;
      s.end = now;
      s.args = {{"bytes", std::to_string(static_cast<int64_t>(flow.total))},
                {"hop", std::to_string(i + 1) + "/" + std::to_string(flow.path.size())}};
      if (i == 0) s.flow_out = flow_id;
      sim_.ReportSlice(s);
      // Links still shared are re-traced by Rebalance below with their new rates.
      if (links_[l].flows.empty()) TraceUtilization(l);
    }
    LinkId last = flow.path.back();
    SliceRecord r;
    r.pid = topo_.process_ids()[topo_.link(last).dst];
    r.tid = TrackOf(last, /*receive_side=*/true);
    r.name = ends.label;
    r.category = "receive";
    r.start = ends.start + flow.latency;
    r.end = now + flow.latency;
    r.args = {{"bytes", std::to_string(static_cast<int64_t>(flow.total))}};
    r.flow_in = flow_id;
    sim_.ReportSlice(r);
  }
  sim_.Schedule(flow.latency, std::move(ends_[f].on_delivered));
  Callback drained = std::move(ends_[f].on_drained);
  free_flows_.push_back(f);
  if (!scratch_links_.empty()) {
    MarkDirty(scratch_links_.data(), scratch_links_.data() + scratch_links_.size());
  }
  // Last: the sender may start new transfers, which reuse this flow's slot and scratch.
  if (drained) drained();
}

void Network::Rebalance(const std::vector<LinkId>& seed_links) {
  // 1. The connected component: links reachable from the seeds through shared flows.
  // Each rebalance takes two stamps (see flow_stamp_); before they wrap around, every stamp
  // goes back to zero so an old one cannot be mistaken for a current one.
  if (epoch_ >= std::numeric_limits<uint32_t>::max() - 2) {
    epoch_ = 0;
    std::fill(flow_stamp_.begin(), flow_stamp_.end(), 0);
    for (LinkScratch& s : scratch_) s.mark = 0;
  }
  epoch_ += 2;
  const uint32_t frozen = epoch_ + 1;
  std::vector<LinkId>& comp_links = comp_links_;
  comp_links.clear();
  // Links carrying flows found so far. Once that is every busy link of the network (a large
  // all-to-all: one component), no further link can be found, so the search stops without
  // walking the paths of the remaining flows; the links found, and their order, are the same.
  int64_t busy_found = 0;
  size_t comp_flows = 0;  // Flows found, while searching.
  auto add_link = [&](LinkId l) {
    if (scratch_[l].mark == epoch_) return;
    scratch_[l].mark = epoch_;
    comp_links.push_back(l);
    if (!links_[l].flows.empty()) ++busy_found;
  };
  for (LinkId l : seed_links) add_link(l);
  for (size_t i = 0; i < comp_links.size() && busy_found < busy_links_; ++i) {
    for (int32_t f : links_[comp_links[i]].flows) {
      if (flow_stamp_[f] == epoch_) continue;
      flow_stamp_[f] = epoch_;
      ++comp_flows;
      for (LinkId m : flows_[f].path) add_link(m);
      if (busy_found == busy_links_) break;
    }
  }
  // Every flow on a busy link is in the component when all busy links are.
  if (busy_found == busy_links_) comp_flows = static_cast<size_t>(active_);
  // 2. Progressive filling: repeatedly find the link whose residual capacity split among its
  // unfrozen flows is smallest; that share is the max-min fair rate of those flows (no flow
  // through that link can get more without another getting less). Freeze them and charge
  // their share to every link they cross.
  //
  // The next bottleneck is the link with the smallest residual / unfrozen, computed in doubles,
  // and among equal shares the first in comp_links order. A small component finds it by a scan
  // of its links that still have unfrozen flows; a large one from a min-heap (rounds x links
  // was most of the run time on large collectives), which picks exactly the link the scan
  // picks, so rates and times are bit-identical either way:
  // - The heap orders entries by the same double quotient, then by that position (`order`): a
  //   strict total order, so its top is exactly the link the scan would pick, whatever the
  //   heap's internal arrangement.
  // - Every link with unfrozen flows has one entry whose share is up to date: a round only
  //   changes the residual and unfrozen count of links crossed by the flows it freezes; those
  //   are collected in fill_touched_ and re-keyed (sifted up or down: rounding can make a
  //   share smaller even though in exact arithmetic it only grows) or removed once they have
  //   no unfrozen flow, after the round, before the next bottleneck is taken.
  // - Flows are frozen, residuals charged (in the same order, so the same roundings) and
  //   rates set (so drain events are scheduled in the same sequence) either way.
  // A heap round costs O(t log L) for t touched links of L, a scan round O(L) without the
  // heap's upkeep: cheaper for small components (scan_links_).
  const bool scan = comp_links.size() <= scan_links_;
  fill_heap_.clear();
  fill_scan_.clear();
  for (size_t i = 0; i < comp_links.size(); ++i) {
    LinkId l = comp_links[i];
    LinkScratch& s = scratch_[l];
    s.residual = links_[l].capacity;
    s.unfrozen = static_cast<int32_t>(links_[l].flows.size());
    s.order = static_cast<int32_t>(i);
    s.heap_pos = -1;
    if (s.unfrozen == 0) continue;
    std::vector<FillEntry>& entries = scan ? fill_scan_ : fill_heap_;
    s.heap_pos = static_cast<int32_t>(entries.size());
    entries.push_back(FillEntry{s.residual / s.unfrozen, s.order, l});
  }
  for (size_t i = fill_heap_.size() / 2; i-- > 0;) FillSiftDown(i);
  size_t left = comp_flows;
  // Freezes the unfrozen flows of `best` at `share`, charging every link they cross, and
  // collects the links charged in fill_touched_; `best` is then left without unfrozen flows.
  auto freeze = [&](LinkId best, double share) {
    if (!(share < std::numeric_limits<double>::infinity())) {
      throw std::logic_error("progressive filling found no finite fair share");
    }
    for (int32_t f : links_[best].flows) {
      if (flow_stamp_[f] == frozen) continue;
      flow_stamp_[f] = frozen;
      --left;
      for (LinkId m : flows_[f].path) {
        LinkScratch& s = scratch_[m];
        s.residual = std::max(0.0, s.residual - share);
        --s.unfrozen;
        if (!s.touched) {
          s.touched = true;
          fill_touched_.push_back(m);
        }
      }
      SetRate(f, share);
    }
    if (scratch_[best].unfrozen != 0) {
      throw std::logic_error("progressive filling left flows of a bottleneck link unfrozen");
    }
  };
  while (scan) {
    // The first link of the smallest share among those with unfrozen flows (entries of links
    // whose flows are all frozen hold link -1). Each entry's share is up to date: only the
    // links a round charges change theirs, and those are re-keyed after it, as in the heap.
    LinkId best = -1;
    double best_share = std::numeric_limits<double>::infinity();
    for (const FillEntry& e : fill_scan_) {
      if (e.link >= 0 && (best < 0 || e.share < best_share)) {
        best = e.link;
        best_share = e.share;
      }
    }
    if (best < 0) break;
    fill_touched_.clear();
    freeze(best, best_share);
    for (LinkId m : fill_touched_) {
      LinkScratch& s = scratch_[m];
      s.touched = false;
      if (s.heap_pos < 0) {
        throw std::logic_error("progressive filling charged a link outside its component");
      }
      FillEntry& e = fill_scan_[static_cast<size_t>(s.heap_pos)];
      if (s.unfrozen == 0) {
        e.link = -1;
      } else {
        e.share = s.residual / s.unfrozen;
      }
    }
  }
  while (!fill_heap_.empty()) {
    const LinkId best = fill_heap_[0].link;
    fill_touched_.clear();
    freeze(best, fill_heap_[0].share);
    for (LinkId m : fill_touched_) {
      scratch_[m].touched = false;
      FillUpdate(m);
    }
  }
  if (left != 0) throw std::logic_error("progressive filling left flows without a rate");
  if (sim_.tracing()) {
    for (LinkId l : comp_links) TraceUtilization(l);
  }
}

void Network::FillPlace(size_t i, const FillEntry& e) {
  fill_heap_[i] = e;
  scratch_[e.link].heap_pos = static_cast<int32_t>(i);
}

void Network::FillSiftUp(size_t i) {
  FillEntry e = fill_heap_[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!FillBefore(e, fill_heap_[parent])) break;
    FillPlace(i, fill_heap_[parent]);
    i = parent;
  }
  FillPlace(i, e);
}

void Network::FillSiftDown(size_t i) {
  FillEntry e = fill_heap_[i];
  const size_t n = fill_heap_.size();
  while (true) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && FillBefore(fill_heap_[child + 1], fill_heap_[child])) ++child;
    if (!FillBefore(fill_heap_[child], e)) break;
    FillPlace(i, fill_heap_[child]);
    i = child;
  }
  FillPlace(i, e);
}

void Network::FillUpdate(LinkId link) {
  LinkScratch& s = scratch_[link];
  if (s.heap_pos < 0) {
    throw std::logic_error("progressive filling charged a link outside its heap");
  }
  size_t i = static_cast<size_t>(s.heap_pos);
  if (s.unfrozen == 0) {
    // Out of the heap: the last entry takes its place and moves up or down from there.
    s.heap_pos = -1;
    FillEntry last = fill_heap_.back();
    fill_heap_.pop_back();
    if (i == fill_heap_.size()) return;
    FillPlace(i, last);
    FillSiftUp(i);
    FillSiftDown(static_cast<size_t>(scratch_[last.link].heap_pos));
    return;
  }
  fill_heap_[i].share = s.residual / s.unfrozen;
  FillSiftUp(i);
  FillSiftDown(static_cast<size_t>(s.heap_pos));
}

void Network::TraceUtilization(LinkId link) {
  const LinkState& s = links_[link];
  double used = 0;
  for (int32_t f : s.flows) used += flows_[f].rate;
  double util = std::min(1.0, used / s.capacity);
  // Round to 1e-6 so float noise does not emit spurious samples.
  util = std::round(util * 1e6) / 1e6;
  if (util == scratch_[link].traced_util) return;
  scratch_[link].traced_util = util;
  const Link& l = topo_.link(link);
  CounterRecord c;
  c.pid = topo_.process_ids()[l.src];
  c.name =
      FormatUtilName(std::string(LinkKindName(l.kind)) + " \xE2\x86\x92 " + topo_.node(l.dst).name);
  c.time = sim_.Now();
  c.value = util;
  sim_.ReportCounter(c);
}

}  // namespace shardsim
