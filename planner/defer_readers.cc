#include "planner/defer_readers.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>

#include "collectives/ir/op_registry.h"
#include "planner/grad.h"
#include "planner/name_bindings.h"
#include "planner/remat.h"

namespace shardsim::planner {

namespace {

// What DeferOrder needs to know of each op.
struct TailOps {
  std::vector<char> moves;  // Per op: it moves (see DeferOrder).
  // Per op: the ops reading its results (the graph's, which outlives this).
  const std::vector<std::vector<size_t>>* readers = nullptr;
  // Per op that moves: the position of the first op it must precede (one that does not move
  // and reads it, directly or through ops that move); ops.size() when only outputs read it.
  std::vector<size_t> latest;
  std::vector<size_t> collectives;  // The tail collectives, in program order.
};

// Per op of `ops` that `movable` marks: the first position it must precede, given that the
// ops `movable` marks may move after it (readers first: each reader follows what it reads).
std::vector<size_t> LatestPositions(const std::vector<std::vector<size_t>>& readers,
                                    const std::vector<char>& movable) {
  const size_t n = readers.size();
  std::vector<size_t> latest(n, n);
  for (size_t i = n; i-- > 0;) {
    for (size_t r : readers[i]) latest[i] = std::min(latest[i], movable[r] ? latest[r] : r);
  }
  return latest;
}

TailOps FindTailOps(const ProgramSpec& manual, const OpGraph& g) {
  const size_t n = manual.ops.size();
  TailOps t;
  t.readers = &g.readers;
  auto collective = [&](size_t i) {
    return Op(manual.ops[i].kind).stream == OpStream::kCollective;
  };
  // Local ops that may move without changing a binding.
  std::vector<char> local(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const OpStream stream = Op(manual.ops[i].kind).stream;
    local[i] = (stream == OpStream::kCompute || stream == OpStream::kFree) && g.bound_once[i];
  }
  // Those that only the outputs wait for and that read collectives' results, the results of
  // such ops and input arrays only: moving them keeps nothing else the step computes alive.
  const std::vector<size_t> latest = LatestPositions(*t.readers, local);
  t.moves.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (!local[i] || latest[i] != n) continue;
    bool only = true, some = false;
    for (size_t k = g.input_start[i]; k < g.input_start[i + 1]; ++k) {
      const size_t m = g.input_maker[k];
      if (m == NameBindings::kNoMaker) continue;
      const bool tail = collective(m) || t.moves[m];
      only = only && tail;
      some = some || tail;
    }
    t.moves[i] = only && some;
  }
  t.latest = LatestPositions(*t.readers, t.moves);
  for (size_t i = 0; i < n; ++i) {
    if (!collective(i)) continue;
    for (size_t r : (*t.readers)[i]) {
      if (t.moves[r]) {
        t.collectives.push_back(i);
        break;
      }
    }
  }
  return t;
}

}  // namespace

std::vector<char> TailCollectivesOf(const ProgramSpec& manual, const OpGraph& graph) {
  std::vector<char> tail(manual.ops.size(), 0);
  for (size_t i : FindTailOps(manual, graph).collectives) tail[i] = 1;
  return tail;
}

std::vector<char> TailCollectivesOf(const ProgramSpec& manual) {
  return TailCollectivesOf(manual, GraphOf(manual));
}

namespace {

// DeferOrder on `manual`'s tail ops `t`.
std::vector<size_t> DeferOrderOf(const ProgramSpec& manual, const TailOps& t,
                                 const std::vector<size_t>& phase_starts,
                                 const std::vector<size_t>& segment_starts) {
  const size_t n = manual.ops.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  auto count_upto = [](const std::vector<size_t>& starts, size_t i) {
    return std::upper_bound(starts.begin(), starts.end(), i) - starts.begin();
  };
  // The tail collectives in runs of one segment each (a segment starts at a phase or a
  // segment start), with each run's phase.
  struct Run {
    size_t last;  // Its last tail collective.
    ptrdiff_t phase;
  };
  std::vector<Run> runs;
  std::vector<size_t> run_of(t.collectives.size());
  ptrdiff_t segment = -1;
  for (size_t k = 0; k < t.collectives.size(); ++k) {
    const size_t c = t.collectives[k];
    const ptrdiff_t phase = count_upto(phase_starts, c);
    const ptrdiff_t s = phase + count_upto(segment_starts, c);
    if (runs.empty() || s != segment) runs.push_back({c, phase});
    segment = s;
    runs.back().last = c;
    run_of[k] = runs.size() - 1;
  }
  // Where each op goes: just before op place[i] (itself when it stays). The ops reading a tail
  // collective aim just past the next run of its phase (else its phase's last run); an op that
  // moves and reads another at least where that one went (so it follows it); no op goes past
  // its latest position or back.
  std::vector<size_t> aim(n, 0);
  for (size_t k = 0; k < t.collectives.size(); ++k) {
    size_t r = run_of[k];
    if (r + 1 < runs.size() && runs[r + 1].phase == runs[r].phase) ++r;
    for (size_t reader : (*t.readers)[t.collectives[k]])
      aim[reader] = std::max(aim[reader], runs[r].last + 1);
  }
  std::vector<size_t> place(n);
  for (size_t i = 0; i < n; ++i) {
    if (!t.moves[i]) {
      place[i] = i;
      continue;
    }
    place[i] = std::max(i, std::min(t.latest[i], aim[i]));
    for (size_t r : (*t.readers)[i]) aim[r] = std::max(aim[r], place[i]);
  }
  // Sorted stably by place: an op placed before op q comes after every op placed before an
  // earlier one and before q itself (it was before q in program order: i < q), and ops placed
  // alike keep their program order.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return place[a] < place[b]; });
  return order;
}

}  // namespace

