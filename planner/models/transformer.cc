#include "planner/models/transformer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "collectives/ir/program_builder.h"
#include "planner/models/dropless_moe.h"
#include "sim/spec_error.h"

namespace shardsim::planner {
namespace {

// What a step does: train (forward, grad, update), or serve: prefill a prompt (forward,
// returning the KV cache and the last position's logits) or decode one token per sequence
// against the cache.
enum class StepKind { kTrain, kPrefill, kDecode };

// Builds one step; each member appends a part of the program.
class TrainStepBuilder {
 public:
  TrainStepBuilder(const TransformerConfig& model, const TrainConfig& train,
                   const std::vector<MeshAxis>& axes, const LogicalRules& rules,
                   std::vector<std::vector<std::string>>* layer_values,
                   std::vector<std::map<std::string, std::string>>* layer_checkpoints = nullptr,
                   std::vector<std::vector<std::string>>* head_tiles = nullptr)
      : model_(model),
        train_(train),
        rules_(rules),
        axes_(axes),
        layer_values_(layer_values),
        layer_checkpoints_(layer_checkpoints),
        head_tiles_(head_tiles),
        pb_(axes, {}, ProgramMode::kAuto) {}

  // The builder of an MLP classifier's step (Build() then makes it).
  void SetMlp(const MlpModel& mlp) { mlp_ = &mlp; }

  // A serving step (kPrefill or kDecode) of `serve`'s batch.
  ProgramSpec BuildServe(StepKind kind, const ServeConfig& serve) && {
    kind_ = kind;
    InitSpec ids;
    ids.kind = InitSpec::Kind::kArange;
    const int64_t tokens_per_sequence = kind == StepKind::kPrefill ? serve.prompt_len : 1;
    ids.modulus = ValidIds(serve.batch * tokens_per_sequence);
    group_tokens_ = tokens_per_sequence;
    moe_batch_ = serve.batch;
    linear_dtype_ = serve.matmul_dtype;
    kv_dtype_ = serve.kv_dtype;
    pb_.Input("tokens", {serve.batch, tokens_per_sequence}, DType::kI32,
              rules_.Spec({"batch", "length"}), ids);
    DeclareParams();
    if (kind == StepKind::kDecode) {
      // The cache of the context so far, per layer: keys and values [batch, length, kv_heads,
      // head_dim] in kv_dtype.
      InitSpec cache;
      cache.kind = InitSpec::Kind::kNormal;
      for (int64_t l = 0; l < model_.layers; ++l) {
        for (bool keys : {true, false}) {
          cache.seed = ++seed_;
          pb_.Input(KvCacheName(keys, l),
                    {serve.batch, serve.context, model_.kv_heads, model_.head_dim}, serve.kv_dtype,
                    rules_.Spec({"batch", "length", "kv_heads", "head_dim"}), cache);
        }
      }
    }
    std::string x = Op(OpKind::kTake, {W("embed"), "tokens"}, "x0");
    for (int64_t l = 0; l < model_.layers; ++l) x = LayerAndRecord(x, l);
    x = Residual(x, "rf");
    if (kind == StepKind::kPrefill && tokens_per_sequence > 1) {
      // Only the last position's logits pick the first generated token.
      OpSpec last;
      last.kind = OpKind::kSlice;
      last.in = {x};
      last.out = {"x_last"};
      last.axis = 1;
      last.start = tokens_per_sequence - 1;
      last.size = 1;
      x = pb_.Add(std::move(last));
    }
    const std::string xf = Norm(x, W("final_norm"), "xf");
    const std::string logits = model_.tied_embeddings
                                   ? pb_.Einsum("btd,vd->btv", xf, W("embed"), "logits")
                                   : pb_.Einsum("btd,dv->btv", xf, W("unembed"), "logits");
    pb_.Output(logits, rules_.Spec({"batch", "length", "vocab"}));
    const PartitionSpec cache_spec = rules_.Spec({"batch", "length", "kv_heads", "head_dim"});
    for (const std::string& kv : cache_out_) pb_.Output(kv, cache_spec);
    return std::move(pb_).Build();
  }

