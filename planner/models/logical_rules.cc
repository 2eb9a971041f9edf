#include "planner/models/logical_rules.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim::planner {
namespace {

void CheckName(const std::string& name) {
  const std::vector<std::string>& names = LogicalRules::Names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown logical dimension '" + name + "' (known: " + known + ")");
  }
}

}  // namespace

LogicalRules::LogicalRules(std::map<std::string, std::vector<std::string>> rules,
                           const std::vector<MeshAxis>& axes)
    : rules_(std::move(rules)) {
  for (const auto& [name, mapped] : rules_) {
    CheckName(name);
    for (size_t i = 0; i < mapped.size(); ++i) {
      const bool on_mesh = std::any_of(axes.begin(), axes.end(),
                                       [&](const MeshAxis& a) { return a.name == mapped[i]; });
      if (!on_mesh) {
        throw std::invalid_argument("logical dimension '" + name + "' maps to mesh axis '" +
                                    mapped[i] + "', which the mesh does not have");
      }
      if (std::find(mapped.begin(), mapped.begin() + static_cast<std::ptrdiff_t>(i), mapped[i]) !=
          mapped.begin() + static_cast<std::ptrdiff_t>(i)) {
        throw std::invalid_argument("logical dimension '" + name + "' names mesh axis '" +
                                    mapped[i] + "' twice");
      }
    }
  }
}

const std::vector<std::string>& LogicalRules::Axes(const std::string& name) const {
  static const std::vector<std::string> kNone;
  CheckName(name);
  const auto it = rules_.find(name);
  return it == rules_.end() ? kNone : it->second;
}

PartitionSpec LogicalRules::Spec(const std::vector<std::string>& dims) const {
  PartitionSpec spec;
  std::vector<std::string> taken;
  for (const std::string& name : dims) {
    std::vector<std::string> axes;
    if (!name.empty()) {
      for (const std::string& a : Axes(name)) {
        if (std::find(taken.begin(), taken.end(), a) == taken.end()) axes.push_back(a);
      }
    }
    taken.insert(taken.end(), axes.begin(), axes.end());
    spec.dims.push_back(std::move(axes));
  }
  // Trailing replicated dimensions are left out, as P('fsdp') means P('fsdp', None).
  while (!spec.dims.empty() && spec.dims.back().empty()) spec.dims.pop_back();
  return spec;
}

const std::vector<std::string>& LogicalRules::Names() {
  static const std::vector<std::string> kNames = {"batch",  "length",   "embed",           "mlp",
                                                  "heads",  "kv_heads", "head_dim",        "vocab",
                                                  "expert", "layers",   "activation_embed"};
  return kNames;
}

int64_t NamedAxesSize(const std::vector<MeshAxis>& mesh, const std::vector<std::string>& names) {
  int64_t n = 1;
  for (const std::string& name : names) {
    for (const MeshAxis& a : mesh) n *= a.name == name ? a.size : 1;
  }
  return n;
}

}  // namespace shardsim::planner
