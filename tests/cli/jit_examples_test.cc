// The examples of configs/jit/: for each, the collectives the partitioner must insert (kind,
// mesh axes, bytes each device sends in), derived by hand beside the entry from the shapes and
// shardings; every example passes its numerics check (the large ones with their dimensions
// made smaller through --set, the same program) and round-trips through `shardsim lower` to
// the same simulated time and outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

// An inserted collective: op, mesh axes, bytes of its input on one device.
struct Coll {
  std::string op;
  std::vector<std::string> axes;
  int64_t bytes;
  bool operator<(const Coll& o) const {
    return std::tie(op, axes, bytes) < std::tie(o.op, o.axes, o.bytes);
  }
  bool operator==(const Coll&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Coll& c) {
  os << c.op << " over";
  for (const std::string& a : c.axes) os << " " << a;
  return os << " (" << c.bytes << " B)";
}

struct Example {
  std::vector<Coll> collectives;  // At the file's own sizes, in any order.
  // --set overrides making the example small enough to check on CPU; empty: as written.
  std::vector<std::string> smaller;
};

constexpr int64_t kF32 = 4;

// The seed MLP at batch 64 and hidden 64 (784 inputs and 10 classes kept).
const std::vector<std::string> kSmallerSeedMlp = {
    "--set", "arrays.x.shape=[64,784]",  "--set", "arrays.labels.shape=[64]",
    "--set", "arrays.w1.shape=[784,64]", "--set", "arrays.w2.shape=[64,64]",
    "--set", "arrays.w3.shape=[64,64]",  "--set", "arrays.w4.shape=[64,10]"};

// Two Llama layers at d 64, 8 heads of 8, ff 128, 16 tokens, in f32 (bf16 through attention
// and the norms of data this large leaves the error bound infinite: no check).
std::vector<std::string> SmallerLlama() {
  std::vector<std::string> set = {"--set", "arrays.x.shape=[1,16,64]", "--set",
                                  "arrays.x.dtype=f32"};
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"attn_norm", "[64]"},  {"mlp_norm", "[64]"}, {"wq", "[64,8,8]"},
      {"wk", "[64,8,8]"},     {"wv", "[64,8,8]"},   {"wo", "[8,8,64]"},
      {"w_gate", "[64,128]"}, {"w_up", "[64,128]"}, {"w_down", "[128,64]"}};
  for (int layer = 0; layer < 2; ++layer) {
    for (const auto& [name, shape] : shapes) {
      const std::string key = "arrays." + name + std::to_string(layer);
      set.insert(set.end(), {"--set", key + ".shape=" + shape, "--set", key + ".dtype=f32"});
    }
  }
  return set;
}

// transformer_fsdp8's collectives: per parameter (elements), an all_gather of its eighth in
// the forward and again in the backward (all but the embedding table, which take's gradient
// does not read), a psum_scatter of its whole gradient; the loss's psum.
std::vector<Coll> FsdpTransformer() {
  std::vector<int64_t> params = {128 * 64, 64, 64 * 128};  // embed, final_norm, unembed.
  for (int layer = 0; layer < 2; ++layer) {
    // attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down.
    for (int64_t n : {64, 64 * 64, 64 * 64, 64 * 64, 64 * 64, 64, 64 * 128, 64 * 128, 128 * 64}) {
      params.push_back(n);
    }
  }
  std::vector<Coll> c = {{"psum", {"fsdp"}, 4}};
  for (size_t p = 0; p < params.size(); ++p) {
    const int64_t n = params[p];
    for (int pass = p == 0 ? 1 : 0; pass < 2; ++pass) {
      c.push_back({"all_gather", {"fsdp"}, n / 8 * kF32});
    }
    c.push_back({"psum_scatter", {"fsdp"}, n * kF32});
  }
  return c;
}