  ProgramSpec Build() && {
    group_tokens_ = train_.seq_len;
    moe_batch_ = train_.batch / std::max<int64_t>(train_.microbatches, 1);
    linear_dtype_ = train_.matmul_dtype.value_or(train_.dtype);
    InitSpec ids;
    ids.kind = InitSpec::Kind::kArange;
    ids.modulus =
        ValidIds(train_.batch / std::max<int64_t>(train_.microbatches, 1) * train_.seq_len);
    const int64_t micro = train_.microbatches;
    const PartitionSpec tokens = rules_.Spec({"batch", "length"});
    for (int64_t i = 0; i < micro; ++i) {
      sfx_ = micro == 1 ? "" : "_mb" + std::to_string(i);
      const int64_t b = train_.batch / micro;
      if (mlp_) {
        // Features [batch, inputs] and class labels [batch] (class 0: valid for any count).
        InitSpec features;
        features.kind = InitSpec::Kind::kNormal;
        features.seed = 1000 + static_cast<uint64_t>(i);
        pb_.Input(N("x"), {b, mlp_->layer_sizes.front()}, train_.dtype, rules_.Spec({"batch"}),
                  features);
        pb_.Input(N("labels"), {b}, DType::kI32, rules_.Spec({"batch"}));
        continue;
      }
      const Shape shape = {b, train_.seq_len};
      if (train_.layers_only) {
        // The activation in and its output's cotangent, as the stages before and after send.
        const Shape act = {b, train_.seq_len, model_.d_model};
        const PartitionSpec residual = rules_.Spec({"batch", "length", "activation_embed"});
        for (const char* name : {"x_in", "g_out"}) {
          InitSpec values;
          values.kind = InitSpec::Kind::kNormal;
          values.seed = 2000 + 2 * static_cast<uint64_t>(i) + (name[0] == 'g' ? 1 : 0);
          pb_.Input(N(name), act, train_.dtype, residual, values);
        }
        continue;
      }
      pb_.Input(N("tokens"), shape, DType::kI32, tokens, ids);
      pb_.Input(N("labels"), shape, DType::kI32, tokens, ids);
    }
    if (mlp_) {
      DeclareMlpParams();
    } else {
      DeclareParams();
    }

    // Each microbatch: its forward, then its backward; the gradients summed as they come.
    std::string loss_sum;
    for (int64_t i = 0; i < micro; ++i) {
      sfx_ = micro == 1 ? "" : "_mb" + std::to_string(i);
      aux_.clear();
      std::string loss = mlp_ ? Op(OpKind::kCrossEntropy, {MlpLogits(), N("labels")}, N("loss"))
                              : TransformerLoss();
      // The routers' load-balancing losses join the loss the gradients are taken of.
      if (!aux_.empty()) loss = Op(OpKind::kAdd, {loss, aux_}, N("loss"));
      if (train_.forward_only) {
        pb_.Output(loss, PartitionSpec{});
        return std::move(pb_).Build();
      }
      std::vector<std::string> grads;
      for (const Parameter& p : params_) grads.push_back(N("d_" + p.name));
      std::vector<std::string> wrt = Names();
      if (train_.layers_only) {
        wrt.push_back(N("x_in"));
        grads.push_back(N("d_x_in"));
      }
      pb_.Grad(loss, wrt, grads);
      if (train_.layers_only) {
        pb_.Output(N("d_x_in"), rules_.Spec({"batch", "length", "activation_embed"}));
      }
      if (micro == 1) break;
      loss_sum = i == 0 ? loss : Op(OpKind::kAdd, {loss_sum, loss}, N("loss_sum"));
      for (Parameter& p : params_) {
        const std::string g = N("d_" + p.name);
        p.acc = i == 0 ? g : Op(OpKind::kAdd, {p.acc, g}, N("acc_" + p.name));
      }
    }
    if (micro > 1) {
      sfx_.clear();
      const double mean = 1.0 / static_cast<double>(micro);
      Scalar(OpKind::kMul, loss_sum, mean, "loss");
      for (const Parameter& p : params_) Scalar(OpKind::kMul, p.acc, mean, "d_" + p.name);
    }
    pb_.Output("loss", PartitionSpec{});
    switch (train_.optimizer) {
      case Optimizer::kNone:
        for (const Parameter& p : params_) {
          pb_.Output("d_" + p.name, p.spec, train_.unreduced_gradients);
        }
        break;
      case Optimizer::kSgd:
        for (const Parameter& p : params_) {
          const std::string step = Scalar(OpKind::kMul, "d_" + p.name, train_.learning_rate);
          pb_.Output(Op(OpKind::kSub, {p.name, step}, p.name + "_new"), p.spec);
        }
        break;
      case Optimizer::kAdam:
        for (const Parameter& p : params_) Adam(p);
        break;
    }
    return std::move(pb_).Build();
  }

 private:
  // The arange modulus that keeps `count` token ids (and labels) valid classes of the
  // vocabulary, for take and cross_entropy: the vocabulary when the ids would pass it, else
  // none (plain arange).
  int64_t ValidIds(int64_t count) const { return count > model_.vocab ? model_.vocab : 0; }

  // The transformer's forward for the current microbatch and its cross-entropy (fills aux_
  // with MoE layers' losses, to which it leaves the name "loss"). With train.vocab_tiling = n >
  // 1 the head runs in n
  // tiles along the sequence (MaxText's vocabulary tiling): each tile's hidden states and labels
  // sliced, its logits and mean loss, the loss the mean of the tiles' (equal tiles: the mean
  // over every position); each tile's logits and loss are a head_tiles_ segment.
  std::string TransformerLoss() {
    if (train_.layers_only) {
      // The dot product of the last layer's output with its cotangent.
      std::string x = N("x_in");
      for (int64_t l = 0; l < model_.layers; ++l) x = LayerAndRecord(x, l);
      const std::string y = Op(OpKind::kMul, {Residual(x, N("rf")), N("g_out")}, N("y_g"));
      OpSpec sum;
      sum.kind = OpKind::kSum;
      sum.in = {y};
      sum.axes = {0, 1, 2};
      sum.out = {N(aux_.empty() ? "loss" : "ce_loss")};
      return pb_.Add(std::move(sum));
    }
    std::string x = Op(OpKind::kTake, {W("embed"), N("tokens")}, N("x0"));
    for (int64_t l = 0; l < model_.layers; ++l) x = LayerAndRecord(x, l);
    const std::string loss = N(aux_.empty() ? "loss" : "ce_loss");
    x = Residual(x, N("rf"));
    const std::string xf = Norm(x, W("final_norm"), N("xf"));
    const int64_t tiles = train_.vocab_tiling;
    if (tiles <= 1) return Op(OpKind::kCrossEntropy, {Logits(xf, ""), N("labels")}, loss);
    const int64_t tile = train_.seq_len / tiles;
    std::string sum;
    for (int64_t j = 0; j < tiles; ++j) {
      const std::string J = "_t" + std::to_string(j);
      auto slice = [&](const std::string& in, const std::string& out) {
        OpSpec op;
        op.kind = OpKind::kSlice;
        op.in = {in};
        op.out = {N(out + J)};
        op.axis = 1;
        op.start = j * tile;
        op.size = tile;
        return pb_.Add(std::move(op));
      };
      const size_t first = pb_.program().ops.size();
      const std::string logits = Logits(slice(xf, "xf"), J);
      const std::string ce =
          Op(OpKind::kCrossEntropy, {logits, slice(N("labels"), "labels")}, N("ce" + J));
      if (head_tiles_) {
        std::vector<std::string>& made = head_tiles_->emplace_back();
        const std::vector<OpSpec>& ops = pb_.program().ops;
        for (size_t i = first; i < ops.size(); ++i) {
          if (ops[i].kind != OpKind::kSlice)
            made.insert(made.end(), ops[i].out.begin(), ops[i].out.end());
        }
      }
      sum = j == 0 ? ce : Op(OpKind::kAdd, {sum, ce}, N("ce_sum" + J));
    }
    return Scalar(OpKind::kMul, sum, 1.0 / static_cast<double>(tiles), loss);
  }

