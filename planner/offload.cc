#include "planner/offload.h"

#include <algorithm>
#include <map>
#include <set>

#include "planner/grad.h"
#include "planner/name_bindings.h"

namespace shardsim::planner {

namespace {

// One of MaxText's checkpoint names and the most recompute a remat policy may do while keeping
// the value it names anyway (ApplyRemat): every policy keeps the layer's input, selective the
// matmul outputs, only none the attention's output.
struct Checkpoint {
  const char* name;
  RematPolicy kept_through;
};

// MaxText's decoder layer (layers/llama2.py, layers/attentions.py, layers/linears.py).
const std::vector<Checkpoint>& Checkpoints() {
  static const std::vector<Checkpoint> checkpoints = {
      {"decoder_layer_input", RematPolicy::kFull},  // The layer's input (the residual stream).
      {"query_proj", RematPolicy::kSelective},      // q = norm(x) Wq.
      {"key_proj", RematPolicy::kSelective},        // k = norm(x) Wk.
      {"value_proj", RematPolicy::kSelective},      // v = norm(x) Wv.
      // The attention's output (its lse, flash-internal, is not a value).
      {"context", RematPolicy::kNone},
      // The attention output's projection, before the residual add.
      {"out_proj", RematPolicy::kSelective},
      {"mlpwi_0", RematPolicy::kSelective},  // The MLP's gate (SwiGLU) or input projection.
      {"mlpwi_1", RematPolicy::kSelective},  // The MLP's up projection (SwiGLU).
      {"mlpwo", RematPolicy::kSelective},    // The MLP's output projection.
  };
  return checkpoints;
}

}  // namespace

const std::vector<std::string>& CheckpointNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Checkpoint& c : Checkpoints()) out.push_back(c.name);
    return out;
  }();
  return names;
}

bool RematKeeps(RematPolicy policy, const std::string& name, const std::vector<std::string>& save) {
  if (policy == RematPolicy::kCustom && std::find(save.begin(), save.end(), name) != save.end()) {
    return true;
  }
  for (const Checkpoint& c : Checkpoints()) {
    if (c.name == name) return RematRank(policy) <= RematRank(c.kept_through);
  }
  return false;
}

void ApplyOffload(ProgramSpec& expanded, std::vector<size_t>& pass_starts,
                  const std::vector<std::vector<std::string>>& offloaded) {
  const std::vector<OpSpec>& ops = expanded.ops;
  const size_t n = ops.size();
  const std::vector<int> pass_of = PassOfOps(n, pass_starts);  // -1: no pass.
  const NameBindings bindings = BindingsOf(expanded);
  // Per value offloaded: its segment and its first backward reader.
  std::map<std::string, int> segment_of;
  for (size_t s = 0; s < offloaded.size(); ++s) {
    for (const std::string& v : offloaded[s]) {
      const NameBindings::Binding* binding = bindings.Find(v);
      if (binding && binding->count == 1 && binding->maker != NameBindings::kNoMaker &&
          pass_of[binding->maker] < 0) {
        segment_of[v] = static_cast<int>(s);
      }
    }
  }
  std::map<std::string, size_t> first_read;
  for (size_t i = 0; i < n; ++i) {
    if (pass_of[i] < 0) continue;
    for (const std::string& in : ops[i].in) {
      if (segment_of.count(in)) first_read.emplace(in, i);
    }
  }
  // Per segment: its first backward read of any offloaded value.
  std::map<int, size_t> segment_first;
  for (const auto& [v, at] : first_read) {
    const int s = segment_of.at(v);
    const auto it = segment_first.find(s);
    if (it == segment_first.end() || at < it->second) segment_first[s] = at;
  }
  // A segment's fetch goes where the segment read just before it in the same pass starts;
  // the first segment a pass reads fetches as the pass starts (XLA issues its copy-starts
  // there), not at its own first read, where its backward would wait for the copy.
  std::vector<size_t> starts;
  for (const auto& [s, at] : segment_first) starts.push_back(at);
  std::sort(starts.begin(), starts.end());
  auto fetch_at = [&](int s) {
    const size_t own = segment_first.at(s);
    const auto it = std::lower_bound(starts.begin(), starts.end(), own);
    if (it != starts.begin() && pass_of[*(it - 1)] == pass_of[own]) return *(it - 1);
    return pass_starts[2 * static_cast<size_t>(pass_of[own])];
  };
  std::map<size_t, std::vector<std::string>> put_after;   // Maker -> values to copy out.
  std::map<size_t, std::vector<std::string>> put_before;  // Op -> values to copy back first.
  // Each value's host copy and fetched copy: v + "_host" and v + "_dev", or with a number
  // after them where the program binds that name already.
  std::map<std::string, std::pair<std::string, std::string>> copies;
  std::set<std::string> taken;
  auto fresh = [&](const std::string& base) {
    std::string name = base;
    for (int k = 2; bindings.Find(name) || taken.count(name); ++k) {
      name = base + "_" + std::to_string(k);
    }
    taken.insert(name);
    return name;
  };
  for (const auto& [v, at] : first_read) {
    put_after[bindings.Maker(v)].push_back(v);
    put_before[fetch_at(segment_of.at(v))].push_back(v);
    copies[v] = {fresh(v + "_host"), fresh(v + "_dev")};
  }
  auto move = [](OpKind kind, const std::string& in, const std::string& out) {
    OpSpec op;
    op.kind = kind;
    op.in = {in};
    op.out = {out};
    op.name = out;
    return op;
  };
  std::vector<OpSpec> out;
  out.reserve(n + 2 * first_read.size());
  std::vector<size_t> block_start(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    block_start[i] = out.size();
    if (const auto it = put_before.find(i); it != put_before.end()) {
      for (const std::string& v : it->second) {
        out.push_back(move(OpKind::kMoveToDevice, copies.at(v).first, copies.at(v).second));
      }
    }
    if (i == n) break;
    OpSpec op = ops[i];
    if (pass_of[i] >= 0) {
      for (std::string& in : op.in) {
        if (const auto c = copies.find(in); c != copies.end()) in = c->second.second;
      }
    }
    out.push_back(std::move(op));
    if (const auto it = put_after.find(i); it != put_after.end()) {
      for (const std::string& v : it->second) {
        out.push_back(move(OpKind::kMoveToHost, v, copies.at(v).first));
      }
    }
  }
  for (size_t& at : pass_starts) at = block_start[std::min(at, n)];
  expanded.ops = std::move(out);
}

}  // namespace shardsim::planner
