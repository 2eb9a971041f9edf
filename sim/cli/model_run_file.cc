#include "sim/cli/model_run_file.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "collectives/algorithm.h"
#include "collectives/dtype.h"
#include "collectives/placement.h"
#include "planner/models/logical_rules.h"
#include "planner/models/model_presets.h"
#include "planner/offload.h"
#include "sim/cli/run_file.h"
#include "sim/cli/yaml_reader.h"
#include "sim/closest_name.h"

namespace shardsim {
namespace {

using planner::MlpKind;
using planner::NormKind;
using planner::Optimizer;
using planner::TransformerConfig;

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const planner::ModelPreset& p : planner::ModelPresets()) names.push_back(p.name);
  return names;
}

// A preset by name, failing at `at` with the list (or a did-you-mean) otherwise.
const TransformerConfig& Preset(const YamlValue& at, const std::string& name) {
  if (const planner::ModelPreset* p = planner::FindModelPreset(name)) return p->config;
  const std::string suggestion = SuggestKey(name, PresetNames());
  at.Fail("unknown model preset '" + name + "'" +
          (suggestion.empty() ? " (presets: " + JoinNames(PresetNames()) + ")"
                              : "; did you mean '" + suggestion + "'?"));
}

}  // namespace

// `model:` a preset name, or a map: `kind: transformer` with its sizes, or `preset:` with
// some sizes overridden (e.g. {preset: llama-3-8b, layers: 2}).
std::pair<std::string, TransformerConfig> ReadModel(const YamlValue& value) {
  if (value.IsScalar()) {
    const std::string name = value.String();
    return {name, Preset(value, name)};
  }
  YamlMap map = value.Map({"kind",           "preset",
                           "layers",         "d_model",
                           "d_ff",           "heads",
                           "kv_heads",       "head_dim",
                           "vocab",          "mlp",
                           "norm",           "experts",
                           "top_k",          "capacity_factor",
                           "shared_experts", "expert_d_ff",
                           "dense_layers",   "router_aux_loss",
                           "attention",      "layer_sizes",
                           "activation",     "ragged_buffer_factor"});
  std::string name = "transformer";
  TransformerConfig m;
  if (auto preset = map.Find("preset")) {
    name = preset->String();
    m = Preset(*preset, name);
  } else {
    map.Get("kind").OneOf({"transformer", "mlp"});
    // A map without a preset gives every size but kv_heads and head_dim (derived below).
    for (const char* key : {"layers", "d_model", "d_ff", "heads", "vocab"}) map.Get(key);
  }
  if (auto k = map.Find("kind"); k && map.Has("preset")) {
    k->FailAtKey("give either preset: or kind:, not both");
  }
  for (const char* key : {"layer_sizes", "activation"}) {
    if (auto v = map.Find(key)) v->FailAtKey(std::string(key) + ": belongs to kind: mlp");
  }
  if (auto v = map.Find("layers")) m.layers = v->Int64(1);
  if (auto v = map.Find("d_model")) m.d_model = v->Int64(1);
  if (auto v = map.Find("d_ff")) m.d_ff = v->Int64(1);
  if (auto v = map.Find("heads")) m.heads = v->Int64(1);
  if (!map.Has("preset")) m.kv_heads = m.heads;  // No grouped-query attention unless given.
  if (auto v = map.Find("kv_heads")) m.kv_heads = v->Int64(1);
  if (!map.Has("preset") || map.Has("d_model") || map.Has("heads")) {
    if (m.d_model % m.heads != 0 && !map.Has("head_dim")) {
      map.self().FailChild("head_dim", "d_model (" + std::to_string(m.d_model) +
                                           ") is not a multiple of heads (" +
                                           std::to_string(m.heads) + "): give head_dim");
    }
    m.head_dim = m.d_model / m.heads;
  }
  if (auto v = map.Find("head_dim")) m.head_dim = v->Int64(1);
  if (m.heads % m.kv_heads != 0) {
    map.self().FailChild("kv_heads", "heads (" + std::to_string(m.heads) +
                                         ") must be a multiple of kv_heads (" +
                                         std::to_string(m.kv_heads) + ")");
  }
  if (auto v = map.Find("vocab")) m.vocab = v->Int64(1);
  if (auto v = map.Find("mlp")) {
    const std::string mlp = v->OneOf({"swiglu", "gelu", "relu"});
    m.mlp = mlp == "swiglu" ? MlpKind::kSwiGlu : mlp == "gelu" ? MlpKind::kGelu : MlpKind::kRelu;
  }
  if (auto v = map.Find("norm"))
    m.norm = v->OneOf({"rms", "layer"}) == "rms" ? NormKind::kRms : NormKind::kLayer;
  if (auto v = map.Find("experts")) m.experts = v->Int64(0);
  if (auto v = map.Find("top_k")) m.top_k = v->Int64(1);
  if (auto v = map.Find("capacity_factor")) {
    m.capacity_factor = v->Number();
    if (!std::isfinite(m.capacity_factor)) {
      v->Fail("capacity_factor must be a number: > 0 (a capacity) or -1 (dropless, MaxText's)");
    }
  }
  if (auto v = map.Find("ragged_buffer_factor")) {
    m.ragged_buffer_factor = v->Number();
    if (!std::isfinite(m.ragged_buffer_factor)) {
      v->Fail(
          "ragged_buffer_factor must be a number: > 0 (a bounded buffer) or -1 (the worst "
          "case, MaxText's default)");
    }
    if (m.ragged_buffer_factor > 0 && m.capacity_factor > 0) {
      v->Fail(
          "ragged_buffer_factor bounds dropless routing's buffers: give capacity_factor: -1 "
          "too");
    }
  }
  if (auto v = map.Find("shared_experts")) m.shared_experts = v->Int64(0);
  if (auto v = map.Find("expert_d_ff")) m.expert_d_ff = v->Int64(1);
  if (auto v = map.Find("dense_layers")) m.dense_layers = v->Int64(0);
  if (auto v = map.Find("attention")) {
    m.attention = v->OneOf({"flash", "unfused", "mmha"});
  }
  if (auto v = map.Find("router_aux_loss")) {
    m.router_aux_loss = v->Number();
    if (!(m.router_aux_loss >= 0 && std::isfinite(m.router_aux_loss))) {
      v->Fail("router_aux_loss must be a finite number >= 0");
    }
    if (m.experts == 0 && m.router_aux_loss > 0) {
      v->Fail("router_aux_loss balances the experts' routers: give experts too");
    }
  }
  if (m.experts > 0 && m.top_k > m.experts) {
    const std::optional<YamlValue> at = map.Find("top_k");
    (at ? *at : value)
        .Fail("top_k (" + std::to_string(m.top_k) + ") must be in [1, experts (" +
              std::to_string(m.experts) + ")]");
  }
  if (m.dense_layers > m.layers) {
    map.Get("dense_layers")
        .Fail("dense_layers (" + std::to_string(m.dense_layers) + ") exceeds the layers (" +
              std::to_string(m.layers) + ")");
  }
  return {name, m};
}