  // The logits of final hidden states `xf` [batch, length, embed], named with `suffix`.
  std::string Logits(const std::string& xf, const std::string& suffix) {
    const std::string logits =
        model_.tied_embeddings ? pb_.Einsum("btd,vd->btv", xf, W("embed"), N("logits" + suffix))
                               : pb_.Einsum("btd,dv->btv", xf, W("unembed"), N("logits" + suffix));
    return Constrain(logits, {"batch", "length", "vocab"}, N("logits_c" + suffix));
  }

  // The MLP's weights w<i> [n_i, n_i+1], alternately [embed, mlp] and [mlp, embed] (Megatron's
  // column- then row-parallel pairs under `mlp: tensor`); the last one's output dimension is
  // the classes, `vocab` (as a language model's head).
  void DeclareMlpParams() {
    const std::vector<int64_t>& n = mlp_->layer_sizes;
    for (size_t i = 0; i + 1 < n.size(); ++i) {
      const bool even = i % 2 == 0;
      const bool last = i + 2 == n.size();
      Param("w" + std::to_string(i), {n[i], n[i + 1]},
            {even ? "embed" : "mlp", last   ? "vocab"
                                     : even ? "mlp"
                                            : "embed"});
    }
  }

  // The MLP's forward for the current microbatch: each layer's input held as [batch, -] (the
  // data and FSDP axes keep their examples), the activation between layers.
  std::string MlpLogits() {
    std::string h = N("x");
    const size_t layers = mlp_->layer_sizes.size() - 1;
    for (size_t i = 0; i < layers; ++i) {
      const std::string k = std::to_string(i);
      h = Constrain(h, {"batch"}, N("h" + k));
      h = pb_.Einsum("bi,io->bo", h, W("w" + k), N("z" + k));
      if (i + 1 < layers) {
        h = Op(mlp_->activation == MlpKind::kGelu ? OpKind::kGelu : OpKind::kRelu, {h}, N("a" + k));
      }
    }
    return h;
  }

  // Every parameter, in declaration order (their seeds follow it).
  void DeclareParams() {
    const int64_t d = model_.d_model;
    if (!train_.layers_only) Param("embed", {model_.vocab, d}, {"vocab", "embed"});
    for (int64_t l = 0; l < model_.layers; ++l) {
      const std::string L = std::to_string(l);
      Param("attn_norm" + L, {d}, {"embed"}, /*ones=*/true);
      Param("wq" + L, {d, model_.heads, model_.head_dim}, {"embed", "heads", "head_dim"}, false,
            true);
      Param("wk" + L, {d, model_.kv_heads, model_.head_dim}, {"embed", "kv_heads", "head_dim"},
            false, true);
      Param("wv" + L, {d, model_.kv_heads, model_.head_dim}, {"embed", "kv_heads", "head_dim"},
            false, true);
      Param("wo" + L, {model_.heads, model_.head_dim, d}, {"heads", "head_dim", "embed"}, false,
            true);
      Param("mlp_norm" + L, {d}, {"embed"}, /*ones=*/true);
      if (!IsMoeLayer(model_, l)) {
        FeedForwardParams("w", L, {}, model_.d_ff);
        continue;
      }
      // The router [embed, experts] (its expert dimension whole: every token scores every
      // expert), the experts' MLPs [experts, ...] and the shared experts' one MLP.
      Param("w_router" + L, {d, model_.experts}, {"embed", ""});
      FeedForwardParams("we", L, {model_.experts}, ExpertDff(model_));
      if (model_.shared_experts > 0) {
        FeedForwardParams("ws", L, {}, model_.shared_experts * ExpertDff(model_));
      }
    }
    if (train_.layers_only) return;
    Param("final_norm", {d}, {"embed"}, /*ones=*/true);
    if (!model_.tied_embeddings) Param("unembed", {d, model_.vocab}, {"embed", "vocab"});
  }

  // An MLP's weights <prefix>_gate (SwiGLU only), <prefix>_up [embed, mlp] and <prefix>_down
  // [mlp, embed] of layer L, `ff` wide; with `experts` ({E}) each has a leading expert
  // dimension.
  void FeedForwardParams(const std::string& prefix, const std::string& L,
                         const std::vector<int64_t>& experts, int64_t ff) {
    const int64_t d = model_.d_model;
    auto param = [&](const std::string& name, Shape shape, std::vector<std::string> dims) {
      if (!experts.empty()) {
        shape.insert(shape.begin(), experts[0]);
        dims.insert(dims.begin(), "expert");
      }
      Param(prefix + "_" + name + L, std::move(shape), dims, false, /*linear=*/true);
    };
    if (model_.mlp == MlpKind::kSwiGlu) param("gate", {d, ff}, {"embed", "mlp"});
    param("up", {d, ff}, {"embed", "mlp"});
    param("down", {ff, d}, {"mlp", "embed"});
  }

  // The MLP of layer L on x (its weights <prefix>_* as FeedForwardParams declares them):
  // einsums `in` (x by gate or up) and `out` (the activation by down), values named
  // <name><kind><L>: SwiGLU down(silu(x gate) * (x up)), else down(act(x up)).
  // The dense MLP's projections are recorded as MaxText's mlpwi_0 (gate, or the one input
  // projection of a GELU MLP), mlpwi_1 (up) and mlpwo.
  std::string FeedForward(const std::string& x, const std::string& prefix, const std::string& L,
                          const std::string& in, const std::string& out, const std::string& name) {
    const bool dense = name.empty();
    std::string m;
    if (model_.mlp == MlpKind::kSwiGlu) {
      const std::string gate = Linear(in, x, prefix + "_gate" + L, N(name + "gate" + L));
      const std::string up = Linear(in, x, prefix + "_up" + L, N(name + "up" + L));
      if (dense) checkpoints_["mlpwi_0"] = gate;
      if (dense) checkpoints_["mlpwi_1"] = up;
      const std::string act = Op(OpKind::kSilu, {gate}, N(name + "act" + L));
      m = Op(OpKind::kMul, {act, up}, N(name + "m" + L));
    } else {
      const std::string up = Linear(in, x, prefix + "_up" + L, N(name + "up" + L));
      if (dense) checkpoints_["mlpwi_0"] = up;
      m = Op(model_.mlp == MlpKind::kGelu ? OpKind::kGelu : OpKind::kRelu, {up},
             N(name + "act" + L));
    }
    const std::string down = Linear(out, m, prefix + "_down" + L, N(name + "d" + L));
    if (dense) checkpoints_["mlpwo"] = down;
    return down;
  }