std::vector<size_t> DeferOrder(const ProgramSpec& manual, const std::vector<size_t>& phase_starts,
                               const std::vector<size_t>& segment_starts) {
  const OpGraph g = GraphOf(manual);
  return DeferOrderOf(manual, FindTailOps(manual, g), phase_starts, segment_starts);
}

void DeferCollectiveReaders(PartitionResult& partitioned, const std::vector<size_t>& phase_starts,
                            const std::vector<size_t>& segment_starts, const OpNameIds* ids) {
  const OpGraph g = GraphOf(partitioned.program, ids, partitioned.origin);
  const TailOps t = FindTailOps(partitioned.program, g);
  if (t.collectives.empty()) return;
  Reorder(partitioned, DeferOrderOf(partitioned.program, t, phase_starts, segment_starts));
}

namespace {

// Each value of `segments` to its segment.
std::unordered_map<std::string, size_t> SegmentOf(
    const std::vector<std::vector<std::string>>& segments) {
  std::unordered_map<std::string, size_t> segment_of;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (const std::string& v : segments[s]) segment_of.emplace(v, s);
  }
  return segment_of;
}

}  // namespace

std::vector<size_t> LayerBackwardStarts(const ProgramSpec& expanded,
                                        const std::vector<size_t>& pass_starts,
                                        const std::vector<std::vector<std::string>>& segments) {
  const std::vector<OpSpec>& ops = expanded.ops;
  std::unordered_map<std::string, size_t> segment_of = SegmentOf(segments);
  // A value another segment's forward reads (a layer's output) is left out: the next layer's
  // backward reads it first.
  const std::vector<int> pass_of = PassOfOps(ops.size(), pass_starts);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (pass_of[i] >= 0 || ops[i].out.empty()) continue;
    const auto own = segment_of.find(ops[i].out[0]);
    for (const std::string& in : ops[i].in) {
      const auto it = segment_of.find(in);
      if (it != segment_of.end() && (own == segment_of.end() || own->second != it->second)) {
        segment_of.erase(it);
      }
    }
  }
  const std::string suffix = kRematSuffix;
  std::vector<size_t> starts;
  for (size_t k = 0; k + 1 < pass_starts.size(); k += 2) {
    std::vector<char> seen(segments.size(), 0);
    for (size_t i = pass_starts[k]; i < pass_starts[k + 1] && i < ops.size(); ++i) {
      for (const std::string& in : ops[i].in) {
        auto it = segment_of.find(in);
        if (it == segment_of.end() && IsRecompute(in)) {
          it = segment_of.find(in.substr(0, in.size() - suffix.size()));
        }
        if (it == segment_of.end() || seen[it->second]) continue;
        seen[it->second] = 1;
        starts.push_back(i);
      }
    }
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  return starts;
}

std::vector<size_t> LayerForwardStarts(const ProgramSpec& expanded,
                                       const std::vector<size_t>& pass_starts,
                                       const std::vector<std::vector<std::string>>& segments) {
  const std::unordered_map<std::string, size_t> segment_of = SegmentOf(segments);
  const std::vector<int> pass_of = PassOfOps(expanded.ops.size(), pass_starts);
  std::vector<char> seen(segments.size(), 0);
  std::vector<size_t> starts;
  for (size_t i = 0; i < expanded.ops.size(); ++i) {
    if (pass_of[i] >= 0 || expanded.ops[i].out.empty()) continue;
    const auto it = segment_of.find(expanded.ops[i].out[0]);
    if (it == segment_of.end() || seen[it->second]) continue;
    seen[it->second] = 1;
    starts.push_back(i);
  }
  return starts;
}

}  // namespace shardsim::planner