namespace {

DType ReadDtype(const YamlValue& value) {
  return *ParseDType(value.OneOf({"f32", "bf16", "f16", "float32", "bfloat16"}));
}

// `model: {kind: mlp, layer_sizes: [784, 8192, 10], activation: relu}`.
planner::MlpModel ReadMlp(const YamlValue& value) {
  YamlMap map = value.Map({"kind", "layer_sizes", "activation"});
  planner::MlpModel mlp;
  const YamlValue sizes = map.Get("layer_sizes");
  for (const YamlValue& n : sizes.List()) mlp.layer_sizes.push_back(n.Int64(1));
  if (mlp.layer_sizes.size() < 2) sizes.Fail("give at least the inputs and the classes");
  if (auto a = map.Find("activation")) {
    mlp.activation = a->OneOf({"relu", "gelu"}) == "gelu" ? MlpKind::kGelu : MlpKind::kRelu;
  }
  return mlp;
}

}  // namespace

// Whether `value` is a map whose kind is mlp.
bool IsMlp(const YamlValue& value) {
  if (!value.IsMap()) return false;
  const YAML::Node kind = value.node()["kind"];
  return kind && kind.IsScalar() && kind.Scalar() == "mlp";
}

namespace {}  // namespace

// An element type a step may store its cache or run its GEMMs in: ReadDtype's and the 8-bit
// floats.
DType ReadStorageDtype(const YamlValue& value) {
  std::vector<std::string> floats;
  for (const std::string& name : DTypeNames()) {
    if (ParseDType(name) != DType::kI32) floats.push_back(name);
  }
  return *ParseDType(value.OneOf(floats));
}