// transformer_fsdp4_tp2's collectives (the header of the example derives them).
std::vector<Coll> FsdpTpTransformer() {
  const int64_t b = 8 / 4, t = 16, d = 64, v = 128;  // Batch per fsdp position.
  std::vector<Coll> c = {
      {"all_gather", {"tp"}, v / 2 * d / 4 * kF32},    // embed [128@tp, 64@fsdp]: take reads
      {"all_gather", {"fsdp"}, v * d / 4 * kF32},      // it whole.
      {"all_gather", {"fsdp"}, d / 4 * v / 2 * kF32},  // unembed's [64/4, 128/2] block,
      {"all_gather", {"fsdp"}, d / 4 * v / 2 * kF32},  // forward and backward.
      {"all_gather", {"tp"}, b * t * v / 2 * kF32},    // logits: the loss reads vocab whole,
      {"all_gather", {"tp"}, b * t * v / 2 * kF32},    // forward and backward; d_logits is
      {"psum", {"tp"}, b * t * d * kF32},              // constrained back to its tp block, so
      {"psum", {"fsdp"}, 4},                           // d_xf is partial over tp. The loss.
      {"psum_scatter", {"fsdp"}, v / 2 * d * kF32},    // d_embed's tp block: ids on fsdp.
      {"psum_scatter", {"fsdp"}, d * v / 2 * kF32},    // d_unembed's tp block.
  };
  // Every weight but the embedding is gathered in the forward and again in the backward.
  for (int norm = 0; norm < 5; ++norm) {  // attn_norm, mlp_norm per layer; final_norm.
    c.push_back({"all_gather", {"fsdp"}, d / 4 * kF32});
    c.push_back({"all_gather", {"fsdp"}, d / 4 * kF32});
    c.push_back({"psum_scatter", {"fsdp"}, d * kF32});
    // The norms' cotangents are partial over tp.
    c.push_back({"psum", {"tp"}, d / 4 * kF32});
  }
  for (int layer = 0; layer < 2; ++layer) {
    for (int w = 0; w < 4; ++w) {  // wq, wk, wv [64, 8, 8]; wo [8, 8, 64]: 4096 elements.
      c.push_back({"all_gather", {"fsdp"}, 64 * 64 / 8 * kF32});
      c.push_back({"all_gather", {"fsdp"}, 64 * 64 / 8 * kF32});
      c.push_back({"psum_scatter", {"fsdp"}, 64 * 64 / 2 * kF32});
    }
    for (int w = 0; w < 3; ++w) {  // w_gate, w_up [64, 128]; w_down [128, 64].
      c.push_back({"all_gather", {"fsdp"}, 64 * 128 / 8 * kF32});
      c.push_back({"all_gather", {"fsdp"}, 64 * 128 / 8 * kF32});
      c.push_back({"psum_scatter", {"fsdp"}, 64 * 128 / 2 * kF32});
    }
    // Forward: after o and w_down; backward: the residual cotangents after q/k/v and gate/up.
    for (int k = 0; k < 4; ++k) c.push_back({"psum", {"tp"}, b * t * d * kF32});
  }
  return c;
}

