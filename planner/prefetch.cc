#include "planner/prefetch.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "collectives/ir/op_registry.h"
#include "planner/name_bindings.h"

namespace shardsim::planner {

namespace {

// Which ops are weight ops (see PrefetchOrder).
struct WeightOps {
  std::vector<char> weight;         // Per op: a weight op.
  std::vector<size_t> collectives;  // The weight collectives, in program order.
};

WeightOps FindWeightOps(const ProgramSpec& manual, const OpGraph& g) {
  const size_t n = manual.ops.size();
  WeightOps w;
  // Weight ops: one input, an input array never rebound or a weight op's result (a
  // parameter, its casts and gathers; not what the step computes from several values), and
  // results bound nowhere else. Only these move, so a name's readers still see the binding
  // they saw.
  w.weight.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const size_t k = g.input_start[i];
    bool only = g.input_start[i + 1] == k + 1 && g.input_once[k] && g.output_once[i];
    if (only) {
      if (const size_t m = g.input_maker[k]; m != NameBindings::kNoMaker) {
        only = m < i && w.weight[m];
      }
    }
    w.weight[i] = only;
    if (only && Op(manual.ops[i].kind).stream == OpStream::kCollective) {
      w.collectives.push_back(i);
    }
  }
  return w;
}

}  // namespace

std::vector<char> WeightOpsOf(const ProgramSpec& manual) {
  return FindWeightOps(manual, GraphOf(manual)).weight;
}

std::vector<char> WeightOpsOf(const ProgramSpec& manual, const OpGraph& graph) {
  return FindWeightOps(manual, graph).weight;
}

namespace {

// PrefetchOrder on `manual`'s data flow `g` and weight ops `w`.
std::vector<size_t> PrefetchOrderOf(const ProgramSpec& manual, const OpGraph& g, const WeightOps& w,
                                    int distance) {
  const size_t n = manual.ops.size();
  std::vector<size_t> unchanged(n);
  std::iota(unchanged.begin(), unchanged.end(), size_t{0});
  if (distance <= 0) return unchanged;
  const std::vector<size_t>& weights = w.collectives;
  // Each op's first reader.
  std::vector<size_t> first_reader(n, n);
  for (size_t j = 0; j < n; ++j) {
    for (size_t k = g.input_start[j]; k < g.input_start[j + 1]; ++k) {
      const size_t m = g.input_maker[k];
      if (m != NameBindings::kNoMaker && g.input_once[k] && first_reader[m] == n) {
        first_reader[m] = j;
      }
    }
  }
  // Weight collective k moves to just before the first reader of weight collective
  // k - distance (the program's start for the first `distance`), never later than it was.
  std::vector<std::vector<size_t>> before(n + 1);
  for (size_t k = 0; k < weights.size(); ++k) {
    const size_t i = weights[k];
    const size_t at = k < static_cast<size_t>(distance) ? 0 : first_reader[weights[k - distance]];
    if (at < i) before[at].push_back(i);
  }
  std::vector<size_t> order;
  order.reserve(n);
  std::vector<char> placed(n, 0);
  // Places weight op i after the weight ops it reads that are not placed yet.
  auto place = [&](auto&& self, size_t i) -> void {
    if (placed[i]) return;
    placed[i] = 1;
    for (size_t k = g.input_start[i]; k < g.input_start[i + 1]; ++k) {
      if (const size_t m = g.input_maker[k]; m != NameBindings::kNoMaker) self(self, m);
    }
    order.push_back(i);
  };
  for (size_t p = 0; p < n; ++p) {
    for (size_t i : before[p]) place(place, i);
    if (!placed[p]) {
      placed[p] = 1;  // Everything it reads was placed before it already.
      order.push_back(p);
    }
  }
  return order;
}

}  // namespace

std::vector<size_t> PrefetchOrder(const ProgramSpec& manual, int distance) {
  const OpGraph g = GraphOf(manual);
  return PrefetchOrderOf(manual, g, FindWeightOps(manual, g), distance);
}

void PrefetchWeightCollectives(PartitionResult& partitioned, int groups, const OpNameIds* ids) {
  if (groups <= 0) return;
  const OpGraph g = GraphOf(partitioned.program, ids, partitioned.origin);
  const WeightOps w = FindWeightOps(partitioned.program, g);
  const int count = static_cast<int>(w.collectives.size());
  Reorder(partitioned, PrefetchOrderOf(partitioned.program, g, w, std::max(1, count / groups)));
}

}  // namespace shardsim::planner
