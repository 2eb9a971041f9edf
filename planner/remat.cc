#include "planner/remat.h"

#include <algorithm>
#include <map>
#include <set>

#include "planner/grad.h"
#include "planner/name_bindings.h"

namespace shardsim::planner {

const char* RematPolicyName(RematPolicy policy) {
  switch (policy) {
    case RematPolicy::kNone:
      return "none";
    case RematPolicy::kSelective:
      return "selective";
    case RematPolicy::kFull:
      return "full";
    case RematPolicy::kCustom:
      return "custom";
  }
  return "none";
}

int RematRank(RematPolicy policy) {
  switch (policy) {
    case RematPolicy::kNone:
      return 0;
    case RematPolicy::kSelective:
      return 1;
    case RematPolicy::kFull:
    case RematPolicy::kCustom:
      return 2;
  }
  return 0;
}

std::string RematText(RematPolicy policy, const std::vector<std::string>& save) {
  std::string text = RematPolicyName(policy);
  if (policy != RematPolicy::kCustom) return text;
  text += " (save";
  for (size_t i = 0; i < save.size(); ++i) text += (i == 0 ? " " : ", ") + save[i];
  return text + (save.empty() ? " the layer input only)" : ")");
}

bool IsRecompute(const std::string& name) {
  const std::string suffix = kRematSuffix;
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void ApplyRemat(ProgramSpec& expanded, std::vector<size_t>& pass_starts,
                const std::vector<std::vector<std::string>>& segments, RematPolicy policy,
                const std::set<std::string>& saved) {
  if (policy == RematPolicy::kNone || segments.empty()) return;
  const std::vector<OpSpec>& ops = expanded.ops;
  const size_t n = ops.size();
  const std::vector<int> pass_of = PassOfOps(n, pass_starts);  // -1: no pass.
  const NameBindings bindings = BindingsOf(expanded);
  auto maker = [&](const std::string& v) { return bindings.Maker(v); };
  // Each segment value's segment (forward values bound once only).
  std::map<std::string, int> segment_of;
  for (size_t s = 0; s < segments.size(); ++s) {
    for (const std::string& v : segments[s]) {
      const NameBindings::Binding* binding = bindings.Find(v);
      if (binding && binding->count == 1 && binding->maker != NameBindings::kNoMaker &&
          pass_of[binding->maker] < 0) {
        segment_of[v] = static_cast<int>(s);
      }
    }
  }
  // An op's other outputs belong to its first's segment: those grad added to a shard_map
  // region (the residuals its backward region reads) are recomputed with it.
  for (size_t i = 0; i < n; ++i) {
    if (pass_of[i] >= 0 || ops[i].out.size() < 2) continue;
    const auto it = segment_of.find(ops[i].out[0]);
    if (it == segment_of.end()) continue;
    const int s = it->second;
    for (const std::string& v : ops[i].out) {
      if (bindings.Once(v)) segment_of.emplace(v, s);
    }
  }
  // Kept: the policy keeps it, or a forward op outside its segment reads it.
  std::set<std::string> kept;
  for (const auto& [v, s] : segment_of) {
    if (saved.count(v)) kept.insert(v);
    const OpKind kind = ops[maker(v)].kind;
    if (policy == RematPolicy::kSelective && (kind == OpKind::kEinsum || kind == OpKind::kMatmul)) {
      kept.insert(v);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (pass_of[i] >= 0) continue;
    int own = -1;
    if (!ops[i].out.empty()) {
      const auto it = segment_of.find(ops[i].out[0]);
      if (it != segment_of.end()) own = it->second;
    }
    for (const std::string& in : ops[i].in) {
      const auto it = segment_of.find(in);
      if (it != segment_of.end() && it->second != own) kept.insert(in);
    }
  }
  auto recomputed = [&](const std::string& v) { return segment_of.count(v) && !kept.count(v); };
  // Per pass and segment: where its recompute goes and the makers it repeats.
  std::map<size_t, std::vector<size_t>> insert_before;  // Op index -> makers to repeat.
  for (size_t k = 0; k + 1 < pass_starts.size(); k += 2) {
    std::map<int, size_t> first_read;        // Segment -> first reader in this pass.
    std::map<int, std::set<size_t>> makers;  // Segment -> makers to repeat.
    for (size_t i = pass_starts[k]; i < pass_starts[k + 1] && i < n; ++i) {
      for (const std::string& in : ops[i].in) {
        if (!recomputed(in)) continue;
        const int s = segment_of.at(in);
        first_read.emplace(s, i);
        // The maker, and the makers of what it reads that is recomputed too.
        std::vector<size_t> to_visit = {maker(in)};
        while (!to_visit.empty()) {
          const size_t m = to_visit.back();
          to_visit.pop_back();
          if (!makers[s].insert(m).second) continue;
          for (const std::string& x : ops[m].in) {
            if (recomputed(x)) to_visit.push_back(maker(x));
          }
        }
      }
    }
    for (const auto& [s, at] : first_read) {
      std::vector<size_t>& list = insert_before[at];
      list.insert(list.end(), makers[s].begin(), makers[s].end());  // Forward order.
    }
  }
  auto rename = [&](std::vector<std::string>& names) {
    for (std::string& x : names) {
      if (recomputed(x)) x += kRematSuffix;
    }
  };
  std::vector<OpSpec> out;
  out.reserve(n);
  std::vector<size_t> block_start(n + 1);  // Where op i's recompute (or op i) now starts.
  for (size_t i = 0; i <= n; ++i) {
    block_start[i] = out.size();
    if (const auto it = insert_before.find(i); it != insert_before.end()) {
      for (size_t m : it->second) {
        OpSpec clone = ops[m];
        rename(clone.in);
        for (std::string& x : clone.out) x += kRematSuffix;
        clone.name = (clone.name.empty() ? ops[m].out[0] : clone.name) + kRematSuffix;
        out.push_back(std::move(clone));
      }
    }
    if (i == n) break;
    OpSpec op = ops[i];
    if (pass_of[i] >= 0) rename(op.in);
    out.push_back(std::move(op));
  }
  // A pass starts with the recompute before its first op; it ends where the op after it now
  // starts.
  for (size_t& at : pass_starts) at = block_start[std::min(at, n)];
  expanded.ops = std::move(out);
}

}  // namespace shardsim::planner