// transformer_dp2_tp4_sp's collectives (the header of the example derives them).
std::vector<Coll> SequenceParallelTransformer() {
  const int64_t b = 8 / 2, t = 16 / 4, d = 64, v = 128;  // Batch per data, length per tp.
  std::vector<Coll> c = {
      {"all_gather", {"data"}, b * t * v * kF32},    // The logits for the loss,
      {"all_gather", {"tp"}, 2 * b * t * v * kF32},  // then over the sequence;
      {"all_gather", {"data"}, b * t * 4},           // the labels (i32) alike;
      {"all_gather", {"tp"}, 2 * b * t * 4},
      {"all_gather", {"data"}, b * t * v * kF32},    // d_logits and the final normed input
      {"all_gather", {"tp"}, 2 * b * t * v * kF32},  // for d_unembed (replicated);
      {"all_gather", {"data"}, b * t * d * kF32},
      {"all_gather", {"tp"}, 2 * b * t * d * kF32},
      {"all_gather", {"data"}, b * t * d * kF32},    // d_x0 for the embedding gradient,
      {"all_gather", {"tp"}, 2 * b * t * d * kF32},  // and the ids.
      {"all_gather", {"data"}, b * t * 4},
      {"all_gather", {"tp"}, 2 * b * t * 4},
  };
  for (int norm = 0; norm < 5; ++norm) c.push_back({"psum", {"data", "tp"}, d * kF32});
  for (int layer = 0; layer < 2; ++layer) {
    for (int w = 0; w < 4; ++w) c.push_back({"psum", {"data"}, 64 * 64 / 4 * kF32});
    for (int w = 0; w < 3; ++w) c.push_back({"psum", {"data"}, 64 * 128 / 4 * kF32});
    // Two blocks, forward and backward: gather the sequence in, scatter it out; the
    // backward gathers each block's normed input again for its weight gradients.
    for (int k = 0; k < 4; ++k) {
      c.push_back({"all_gather", {"tp"}, b * t * d * kF32});
      c.push_back({"psum_scatter", {"tp"}, b * 4 * t * d * kF32});
    }
    for (int k = 0; k < 2; ++k) c.push_back({"all_gather", {"tp"}, b * t * d * kF32});
  }
  return c;
}