  // The mixture of experts of layer L on x [batch, length, embed] (GShard's dense dispatch with
  // a capacity, as MaxText's "dropping" MoE; each sequence is a routing group of T tokens):
  // router logits x w_router [b, t, E]; their top k and softmax over those k (Mixtral's
  // normalised gates); moe_route's mask [b, t, E, C], C = ExpertCapacity(T); the combine
  // weights, the mask times each chosen expert's gate (the gates placed by one_hot); the
  // experts' inputs einsum(btec,btd->ebcd) held as [expert, batch, -, -] (an all-to-all over
  // an expert axis that held tokens); each expert's MLP; its outputs held as [-, batch, -, -]
  // (the all-to-all back); the tokens' outputs einsum(btec,ebcd->btd) with the combine
  // weights. The shared experts' MLP, on every token, is added.
  std::string MixtureOfExperts(const std::string& x, const std::string& L) {
    const int64_t e = model_.experts;
    const std::string dtype(DTypeName(train_.dtype));
    const std::string logits = pb_.Einsum("btd,de->bte", x, W("w_router" + L), N("router" + L));
    OpSpec top;
    top.kind = OpKind::kTopK;
    top.in = {logits};
    top.out = {N("top" + L), N("choice" + L)};
    top.k = model_.top_k;
    pb_.Add(std::move(top));
    const std::string gates = Op(OpKind::kSoftmax, {N("top" + L)}, N("gates" + L));
    OpSpec one_hot;
    one_hot.kind = OpKind::kOneHot;
    one_hot.in = {N("choice" + L)};
    one_hot.out = {N("onehot" + L)};
    one_hot.num_classes = e;
    one_hot.dtype = dtype;
    const std::string hot = pb_.Add(std::move(one_hot));
    const std::string expert_gates = pb_.Einsum("btk,btke->bte", gates, hot, N("egates" + L));
    if (kind_ == StepKind::kTrain && model_.router_aux_loss > 0) {
      // The load-balancing loss: experts * sum_e c_e P_e, weighted (router_aux_loss). Only the
      // probabilities carry a gradient; the counts come from the integer choices.
      OpSpec per_token;
      per_token.kind = OpKind::kSum;
      per_token.in = {hot};
      per_token.axes = {2};
      per_token.out = {N("chosen" + L)};
      const std::string chosen = pb_.Add(std::move(per_token));  // [b, t, E]
      OpSpec counts;
      counts.kind = OpKind::kMean;
      counts.in = {chosen};
      counts.axes = {0, 1};
      counts.out = {N("load" + L)};
      const std::string load = pb_.Add(std::move(counts));  // c [E]
      const std::string probs = Op(OpKind::kSoftmax, {logits}, N("probs" + L));
      OpSpec mean_probs;
      mean_probs.kind = OpKind::kMean;
      mean_probs.in = {probs};
      mean_probs.axes = {0, 1};
      mean_probs.out = {N("importance" + L)};
      const std::string importance = pb_.Add(std::move(mean_probs));  // P [E]
      const std::string balance = pb_.Einsum("e,e->", load, importance, N("balance" + L));
      const std::string term = Scalar(
          OpKind::kMul, balance, model_.router_aux_loss * static_cast<double>(e), N("aux" + L));
      aux_ = aux_.empty() ? term : Op(OpKind::kAdd, {aux_, term}, N("aux_sum" + L));
    }
    if (model_.capacity_factor <= 0) {
      std::string y = DroplessExperts(x, N("choice" + L), gates, L);
      if (model_.shared_experts > 0) {
        const std::string shared = FeedForward(x, "ws", L, "btd,df->btf", "btf,fd->btd", "s");
        y = Op(OpKind::kAdd, {y, shared}, N("moes" + L));
      }
      return y;
    }
    OpSpec route;
    route.kind = OpKind::kMoeRoute;
    route.in = {N("choice" + L)};
    route.out = {N("dispatch" + L)};
    route.experts = e;
    route.capacity = ExpertCapacity(model_, group_tokens_);
    route.dtype = dtype;
    const std::string dispatch = pb_.Add(std::move(route));
    const std::string combine =
        pb_.Einsum("btec,bte->btec", dispatch, expert_gates, N("combine" + L));
    // Each change of layout is constrained on both sides, so that the backward pass (whose
    // constraints are the forward's, transposed) moves the cotangents with the same two
    // all-to-alls rather than resharding the experts' saved activations.
    std::string xe = pb_.Einsum("btec,btd->ebcd", dispatch, x, N("xe" + L));
    xe = Constrain(xe, {"", "batch", "", ""}, N("xeb" + L));
    xe = Constrain(xe, {"expert", "batch", "", ""}, N("xec" + L));
    std::string ye = FeedForward(xe, "we", L, "ebcd,edf->ebcf", "ebcf,efd->ebcd", "e");
    ye = Constrain(ye, {"expert", "batch", "", ""}, N("yee" + L));
    ye = Constrain(ye, {"", "batch", "", ""}, N("yec" + L));
    std::string y = pb_.Einsum("btec,ebcd->btd", combine, ye, N("moe" + L));
    if (model_.shared_experts > 0) {
      const std::string shared = FeedForward(x, "ws", L, "btd,df->btf", "btf,fd->btd", "s");
      y = Op(OpKind::kAdd, {y, shared}, N("moes" + L));
    }
    return y;
  }

