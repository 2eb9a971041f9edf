// configs/jit/moe_dispatch.yaml computed by hand: the seed's MoE layer under jit routes each
// token to its router's top-1 expert, drops those past the capacity, and returns each kept
// token as its expert's FFN of it and each dropped one as zeros. The example's numerics check
// compares the sharded run with the reference, which runs the same body; this test checks the
// body's algorithm itself against the layer's definition.
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

TEST(MoeDispatchExampleTest, KeptTokensAreTheirExpertsFfnAndDroppedOnesZero) {
  namespace fs = std::filesystem;
  RunFile file =
      LoadRunFile((fs::path(cli_test::SourceDir()) / "configs/jit/moe_dispatch.yaml").string());
  ProgramSpec program = *file.program;
  for (const char* name : {"x", "wr", "w1", "w2"}) {
    program.outputs.push_back(OutputSpec{name, PartitionSpec{}, ""});
  }
  program.outputs.push_back(OutputSpec{"y", PartitionSpec{}, ""});
  const std::map<std::string, Array> v = planner::GlobalReference(program, "");
  const Array &x = v.at("x"), &wr = v.at("wr"), &w1 = v.at("w1"), &w2 = v.at("w2"), &y = v.at("y");
  const int devices = 4, tokens = 8, d = 16, f = 32, experts = 4, capacity = 3;
  int dropped = 0;
  for (int dev = 0; dev < devices; ++dev) {
    std::vector<int> queue(experts, 0);  // Tokens of this device routed to each expert so far.
    for (int t = dev * tokens; t < (dev + 1) * tokens; ++t) {
      // Top-1 of the router's logits (exact: small integers); ties take the lower expert.
      int expert = 0;
      double best = -1e300;
      for (int e = 0; e < experts; ++e) {
        double logit = 0;
        for (int k = 0; k < d; ++k) logit += x.ValueAt(t * d + k) * wr.ValueAt(k * experts + e);
        if (logit > best) best = logit, expert = e;
      }
      const bool kept = ++queue[static_cast<size_t>(expert)] <= capacity;
      dropped += !kept;
      std::vector<double> hidden(f, 0.0);
      for (int j = 0; j < f; ++j) {
        for (int k = 0; k < d; ++k) {
          hidden[static_cast<size_t>(j)] +=
              x.ValueAt(t * d + k) * w1.ValueAt((expert * d + k) * f + j);
        }
        hidden[static_cast<size_t>(j)] = std::max(0.0, hidden[static_cast<size_t>(j)]);
      }
      for (int k = 0; k < d; ++k) {
        double want = 0;
        for (int j = 0; j < f; ++j) {
          want += hidden[static_cast<size_t>(j)] * w2.ValueAt((expert * f + j) * d + k);
        }
        // The layer sums 16 then 32 float32 products (rounding near 1e-7 each): 1e-5 relative
        // holds with room; a dropped token is exactly zero.
        const double tolerance = kept ? 1e-5 * (1 + std::fabs(want)) : 0;
        EXPECT_NEAR(y.ValueAt(t * d + k), kept ? want : 0.0, tolerance)
            << "token " << t << " (expert " << expert << (kept ? "" : ", dropped") << ") dim " << k;
      }
    }
  }
  // The data drops some tokens (so the capacity is exercised), not all.
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, devices * tokens);
}

}  // namespace
}  // namespace shardsim