std::map<std::string, Example> Examples() {
  // The seed MLP: x [8192, 784], w1 [784, 8192], w2 and w3 [8192, 8192], w4 [8192, 10].
  const int64_t b = 8192, i = 784, h = 8192, c = 10;
  // The notebook's small MLP: x [512, 32], w1 [32, 128], w2 [128, 256], w3 [256, 128],
  // w4 [128, 4].
  const int64_t sb = 512, s0 = 32, s1 = 128, s2 = 256, s3 = 128, s4 = 4;
  const int64_t kBf16 = 2;
  return {
      // Megatron TP over 8: attention's wo and the MLP's w_down contract the tp-split heads
      // and ff; their [1, 2048, 4096] bf16 outputs psummed over tp, two per layer.
      {"llama2_7b_tp8_forward",
       {{{"psum", {"tp"}, 2048 * 4096 * kBf16},
         {"psum", {"tp"}, 2048 * 4096 * kBf16},
         {"psum", {"tp"}, 2048 * 4096 * kBf16},
         {"psum", {"tp"}, 2048 * 4096 * kBf16}},
        SmallerLlama()}},
      // FSDP over 8 of the small transformer: each parameter's block gathered over fsdp,
      // each gradient psum_scattered (whole parameter in), the loss psummed.
      {"transformer_fsdp8", {FsdpTransformer(), {}}},
      {"transformer_fsdp4_tp2", {FsdpTpTransformer(), {}}},
      {"transformer_dp2_tp4_sp", {SequenceParallelTransformer(), {}}},
      // An elementwise op keeps In's sharding: nothing to insert.
      {"sin", {{}, {}}},
      // h = ragged_dot(x, w) with k split: its partial sums psummed once ([8, 32] f32); the
      // backward pass gathers w2's transpose (split on its k) for d h's ragged_dot.
      // Teacher [256, 512] -> 2048@tp -> 64 on mesh infer, student on mesh train with the batch
      // over dp. The teacher's products over the split 2048 are partial sums: one psum over tp
      // of [256, 64] before its device_put, one for the next batch's output. The student's
      // loss (a mean over rows split over dp) psums 4 B; its gradient of w2 ([256, 64]) is
      // psummed over dp, while for w1 ([512, 256], 512 KiB) auto mode prices gathering the
      // batch ([64, 512] blocks) and the cotangent ([64, 256] blocks) over dp as cheaper than
      // psumming the gradient, and gathers them. device_put inserts nothing: it is written.
      {"teacher_student",
       {{{"psum", {"tp"}, 256 * 64 * kF32},
         {"psum", {"tp"}, 256 * 64 * kF32},
         {"psum", {"dp"}, 4},
         {"psum", {"dp"}, 256 * 64 * kF32},
         {"all_gather", {"dp"}, 64 * 512 * kF32},
         {"all_gather", {"dp"}, 64 * 256 * kF32}},
        {}}},
      // Layer 1 [256, 512] x [512, 1024@tp] on mesh a, layer 2 [1024, 64] and the loss on
      // mesh b over dp. Both device_puts (the activations forward, their cotangent back to
      // P(None, 'tp') on a) are written or made by grad, not inserted; on b, the loss (4 B) and
      // w2's update ([1024, 64] f32, partial over dp) are psummed over dp; a needs nothing: the
      // cotangent lands column-split, as w1's gradient is.
      {"two_mesh_pipeline", {{{"psum", {"dp"}, 1024 * 64 * kF32}, {"psum", {"dp"}, 4}}, {}}},
      {"ragged_dot_tp_grad",
       {{{"psum", {"tp"}, 8 * 32 * kF32}, {"all_gather", {"tp"}, 2 * 8 * 32 * kF32}}, {}}},
      // einsum('bd,df->bf') with In [2048@X, 4096@Y], W [4096@Y, 1024]: local products of
      // [512, 1024] summed over Y for out P('X', None).
      {"einsum_auto", {{{"psum", {"Y"}, 512 * 1024 * kF32}}, {}}},
      // The same once W is resharded to P('Y', None) (a local slice of the replicated W).
      {"einsum_explicit", {{{"psum", {"Y"}, 512 * 1024 * kF32}}, {}}},
      // DP over 8 on 32-128-4: each weight gradient psummed over dp (its bytes), the loss 4 B.
      {"mlp_dp_grad",
       {{{"psum", {"dp"}, 4}, {"psum", {"dp"}, 32 * 128 * kF32}, {"psum", {"dp"}, 128 * 4 * kF32}},
        {}}},
      // DP over 8: one psum over dp per weight gradient, their bytes the parameters' bytes.
      {"mlp_seed_dp",
       {{{"psum", {"dp"}, 4},
         {"psum", {"dp"}, i * h * kF32},
         {"psum", {"dp"}, h * h * kF32},
         {"psum", {"dp"}, h * h * kF32},
         {"psum", {"dp"}, h * c * kF32}},
        kSmallerSeedMlp}},
      // FSDP over 8: each weight's [rows / 8, cols] block all-gathered, and again in the
      // backward for the activations' cotangents (all but w1: x is not differentiated); each
      // gradient (whole, partial over fsdp) psum_scattered.
      {"mlp_seed_fsdp",
       {{{"all_gather", {"fsdp"}, i / 8 * h * kF32},
         {"all_gather", {"fsdp"}, h / 8 * h * kF32},
         {"all_gather", {"fsdp"}, h / 8 * h * kF32},
         {"all_gather", {"fsdp"}, h / 8 * c * kF32},
         {"all_gather", {"fsdp"}, h / 8 * h * kF32},
         {"all_gather", {"fsdp"}, h / 8 * h * kF32},
         {"all_gather", {"fsdp"}, h / 8 * c * kF32},
         {"psum_scatter", {"fsdp"}, i * h * kF32},
         {"psum_scatter", {"fsdp"}, h * h * kF32},
         {"psum_scatter", {"fsdp"}, h * h * kF32},
         {"psum_scatter", {"fsdp"}, h * c * kF32},
         {"psum", {"fsdp"}, 4}},
        kSmallerSeedMlp}},
      // dp 4 x tp 2: z2, the logits (forward) and dh2 (backward) psummed over tp on a quarter
      // of the batch; each gradient's tp block psummed over dp.
      {"mlp_seed_dp4_tp2",
       {{{"psum", {"tp"}, b / 4 * h * kF32},
         {"psum", {"tp"}, b / 4 * c * kF32},
         {"psum", {"tp"}, b / 4 * h * kF32},
         {"psum", {"dp"}, 4},
         {"psum", {"dp"}, i * h / 2 * kF32},
         {"psum", {"dp"}, h / 2 * h * kF32},
         {"psum", {"dp"}, h * h / 2 * kF32},
         {"psum", {"dp"}, h / 2 * c * kF32}},
        kSmallerSeedMlp}},
      {"mlp_small_dp",
       {{{"psum", {"dp"}, s0 * s1 * kF32},
         {"psum", {"dp"}, s1 * s2 * kF32},
         {"psum", {"dp"}, s2 * s3 * kF32},
         {"psum", {"dp"}, s3 * s4 * kF32},
         {"psum", {"dp"}, 4}},
        {}}},
      {"mlp_small_fsdp",
       {{{"all_gather", {"fsdp"}, s0 / 8 * s1 * kF32},
         {"all_gather", {"fsdp"}, s1 / 8 * s2 * kF32},
         {"all_gather", {"fsdp"}, s2 / 8 * s3 * kF32},
         {"all_gather", {"fsdp"}, s3 / 8 * s4 * kF32},
         {"all_gather", {"fsdp"}, s1 / 8 * s2 * kF32},  // The backward's, as mlp_seed_fsdp.
         {"all_gather", {"fsdp"}, s2 / 8 * s3 * kF32},
         {"all_gather", {"fsdp"}, s3 / 8 * s4 * kF32},
         {"psum_scatter", {"fsdp"}, s0 * s1 * kF32},
         {"psum_scatter", {"fsdp"}, s1 * s2 * kF32},
         {"psum_scatter", {"fsdp"}, s2 * s3 * kF32},
         {"psum_scatter", {"fsdp"}, s3 * s4 * kF32},
         {"psum", {"fsdp"}, 4}},
        {}}},
      // TP over 8, whole batch: z2 [512, 256], logits [512, 4], dh2 [512, 256].
      {"mlp_small_tp",
       {{{"psum", {"tp"}, sb * s2 * kF32},
         {"psum", {"tp"}, sb * s4 * kF32},
         {"psum", {"tp"}, sb * s2 * kF32}},
        {}}},
      // fsdp 4 x tp 2: each weight's block ([rows/4 or /2, cols/2 or /4]) gathered over fsdp
      // to its tp block (w2..w4 again in the backward); TP's psums on 128 rows; each
      // gradient's tp block, partial over fsdp, psum_scattered.
      {"mlp_small_fsdp_tp",
       {{{"all_gather", {"fsdp"}, s0 / 4 * s1 / 2 * kF32},
         {"all_gather", {"fsdp"}, s1 / 2 * s2 / 4 * kF32},
         {"all_gather", {"fsdp"}, s2 / 4 * s3 / 2 * kF32},
         {"all_gather", {"fsdp"}, s3 / 2 * s4 / 4 * kF32},
         {"all_gather", {"fsdp"}, s1 / 2 * s2 / 4 * kF32},
         {"all_gather", {"fsdp"}, s2 / 4 * s3 / 2 * kF32},
         {"all_gather", {"fsdp"}, s3 / 2 * s4 / 4 * kF32},
         {"psum", {"tp"}, sb / 4 * s2 * kF32},
         {"psum", {"tp"}, sb / 4 * s4 * kF32},
         {"psum", {"tp"}, sb / 4 * s2 * kF32},
         {"psum_scatter", {"fsdp"}, s0 * s1 / 2 * kF32},
         {"psum_scatter", {"fsdp"}, s1 / 2 * s2 * kF32},
         {"psum_scatter", {"fsdp"}, s2 * s3 / 2 * kF32},
         {"psum_scatter", {"fsdp"}, s3 / 2 * s4 * kF32},
         {"psum", {"fsdp"}, 4}},
        {}}},
      // The MoE dispatch in a shard_map region: its ragged_all_to_alls are the body's, written
      // rather than inserted, and the inputs take their in_specs without communication (the
      // embedding, replicated, is sliced to the rows the region wants before tanh).
      {"moe_dispatch", {{}, {}}},
      // 128-512-128 on data 2 x model 4, batch 64: y [32, 128] psummed over model; each
      // gradient's [128, 128] model block psummed once over data (both Adam moments read the
      // sum); the loss 4 B.
      {"flax_mlp_adam",
       {{{"psum", {"model"}, 32 * 128 * kF32},
         {"psum", {"data"}, 128 * 128 * kF32},
         {"psum", {"data"}, 128 * 128 * kF32},
         {"psum", {"data"}, 4}},
        {}}},
  };
}