// `train:` {global_batch, seq_len, microbatches, optimizer, dtype, param_dtype,
// learning_rate}; seq_len only when `sequences` (an MLP's batch rows are single examples).
planner::TrainConfig ReadTrain(const YamlValue& value, bool sequences) {
  YamlMap map = value.Map({"global_batch", "seq_len", "microbatches", "optimizer", "dtype",
                           "param_dtype", "learning_rate", "matmul_dtype", "vocab_tiling"});
  planner::TrainConfig t;
  t.batch = map.Get("global_batch").Int64(1);
  if (sequences) {
    t.seq_len = map.Get("seq_len").Int64(1);
  } else if (auto v = map.Find("seq_len")) {
    v->FailAtKey("seq_len: an MLP's batch rows are single examples (give global_batch)");
  }
  t.optimizer = Optimizer::kAdam;
  t.dtype = DType::kBF16;
  t.param_dtype = DType::kF32;
  if (auto v = map.Find("microbatches")) {
    t.microbatches = v->Int64(1);
    if (t.batch % t.microbatches != 0) {
      v->Fail("microbatches (" + std::to_string(t.microbatches) + ") must divide global_batch (" +
              std::to_string(t.batch) + ")");
    }
  }
  if (auto v = map.Find("optimizer")) {
    const std::string o = v->OneOf({"adam", "sgd", "none"});
    t.optimizer = o == "adam" ? Optimizer::kAdam : o == "sgd" ? Optimizer::kSgd : Optimizer::kNone;
  }
  if (auto v = map.Find("dtype")) t.dtype = ReadDtype(*v);
  if (auto v = map.Find("param_dtype")) t.param_dtype = ReadDtype(*v);
  if (auto v = map.Find("matmul_dtype")) t.matmul_dtype = ReadStorageDtype(*v);
  if (auto v = map.Find("learning_rate")) t.learning_rate = v->Number();
  if (auto v = map.Find("vocab_tiling")) {
    if (!sequences) v->FailAtKey("vocab_tiling: tiles a language model's sequences");
    t.vocab_tiling = v->Int64(1);
    if (t.seq_len % t.vocab_tiling != 0) {
      v->Fail("vocab_tiling (" + std::to_string(t.vocab_tiling) + ") must divide seq_len (" +
              std::to_string(t.seq_len) + ")");
    }
  }
  return t;
}

// `serve:` {batch, prompt_len, decode_len, dtype, kv_dtype, matmul_dtype}.
planner::ServeConfig ReadServe(const YamlValue& value) {
  YamlMap map =
      value.Map({"batch", "prompt_len", "decode_len", "dtype", "kv_dtype", "matmul_dtype"});
  planner::ServeConfig s;
  s.batch = map.Get("batch").Int64(1);
  s.prompt_len = map.Get("prompt_len").Int64(1);
  s.decode_len = map.Get("decode_len").Int64(1);
  if (auto v = map.Find("dtype")) s.dtype = ReadDtype(*v);
  s.kv_dtype = s.dtype;
  if (auto v = map.Find("kv_dtype")) s.kv_dtype = ReadStorageDtype(*v);
  s.matmul_dtype = s.dtype;
  if (auto v = map.Find("matmul_dtype")) s.matmul_dtype = ReadStorageDtype(*v);
  return s;
}

// One rule's mesh axes: an axis name, a list of them, or null (replicated).
std::vector<std::string> ReadRuleAxes(const YamlValue& value, const std::vector<MeshAxis>& mesh) {
  std::vector<YamlValue> entries;
  if (value.node().IsNull()) return {};
  if (value.IsList()) {
    entries = value.List();
  } else {
    entries = {value};
  }
  std::vector<std::string> names;
  for (const YamlValue& e : entries) {
    const std::string axis = e.String();
    bool known = false;
    for (const MeshAxis& a : mesh) known = known || a.name == axis;
    if (!known) {
      std::vector<std::string> axes;
      for (const MeshAxis& a : mesh) axes.push_back(a.name);
      e.Fail("'" + axis + "' is not an axis of plan.mesh (" + JoinNames(axes) + ")");
    }
    for (const std::string& n : names) {
      if (n == axis) e.Fail("mesh axis '" + axis + "' is named twice in one rule");
    }
    names.push_back(axis);
  }
  return names;
}

planner::RematPolicy ReadRemat(const YamlValue& value) {
  if (value.IsMap()) {
    value.Fail(
        "a custom remat ({save: [...]}) is given alone (plan.remat: {save: [...]}); a list of "
        "policies names none, selective and full");
  }
  const std::string policy = value.OneOf({"none", "selective", "full"});
  for (planner::RematPolicy p : {planner::RematPolicy::kNone, planner::RematPolicy::kSelective,
                                 planner::RematPolicy::kFull}) {
    if (policy == planner::RematPolicyName(p)) return p;
  }
  value.Fail("unknown remat policy");
}