  // The routed experts of layer L without a capacity (capacity_factor <= 0, MaxText's dropless
  // sparse_matmul path): a shard_map region (DroplessMoeBody) over the tokens x [batch, length,
  // embed], their top_k experts `choice` and `gates`, and the experts' weights. Its tokens are
  // split as the batch rule says, and also over every expert axis the batch rule leaves out
  // (its batch dimension if that divides, else its sequence), so that each member of an
  // expert group dispatches tokens of its own; where neither divides (a decode step's few
  // tokens), every member holds them all (tokens_replicated) when the batch rule names no
  // expert axis, else they stay whole over the expert axes it leaves out (each member then
  // dispatches its column's copies). The weights enter split over expert, embed (gathered inside,
  // as FSDP) and mlp (whose partial sums are psummed inside).
  std::string DroplessExperts(const std::string& x, const std::string& choice,
                              const std::string& gates, const std::string& L) {
    if (linear_dtype_ != train_.dtype) {
      throw SpecError("model.capacity_factor",
                      "dropless MoE (capacity_factor <= 0) runs its experts in the compute dtype: "
                      "quantized GEMMs (matmul_dtype) are not built for it");
    }
    DroplessMoeLayout layout;
    layout.mesh = axes_;
    layout.batch = moe_batch_;
    layout.length = group_tokens_;
    layout.d_model = model_.d_model;
    layout.d_ff = ExpertDff(model_);
    layout.experts = model_.experts;
    layout.top_k = model_.top_k;
    layout.gated = model_.mlp == MlpKind::kSwiGlu;
    layout.activation = model_.mlp == MlpKind::kSwiGlu ? OpKind::kSilu
                        : model_.mlp == MlpKind::kGelu ? OpKind::kGelu
                                                       : OpKind::kRelu;
    layout.dtype = train_.dtype;
    layout.buffer_factor = model_.ragged_buffer_factor;
    layout.batch_axes = rules_.Axes("batch");
    // The weights enter as they are held (FeedForwardParams' specs, which give an axis to the
    // first of their dimensions that names it).
    const PartitionSpec held_in = rules_.Spec({"expert", "embed", "mlp"});
    const PartitionSpec held_out = rules_.Spec({"expert", "mlp", "embed"});
    auto dim = [](const PartitionSpec& spec, size_t d) {
      return d < spec.dims.size() ? spec.dims[d] : std::vector<std::string>{};
    };
    layout.expert_axes = dim(held_in, 0);
    layout.embed_axes = dim(held_in, 1);
    layout.mlp_axes = dim(held_in, 2);
    if (dim(held_out, 0) != layout.expert_axes || dim(held_out, 1) != layout.mlp_axes ||
        dim(held_out, 2) != layout.embed_axes) {
      throw SpecError("plan.rules",
                      "dropless MoE: the rules split the experts' embed and mlp dimensions over "
                      "one mesh axis");
    }
    std::vector<std::string> extra;
    for (const std::string& a : layout.expert_axes) {
      const auto& b = layout.batch_axes;
      if (std::find(b.begin(), b.end(), a) == b.end()) extra.push_back(a);
    }
    const int64_t extra_size = NamedAxesSize(axes_, extra);
    if (layout.batch % (NamedAxesSize(axes_, layout.batch_axes) * extra_size) == 0) {
      layout.batch_axes.insert(layout.batch_axes.end(), extra.begin(), extra.end());
    } else if (layout.length % extra_size == 0) {
      layout.length_axes = extra;
    } else if (extra.size() == layout.expert_axes.size()) {
      // Neither divides (a decode step's few tokens) and no expert axis splits the batch:
      // every member of an expert group holds the same tokens (DroplessMoeLayout).
      layout.tokens_replicated = true;
    }
    // Else some expert axes split the batch and the tokens are held whole over the rest: each
    // member dispatches its column's copies (DroplessMoeLayout::tokens_replicated).
    for (const std::string& a : layout.mlp_axes) {
      for (const auto* other : {&layout.batch_axes, &layout.length_axes, &layout.expert_axes}) {
        if (std::find(other->begin(), other->end(), a) != other->end()) {
          throw SpecError("plan.rules", "dropless MoE: mesh axis '" + a +
                                            "' splits the experts' MLP width and their tokens "
                                            "or experts too");
        }
      }
    }
    ProgramSpec body;
    try {
      body = DroplessMoeBody(layout);
    } catch (const std::invalid_argument& e) {
      throw SpecError("plan.rules", e.what());
    }
    std::vector<std::string> in = {x, choice, gates};
    if (layout.gated) in.push_back(W("we_gate" + L));
    in.push_back(W("we_up" + L));
    in.push_back(W("we_down" + L));
    std::vector<std::string> out = {N("moe" + L)};
    if (DroplessBounded(layout)) out.push_back(N(kDroppedCopiesName + L));
    return pb_.ShardMap(std::move(in), std::move(body), std::move(out)).at(0);
  }

  // Layer `l` on x, its values recorded for remat when asked.
  std::string LayerAndRecord(const std::string& x, int64_t l) {
    const size_t first = pb_.program().ops.size();
    checkpoints_.clear();
    std::string y = Layer(x, l);
    if (layer_checkpoints_) layer_checkpoints_->push_back(checkpoints_);
    if (layer_values_) {
      std::vector<std::string>& made = layer_values_->emplace_back();
      const std::vector<OpSpec>& ops = pb_.program().ops;
      for (size_t i = first; i < ops.size(); ++i) {
        made.insert(made.end(), ops[i].out.begin(), ops[i].out.end());
      }
    }
    return y;
  }

  struct Parameter {
    std::string name;
    Shape shape;
    PartitionSpec spec;
    std::string acc;  // Microbatches: the sum of its gradients so far.
  };

  // Value `base` of the current microbatch.
  std::string N(const std::string& base) const { return base + sfx_; }

