#include "sim/cli/plan_search_file.h"

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "planner/models/logical_rules.h"
#include "sim/cli/model_run_file.h"
#include "sim/cli/run_file.h"
#include "sim/cli/yaml_reader.h"
#include "sim/closest_name.h"

namespace shardsim {
namespace {

// Entries of a value that may be one item or a list of them.
std::vector<YamlValue> OneOrList(const YamlValue& value) {
  if (value.IsList()) {
    std::vector<YamlValue> list = value.List();
    if (list.empty()) value.Fail("give at least one candidate");
    return list;
  }
  return {value};
}

// A search's `plan.algorithms`: each kind's algorithm or a list of candidates; every
// combination, in the order given (the first kind varying slowest).
std::vector<std::map<std::string, std::string>> ReadPlanAlgorithmSets(const YamlValue& value) {
  // Each set is a family of candidates simulated in full: a few hundred is already hours.
  constexpr size_t kMaxSets = 256;
  std::vector<std::map<std::string, std::string>> sets = {{}};
  YamlMap algorithms = value.Map(AlgorithmKeys());
  size_t combinations = 1;
  for (const auto& [op, names] : algorithms.entries()) {
    combinations *= std::max<size_t>(OneOrList(names).size(), 1);
    if (combinations > kMaxSets) {
      value.Fail("the algorithm lists make more than " + std::to_string(kMaxSets) +
                 " combinations, each a family of plans: give fewer candidates");
    }
  }
  for (const auto& [op, names] : algorithms.entries()) {
    std::vector<std::string> choices;
    for (const YamlValue& v : OneOrList(names)) {
      const std::string name = ReadAlgorithm(v);
      if (std::find(choices.begin(), choices.end(), name) != choices.end()) {
        v.Fail("'" + name + "' is named twice");
      }
      choices.push_back(name);
    }
    // Every set so far with each choice: the first key varies slowest.
    std::vector<std::map<std::string, std::string>> more;
    for (const std::map<std::string, std::string>& set : sets) {
      for (const std::string& name : choices) {
        more.push_back(set);
        more.back()[op] = name;
      }
    }
    sets = std::move(more);
  }
  return sets;
}

// `plan.pipeline` in a search file: {axis, schedule, virtual_stages, first_stage_layers,
// last_stage_layers}, schedule and virtual_stages one or a list; every combination that can
// run (virtual stages above one need the interleaved schedule), in the order written.
std::vector<planner::PipelinePlan> ReadPipelines(const YamlValue& value,
                                                 const std::vector<MeshAxis>& axes) {
  YamlMap map =
      value.Map({"axis", "schedule", "virtual_stages", "first_stage_layers", "last_stage_layers"});
  planner::PipelinePlan base;
  ReadStageLayers(map, base);
  if (auto axis = map.Find("axis")) {
    base.axis = axis->String();
    bool known = false;
    for (const MeshAxis& a : axes) known = known || a.name == base.axis;
    if (!known) axis->Fail("'" + base.axis + "' is not a mesh axis of the search");
  }
  std::vector<planner::PipelineSchedule> schedules = {base.schedule};
  if (auto s = map.Find("schedule")) {
    schedules.clear();
    for (const YamlValue& v : OneOrList(*s)) schedules.push_back(ReadPipelineSchedule(v));
  }
  std::vector<int> virtual_stages = {1};
  if (auto vs = map.Find("virtual_stages")) {
    virtual_stages.clear();
    for (const YamlValue& v : OneOrList(*vs)) virtual_stages.push_back(v.Int(1));
  }
  std::vector<planner::PipelinePlan> out;
  for (planner::PipelineSchedule schedule : schedules) {
    for (int v : virtual_stages) {
      if (v > 1 && schedule != planner::PipelineSchedule::kInterleaved) continue;
      planner::PipelinePlan plan = base;
      plan.schedule = schedule;
      plan.virtual_stages = v;
      out.push_back(plan);
    }
  }
  if (out.empty()) {
    value.Fail(
        "no schedule and virtual_stages pair can run (virtual_stages > 1 needs "
        "schedule: interleaved)");
  }
  return out;
}

}  // namespace

PlanSearchSpec ReadPlanSearch(const YamlMap& top) {
  PlanSearchSpec spec;
  const YamlValue model = top.Get("model");
  if (IsMlp(model)) model.Fail("plan search builds transformer steps (kind: mlp is run only)");
  std::tie(spec.name, spec.model) = ReadModel(model);
  std::optional<YamlValue> train = top.Find("train");
  std::optional<YamlValue> serve = top.Find("serve");
  if (train && serve) serve->FailAtKey("give either train: or serve:, not both");
  if (!train && !serve) {
    top.self().FailChild("train",
                         "missing required key 'train' (or serve:, to search serving plans)");
  }
  planner::SearchSpace& space = spec.space;
  if (serve) {
    space.serve = ReadServe(*serve);
    space.objective = planner::SearchObjective::kTokensPerSPerDevice;
  } else {
    spec.train = ReadTrain(*train, true);
  }
  space.microbatches = {spec.train.microbatches};

  std::optional<YamlMap> search;
  if (auto s = top.Find("search")) {
    search = s->Map({"axes", "axis_orders", "torus_orders", "remat", "offload", "microbatches",
                     "collective_matmul", "sequence_parallel", "activation_embed", "objective",
                     "memory_limit"});
  }
  std::optional<YamlMap> plan;
  if (auto p = top.Find("plan")) {
    plan = p->Map({"mesh", "rules", "remat", "offload", "pipeline", "collective_matmul",
                   "algorithms", "devices", "torus_order", "microbatches"});
    if (auto d = plan->Find("devices")) {
      d->FailAtKey("devices: a search places each mesh by default (give plan.mesh alone)");
    }
    if (auto m = plan->Find("microbatches")) {
      m->FailAtKey("microbatches: give them in search: (search: {microbatches: [1, 2, 4]})");
    }
  }
  // The mesh: sizes searched over search.axes, or candidates from plan.mesh.
  std::optional<YamlValue> axes = search ? search->Find("axes") : std::nullopt;
  std::optional<YamlValue> meshes = plan ? plan->Find("mesh") : std::nullopt;
  if (axes && meshes) {
    meshes->FailAtKey("give search.axes (the search sizes them) or plan.mesh, not both");
  }
  if (!axes && !meshes) {
    (search ? search->self() : top.self())
        .FailChild(search ? "axes" : "search",
                   "missing the mesh axes to search: give search: {axes: [data, fsdp, tensor]} "
                   "(or plan.mesh)");
  }
  std::vector<MeshAxis> all_axes;  // Every axis a candidate mesh may have, for the rules.
  if (axes) {
    for (const YamlValue& a : axes->List()) {
      const std::string name = a.String();
      if (std::count(space.axes.begin(), space.axes.end(), name)) {
        a.Fail("mesh axis '" + name + "' is named twice");
      }
      if (name == "expert" && spec.model.experts == 0) {
        a.Fail("expert: the model has no experts (give model: {..., experts: E})");
      }
      space.axes.push_back(name);
      all_axes.push_back({name, 1});
    }
    if (space.axes.empty()) axes->Fail("give at least one mesh axis");
  } else {
    for (const YamlValue& m : OneOrList(*meshes)) {
      space.meshes.push_back(ReadMeshAxes(m));
      for (const MeshAxis& a : space.meshes.back()) {
        bool seen = false;
        for (const MeshAxis& b : all_axes) seen = seen || a.name == b.name;
        if (!seen) all_axes.push_back({a.name, 1});
      }
    }
  }
  if (plan) {
    if (auto t = plan->Find("torus_order")) space.torus_order = ReadTorusOrder(*t);
    if (auto r = plan->Find("rules")) {
      for (const YamlValue& rules : OneOrList(*r)) {
        space.rules.push_back(ReadRules(rules, all_axes));
      }
    }
    if (auto r = plan->Find("remat")) {
      space.remat.clear();
      if (r->IsMap()) {
        // One custom policy, pinned.
        space.remat = {planner::RematPolicy::kCustom};
        space.remat_save = ReadOffload(r->Map({"save"}).Get("save"));
      } else {
        for (const YamlValue& v : OneOrList(*r)) space.remat.push_back(ReadRemat(v));
      }
    }
    if (auto o = plan->Find("offload")) {
      space.offload = {ReadOffload(*o)};
      RefuseSavedAndOffloaded(space.remat_save, space.offload.front(), *o);
      if (!space.offload.front().empty()) spec.offload_key = "plan.offload";
    }
    if (auto p = plan->Find("pipeline")) space.pipelines = ReadPipelines(*p, all_axes);
    if (auto c = plan->Find("collective_matmul")) {
      space.collective_matmul.clear();
      for (const YamlValue& v : OneOrList(*c)) {
        space.collective_matmul.push_back(ReadCollectiveMatmul(v));
      }
    }
    if (auto a = plan->Find("algorithms")) space.algorithms = ReadPlanAlgorithmSets(*a);
  }
  if (space.rules.empty()) {
    // Default rules come from the axes' roles: every axis needs one.
    for (const MeshAxis& a : all_axes) {
      if (planner::AxisRoles().count(a.name)) continue;
      std::vector<std::string> known;
      for (const auto& [name, dims] : planner::AxisRoles()) known.push_back(name);
      (axes ? *axes : *meshes)
          .Fail("mesh axis '" + a.name + "' has no default role (" + JoinNames(known) +
                " have one): give plan.rules");
    }
  }
  if (search) {
    if (auto r = search->Find("remat")) {
      if (plan && plan->Has("remat")) r->FailAtKey("give search.remat or plan.remat, not both");
      space.remat.clear();
      for (const YamlValue& v : r->List()) space.remat.push_back(ReadRemat(v));
      if (space.remat.empty()) r->Fail("give at least one remat policy");
    }
    if (auto o = search->Find("offload")) {
      if (plan && plan->Has("offload")) {
        o->FailAtKey("give search.offload or plan.offload, not both");
      }
      space.offload.clear();
      for (const YamlValue& set : o->List()) {
        space.offload.push_back(ReadOffload(set));
        RefuseSavedAndOffloaded(space.remat_save, space.offload.back(), set);
        if (!space.offload.back().empty()) spec.offload_key = "search.offload";
      }
      if (space.offload.empty()) {
        o->Fail("give at least one set of names to offload ([] for none)");
      }
    }
    if (auto m = search->Find("microbatches")) {
      if (spec.train.microbatches != 1) {
        m->FailAtKey("give search.microbatches or train.microbatches, not both");
      }
      space.microbatches.clear();
      for (const YamlValue& v : m->List()) space.microbatches.push_back(v.Int64(1));
      if (space.microbatches.empty()) m->Fail("give at least one microbatch count");
    }
    if (auto c = search->Find("collective_matmul")) {
      if (plan && plan->Has("collective_matmul")) {
        c->FailAtKey("give search.collective_matmul or plan.collective_matmul, not both");
      }
      space.collective_matmul.clear();
      for (const YamlValue& v : OneOrList(*c)) {
        space.collective_matmul.push_back(ReadCollectiveMatmul(v));
      }
    }
    if (auto sp = search->Find("sequence_parallel")) {
      space.sequence_parallel.clear();
      for (const YamlValue& v : OneOrList(*sp)) {
        space.sequence_parallel.push_back(v.OneOf({"off", "on"}) == "on");
      }
    }
    if (auto ae = search->Find("activation_embed")) {
      space.activation_embed.clear();
      for (const YamlValue& v : OneOrList(*ae)) {
        space.activation_embed.push_back(v.OneOf({"off", "on"}) == "on");
      }
    }
    if (auto o = search->Find("objective")) {
      constexpr planner::SearchObjective kAll[] = {
          planner::SearchObjective::kStepTime, planner::SearchObjective::kTokensPerSPerDevice,
          planner::SearchObjective::kTtft, planner::SearchObjective::kTpot};
      std::vector<std::string> names;
      for (planner::SearchObjective k : kAll) names.push_back(planner::SearchObjectiveName(k));
      const std::string name = o->OneOf(names);
      for (planner::SearchObjective k : kAll) {
        if (name == planner::SearchObjectiveName(k)) space.objective = k;
      }
      const bool serving_only = space.objective == planner::SearchObjective::kTtft ||
                                space.objective == planner::SearchObjective::kTpot;
      if (serving_only && !space.serve) {
        o->Fail("objective: " + name + " ranks serving plans (give serve: instead of train:)");
      }
    }
    if (auto o = search->Find("axis_orders")) {
      space.all_axis_orders = o->OneOf({"given", "all"}) == "all";
    }
    if (auto o = search->Find("torus_orders")) {
      space.all_torus_orders = o->OneOf({"default", "all"}) == "all";
      if (space.all_torus_orders && plan && plan->Has("torus_order")) {
        o->FailAtKey("give search.torus_orders or plan.torus_order, not both");
      }
    }
    if (auto l = search->Find("memory_limit")) {
      space.memory_limit = l->Number();
      if (!(space.memory_limit > 0 && space.memory_limit <= 1)) {
        l->Fail("memory_limit is a fraction of HBM in (0, 1]");
      }
    }
  }
  if (space.serve) {
    // Serving steps have no backward pass to recompute for and no gradient accumulation.
    for (const auto& [section, key] :
         std::vector<std::pair<const std::optional<YamlMap>*, const char*>>{
             {&plan, "remat"},
             {&search, "remat"},
             {&plan, "offload"},
             {&search, "offload"},
             {&search, "microbatches"},
             {&plan, "pipeline"},
             {&plan, "collective_matmul"},
             {&search, "collective_matmul"},
             {&search, "sequence_parallel"},
             {&search, "activation_embed"}}) {
      if (*section) {
        if (auto v = (*section)->Find(key)) {
          v->FailAtKey(std::string(key) + ": applies to training steps, not to serve:");
        }
      }
    }
  }
  return spec;
}

}  // namespace shardsim