class JitExampleTest : public CliFixture {
 protected:
  // `shardsim run` of `file` with `extra` arguments; the summary's JSON.
  nlohmann::json RunJson(const std::string& file, const std::string& tag,
                         std::vector<std::string> extra) {
    const std::string json = (out() / (tag + ".json")).string();
    std::vector<std::string> args = {"run", file, "--json", json};
    args.insert(args.end(), extra.begin(), extra.end());
    RunOk(args);
    return nlohmann::json::parse(ReadFile(json));
  }
};

std::vector<Coll> Inserted(const nlohmann::json& summary) {
  std::vector<Coll> out;
  for (const auto& op : summary["ops"]) {
    if (!op.contains("axis_name") || !op.contains("reason")) continue;
    out.push_back({op["op"], op["axis_name"].get<std::vector<std::string>>(), op["bytes"]});
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(JitExampleTest, EveryExampleInsertsWhatItShouldAndRoundTrips) {
  const std::map<std::string, Example> examples = Examples();
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(SourceDir()) / "configs" / "jit")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string stem = entry.path().stem().string();
    const std::string file = entry.path().string();
    SCOPED_TRACE(stem);
    const auto it = examples.find(stem);
    ASSERT_NE(it, examples.end()) << "configs/jit/" << stem << ".yaml has no entry here";
    ++seen;
    const Example& ex = it->second;
    // At its own size: the collectives, and the lowered file's simulated time.
    nlohmann::json full = RunJson(file, stem, {"--numerics", "off"});
    std::vector<Coll> want = ex.collectives;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(Inserted(full), want);
    const std::string lowered = (out() / (stem + "_lowered.yaml")).string();
    RunOk({"lower", file, "-o", lowered});
    EXPECT_NE(ReadFile(lowered).find("mode: manual"), std::string::npos);
    nlohmann::json again = RunJson(lowered, stem + "_lowered", {"--numerics", "off"});
    EXPECT_EQ(again["simulated_time_s"], full["simulated_time_s"]);
    // Numerics (smaller where the example is large), and the same outputs once lowered.
    const std::string dump = (out() / (stem + "_dump")).string();
    std::vector<std::string> check = {"--numerics", "on", "--dump", dump};
    check.insert(check.end(), ex.smaller.begin(), ex.smaller.end());
    nlohmann::json small = RunJson(file, stem + "_small", check);
    EXPECT_EQ(small["numerics"]["passed"], true);
    EXPECT_TRUE(small["numerics"]["tolerance"].is_number() &&
                std::isfinite(small["numerics"]["tolerance"].get<double>()))
        << "an infinite bound checks nothing";
    const std::string lowered_small = (out() / (stem + "_lowered_small.yaml")).string();
    std::vector<std::string> lower = {"lower", file, "-o", lowered_small};
    lower.insert(lower.end(), ex.smaller.begin(), ex.smaller.end());
    RunOk(lower);
    const std::string dump2 = (out() / (stem + "_lowered_dump")).string();
    nlohmann::json small2 =
        RunJson(lowered_small, stem + "_lowered_small", {"--numerics", "on", "--dump", dump2});
    EXPECT_EQ(small2["simulated_time_s"], small["simulated_time_s"]);
    for (const auto& npy : fs::directory_iterator(dump)) {
      EXPECT_EQ(ReadFile((fs::path(dump2) / npy.path().filename()).string()),
                ReadFile(npy.path().string()))
          << npy.path().filename();
    }
  }
  EXPECT_EQ(seen, static_cast<int>(examples.size())) << "an entry has no example file";
}

}  // namespace
}  // namespace shardsim::cli_test
