// The dropless MoE region (planner/models/dropless_moe.h) run on its own: what real routing
// does to its time.
#include "planner/models/dropless_moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
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
// first(t) and second(t). Receive buffers of `buffer_factor` (DroplessMoeLayout).
// Tokens `replicated` over the expert axis instead of split over it (DroplessMoeLayout::
// tokens_replicated).
// `layout`'s region with real inputs: token t of every sequence chooses experts first(t) and
// second(t).
ProgramSpec WithLayout(const DroplessMoeLayout& layout, int (*first)(int), int (*second)(int)) {
  ProgramSpec body = DroplessMoeBody(layout);
  uint64_t seed = 1;
  for (ArraySpec& a : body.arrays) {
    if (a.name == "choice") {
      a.init.kind = InitSpec::Kind::kValue;
      for (int64_t s = 0; s < layout.batch; ++s) {
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

ProgramSpec WithChoices(int (*first)(int), int (*second)(int), double buffer_factor = -1,
                        bool replicated = false) {
  DroplessMoeLayout layout = FourExperts();
  layout.buffer_factor = buffer_factor;
  if (replicated) {
    layout.batch_axes.clear();
    layout.tokens_replicated = true;
  }
  return WithLayout(layout, first, second);
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

// The region's tokens' output (its first).
const Array& Output(const RunResult& r) {
  EXPECT_GE(r.outputs.size(), 1u);
  for (const auto& [name, array] : r.outputs) {
    if (array.shape() == Shape{4, 8, 16}) return array;
  }
  ADD_FAILURE() << "no output y";
  return r.outputs.begin()->second;
}

// The copies each device dropped (the region's second output, bounded buffers only).
std::vector<double> Dropped(const RunResult& r) {
  EXPECT_EQ(r.outputs.size(), 2u);
  std::vector<double> dropped;
  for (const auto& [name, array] : r.outputs) {
    if (array.shape() != Shape{4}) continue;
    for (int64_t i = 0; i < array.size(); ++i) dropped.push_back(array.ValueAt(i));
  }
  return dropped;
}

// `got` equals `want` to f32 rounding: each output sums the same products in another order
// (1e-5 of the O(1) values catches a copy lost or doubled), and `want` is not zeros.
void ExpectSameToRounding(const Array& got, const Array& want) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got.ValueAt(i) - want.ValueAt(i)));
    largest = std::max(largest, std::abs(want.ValueAt(i)));
  }
  EXPECT_LT(worst, 1e-5 * largest);
  EXPECT_GT(largest, 0.1);
}

// Bounded receive buffers (MaxText's ragged_buffer_factor): each device holds 16 rows, what it
// receives when routing is balanced (factor 1; 64, every member's, unbounded).
// - Balanced routing fills them exactly: the output is the unbounded region's, to the bit, and
//   the buffers take a quarter of the memory. (Not less time at this size: the sizes that fit
//   cost a few small ops more than the buffers' rows save.)
// - Every token choosing experts 0 and 1 sends 8 rows from each device to each of devices 0
//   and 1, which place them by sender: device 0's and device 1's rows fill the 16, those of devices
//   2 and 3 would land at rows 16-31 and are not sent. So the tokens of sequences 0 and 1 (on
//   devices 0 and 1) get both experts' outputs, as unbounded, and those of sequences 2 and 3
//   get nothing: all their copies were dropped, 16 each (the region's count of drops).
// - A factor of the group size or more holds every member's rows: the unbounded region.
TEST(DroplessMoeTest, BoundedBufferDropsWhatOverflows) {
  auto balanced_first = [](int t) { return t % 4; };
  auto balanced_second = [](int t) { return (t + 1) % 4; };
  const RunResult unbounded = RunRegion(WithChoices(balanced_first, balanced_second), true);
  const RunResult bounded = RunRegion(WithChoices(balanced_first, balanced_second, 1.0), true);
  ASSERT_TRUE(Output(unbounded).has_data());
  EXPECT_EQ(Output(bounded).values(), Output(unbounded).values());
  EXPECT_LT(bounded.peak_memory, unbounded.peak_memory);
  EXPECT_EQ(Dropped(bounded), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(unbounded.outputs.size(), 1u);  // No count: nothing can be dropped.

  auto zero = [](int) { return 0; };
  auto one = [](int) { return 1; };
  const RunResult all_run = RunRegion(WithChoices(zero, one), true);
  const RunResult kept_run = RunRegion(WithChoices(zero, one, 1.0), true);
  const Array& all = Output(all_run);
  const Array& kept = Output(kept_run);
  EXPECT_EQ(Dropped(kept_run), (std::vector<double>{0, 0, 16, 16}));
  const int64_t per_sequence = 8 * 16;  // Tokens x d_model.
  ASSERT_EQ(all.size(), 4 * per_sequence);
  int64_t nonzero = 0;
  for (int64_t i = 0; i < all.size(); ++i) {
    if (i < 2 * per_sequence) {
      EXPECT_EQ(kept.ValueAt(i), all.ValueAt(i)) << i;
      nonzero += all.ValueAt(i) != 0;
    } else {
      EXPECT_EQ(kept.ValueAt(i), 0.0) << i;
    }
  }
  EXPECT_GT(nonzero, per_sequence);  // The kept tokens' outputs are not zeros by chance.
  const RunResult whole = RunRegion(WithChoices(zero, one, 4.0), true);
  EXPECT_EQ(Output(whole).values(), all.values());
}

// Tokens replicated over the expert axis (a decode step's batch too small to split): every
// device holds all 4 sequences, runs its expert over the copies routed to it, and the partial
// outputs are psummed, with no all-to-all. The result is the dispatching region's: on skewed
// and on balanced routing, to f32 rounding (each output sums the same two products, in another
// order: 1e-5 of the O(1) values catches a copy lost or doubled). Timing only, each device's
// grouped matmuls run the balanced 16 rows, as the dispatching devices' do.
TEST(DroplessMoeTest, ReplicatedTokensComputeWhatDispatchComputes) {
  auto zero = [](int) { return 0; };
  auto one = [](int) { return 1; };
  auto balanced_first = [](int t) { return t % 4; };
  auto balanced_second = [](int t) { return (t + 1) % 4; };
  for (auto [first, second] :
       {std::pair<int (*)(int), int (*)(int)>{zero, one},
        std::pair<int (*)(int), int (*)(int)>{balanced_first, balanced_second}}) {
    const RunResult dispatched = RunRegion(WithChoices(first, second), true);
    const RunResult replicated = RunRegion(WithChoices(first, second, -1, true), true);
    ExpectSameToRounding(Output(replicated), Output(dispatched));
  }
  const ProgramSpec timing = WithChoices(zero, one, -1, true);
  int ops = 0;
  for (const OpSpec& op : timing.ops) {
    EXPECT_NE(op.kind, OpKind::kRaggedAllToAll);
    if (op.kind == OpKind::kRaggedDot) {
      EXPECT_EQ(op.expected_rows, 16);
      ++ops;
    }
  }
  EXPECT_EQ(ops, 3);
}

// Eight experts on the four devices (two each): token t of sequence s chooses experts 0 and 1
// (both on device 0) with gates gate(s, t, j); receive buffers of `buffer_factor`.
ProgramSpec TwoLocalExperts(double buffer_factor, double (*gate)(int, int, int)) {
  DroplessMoeLayout layout = FourExperts();
  layout.experts = 8;
  layout.buffer_factor = buffer_factor;
  ProgramSpec body = WithLayout(
      layout, [](int) { return 0; }, [](int) { return 1; });
  for (ArraySpec& a : body.arrays) {
    if (a.name != "gates") continue;
    a.init.kind = InitSpec::Kind::kValue;
    a.init.values.clear();
    for (int s = 0; s < 4; ++s) {
      for (int t = 0; t < 8; ++t) {
        for (int j = 0; j < 2; ++j) a.init.values.push_back(gate(s, t, j));
      }
    }
  }
  return body;
}

double Gate(int s, int t, int j) { return 0.5 + 0.25 * j + 0.01 * t + 0.1 * s; }
// Gate, but copy 1 of sequence 1 weighs nothing.
double GateWithoutSecondCopyOfSequence1(int s, int t, int j) {
  return s == 1 && j == 1 ? 0 : Gate(s, t, j);
}

// Received rows find their experts from the gathered counts (MaxText's repeat), not from ids
// sent beside them: the dispatch moves the rows there and back with two ragged_all_to_alls,
// gathers the counts once and exchanges the return offsets with one all_to_all.
// With two experts on each device, every token choosing experts 0 and 1 sends all copies to
// device 0: each member's message there holds 8 rows for expert 0, then 8 for expert 1.
// - Unbounded, the result is the replicated region's (no dispatch at all), to f32 rounding.
// - A buffer of 1.5 x 16 = 24 rows holds member 0's 16 rows and the first 8 of member 1's,
//   its copies for expert 0: sequence 1 keeps its first choices and loses its second (8 copies
//   dropped), sequences 2 and 3 lose both (16 each). Sequence 0's outputs are the unbounded
//   region's and sequence 1's those of a region where copy 1's gates are 0, to the bit (the
//   same products, a zero added); the others are zeros.
TEST(DroplessMoeTest, RowsFindTheirExpertsFromTheGatheredCounts) {
  const ProgramSpec unbounded_body = TwoLocalExperts(-1, Gate);
  std::map<OpKind, int> collectives;
  for (const OpSpec& op : unbounded_body.ops) {
    if (IsCollective(op.kind)) ++collectives[op.kind];
  }
  EXPECT_EQ(collectives,
            (std::map<OpKind, int>{
                {OpKind::kAllGather, 1}, {OpKind::kAllToAll, 1}, {OpKind::kRaggedAllToAll, 2}}));

  DroplessMoeLayout replicated_layout = FourExperts();
  replicated_layout.experts = 8;
  replicated_layout.batch_axes.clear();
  replicated_layout.tokens_replicated = true;
  ProgramSpec replicated_body = DroplessMoeBody(replicated_layout);
  for (size_t i = 0; i < replicated_body.arrays.size(); ++i) {
    replicated_body.arrays[i].init = unbounded_body.arrays[i].init;
  }
  const RunResult unbounded_run = RunRegion(unbounded_body, true);
  const Array& unbounded = Output(unbounded_run);
  const RunResult replicated_run = RunRegion(replicated_body, true);
  ExpectSameToRounding(Output(replicated_run), unbounded);

  const RunResult bounded_run = RunRegion(TwoLocalExperts(1.5, Gate), true);
  EXPECT_EQ(Dropped(bounded_run), (std::vector<double>{0, 8, 16, 16}));
  const Array& bounded = Output(bounded_run);
  const RunResult first_only_run =
      RunRegion(TwoLocalExperts(-1, GateWithoutSecondCopyOfSequence1), true);
  const Array& first_only = Output(first_only_run);
  const int64_t per_sequence = 8 * 16;
  for (int64_t i = 0; i < bounded.size(); ++i) {
    const int64_t sequence = i / per_sequence;
    const double want = sequence == 0   ? unbounded.ValueAt(i)
                        : sequence == 1 ? first_only.ValueAt(i)
                                        : 0.0;
    EXPECT_EQ(bounded.ValueAt(i), want) << i;
  }
  EXPECT_NE(first_only.ValueAt(per_sequence), unbounded.ValueAt(per_sequence));
}

// Eight experts over two expert axes a and b (two each on the 2 x 2 devices), 4 sequences of
// 8 tokens; `batch_axes` split the sequences.
DroplessMoeLayout TwoExpertAxes(std::vector<std::string> batch_axes) {
  DroplessMoeLayout l = FourExperts();
  l.mesh = {{"a", 2}, {"b", 2}};
  l.experts = 8;
  l.expert_axes = {"a", "b"};
  l.batch_axes = std::move(batch_axes);
  l.tokens_replicated = l.batch_axes.empty();
  return l;
}

// Tokens split over expert axis a and held whole over b (a decode batch that divides one
// expert axis and not the other, refused before): each device dispatches over a the copies
// bound for its column (the experts of the devices with its b), and the outputs are summed over
// b. The collectives say so, and the result is that of the same tokens dispatched over both
// axes and of the same tokens replicated over both, on skewed and balanced routing (to f32
// rounding, as above). With balanced routing (token t: experts t and t + 1 mod 8, so each
// device sends each peer 8 of its 32 copies) a timing-only run takes exactly the time of a run
// with the data, as the whole dispatch does: each pair moves rows / group, not the operand's
// rows / peers; and buffers of factor 1 (the 16 rows a device receives) hold it all.
TEST(DroplessMoeTest, TokensSplitOverSomeExpertAxesDispatchTheirColumn) {
  const DroplessMoeLayout mixed = TwoExpertAxes({"a"});
  EXPECT_EQ(DroplessDispatchAxes(mixed), std::vector<std::string>{"a"});
  std::map<std::pair<OpKind, std::vector<std::string>>, int> collectives;
  const ProgramSpec body = DroplessMoeBody(mixed);
  for (const OpSpec& op : body.ops) {
    if (IsCollective(op.kind)) ++collectives[{op.kind, op.axis_name}];
  }
  const std::vector<std::string> a = {"a"}, b = {"b"};
  EXPECT_EQ(collectives, (std::map<std::pair<OpKind, std::vector<std::string>>, int>{
                             {{OpKind::kAllGather, a}, 1},
                             {{OpKind::kAllToAll, a}, 1},
                             {{OpKind::kRaggedAllToAll, a}, 2},
                             {{OpKind::kPsum, b}, 1}}));
  auto zero = [](int) { return 0; };
  auto five = [](int) { return 5; };
  auto balanced_first = [](int t) { return t % 8; };
  auto balanced_second = [](int t) { return (t + 1) % 8; };
  for (auto [first, second] :
       {std::pair<int (*)(int), int (*)(int)>{zero, five},
        std::pair<int (*)(int), int (*)(int)>{balanced_first, balanced_second}}) {
    const RunResult got_run = RunRegion(WithLayout(mixed, first, second), true);
    const Array& got = Output(got_run);
    for (const DroplessMoeLayout& other : {TwoExpertAxes({"a", "b"}), TwoExpertAxes({})}) {
      const RunResult want_run = RunRegion(WithLayout(other, first, second), true);
      ExpectSameToRounding(got, Output(want_run));
    }
  }
  const ProgramSpec balanced = WithLayout(mixed, balanced_first, balanced_second);
  EXPECT_EQ(Simulate(balanced, true), Simulate(balanced, false));
  DroplessMoeLayout bounded = mixed;
  bounded.buffer_factor = 1;
  ASSERT_TRUE(DroplessBounded(bounded));
  const RunResult unbounded_run = RunRegion(balanced, true);
  const RunResult bounded_run =
      RunRegion(WithLayout(bounded, balanced_first, balanced_second), true);
  EXPECT_EQ(Output(bounded_run).values(), Output(unbounded_run).values());
  EXPECT_EQ(Dropped(bounded_run), (std::vector<double>{0, 0, 0, 0}));
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