  void Param(const std::string& name, Shape shape, const std::vector<std::string>& dims,
             bool ones = false, bool linear = false) {
    InitSpec init;
    init.kind = ones ? InitSpec::Kind::kOnes : InitSpec::Kind::kNormal;
    if (!ones) init.seed = ++seed_;
    const PartitionSpec spec = rules_.Spec(dims);
    for (size_t d = 0; d < spec.dims.size(); ++d) {
      const int64_t blocks = NamedAxesSize(axes_, spec.dims[d]);
      if (shape[d] % blocks == 0) continue;
      std::string dims_text;
      for (const std::string& n : dims) dims_text += (dims_text.empty() ? "" : ", ") + n;
      throw SpecError("plan.rules", "the rules shard parameter " + name + " [" + dims_text +
                                        "] as " + FormatPartitionSpec(spec) + ", but its " +
                                        dims[d] + " dimension (" + std::to_string(shape[d]) +
                                        ") does not divide into " + std::to_string(blocks) +
                                        " blocks");
    }
    // Serving stores a linear layer's weight of quantized GEMMs in their type; training keeps
    // its master weights and converts them.
    const bool stored = linear && linear_dtype_ != train_.dtype && kind_ != StepKind::kTrain;
    const DType dtype = stored ? linear_dtype_ : train_.param_dtype;
    pb_.Input(name, shape, dtype, spec, init);
    params_.push_back({name, std::move(shape), spec, ""});
  }

  // `in` converted to the narrower `dtype` as `out`, saturating (FP8 casts clamp to the
  // format's range); `fused`: into the kernel that makes `in` (no time of its own).
  std::string Cast(const std::string& in, const std::string& out, DType dtype, bool fused) {
    OpSpec cast;
    cast.kind = OpKind::kConvert;
    cast.in = {in};
    cast.out = {out};
    cast.dtype = DTypeName(dtype);
    cast.saturate = true;
    cast.fused = fused;
    return pb_.Add(std::move(cast));
  }

  // x times linear weight `weight` by einsum `spec`: with quantized GEMMs (linear_dtype_), x is
  // converted to their type once and the product accumulated into the compute dtype. The
  // conversion is fused (free): TensorRT-LLM quantizes in the epilogue of the kernel that makes
  // x, and the GEMM's bytes count the narrow x it reads.
  std::string Linear(const std::string& spec, const std::string& x, const std::string& weight,
                     const std::string& out) {
    if (linear_dtype_ == train_.dtype) return pb_.Einsum(spec, x, W(weight), out);
    std::string w = weight;
    if (kind_ == StepKind::kTrain) {
      // The weight's compute copy cast to the GEMMs' type where first read (a kernel of its
      // own, as Transformer Engine casts the weights).
      const std::string copy = W(weight);
      auto [at, made] = quantized_.try_emplace(copy);
      if (made) at->second = Cast(copy, N(weight + "_q"), linear_dtype_, /*fused=*/false);
      w = at->second;
    }
    auto [it, fresh] = quantized_.try_emplace(x);
    if (fresh) it->second = Cast(x, x + "_q", linear_dtype_, /*fused=*/true);
    OpSpec gemm;
    gemm.kind = OpKind::kEinsum;
    gemm.spec = spec;
    gemm.in = {it->second, w};
    gemm.out = {out};
    gemm.dtype = DTypeName(train_.dtype);
    return pb_.Add(std::move(gemm));
  }

  // The value the forward pass reads for parameter `name`: the parameter, or with mixed
  // precision its compute-dtype copy <name>_c, cast from the sharded block where the current
  // microbatch first reads it (as MaxText casts inside each layer). So each layer's backward
  // ends with its gradients' casts back to param_dtype, and their reduce-scatters follow the
  // layer instead of waiting for the whole backward pass.
  std::string W(const std::string& name) {
    if (train_.param_dtype == train_.dtype) return name;
    const std::string copy = N(name + "_c");
    if (!cast_.insert(copy).second) return copy;
    OpSpec cast;
    cast.kind = OpKind::kConvert;
    cast.in = {name};
    cast.out = {copy};
    cast.dtype = std::string(DTypeName(train_.dtype));
    return pb_.Add(std::move(cast));
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const Parameter& p : params_) names.push_back(p.name);
    return names;
  }

  std::string Op(OpKind kind, std::vector<std::string> in, std::string out) {
    OpSpec op;
    op.kind = kind;
    op.in = std::move(in);
    op.out = {std::move(out)};
    return pb_.Add(std::move(op));
  }

  std::string Scalar(OpKind kind, const std::string& x, double scalar, std::string out = "") {
    OpSpec op;
    op.kind = kind;
    op.in = {x};
    op.scalar = scalar;
    if (!out.empty()) op.out = {std::move(out)};
    return pb_.Add(std::move(op));
  }

  std::string Norm(const std::string& x, const std::string& scale, std::string out) {
    return Op(model_.norm == NormKind::kRms ? OpKind::kRmsNorm : OpKind::kLayerNorm, {x, scale},
              std::move(out));
  }

  // The residual stream held as [batch, length, activation_embed] (MaxText's activation
  // constraints): data and FSDP keep each device's sequences (the weights are gathered, not the
  // batch), sequence parallelism its sequence shard, activation_embed its d_model shard. None
  // when none of them is split.
  std::string Residual(const std::string& x, std::string out) {
    return Constrain(x, {"batch", "length", "activation_embed"}, std::move(out));
  }

  // x constrained to the rules' sharding of logical dimensions `dims` (x itself when the rules
  // split none of them).
  std::string Constrain(const std::string& x, const std::vector<std::string>& dims,
                        std::string out) {
    bool split = false;
    for (const std::string& d : dims) split = split || (!d.empty() && !rules_.Axes(d).empty());
    if (!split) return x;
    OpSpec op;
    op.kind = OpKind::kShardingConstraint;
    op.in = {x};
    op.out = {std::move(out)};
    op.sharding = rules_.Spec(dims);
    return pb_.Add(std::move(op));
  }

