// Host offload of saved activations (ApplyOffload): where the copies go, what the backward pass
// reads, and that the offloaded program computes the same gradients, sharded, as the program
// without offload.
#include "planner/offload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "planner/grad.h"
#include "planner/remat.h"
#include "sim/spec_error.h"
#include "tests/planner/partition_test_support.h"

namespace shardsim::planner {
namespace {

// Two layers under data parallelism over 8: h1 = x @ w1, a1 = relu(h1), h2 = a1 @ w2,
// a2 = relu(h2), loss = sum(a2), and its gradients with respect to w1 and w2. Layer values:
// {h1, a1} and {h2, a2}; the backward reads h2 (relu'), a1 (d_w2 = a1^T g), h1 (relu').
ProgramSpec TwoLayers() {
  ProgramBuilder pb({{"dp", 8}}, {}, ProgramMode::kAuto);
  pb.Input("x", {16, 8}, DType::kF32, P({{"dp"}}), Normal(1));
  pb.Input("w1", {8, 8}, DType::kF32, P({}), Normal(2));
  pb.Input("w2", {8, 8}, DType::kF32, P({}), Normal(3));
  pb.Matmul("x", "w1", "h1");
  pb.Unary(OpKind::kRelu, "h1", "a1");
  pb.Matmul("a1", "w2", "h2");
  pb.Unary(OpKind::kRelu, "h2", "a2");
  OpSpec sum;
  sum.kind = OpKind::kSum;
  sum.in = {"a2"};
  sum.out = {"loss"};
  pb.Add(std::move(sum));
  pb.Grad("loss", {"w1", "w2"}, {"d_w1", "d_w2"});
  pb.Output("d_w1", P({}));
  pb.Output("d_w2", P({}));
  return std::move(pb).Build();
}

struct Offloaded {
  ProgramSpec program;
  std::vector<size_t> passes;
};

// ApplyRemat with `remat` on `segments` (by default the two layers), then ApplyOffload.
Offloaded Apply(RematPolicy remat, const std::vector<std::vector<std::string>>& offloaded,
                const std::vector<std::vector<std::string>>& segments = {{"h1", "a1"},
                                                                         {"h2", "a2"}}) {
  Offloaded r;
  r.program = ExpandGrads(TwoLayers(), &r.passes);
  std::set<std::string> saved;
  for (const auto& layer : offloaded) saved.insert(layer.begin(), layer.end());
  ApplyRemat(r.program, r.passes, segments, remat, saved);
  ApplyOffload(r.program, r.passes, offloaded);
  return r;
}

// The index of the op making `name` (ops.size() if none).
size_t MakerOf(const ProgramSpec& p, const std::string& name) {
  for (size_t i = 0; i < p.ops.size(); ++i) {
    if (std::find(p.ops[i].out.begin(), p.ops[i].out.end(), name) != p.ops[i].out.end()) return i;
  }
  return p.ops.size();
}

// The first op from `from` on reading `name` (ops.size() if none).
size_t FirstReader(const ProgramSpec& p, const std::string& name, size_t from = 0) {
  for (size_t i = from; i < p.ops.size(); ++i) {
    if (std::find(p.ops[i].in.begin(), p.ops[i].in.end(), name) != p.ops[i].in.end()) return i;
  }
  return p.ops.size();
}

// Without remat, offloading h1 and h2: each is copied out right after the matmul making it;
// the backward reads h1_dev and h2_dev, never h1 or h2; both copies back go before the first
// backward reader of h2 (layer 2's backward runs first; layer 1's copy is prefetched a layer
// ahead, as XLA's scheduler issues it); the forward's relus still read h1 and h2.
TEST(OffloadTest, CopiesOutAfterTheMakerAndBackALayerAhead) {
  const Offloaded r = Apply(RematPolicy::kNone, {{"h1"}, {"h2"}});
  const ProgramSpec& p = r.program;
  const size_t backward = r.passes.at(0);
  for (const char* v : {"h1", "h2"}) {
    SCOPED_TRACE(v);
    const std::string name = v;
    const size_t out = MakerOf(p, name + "_host");
    ASSERT_LT(out, p.ops.size());
    EXPECT_EQ(p.ops[out].kind, OpKind::kMoveToHost);
    EXPECT_EQ(out, MakerOf(p, name) + 1);
    EXPECT_EQ(FirstReader(p, name, backward), p.ops.size());  // The backward reads the copy.
    const size_t back = MakerOf(p, name + "_dev");
    ASSERT_LT(back, p.ops.size());
    EXPECT_EQ(p.ops[back].kind, OpKind::kMoveToDevice);
    EXPECT_EQ(p.ops[back].in, std::vector<std::string>{name + "_host"});
    EXPECT_GE(back, backward);
    EXPECT_LT(FirstReader(p, name + "_dev"), p.ops.size());
  }
  const size_t h2_read = FirstReader(p, "h2_dev");
  EXPECT_LT(MakerOf(p, "h1_dev"), h2_read);
  EXPECT_LT(MakerOf(p, "h2_dev"), h2_read);
  EXPECT_LT(FirstReader(p, "h1"), backward);  // relu(h1) in the forward.
  EXPECT_EQ(r.passes.at(1), p.ops.size());
}

// With full remat over one segment {h1, a1, h2, a2} and h1 offloaded, h1 is kept (not
// recomputed) and the segment's other values the backward reads are recomputed from its fetched
// copy: a1 = relu(h1_dev), h2 = a1 @ w2 from that (a2, which the loss outside reads, is kept).
TEST(OffloadTest, FullRematRecomputesFromTheFetchedCopies) {
  const Offloaded r = Apply(RematPolicy::kFull, {{"h1"}}, {{"h1", "a1", "h2", "a2"}});
  const ProgramSpec& p = r.program;
  const std::string a1 = std::string("a1") + kRematSuffix;
  const size_t rc = MakerOf(p, a1);
  ASSERT_LT(rc, p.ops.size());
  EXPECT_EQ(p.ops[rc].in, std::vector<std::string>{"h1_dev"});
  const size_t h2 = MakerOf(p, std::string("h2") + kRematSuffix);
  ASSERT_LT(h2, p.ops.size());
  EXPECT_EQ(p.ops[h2].in, (std::vector<std::string>{a1, "w2"}));
  EXPECT_EQ(MakerOf(p, std::string("h1") + kRematSuffix), p.ops.size());
  EXPECT_LT(MakerOf(p, "h1_dev"), rc);
}

// Values the backward never reads (a2: relu's derivative reads its input) stay where they are.
TEST(OffloadTest, ValuesTheBackwardDoesNotReadAreLeftAlone) {
  const Offloaded r = Apply(RematPolicy::kNone, {{}, {"a2"}});
  EXPECT_EQ(MakerOf(r.program, "a2_host"), r.program.ops.size());
}

// Names the program binds already are not taken: with a value named h1_host, h1's host copy
// is h1_host_2.
TEST(OffloadTest, CopiesTakeFreshNames) {
  Offloaded r;
  r.program = ExpandGrads(TwoLayers(), &r.passes);
  OpSpec taken;
  taken.kind = OpKind::kNeg;
  taken.in = {"x"};
  taken.out = {"h1_host"};
  taken.name = "h1_host";
  r.program.ops.insert(r.program.ops.begin(), taken);
  for (size_t& at : r.passes) ++at;
  ApplyOffload(r.program, r.passes, {{"h1"}, {}});
  const size_t out = MakerOf(r.program, "h1_host_2");
  ASSERT_LT(out, r.program.ops.size());
  EXPECT_EQ(r.program.ops[out].kind, OpKind::kMoveToHost);
  EXPECT_EQ(r.program.ops[MakerOf(r.program, "h1_dev")].in, std::vector<std::string>{"h1_host_2"});
}

// Partitioned (data parallel over 8) and run with data, with and without remat, the offloaded
// program's gradients are the unsharded program's.
TEST(OffloadTest, GradientsMatchTheUnshardedOnes) {
  for (RematPolicy remat : {RematPolicy::kNone, RematPolicy::kFull}) {
    SCOPED_TRACE(RematPolicyName(remat));
    const Offloaded r = remat == RematPolicy::kNone
                            ? Apply(remat, {{"h1", "a1"}, {"h2"}})
                            : Apply(remat, {{"h1"}}, {{"h1", "a1", "h2", "a2"}});
    Machine machine(BuildPreset("tpu-v5e", {4, 2}));
    const ProgramSpec global = TwoLayers();
    const Mesh mesh = PlaceMesh(machine, global.mesh_axes);
    const PartitionResult partitioned = PartitionExpanded(r.program, r.passes);
    ExpectNumericsPass(global, partitioned, machine, mesh);
  }
}

// On a dp 4 x tp 2 mesh: h = x @ w1, replicated on every device, and its copy out hh.
ProgramBuilder CopiedOut() {
  ProgramBuilder pb({{"dp", 4}, {"tp", 2}}, {}, ProgramMode::kAuto);
  pb.Input("x", {64, 32}, DType::kF32, P({}), Normal(1));
  pb.Input("w1", {32, 64}, DType::kF32, P({}), Normal(2));
  pb.Matmul("x", "w1", "h");
  OpSpec to_host;
  to_host.kind = OpKind::kMoveToHost;
  to_host.in = {"h"};
  to_host.out = {"hh"};
  pb.Add(std::move(to_host));
  return pb;
}

// A copy of a replicated value: h copied out and back (CopiedOut), the copy back (hb) wanted
// split over dp and tp and added to relu(h). `out` is the output the copy back is named and
// laid out as (default hb as P('dp', 'tp')).
ProgramSpec ReplicatedCopy(const std::string& out = "hb",
                           PartitionSpec spec = P({{"dp"}, {"tp"}})) {
  ProgramBuilder pb = CopiedOut();
  pb.Unary(OpKind::kRelu, "h", "r");
  OpSpec to_device;
  to_device.kind = OpKind::kMoveToDevice;
  to_device.in = {"hh"};
  to_device.out = {"hb"};
  pb.Add(std::move(to_device));
  pb.Output("r", P({}));
  pb.Output(out, std::move(spec));
  return std::move(pb).Build();
}

// The partitioner never reshards a value in host memory: a split wanted of the copy back is
// sliced from it in device memory (slicing the host copy first, which makes the copy smaller,
// would be an op reading host memory), and the run matches the unsharded program.
TEST(OffloadTest, PartitionerReshardsCopiesBackNotHostValues) {
  const ProgramSpec global = ReplicatedCopy();
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  const PartitionResult partitioned = PartitionOnMachine(global, machine, mesh);
  for (const OpSpec& op : partitioned.program.ops) {
    if (op.kind == OpKind::kMoveToDevice) continue;
    EXPECT_EQ(std::find(op.in.begin(), op.in.end(), "hh"), op.in.end()) << op.name;
  }
  ExpectNumericsPass(global, partitioned, machine, mesh);
}

// An output in host memory wanted in another layout than it has is refused where the output
// is named (no reshard runs on host memory), not at an op the partitioner made.
TEST(OffloadTest, HostOutputInAnotherLayoutIsALocatedError) {
  const ProgramSpec global = ReplicatedCopy("hh", P({{"dp"}}));
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  try {
    PartitionOnMachine(global, machine, mesh);
    FAIL() << "expected a SpecError";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "outputs.hh");
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
}

// An op reading a value in host memory is refused at that op (only move_to_device reads host
// memory), before the partitioner emits anything for it.
TEST(OffloadTest, PartitionerRefusesAnOpReadingHostMemory) {
  ProgramBuilder pb = CopiedOut();
  pb.Unary(OpKind::kRelu, "hh", "r");
  pb.Output("r", P({}));
  const ProgramSpec global = std::move(pb).Build();
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  const Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  try {
    PartitionOnMachine(global, machine, mesh);
    FAIL() << "expected a SpecError";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), global.ops.back().key + ".in");
    EXPECT_NE(std::string(e.what()).find(
                  "relu: 'hh' is in host memory; ops read device memory (move_to_device it first)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardsim::planner
