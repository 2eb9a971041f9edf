// The dropless MoE region (planner/models/dropless_moe.h) run on its own: what real routing
// does to its time.
#include "planner/models/dropless_moe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/runtime/run_program.h"
#include "tests/planner/partition_test_support.h"
#include "topology/build.h"

namespace shardsim::planner {
namespace {

// Four devices, one expert each (expert parallelism 4 over the batch): 4 sequences of 8 tokens,
// d 16, experts of ff 32, top 2, so each device routes 16 rows.
DroplessMoeLayout FourExperts() {
  DroplessMoeLayout l;
  l.mesh = {{"expert", 4}};
  l.batch = 4;
  l.length = 8;
  l.d_model = 16;
  l.d_ff = 32;
  l.experts = 4;
  l.top_k = 2;
  l.batch_axes = {"expert"};
  l.expert_axes = {"expert"};
  return l;
}

// The region's program with real inputs: token t of every sequence chooses experts
// first(t) and second(t).
ProgramSpec WithChoices(int (*first)(int), int (*second)(int)) {
  ProgramSpec body = DroplessMoeBody(FourExperts());
  uint64_t seed = 1;
  for (ArraySpec& a : body.arrays) {
    if (a.name == "choice") {
      a.init.kind = InitSpec::Kind::kValue;
      for (int s = 0; s < 4; ++s) {
        for (int t = 0; t < 8; ++t) {
          a.init.values.push_back(first(t));
          a.init.values.push_back(second(t));
        }
      }
    } else {
      a.init.kind = InitSpec::Kind::kNormal;
      a.init.seed = seed++;
    }
  }
  return body;
}

RunResult RunRegion(const ProgramSpec& program, bool numerics) {
  Machine machine(BuildPreset("tpu-v5e", {2, 2}));
  const Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  RunConfig config;
  config.numerics = numerics;
  return RunProgram(machine, mesh, program, config);
}

Time Simulate(const ProgramSpec& program, bool numerics) {
  return RunRegion(program, numerics).end;
}

// With real data the routing decides the time. Balanced choices (token t: experts t mod 4 and
// t + 1 mod 4, so every device sends 4 rows to each expert and each expert runs 16) take
// exactly the time of a timing-only run, which assumes that balance (each message its
// balanced share, each grouped matmul expected_rows); when every token chooses experts 0 and
// 1, devices 0 and 1 receive and multiply 32 rows each and the others none: those two compute
// longer than with balanced routing, the others shorter, and the step is slower.
TEST(DroplessMoeTest, RoutingImbalanceChangesTheTime) {
  const ProgramSpec balanced =
      WithChoices([](int t) { return t % 4; }, [](int t) { return (t + 1) % 4; });
  const ProgramSpec skewed = WithChoices([](int) { return 0; }, [](int) { return 1; });
  const Time assumed = Simulate(balanced, false);
  EXPECT_EQ(Simulate(balanced, true), assumed);
  EXPECT_EQ(Simulate(skewed, false), assumed);  // Without data the choices cannot matter.
  EXPECT_GT(Simulate(skewed, true), assumed);
  const RunResult even = RunRegion(balanced, true);
  const RunResult uneven = RunRegion(skewed, true);
  // The grouped matmuls' op rows give the busiest device's time: the balanced estimate with
  // balanced data, twice the rows (and more time) with the skewed routing.
  const RunResult assumed_run = RunRegion(balanced, false);
  int dots = 0;
  for (size_t i = 0; i < even.ops.size(); ++i) {
    if (even.ops[i].op != "ragged_dot") continue;
    ++dots;
    EXPECT_EQ(even.ops[i].compute, assumed_run.ops[i].compute) << i;
    EXPECT_GT(uneven.ops[i].compute, even.ops[i].compute) << i;
  }
  EXPECT_EQ(dots, 3);  // Gate, up and down projections.
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(even.per_device[p].compute, even.per_device[0].compute) << p;
    if (p < 2) {
      EXPECT_GT(uneven.per_device[p].compute, even.per_device[p].compute) << p;
    } else {
      EXPECT_LT(uneven.per_device[p].compute, even.per_device[p].compute) << p;
    }
  }
}

// The layout must divide: the experts over the expert axes, the tokens over theirs.
TEST(DroplessMoeTest, RefusesLayoutsThatDoNotDivide) {
  DroplessMoeLayout l = FourExperts();
  l.experts = 6;
  EXPECT_THROW(DroplessMoeBody(l), std::invalid_argument);
  l = FourExperts();
  l.batch = 2;
  EXPECT_THROW(DroplessMoeBody(l), std::invalid_argument);
}

}  // namespace
}  // namespace shardsim::planner
