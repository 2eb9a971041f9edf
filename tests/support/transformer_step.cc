#include "tests/support/transformer_step.h"

#include <utility>
#include <vector>

namespace shardsim::testing {
namespace {

PartitionSpec Spec(std::vector<std::vector<std::string>> dims) {
  PartitionSpec spec;
  spec.dims = std::move(dims);
  return spec;
}

struct LayerWeights {
  std::string wq, wk, wv, wo, w1, w3, w2;
};

// Saved forward activations one layer's backward reads.
struct LayerSaved {
  std::string x, xn, q, k, v, p, o, h, hn, a, b, act, m;
};

}  // namespace

ProgramSpec BuildTransformerStep(const TransformerShape& s) {
  ProgramBuilder b({{"fsdp", s.fsdp}, {"tp", s.tp}});
  const DType dt = s.dtype;
  const int64_t bl = s.batch / s.fsdp;  // Sequences per device.
  const int64_t t = bl * s.seq;         // Tokens per device.
  const int64_t h = s.heads / s.tp, kv = s.kv_heads / s.tp, g = s.heads / s.kv_heads;
  const int64_t e = h * s.head_dim, ekv = kv * s.head_dim;
  const int64_t d = s.d_model;
  std::vector<LayerWeights> weights(s.layers);
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "l" + std::to_string(l) + "_";
    LayerWeights& w = weights[l];
    // Weights: rows (the model dimension) over fsdp, heads / d_ff over tp.
    w.wq = b.Input(p + "wq", {d, s.heads * s.head_dim}, dt, Spec({{"fsdp"}, {"tp"}}));
    w.wk = b.Input(p + "wk", {d, s.kv_heads * s.head_dim}, dt, Spec({{"fsdp"}, {"tp"}}));
    w.wv = b.Input(p + "wv", {d, s.kv_heads * s.head_dim}, dt, Spec({{"fsdp"}, {"tp"}}));
    w.wo = b.Input(p + "wo", {s.heads * s.head_dim, d}, dt, Spec({{"tp"}, {"fsdp"}}));
    w.w1 = b.Input(p + "w1", {d, s.d_ff}, dt, Spec({{"fsdp"}, {"tp"}}));
    w.w3 = b.Input(p + "w3", {d, s.d_ff}, dt, Spec({{"fsdp"}, {"tp"}}));
    w.w2 = b.Input(p + "w2", {s.d_ff, d}, dt, Spec({{"tp"}, {"fsdp"}}));
  }
  std::string x = b.Input("x", {s.batch * s.seq, d}, dt, Spec({{"fsdp"}}));
  auto gather_rows = [&](const std::string& w) { return b.AllGather(w, {"fsdp"}, 0, true); };
  auto gather_cols = [&](const std::string& w) { return b.AllGather(w, {"fsdp"}, 1, true); };
  auto reshape = [&](const std::string& v, Shape shape) {
    OpSpec op;
    op.kind = OpKind::kReshape;
    op.in = {v};
    op.shape = std::move(shape);
    return b.Add(std::move(op));
  };
  std::vector<LayerSaved> saved(s.layers);
  for (int l = 0; l < s.layers; ++l) {
    const LayerWeights& w = weights[l];
    LayerSaved& a = saved[l];
    a.x = x;
    a.xn = b.Binary(OpKind::kMul, x, x);
    a.q = b.Matmul(a.xn, gather_rows(w.wq));
    a.k = b.Matmul(a.xn, gather_rows(w.wk));
    a.v = b.Matmul(a.xn, gather_rows(w.wv));
    std::string q5 = reshape(a.q, {bl, s.seq, kv, g, s.head_dim});
    std::string k4 = reshape(a.k, {bl, s.seq, kv, s.head_dim});
    std::string v4 = reshape(a.v, {bl, s.seq, kv, s.head_dim});
    std::string scores = b.Einsum("bqhgd,bkhd->bhgqk", q5, k4);
    a.p = b.Unary(OpKind::kExp, scores);
    std::string o5 = b.Einsum("bhgqk,bkhd->bqhgd", a.p, v4);
    a.o = reshape(o5, {t, e});
    std::string attn = b.Reduce(OpKind::kPsum, b.Matmul(a.o, gather_cols(w.wo)), {"tp"});
    a.h = b.Binary(OpKind::kAdd, x, attn);
    a.hn = b.Binary(OpKind::kMul, a.h, a.h);
    a.a = b.Matmul(a.hn, gather_rows(w.w1));
    a.b = b.Matmul(a.hn, gather_rows(w.w3));
    a.act = b.Unary(OpKind::kGelu, a.a);
    a.m = b.Binary(OpKind::kMul, a.act, a.b);
    std::string down = b.Reduce(OpKind::kPsum, b.Matmul(a.m, gather_cols(w.w2)), {"tp"});
    x = b.Binary(OpKind::kAdd, a.h, down);
  }
  std::string dy = x;  // The loss gradient's stand-in: the same shape as the activations.
  std::vector<std::pair<std::string, PartitionSpec>> grads;
  for (int l = s.layers - 1; l >= 0; --l) {
    const LayerWeights& w = weights[l];
    const LayerSaved& a = saved[l];
    // MLP: dm = dy w2^T, dw2 = m^T dy (reduce-scattered over fsdp).
    std::string dm = b.Einsum("td,fd->tf", dy, gather_cols(w.w2));
    grads.push_back({b.PsumScatter(b.Einsum("tf,td->fd", a.m, dy), {"fsdp"}, 1, true),
                     Spec({{"tp"}, {"fsdp"}})});
    std::string dact = b.Binary(OpKind::kMul, dm, a.b);
    std::string db = b.Binary(OpKind::kMul, dm, a.act);
    std::string da = b.Binary(OpKind::kMul, dact, a.a);
    std::string dhn1 = b.Einsum("tf,df->td", da, gather_rows(w.w1));
    std::string dhn3 = b.Einsum("tf,df->td", db, gather_rows(w.w3));
    std::string dhn = b.Reduce(OpKind::kPsum, b.Binary(OpKind::kAdd, dhn1, dhn3), {"tp"});
    grads.push_back({b.PsumScatter(b.Einsum("td,tf->df", a.hn, da), {"fsdp"}, 0, true),
                     Spec({{"fsdp"}, {"tp"}})});
    grads.push_back({b.PsumScatter(b.Einsum("td,tf->df", a.hn, db), {"fsdp"}, 0, true),
                     Spec({{"fsdp"}, {"tp"}})});
    std::string dh = b.Binary(OpKind::kAdd, dy, b.Binary(OpKind::kMul, dhn, a.h));
    // Attention: do = dh wo^T, dwo = o^T dh.
    std::string d_o = b.Einsum("td,ed->te", dh, gather_cols(w.wo));
    grads.push_back({b.PsumScatter(b.Einsum("te,td->ed", a.o, dh), {"fsdp"}, 1, true),
                     Spec({{"tp"}, {"fsdp"}})});
    std::string do5 = reshape(d_o, {bl, s.seq, kv, g, s.head_dim});
    std::string k4 = reshape(a.k, {bl, s.seq, kv, s.head_dim});
    std::string v4 = reshape(a.v, {bl, s.seq, kv, s.head_dim});
    std::string q5 = reshape(a.q, {bl, s.seq, kv, g, s.head_dim});
    std::string dp = b.Einsum("bqhgd,bkhd->bhgqk", do5, v4);
    std::string dv = b.Einsum("bhgqk,bqhgd->bkhd", a.p, do5);
    std::string ds = b.Binary(OpKind::kMul, dp, a.p);
    std::string dq = b.Einsum("bhgqk,bkhd->bqhgd", ds, k4);
    std::string dk = b.Einsum("bhgqk,bqhgd->bkhd", ds, q5);
    std::string dq2 = reshape(dq, {t, e});
    std::string dk2 = reshape(dk, {t, ekv});
    std::string dv2 = reshape(dv, {t, ekv});
    std::string dxq = b.Einsum("te,de->td", dq2, gather_rows(w.wq));
    std::string dxk = b.Einsum("te,de->td", dk2, gather_rows(w.wk));
    std::string dxv = b.Einsum("te,de->td", dv2, gather_rows(w.wv));
    std::string dxn = b.Reduce(
        OpKind::kPsum, b.Binary(OpKind::kAdd, b.Binary(OpKind::kAdd, dxq, dxk), dxv), {"tp"});
    grads.push_back({b.PsumScatter(b.Einsum("td,te->de", a.xn, dq2), {"fsdp"}, 0, true),
                     Spec({{"fsdp"}, {"tp"}})});
    grads.push_back({b.PsumScatter(b.Einsum("td,te->de", a.xn, dk2), {"fsdp"}, 0, true),
                     Spec({{"fsdp"}, {"tp"}})});
    grads.push_back({b.PsumScatter(b.Einsum("td,te->de", a.xn, dv2), {"fsdp"}, 0, true),
                     Spec({{"fsdp"}, {"tp"}})});
    dy = b.Binary(OpKind::kAdd, dh, b.Binary(OpKind::kMul, dxn, a.x));
  }
  b.Output(dy, Spec({{"fsdp"}}));
  for (auto& [grad, spec] : grads) b.Output(grad, spec);
  return std::move(b).Build();
}

}  // namespace shardsim::testing