  std::string Layer(std::string x, int64_t layer) {
    const std::string L = std::to_string(layer);
    x = Residual(x, N("r" + L));
    checkpoints_["decoder_layer_input"] = x;
    const std::string na = Norm(x, W("attn_norm" + L), N("n" + L + "a"));
    const std::string q = Linear("btd,dhk->bthk", na, "wq" + L, N("q" + L));
    const std::string k = Linear("btd,dhk->bthk", na, "wk" + L, N("k" + L));
    const std::string v = Linear("btd,dhk->bthk", na, "wv" + L, N("v" + L));
    checkpoints_["query_proj"] = q;
    checkpoints_["key_proj"] = k;
    checkpoints_["value_proj"] = v;
    // Serving: prefill returns each layer's keys and values (the cache); decode attends over
    // the cache (the new token's own key and value are returned to be written into it, as an
    // in-place cache update does, and not attended: one position of the context) instead.
    std::string keys = k, values = v;
    if (kind_ != StepKind::kTrain) {
      // Written into the cache in its type (a conversion fused into the kernel writing them).
      for (const std::string& kv : {k, v}) {
        if (kv_dtype_ == train_.dtype) {
          cache_out_.push_back(kv);
          continue;
        }
        cache_out_.push_back(Cast(kv, kv + "_cache", kv_dtype_, /*fused=*/true));
      }
    }
    if (kind_ == StepKind::kDecode) {
      keys = KvCacheName(true, layer);
      values = KvCacheName(false, layer);
    }
    OpSpec attention;
    attention.kind = OpKind::kAttention;
    attention.in = {q, keys, values};
    attention.out = {N("a" + L)};
    attention.kernel =
        model_.attention == "mmha" && kind_ != StepKind::kDecode ? "flash" : model_.attention;
    const std::string a = pb_.Add(std::move(attention));
    checkpoints_["context"] = a;
    const std::string o = Linear("bthk,hkd->btd", a, "wo" + L, N("o" + L));
    checkpoints_["out_proj"] = o;
    std::string h = Op(OpKind::kAdd, {x, o}, N("h" + L));
    h = Residual(h, N("hc" + L));
    const std::string nm = Norm(h, W("mlp_norm" + L), N("n" + L + "m"));
    const std::string down = IsMoeLayer(model_, layer)
                                 ? MixtureOfExperts(nm, L)
                                 : FeedForward(nm, "w", L, "btd,df->btf", "btf,fd->btd", "");
    return Op(OpKind::kAdd, {h, down}, N("y" + L));
  }

  // optax.adam's first step from zero moments (b1 0.9, b2 0.999, eps 1e-8): m = (1 - b1) g,
  // v = (1 - b2) g^2 written as the general updates m = b1 m + (1 - b1) g, v = b2 v +
  // (1 - b2) g^2 so the moments are real state; bias corrections 1 - b1 and 1 - b2 (t = 1);
  // w -= lr m_hat / (sqrt(v_hat) + eps).
  void Adam(const Parameter& p) {
    constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const std::string g = "d_" + p.name, m = "m_" + p.name, v = "v_" + p.name;
    pb_.Input(m, p.shape, train_.param_dtype, p.spec);
    pb_.Input(v, p.shape, train_.param_dtype, p.spec);
    const std::string m_new = Op(
        OpKind::kAdd, {Scalar(OpKind::kMul, m, b1), Scalar(OpKind::kMul, g, 1 - b1)}, m + "_new");
    const std::string g2 = Op(OpKind::kSquare, {g}, g + "_sq");
    const std::string v_new = Op(
        OpKind::kAdd, {Scalar(OpKind::kMul, v, b2), Scalar(OpKind::kMul, g2, 1 - b2)}, v + "_new");
    const std::string root = Op(OpKind::kSqrt, {Scalar(OpKind::kDiv, v_new, 1 - b2)}, v + "_root");
    const std::string den = Scalar(OpKind::kAdd, root, eps);
    const std::string update =
        Op(OpKind::kDiv, {Scalar(OpKind::kDiv, m_new, 1 - b1), den}, p.name + "_update");
    const std::string step = Scalar(OpKind::kMul, update, train_.learning_rate);
    pb_.Output(Op(OpKind::kSub, {p.name, step}, p.name + "_new"), p.spec);
    pb_.Output(m_new, p.spec);
    pb_.Output(v_new, p.spec);
  }

  const TransformerConfig& model_;
  const MlpModel* mlp_ = nullptr;  // Set: an MLP classifier instead of the transformer.
  const TrainConfig& train_;
  const LogicalRules& rules_;
  const std::vector<MeshAxis>& axes_;
  std::vector<std::vector<std::string>>* layer_values_;  // Per layer: its values (or null).
  // Per layer: its values by MaxText's checkpoint names (or null).
  std::vector<std::map<std::string, std::string>>* layer_checkpoints_;
  std::map<std::string, std::string> checkpoints_;  // The current layer's so far.
  // Per microbatch and vocabulary tile: its logits' and loss's values (or null).
  std::vector<std::vector<std::string>>* head_tiles_;
  ProgramBuilder pb_;
  std::vector<Parameter> params_;
  std::string sfx_;                    // The current microbatch's suffix ("" with one).
  std::string aux_;                    // The microbatch's load-balancing losses so far ("" none).
  std::set<std::string> cast_;         // Compute-dtype copies made so far.
  DType linear_dtype_ = train_.dtype;  // The linear layers' GEMM type.
  DType kv_dtype_ = train_.dtype;      // Serving: the KV cache's type.
  std::map<std::string, std::string> quantized_;  // Value -> its copy in linear_dtype_.
  StepKind kind_ = StepKind::kTrain;
  int64_t group_tokens_ = 0;            // Tokens per sequence: a MoE routing group.
  int64_t moe_batch_ = 0;               // Sequences of a microbatch (serving: of the batch).
  std::vector<std::string> cache_out_;  // Serving: the keys and values each layer returns.
  uint64_t seed_ = 0;
};

void Check(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// Refuses a model that does not fit together (sizes, heads over kv heads, MoE).
void CheckModel(const TransformerConfig& model) {
  Check(model.layers >= 1 && model.d_model >= 1 && model.heads >= 1 && model.kv_heads >= 1 &&
            model.head_dim >= 1 && model.d_ff >= 1 && model.vocab >= 1,
        "transformer sizes must be >= 1");
  Check(model.heads % model.kv_heads == 0, "heads (" + std::to_string(model.heads) +
                                               ") must be a multiple of kv_heads (" +
                                               std::to_string(model.kv_heads) + ")");
  Check(model.router_aux_loss >= 0 && std::isfinite(model.router_aux_loss),
        "router_aux_loss must be a finite number >= 0");
  Check(model.experts > 0 || model.router_aux_loss == 0,
        "router_aux_loss balances the experts' routers: give experts too");
  if (model.experts == 0) return;
  Check(model.top_k >= 1 && model.top_k <= model.experts, "top_k (" + std::to_string(model.top_k) +
                                                              ") must be in [1, experts (" +
                                                              std::to_string(model.experts) + ")]");
  Check(std::isfinite(model.capacity_factor),
        "capacity_factor must be a finite number (> 0, or <= 0 for dropless routing)");
  Check(std::isfinite(model.ragged_buffer_factor),
        "ragged_buffer_factor must be a finite number (> 0, or <= 0 for the worst case)");
  Check(model.ragged_buffer_factor <= 0 || model.capacity_factor <= 0,
        "ragged_buffer_factor bounds dropless routing's buffers: give capacity_factor: -1 too");
  Check(model.shared_experts >= 0 && model.expert_d_ff >= 0 && model.dense_layers >= 0 &&
            model.dense_layers <= model.layers,
        "shared_experts and expert_d_ff must be >= 0, dense_layers in [0, layers]");
}

}  // namespace

bool IsMoeLayer(const TransformerConfig& model, int64_t layer) {
  return model.experts > 0 && layer >= model.dense_layers;
}

int64_t ExpertDff(const TransformerConfig& model) {
  return model.expert_d_ff > 0 ? model.expert_d_ff : model.d_ff;
}

int64_t ExpertCapacity(const TransformerConfig& model, int64_t group_tokens) {
  // ceil(T k cf / E) in double: T k cf stays far below 2^53, the product exact enough.
  const double even = static_cast<double>(group_tokens) * static_cast<double>(model.top_k) /
                      static_cast<double>(model.experts);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(even * model.capacity_factor)));
}

