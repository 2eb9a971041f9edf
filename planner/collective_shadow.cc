#include "planner/collective_shadow.h"

#include <algorithm>
#include <numeric>
#include <span>
#include <string>

#include "collectives/ir/op_registry.h"
#include "planner/defer_readers.h"
#include "planner/name_bindings.h"
#include "planner/prefetch.h"

namespace shardsim::planner {

namespace {

// ShadowOrder on `manual`'s data flow `g`.
std::vector<size_t> ShadowOrderOf(const ProgramSpec& manual, const OpGraph& g,
                                  const std::vector<size_t>& segment_starts) {
  const size_t n = manual.ops.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  const std::vector<char> weight = WeightOpsOf(manual, g);
  const std::vector<char> tail = TailCollectivesOf(manual, g);
  auto stream = [&](size_t i) { return Op(manual.ops[i].kind).stream; };
  // Per op: the earlier ops making its inputs (op i's: [maker_start[i], maker_start[i + 1])
  // of maker_list).
  std::vector<size_t> maker_start(n + 1, 0), maker_list;
  maker_list.reserve(g.input_maker.size());
  for (size_t i = 0; i < n; ++i) {
    maker_start[i] = maker_list.size();
    for (size_t k = g.input_start[i]; k < g.input_start[i + 1]; ++k) {
      if (g.input_maker[k] < i) maker_list.push_back(g.input_maker[k]);
    }
  }
  maker_start[n] = maker_list.size();
  auto makers = [&](size_t i) {
    return std::span<const size_t>(maker_list.data() + maker_start[i],
                                   maker_list.data() + maker_start[i + 1]);
  };
  const std::vector<char>& once = g.bound_once;
  const std::vector<std::vector<size_t>>& readers = g.readers;
  // Where each op goes: an op that stays keeps its index; one that moves goes just before the
  // op `to[i]` (its collective's first reader).
  std::vector<size_t> to(n, 0);
  std::vector<char> moves(n, 0);
  std::vector<size_t> mark(n, n);  // mark[i] == c: op i is in C's window and P needs it.
  std::vector<char> candidate(n, 0);
  size_t start = 0;  // The current window's first op.
  for (size_t c = 0; c < n; ++c) {
    if (stream(c) != OpStream::kCollective || weight[c] || tail[c] || makers(c).empty() ||
        readers[c].empty()) {
      continue;
    }
    const std::span<const size_t> of_c = makers(c);
    const size_t p = *std::max_element(of_c.begin(), of_c.end());
    const size_t r = readers[c].front();
    // R's segment: [its start, ...).
    const auto seg = std::upper_bound(segment_starts.begin(), segment_starts.end(), r);
    const size_t seg_start = seg == segment_starts.begin() ? 0 : *(seg - 1);
    if (p < seg_start) {
      start = std::max(start, r);
      continue;
    }
    start = std::max(start, seg_start);
    if (r > start) {
      // What P needs within the window.
      std::vector<size_t> stack = {p};
      while (!stack.empty()) {
        const size_t op = stack.back();
        stack.pop_back();
        for (size_t m : makers(op)) {
          if (m >= start && mark[m] != c) {
            mark[m] = c;
            stack.push_back(m);
          }
        }
      }
      for (size_t i = start; i < r; ++i) {
        candidate[i] = 0;
        if (i == p || mark[i] == c || moves[i] || weight[i] || !once[i]) continue;
        // Before P: local ops, and collectives reading ops that move; after P, only what reads
        // ops that move (a product's reduce-scatter placed after P).
        const OpStream s = stream(i);
        bool follows = false;
        for (size_t m : makers(i)) follows = follows || (m >= start && candidate[m]);
        if (s == OpStream::kCompute || s == OpStream::kFree) {
          candidate[i] = i < p || follows;
        } else if (s == OpStream::kCollective) {
          candidate[i] = follows;
        }
      }
      // An op stays if a reader of it stays before R (readers first: what a staying op reads
      // stays too).
      for (size_t i = r; i-- > start;) {
        if (!candidate[i]) continue;
        for (size_t x : readers[i]) {
          if (x < r && !candidate[x]) {
            candidate[i] = 0;
            break;
          }
        }
      }
      for (size_t i = start; i < r; ++i) {
        if (!candidate[i]) continue;
        moves[i] = 1;
        to[i] = r;
      }
    }
    start = std::max(start, r);
  }
  // A moved op sorts just before its reader R (after every op that stays before R), moved ops
  // in their program order.
  auto key = [&](size_t i) { return moves[i] ? 2 * to[i] : 2 * i + 1; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
}

}  // namespace

std::vector<size_t> ShadowOrder(const ProgramSpec& manual,
                                const std::vector<size_t>& segment_starts) {
  return ShadowOrderOf(manual, GraphOf(manual), segment_starts);
}

void FillCollectiveShadows(PartitionResult& partitioned, const std::vector<size_t>& segment_starts,
                           const OpNameIds* ids) {
  const OpGraph g = GraphOf(partitioned.program, ids, partitioned.origin);
  Reorder(partitioned, ShadowOrderOf(partitioned.program, g, segment_starts));
}

}  // namespace shardsim::planner
