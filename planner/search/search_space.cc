#include "planner/search/search_space.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "planner/models/logical_rules.h"
#include "planner/models/pipeline_step_run.h"
#include "sim/spec_error.h"

namespace shardsim::planner {

const char* SearchObjectiveName(SearchObjective objective) {
  switch (objective) {
    case SearchObjective::kStepTime:
      return "step_time";
    case SearchObjective::kTokensPerSPerDevice:
      return "tokens_per_s_per_device";
    case SearchObjective::kTtft:
      return "ttft";
    case SearchObjective::kTpot:
      return "tpot";
  }
  return "?";
}

std::string CandidateKey(const PlanCandidate& candidate) {
  const StepPlan& plan = candidate.plan;
  std::string key = "mesh ";
  for (size_t a = 0; a < plan.mesh.size(); ++a) {
    key += (a ? "," : "") + plan.mesh[a].name + "=" + std::to_string(plan.mesh[a].size);
  }
  key += "; rules ";
  bool first = true;
  for (const auto& [name, axes] : plan.rules) {
    if (axes.empty()) continue;
    key += (first ? "" : " ") + name + "=";
    first = false;
    for (size_t i = 0; i < axes.size(); ++i) key += (i ? "+" : "") + axes[i];
  }
  key += std::string("; remat ") + RematPolicyName(plan.remat);
  if (plan.remat == RematPolicy::kCustom) {
    key += " save";
    for (size_t i = 0; i < plan.remat_save.size(); ++i) key += (i ? "+" : " ") + plan.remat_save[i];
  }
  if (!plan.offload.empty()) {
    key += "; offload ";
    for (size_t i = 0; i < plan.offload.size(); ++i) key += (i ? "+" : "") + plan.offload[i];
  }
  if (!plan.torus_order.empty()) {
    key += "; torus_order";
    for (int d : plan.torus_order) key += " " + std::to_string(d);
  }
  key += "; microbatches " + std::to_string(candidate.microbatches);
  if (plan.pipeline) {
    key += "; pipeline " + plan.pipeline->axis + " " +
           std::string(PipelineScheduleName(plan.pipeline->schedule)) + " v" +
           std::to_string(plan.pipeline->virtual_stages);
    if (plan.pipeline->first_stage_layers > 0 || plan.pipeline->last_stage_layers > 0) {
      key += " layers " + std::to_string(plan.pipeline->first_stage_layers) + "/" +
             std::to_string(plan.pipeline->last_stage_layers);
    }
  }
  if (plan.collective_matmul != CollectiveMatmulMode::kOff) {
    key += std::string("; collective_matmul ") + CollectiveMatmulModeName(plan.collective_matmul);
  }
  for (const auto& [op, algorithm] : plan.algorithms) key += "; " + op + "=" + algorithm;
  return key;
}

const std::map<std::string, std::vector<std::string>>& AxisRoles() {
  static const std::map<std::string, std::vector<std::string>> roles = {
      {"data", {"batch"}},
      {"fsdp", {"batch", "embed"}},
      {"tensor", {"heads", "kv_heads", "mlp", "vocab"}},
      {"stage", {"layers"}},
      {"expert", {"batch", "expert"}},
  };
  return roles;
}

std::map<std::string, std::vector<std::string>> DefaultRules(const std::vector<MeshAxis>& mesh) {
  std::map<std::string, std::vector<std::string>> rules;
  for (const MeshAxis& axis : mesh) {
    const auto role = AxisRoles().find(axis.name);
    if (role == AxisRoles().end()) {
      throw std::invalid_argument("mesh axis '" + axis.name +
                                  "' has no default role (give plan.rules)");
    }
    for (const std::string& dim : role->second) rules[dim].push_back(axis.name);
  }
  return rules;
}

std::vector<std::vector<MeshAxis>> AxisOrders(const std::vector<MeshAxis>& mesh) {
  std::vector<size_t> order(mesh.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<std::vector<MeshAxis>> out;
  do {
    std::vector<MeshAxis>& m = out.emplace_back();
    for (size_t i : order) m.push_back(mesh[i]);
  } while (std::next_permutation(order.begin(), order.end()));
  return out;
}

std::vector<std::vector<MeshAxis>> FactorMeshes(int64_t devices,
                                                const std::vector<std::string>& axes) {
  std::vector<std::vector<MeshAxis>> meshes;
  if (axes.empty()) return meshes;
  std::vector<int64_t> sizes(axes.size(), 1);
  // Depth-first over the axes: each takes a divisor of what the earlier ones left; the last
  // takes the rest.
  std::function<void(size_t, int64_t)> visit = [&](size_t a, int64_t left) {
    if (a + 1 == axes.size()) {
      sizes[a] = left;
      std::vector<MeshAxis> mesh;
      for (size_t i = 0; i < axes.size(); ++i) {
        if (sizes[i] > 1) mesh.push_back({axes[i], static_cast<int>(sizes[i])});
      }
      meshes.push_back(std::move(mesh));
      return;
    }
    for (int64_t d = 1; d <= left; ++d) {
      if (left % d != 0) continue;
      sizes[a] = d;
      visit(a + 1, left / d);
    }
  };
  visit(0, devices);
  return meshes;
}

namespace {

// "dim (size) over axis=n x axis=m".
std::string Over(const std::string& dim, int64_t size, const std::vector<MeshAxis>& mesh,
                 const std::vector<std::string>& axes) {
  std::string text = dim + " (" + std::to_string(size) + ") over ";
  for (size_t i = 0; i < axes.size(); ++i) {
    text += (i ? "x" : "") + axes[i] + "=" + std::to_string(NamedAxesSize(mesh, {axes[i]}));
  }
  return text;
}

}  // namespace

std::optional<std::string> Indivisible(const TransformerConfig& model, const TrainConfig& train,
                                       const PlanCandidate& candidate) {
  const StepPlan& plan = candidate.plan;
  const int64_t m = candidate.microbatches;
  if (m < 1 || train.batch % m != 0) {
    return "microbatches (" + std::to_string(m) + ") do not divide the batch (" +
           std::to_string(train.batch) + ")";
  }
  int64_t stages = 1;
  if (plan.pipeline) stages = NamedAxesSize(plan.mesh, {plan.pipeline->axis});
  // Sizes of the logical dimensions the step's arrays carry (a microbatch's batch).
  int64_t batch = train.batch / m;
  if (plan.pipeline) {
    // The data-parallel replicas split the batch before the microbatches do (every stage
    // runs each microbatch); the batch rule's axes are the replicas.
    batch = train.batch;
  }
  std::multimap<std::string, int64_t> sizes = {
      {"batch", batch},       {"length", train.seq_len},    {"embed", model.d_model},
      {"heads", model.heads}, {"kv_heads", model.kv_heads}, {"head_dim", model.head_dim},
      {"vocab", model.vocab},
  };
  // The MLP widths the layers have: dense layers' d_ff, the experts' and the shared experts'.
  if (model.experts == 0 || model.dense_layers > 0) sizes.insert({"mlp", model.d_ff});
  if (model.experts > 0) {
    sizes.insert({"expert", model.experts});
    sizes.insert({"mlp", ExpertDff(model)});
    if (model.shared_experts > 0) sizes.insert({"mlp", model.shared_experts * ExpertDff(model)});
  }
  for (const auto& [dim, axes] : plan.rules) {
    if (axes.empty()) continue;
    const int64_t n = NamedAxesSize(plan.mesh, axes);
    const auto [begin, end] = sizes.equal_range(dim);
    for (auto size = begin; size != end; ++size) {
      if (size->second % n != 0)
        return Over(dim, size->second, plan.mesh, axes) + " does not divide";
    }
  }
  if (plan.pipeline) {
    const int64_t chunks = stages * plan.pipeline->virtual_stages;
    if (model.layers < chunks) {
      return "the " + std::to_string(model.layers) + " layers do not fill " +
             std::to_string(stages) + " stages x " + std::to_string(plan.pipeline->virtual_stages) +
             " virtual stages";
    }
    try {
      PipelineChunkLayers(model.layers, static_cast<int>(stages), *plan.pipeline);
    } catch (const SpecError& e) {
      return e.what();
    }
    if (plan.pipeline->schedule == PipelineSchedule::kInterleaved && m % stages != 0) {
      return "the interleaved schedule's " + std::to_string(m) +
             " microbatches are not a multiple of the " + std::to_string(stages) + " stages";
    }
    int64_t replicas = 1;
    if (const auto b = plan.rules.find("batch"); b != plan.rules.end()) {
      for (const std::string& a : b->second) {
        if (a != plan.pipeline->axis) replicas *= NamedAxesSize(plan.mesh, {a});
      }
    }
    if (train.batch % (m * replicas) != 0) {
      return "the batch (" + std::to_string(train.batch) + ") does not split into " +
             std::to_string(m) + " microbatches on " + std::to_string(replicas) + " replicas";
    }
  }
  return std::nullopt;
}

}  // namespace shardsim::planner