std::string KvCacheName(bool keys, int64_t layer) {
  return (keys ? "k_cache" : "v_cache") + std::to_string(layer);
}

bool IsStageBoundary(const std::string& name) {
  return name.rfind("x_in", 0) == 0 || name.rfind("g_out", 0) == 0;
}

bool IsKvCache(const std::string& name) {
  return name.rfind("k_cache", 0) == 0 || name.rfind("v_cache", 0) == 0;
}

int PrefetchGroups(int64_t layers, const TrainConfig& train) {
  return static_cast<int>(2 * train.microbatches * layers);
}

ProgramSpec BuildServeStep(const TransformerConfig& model, const ServeConfig& serve, ServeStep step,
                           const std::vector<MeshAxis>& axes, const LogicalRules& rules,
                           std::vector<std::vector<std::string>>* layer_values) {
  CheckModel(model);
  Check(serve.batch >= 1 && serve.prompt_len >= 1 && serve.decode_len >= 0 && serve.context >= 1,
        "serve batch, prompt_len and context must be >= 1, decode_len >= 0");
  TrainConfig numerics;  // The builder's dtypes: parameters are served in the compute dtype.
  numerics.batch = serve.batch;
  numerics.dtype = numerics.param_dtype = serve.dtype;
  if (layer_values) layer_values->clear();
  return TrainStepBuilder(model, numerics, axes, rules, layer_values)
      .BuildServe(step == ServeStep::kPrefill ? StepKind::kPrefill : StepKind::kDecode, serve);
}

ProgramSpec BuildMlpTrainStep(const MlpModel& mlp, const TrainConfig& train,
                              const std::vector<MeshAxis>& axes, const LogicalRules& rules) {
  Check(mlp.layer_sizes.size() >= 2, "an MLP needs at least two layer sizes (inputs, classes)");
  for (int64_t n : mlp.layer_sizes) Check(n >= 1, "MLP layer sizes must be >= 1");
  Check(mlp.activation == MlpKind::kRelu || mlp.activation == MlpKind::kGelu,
        "an MLP's activation is relu or gelu");
  Check(train.batch >= 1, "the batch must be >= 1");
  Check(!train.layers_only, "an MLP's step has no decoder layers to run alone");
  Check(train.microbatches >= 1 && train.batch % train.microbatches == 0,
        "microbatches (" + std::to_string(train.microbatches) + ") must divide the batch (" +
            std::to_string(train.batch) + ")");
  const TransformerConfig unused;
  TrainStepBuilder builder(unused, train, axes, rules, nullptr);
  builder.SetMlp(mlp);
  return std::move(builder).Build();
}

ProgramSpec BuildTrainStep(const TransformerConfig& model, const TrainConfig& train,
                           const std::vector<MeshAxis>& axes, const LogicalRules& rules,
                           std::vector<std::vector<std::string>>* layer_values,
                           std::vector<std::map<std::string, std::string>>* layer_checkpoints,
                           std::vector<std::vector<std::string>>* head_tiles) {
  CheckModel(model);
  Check(train.batch >= 1 && train.seq_len >= 1, "batch and seq_len must be >= 1");
  Check(train.microbatches >= 1 && train.batch % train.microbatches == 0,
        "microbatches (" + std::to_string(train.microbatches) + ") must divide the batch (" +
            std::to_string(train.batch) + ")");
  Check(!train.forward_only || train.microbatches == 1, "a forward-only step runs one microbatch");
  Check(!train.layers_only || train.vocab_tiling == 1,
        "a step of the layers alone has no logits to tile");
  if (layer_values) layer_values->clear();
  Check(train.vocab_tiling >= 1 && train.seq_len % train.vocab_tiling == 0,
        "vocab_tiling (" + std::to_string(train.vocab_tiling) + ") must divide seq_len (" +
            std::to_string(train.seq_len) + ")");
  if (layer_checkpoints) layer_checkpoints->clear();
  if (head_tiles) head_tiles->clear();
  return TrainStepBuilder(model, train, axes, rules, layer_values, layer_checkpoints, head_tiles)
      .Build();
}

}  // namespace shardsim::planner
