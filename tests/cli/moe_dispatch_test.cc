// configs/jit/moe_dispatch.yaml computed by hand: the seed's MoE layer under jit routes each
// token to its router's top-1 expert, drops those past the capacity, and returns each kept
// token as its expert's FFN of it and each dropped one as zeros. The example's numerics check
// compares the sharded run with the reference, which runs the same body; this test checks the
// body's algorithm itself against the layer's definition, and the gradients reverse mode takes
// through the region against the layer's derivative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "planner/partitioned_numerics.h"
#include "sim/cli/run_file.h"
#include "tests/cli/subprocess.h"

namespace shardsim {
namespace {

namespace fs = std::filesystem;

const fs::path kConfig = fs::path(cli_test::SourceDir()) / "configs/jit/moe_dispatch.yaml";
constexpr int kDevices = 4, kTokens = 8, kD = 16, kF = 32, kExperts = 4, kCapacity = 3;

// Each token's expert (its router's top-1: exact, the logits are small integers; ties take the
// lower expert) and whether it is kept (its place in its expert's queue on its device is at
// most the capacity).
struct Route {
  int expert = 0;
  bool kept = false;
};
std::vector<Route> Routes(const Array& x, const Array& wr) {
  std::vector<Route> routes;
  for (int dev = 0; dev < kDevices; ++dev) {
    std::vector<int> queue(kExperts, 0);  // Tokens of this device routed to each expert so far.
    for (int t = dev * kTokens; t < (dev + 1) * kTokens; ++t) {
      Route r;
      double best = -1e300;
      for (int e = 0; e < kExperts; ++e) {
        double logit = 0;
        for (int k = 0; k < kD; ++k) logit += x.ValueAt(t * kD + k) * wr.ValueAt(k * kExperts + e);
        if (logit > best) best = logit, r.expert = e;
      }
      r.kept = ++queue[static_cast<size_t>(r.expert)] <= kCapacity;
      routes.push_back(r);
    }
  }
  return routes;
}

// Token t's hidden pre-activations x_t W1[e] of its expert e.
std::vector<double> PreActivation(const Array& x, const Array& w1, int t, int expert) {
  std::vector<double> pre(kF, 0.0);
  for (int j = 0; j < kF; ++j) {
    for (int k = 0; k < kD; ++k) {
      pre[static_cast<size_t>(j)] += x.ValueAt(t * kD + k) * w1.ValueAt((expert * kD + k) * kF + j);
    }
  }
  return pre;
}

TEST(MoeDispatchExampleTest, KeptTokensAreTheirExpertsFfnAndDroppedOnesZero) {
  RunFile file = LoadRunFile(kConfig.string());
  ProgramSpec program = *file.program;
  for (const char* name : {"x", "wr", "w1", "w2"}) {
    program.outputs.push_back(OutputSpec{name, PartitionSpec{}, ""});
  }
  program.outputs.push_back(OutputSpec{"y", PartitionSpec{}, ""});
  const std::map<std::string, Array> v = planner::GlobalReference(program, "");
  const Array &x = v.at("x"), &wr = v.at("wr"), &w1 = v.at("w1"), &w2 = v.at("w2"), &y = v.at("y");
  const std::vector<Route> routes = Routes(x, wr);
  int dropped = 0;
  for (int t = 0; t < kDevices * kTokens; ++t) {
    const auto [expert, kept] = routes[static_cast<size_t>(t)];
    dropped += !kept;
    std::vector<double> hidden = PreActivation(x, w1, t, expert);
    for (double& h : hidden) h = std::max(0.0, h);
    for (int k = 0; k < kD; ++k) {
      double want = 0;
      for (int j = 0; j < kF; ++j) {
        want += hidden[static_cast<size_t>(j)] * w2.ValueAt((expert * kF + j) * kD + k);
      }
      // The layer sums 16 then 32 float32 products (rounding near 1e-7 each): 1e-5 relative
      // holds with room; a dropped token is exactly zero.
      const double tolerance = kept ? 1e-5 * (1 + std::fabs(want)) : 0;
      EXPECT_NEAR(y.ValueAt(t * kD + k), kept ? want : 0.0, tolerance)
          << "token " << t << " (expert " << expert << (kept ? "" : ", dropped") << ") dim " << k;
    }
  }
  // The data drops some tokens (so the capacity is exercised), not all.
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, kDevices * kTokens);
}

// jax.grad through the layer: loss = sum(residual * x), so token t's y has cotangent x_t (each
// row its own: a cotangent read from the wrong rows is wrong) and, by hand over the kept tokens
// T_e of expert e (hidden h_t = relu(x_t W1[e])),
//   d loss / d W2[e][j][k] = sum over T_e of h_t[j] x_t[k],
//   d loss / d W1[e][k][j] = sum over T_e of x_t[k] [x_t W1[e] > 0]_j sum_k' W2[e][j][k'] x_t[k'].
// The reverse pass runs through the region's transpose: the return trip's ragged_all_to_all
// sends each token's cotangent back to its expert (offsets exchanged by all_to_all), the
// ragged_dots' gradients, the take's and argsort's. Dropped tokens get none. The file with the
// loss and grad appended runs sharded with numerics on, and the check passes.
TEST(MoeDispatchExampleTest, GradientsThroughTheLayer) {
  const std::string text = cli_test::ReadFile(kConfig);
  const size_t outputs = text.find("\noutputs:");
  ASSERT_NE(outputs, std::string::npos);
  const std::string with_grad = text.substr(0, outputs) +
                                "\n  - {op: mul, in: [residual, x], out: weighted}"
                                "\n  - {op: sum, in: weighted, out: loss}"
                                "\n  - {op: grad, of: loss, wrt: [w1, w2], out: [dw1, dw2]}" +
                                text.substr(outputs) + "  dw1: \"P()\"\n  dw2: \"P()\"\n";
  const fs::path dir = fs::path(testing::TempDir()) / "moe_dispatch_grad";
  fs::create_directories(dir);
  const fs::path file_path = dir / "moe_dispatch_grad.yaml";
  cli_test::WriteFile(file_path, with_grad);
  RunFile file = LoadRunFile(file_path.string());
  ProgramSpec program = *file.program;
  for (const char* name : {"x", "wr", "w1", "w2"}) {
    program.outputs.push_back(OutputSpec{name, PartitionSpec{}, ""});
  }
  const std::map<std::string, Array> v = planner::GlobalReference(program, "");
  const Array &x = v.at("x"), &w1 = v.at("w1"), &w2 = v.at("w2");
  const Array &dw1 = v.at("dw1"), &dw2 = v.at("dw2");
  std::vector<double> want1(static_cast<size_t>(w1.size()), 0.0);
  std::vector<double> want2(static_cast<size_t>(w2.size()), 0.0);
  const std::vector<Route> routes = Routes(x, v.at("wr"));
  for (int t = 0; t < kDevices * kTokens; ++t) {
    const auto [e, kept] = routes[static_cast<size_t>(t)];
    if (!kept) continue;
    const std::vector<double> pre = PreActivation(x, w1, t, e);
    for (int j = 0; j < kF; ++j) {
      if (pre[static_cast<size_t>(j)] <= 0) continue;
      double row = 0;  // sum_k' W2[e][j][k'] x_t[k'].
      for (int k = 0; k < kD; ++k) {
        want2[static_cast<size_t>((e * kF + j) * kD + k)] +=
            pre[static_cast<size_t>(j)] * x.ValueAt(t * kD + k);
        row += w2.ValueAt((e * kF + j) * kD + k) * x.ValueAt(t * kD + k);
      }
      for (int k = 0; k < kD; ++k) {
        want1[static_cast<size_t>((e * kD + k) * kF + j)] += x.ValueAt(t * kD + k) * row;
      }
    }
  }
  // float32 sums of at most 12 tokens' terms, each a product of sums of 16 or 32 products: 1e-4
  // relative holds with room, and a missing or misrouted token moves an entry by a whole term.
  for (int64_t i = 0; i < dw1.size(); ++i) {
    const double want = want1[static_cast<size_t>(i)];
    EXPECT_NEAR(dw1.ValueAt(i), want, 1e-4 * (1 + std::fabs(want))) << "dw1 element " << i;
  }
  for (int64_t i = 0; i < dw2.size(); ++i) {
    const double want = want2[static_cast<size_t>(i)];
    EXPECT_NEAR(dw2.ValueAt(i), want, 1e-4 * (1 + std::fabs(want))) << "dw2 element " << i;
  }
  const cli_test::Result r =
      cli_test::RunShardsim({"run", file_path.string(), "--numerics", "on"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("numerics:       passed"), std::string::npos) << r;
}

}  // namespace
}  // namespace shardsim