planner::PipelineSchedule ReadPipelineSchedule(const YamlValue& value) {
  constexpr planner::PipelineSchedule kAll[] = {planner::PipelineSchedule::kGpipe,
                                                planner::PipelineSchedule::kOneFOneB,
                                                planner::PipelineSchedule::kInterleaved};
  std::vector<std::string> names;
  for (planner::PipelineSchedule k : kAll) names.emplace_back(planner::PipelineScheduleName(k));
  const std::string name = value.OneOf(names);
  for (planner::PipelineSchedule k : kAll) {
    if (planner::PipelineScheduleName(k) == name) return k;
  }
  value.Fail("unknown pipeline schedule");
}

std::string DescribePlanMesh(const planner::StepPlan& plan) {
  std::string text = DescribeMeshAxes(plan.mesh);
  if (plan.torus_order.empty()) return text;
  return text + " (" + TorusOrderText(plan.torus_order) + ")";
}

void ReadStageLayers(const YamlMap& pipeline, planner::PipelinePlan& pp) {
  if (auto first = pipeline.Find("first_stage_layers")) pp.first_stage_layers = first->Int64(1);
  if (auto last = pipeline.Find("last_stage_layers")) pp.last_stage_layers = last->Int64(1);
}

planner::PipelinePlan ReadPipeline(const YamlValue& value, const std::vector<MeshAxis>& mesh) {
  YamlMap pipeline =
      value.Map({"axis", "schedule", "virtual_stages", "first_stage_layers", "last_stage_layers"});
  planner::PipelinePlan pp;
  if (auto axis = pipeline.Find("axis")) {
    pp.axis = axis->String();
    bool known = false;
    for (const MeshAxis& a : mesh) known = known || a.name == pp.axis;
    if (!known) axis->Fail("'" + pp.axis + "' is not an axis of plan.mesh");
  }
  if (auto s = pipeline.Find("schedule")) pp.schedule = ReadPipelineSchedule(*s);
  if (auto vs = pipeline.Find("virtual_stages")) {
    pp.virtual_stages = static_cast<int>(vs->Int64(1));
    if (pp.virtual_stages > 1 && pp.schedule != planner::PipelineSchedule::kInterleaved) {
      vs->Fail("virtual_stages > 1 needs schedule: interleaved");
    }
  }
  ReadStageLayers(pipeline, pp);
  return pp;
}

std::map<std::string, std::vector<std::string>> ReadRules(const YamlValue& value,
                                                          const std::vector<MeshAxis>& mesh) {
  std::map<std::string, std::vector<std::string>> rules;
  YamlMap entries = value.Map(planner::LogicalRules::Names());
  for (const auto& [name, axes_value] : entries.entries()) {
    rules[name] = ReadRuleAxes(axes_value, mesh);
  }
  return rules;
}

planner::CollectiveMatmulMode ReadCollectiveMatmul(const YamlValue& value) {
  planner::CollectiveMatmulMode mode = planner::CollectiveMatmulMode::kOff;
  planner::ParseCollectiveMatmulMode(
      value.OneOf({"off", "unidirectional", "bidirectional", "auto"}), &mode);
  return mode;
}

std::map<std::string, std::string> ReadPlanAlgorithms(const YamlValue& value) {
  std::map<std::string, std::string> out;
  YamlMap algorithms = value.Map(AlgorithmKeys());
  for (const auto& [op, algorithm] : algorithms.entries()) {
    out[op] = ReadAlgorithm(algorithm);
  }
  return out;
}

namespace {

// The keys of `plan:` (microbatches only to say where it belongs).
const std::vector<std::string>& PlanKeys() {
  static const std::vector<std::string> keys = {
      "mesh",    "devices",  "torus_order",       "rules",      "remat",
      "offload", "pipeline", "collective_matmul", "algorithms", "microbatches"};
  return keys;
}

}  // namespace

std::vector<std::string> ReadOffload(const YamlValue& value) {
  std::vector<std::string> names;
  for (const YamlValue& v : value.List()) {
    const std::string name = v.OneOf(planner::CheckpointNames());
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      v.Fail("'" + name + "' is named twice");
    }
    names.push_back(name);
  }
  return names;
}

void RefuseSavedAndOffloaded(const std::vector<std::string>& saved,
                             const std::vector<std::string>& offloaded, const YamlValue& where) {
  for (const std::string& name : offloaded) {
    if (std::find(saved.begin(), saved.end(), name) != saved.end()) {
      where.Fail("'" + name +
                 "' is both saved by plan.remat and offloaded: a value lives in device or in host "
                 "memory");
    }
  }
}

std::vector<int> ReadTorusOrder(const YamlValue& value) {
  std::vector<int> order;
  for (const YamlValue& d : value.List()) order.push_back(d.Int(0));
  if (order.empty()) value.Fail("torus_order lists the torus dimensions, innermost first");
  return order;
}

namespace {

// `plan:` {mesh, devices, torus_order, rules, remat, offload, pipeline, collective_matmul,
// algorithms}.
planner::StepPlan ReadPlan(const YamlValue& value) {
  YamlMap map = value.Map(PlanKeys());
  planner::StepPlan plan;
  plan.mesh = ReadMeshAxes(map.Get("mesh"));
  if (auto devices = map.Find("devices")) plan.devices = ReadMeshDevices(*devices, plan.mesh);
  if (auto order = map.Find("torus_order")) plan.torus_order = ReadTorusOrder(*order);
  if (auto rules = map.Find("rules")) plan.rules = ReadRules(*rules, plan.mesh);
  if (auto v = map.Find("remat")) {
    if (v->IsMap()) {
      // MaxText's custom policy: the checkpoint names kept in device memory, the rest of each
      // layer recomputed (its input is always kept).
      plan.remat = planner::RematPolicy::kCustom;
      plan.remat_save = ReadOffload(v->Map({"save"}).Get("save"));
    } else {
      plan.remat = ReadRemat(*v);
    }
  }
  if (auto v = map.Find("offload")) {
    plan.offload = ReadOffload(*v);
    RefuseSavedAndOffloaded(plan.remat_save, plan.offload, *v);
  }
  if (auto v = map.Find("pipeline")) plan.pipeline = ReadPipeline(*v, plan.mesh);
  if (auto v = map.Find("collective_matmul")) plan.collective_matmul = ReadCollectiveMatmul(*v);
  if (auto v = map.Find("microbatches")) {
    v->FailAtKey("microbatches: belongs to train: (train: {microbatches: 4})");
  }
  if (auto a = map.Find("algorithms")) plan.algorithms = ReadPlanAlgorithms(*a);
  return plan;
}

}  // namespace

ModelRunSpec ReadModelRun(const YamlMap& top) {
  ModelRunSpec run;
  const YamlValue model = top.Get("model");
  if (IsMlp(model)) {
    run.name = "mlp";
    run.mlp = ReadMlp(model);
  } else {
    std::tie(run.name, run.model) = ReadModel(model);
  }
  std::optional<YamlValue> train = top.Find("train");
  std::optional<YamlValue> serve = top.Find("serve");
  if (train && serve) serve->FailAtKey("give either train: or serve:, not both");
  if (serve) {
    run.serve = ReadServe(*serve);
  } else if (!train) {
    top.self().FailChild("train",
                         "missing required key 'train' (the batch, like train: {global_batch: "
                         "256, seq_len: 4096}; or serve: {batch: 64, prompt_len: 2048, "
                         "decode_len: 256})");
  } else {
    run.train = ReadTrain(*train, !run.mlp);
  }
  run.plan = ReadPlan(top.Get("plan"));
  if (serve && run.plan.collective_matmul != planner::CollectiveMatmulMode::kOff) {
    top.Get("plan")
        .Map(PlanKeys())
        .Get("collective_matmul")
        .FailAtKey("collective_matmul: applies to training steps, not to serve:");
  }
  if (serve && run.plan.remat != planner::RematPolicy::kNone) {
    top.Get("plan")
        .Map(PlanKeys())
        .Get("remat")
        .FailAtKey(
            "remat: applies to training steps, not to serve: (a serving step keeps nothing for a "
            "backward pass)");
  }
  if (serve && !run.plan.offload.empty()) {
    top.Get("plan")
        .Map(PlanKeys())
        .Get("offload")
        .FailAtKey("offload: keeps training activations in host memory; serving steps have none");
  }
  if (run.mlp) {
    if (serve) serve->FailAtKey("serve: serving steps are built for transformers");
    const YamlValue plan = top.Get("plan");
    const YamlMap keys = plan.Map(PlanKeys());
    if (run.plan.remat != planner::RematPolicy::kNone) {
      keys.Get("remat").Fail("remat applies to transformer layers, not kind: mlp");
    }
    if (!run.plan.offload.empty()) {
      keys.Get("offload").FailAtKey("offload: names transformer layer values, not kind: mlp's");
    }
    if (run.plan.pipeline) keys.Get("pipeline").FailAtKey("pipelines stage transformer layers");
  }
  return run;
}

}  // namespace shardsim
