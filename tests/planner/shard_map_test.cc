// shard_map regions inside global programs (jax.shard_map under jax.jit): the shape rule from
// the out specs, the partitioner resharding inputs to the in_specs and inlining the body, the
// reference running the region on its mesh, reverse mode through a region, and the refusals
// (bodies that do not check, bodies on another mesh).
#include "collectives/shard_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "collectives/ir/program_builder.h"
#include "planner/grad.h"
#include "sim/spec_error.h"
#include "tests/planner/partition_test_support.h"

namespace shardsim::planner {
namespace {

using test::Arange;
using test::Normal;

const std::vector<MeshAxis> kAxes = {{"x", 4}, {"y", 2}};

// The body: p (f32[8,6], rows over x: 2 a device) summed over x (s, every device the sum of the
// four row blocks: f32[2,6] replicated) and squared (q, f32[8,6] rows over x).
ProgramSpec SumAndSquareBody() {
  ProgramBuilder b(kAxes);
  b.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  b.Reduce(OpKind::kPsum, "p", {"x"}, "s");
  b.Binary(OpKind::kMul, "p", "p", "q");
  b.Output("s", P({}));
  b.Output("q", P({{"x"}}));
  return std::move(b).Build();
}

// a (f32[8,6], arange, laid out as `a_spec`) through the region, then t = q + q.
ProgramSpec RegionProgram(PartitionSpec a_spec) {
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, std::move(a_spec), Arange());
  const std::vector<std::string> r = g.ShardMap({"a"}, SumAndSquareBody(), {"s", "q"});
  g.Binary(OpKind::kAdd, r[1], r[1], "t");
  g.Output("s", P({}));
  g.Output("t", P({}));
  return std::move(g).Build();
}

// What partitioning `global` refuses: the SpecError's key and message (an empty key and
// "partitioned" when it partitions).
struct Refused {
  std::string key;
  std::string message;
};
Refused PartitionRefusal(const ProgramSpec& global) {
  try {
    Partition(global);
  } catch (const SpecError& e) {
    return {e.key(), e.what()};
  }
  return {"", "partitioned"};
}

// Appends sum(x) over every axis to `g` (a loss), named `out` (fresh when empty); returns it.
std::string SumAll(ProgramBuilder& g, const std::string& x, std::string out = "") {
  OpSpec sum;
  sum.kind = OpKind::kSum;
  sum.in = {x};
  if (!out.empty()) sum.out = {std::move(out)};
  return g.Add(std::move(sum));
}

// The results' global shapes come from the body's local ones and the out specs: s is one
// device's [2, 6] block (out spec P(): replicated), q four row blocks ([8, 6]); the values are
// the sum of a's four row blocks and a squared, computed here by hand.
TEST(ShardMapTest, ResultsAssembledByTheOutSpecs) {
  const ProgramSpec global = RegionProgram(P({}));
  std::vector<float> a(48);
  for (int i = 0; i < 48; ++i) a[static_cast<size_t>(i)] = static_cast<float>(i);
  const std::map<std::string, Array> ref = GlobalReference(global, "");
  ASSERT_EQ(ref.at("s").shape(), (Shape{2, 6}));
  ASSERT_EQ(ref.at("t").shape(), (Shape{8, 6}));
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 6; ++j) {
      float sum = 0;
      for (int block = 0; block < 4; ++block)
        sum += a[static_cast<size_t>((2 * block + i) * 6 + j)];
      EXPECT_EQ(ref.at("s").ValueAt(i * 6 + j), sum) << i << "," << j;
    }
  }
  for (int k = 0; k < 48; ++k) {
    EXPECT_EQ(ref.at("t").ValueAt(k), 2 * a[static_cast<size_t>(k)] * a[static_cast<size_t>(k)]);
  }
  // Shape-only inputs give the shapes alone.
  OpSpec op = global.ops[0];
  const Array in = Array::ShapeOnly(DType::kF32, {8, 6});
  const std::vector<Array> shapes = ShardMapResults(op, {&in});
  EXPECT_EQ(shapes[0].shape(), (Shape{2, 6}));
  EXPECT_EQ(shapes[1].shape(), (Shape{8, 6}));
  EXPECT_FALSE(shapes[0].has_data());
}

// Partitioned: a replicated input needs no communication to take its in_spec (each device
// slices its rows); the body's psum over x is the region's one collective, and the sharded run
// equals the reference.
TEST(ShardMapTest, BodyInlinedAfterTheInputsTakeTheirInSpecs) {
  const ProgramSpec global = RegionProgram(P({}));
  const PartitionResult lowered = Partition(global);
  for (const OpSpec& op : lowered.program.ops) EXPECT_NE(op.kind, OpKind::kShardMap);
  // The body's psum of one device's 2 x 6 f32 block (48 B), then the gather of t (rows over x,
  // as q is) for its out spec P(): nothing before the psum, as a replicated input is sliced.
  EXPECT_EQ(Collectives(global, lowered),
            (std::vector<Inserted>{{OpKind::kPsum, {"x"}, 48}, {OpKind::kAllGather, {"x"}, 48}}));
  ExpectNumericsPass(global);
}

// An input laid out otherwise is resharded to the in_spec first (rows over y become rows over
// x), the reason naming the region.
TEST(ShardMapTest, InputsReshardedToTheirInSpecs) {
  const ProgramSpec global = RegionProgram(P({{"y"}}));
  const PartitionResult lowered = Partition(global);
  bool found = false;
  for (size_t i = 0; i < lowered.program.ops.size(); ++i) {
    if (lowered.reasons[i].find("shard_map") != std::string::npos) {
      found = true;
      EXPECT_NE(lowered.reasons[i].find("takes a as f32[8@x,6] (its in_spec)"), std::string::npos)
          << lowered.reasons[i];
    }
  }
  EXPECT_TRUE(found);
  ExpectNumericsPass(global);
}

// Auto mode reads the in_specs as the layouts wanted of the inputs: tanh of a replicated value,
// read by a region that wants it split over x, runs on the rows it is wanted in (a quarter of
// the work) rather than on every row of every device, the region's slice moving before it.
TEST(ShardMapTest, InSpecsAreHintsForTheProducers) {
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, P({}), Arange());
  g.Unary(OpKind::kTanh, "a", "h");
  g.ShardMap({"h"}, SumAndSquareBody(), {"s", "q"});
  g.Output("s", P({}));
  g.Output("q", P({{"x"}}));
  const ProgramSpec global = std::move(g).Build();
  Machine machine(BuildPreset("tpu-v5e", {4, 2}));
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  const PartitionResult lowered = PartitionOnMachine(global, machine, mesh);
  bool found = false;
  for (size_t i = 0; i < lowered.program.ops.size(); ++i) {
    if (lowered.program.ops[i].kind != OpKind::kTanh) continue;
    found = true;
    EXPECT_EQ(lowered.types[i], "f32[8@x,6]");
  }
  EXPECT_TRUE(found);
  ExpectNumericsPass(global);
}

// The i32 vector `values` (a routing's index data), laid out over ep.
std::string IndexInput(ProgramBuilder& b, const std::string& name, std::vector<float> values) {
  InitSpec init;
  init.kind = InitSpec::Kind::kValue;
  init.values.assign(values.begin(), values.end());
  const int64_t n = static_cast<int64_t>(init.values.size());
  return b.Input(name, {n}, DType::kI32, P({{"ep"}}), init);
}

// The seed's MoE dispatch under jit: the token activations are made by global ops (tanh of the
// embedding, as auto mode lays it out), a shard_map region sends each expert its tokens with
// ragged_all_to_all (sizes from the routing data), runs each expert's FFN with ragged_dot and
// sends the results back, and a global op reads what returns (configs/examples/
// moe_dropless_ragged.yaml's body, its routing written as data). The sharded run equals the
// reference, whose region runs on the mesh as the body does.
TEST(ShardMapTest, MoeDispatchInsideJit) {
  const std::vector<MeshAxis> ep = {{"ep", 4}};
  ProgramBuilder body(ep);
  body.Input("x", {32, 16}, DType::kF32, P({{"ep"}}));
  body.Input("buffer", {48, 16}, DType::kF32, P({{"ep"}}));
  body.Input("w1", {4, 16, 32}, DType::kF32, P({{"ep"}}));
  body.Input("w2", {4, 32, 16}, DType::kF32, P({{"ep"}}));
  const std::vector<std::string> index_names = {"rows",           "input_offsets", "send_sizes",
                                                "output_offsets", "recv_sizes",    "back_in",
                                                "back_send",      "back_out",      "back_recv"};
  for (const std::string& name : index_names) {
    body.Input(name, {name == "rows" ? 4 : 16}, DType::kI32, P({{"ep"}}));
  }
  OpSpec dispatch;
  dispatch.kind = OpKind::kRaggedAllToAll;
  dispatch.in = {"x", "buffer", "input_offsets", "send_sizes", "output_offsets", "recv_sizes"};
  dispatch.out = {"tokens"};
  dispatch.axis_name = {"ep"};
  body.Add(dispatch);
  auto ragged_dot = [&](const std::string& lhs, const std::string& rhs, const std::string& out) {
    OpSpec op;
    op.kind = OpKind::kRaggedDot;
    op.in = {lhs, rhs, "rows"};
    op.out = {out};
    body.Add(op);
  };
  ragged_dot("tokens", "w1", "h");
  body.Unary(OpKind::kRelu, "h", "a");
  ragged_dot("a", "w2", "e");
  OpSpec zeros;
  zeros.kind = OpKind::kFullLike;
  zeros.in = {"x"};
  zeros.out = {"zeros"};
  zeros.fill_value = 0;
  body.Add(zeros);
  OpSpec back = dispatch;
  back.in = {"e", "zeros", "back_in", "back_send", "back_out", "back_recv"};
  back.out = {"y"};
  body.Add(back);
  body.Output("y", P({{"ep"}}));

  ProgramBuilder g(ep, {}, ProgramMode::kAuto);
  g.Input("embedded", {32, 16}, DType::kF32, P({}), Normal(1));
  g.Unary(OpKind::kTanh, "embedded", "x");
  g.Input("buffer", {48, 16}, DType::kF32, P({{"ep"}}));
  g.Input("w1", {4, 16, 32}, DType::kF32, P({{"ep"}}), Normal(2));
  g.Input("w2", {4, 32, 16}, DType::kF32, P({{"ep"}}), Normal(3));
  IndexInput(g, "rows", {6, 8, 8, 10});
  IndexInput(g, "input_offsets", {0, 3, 5, 6, 0, 1, 5, 7, 0, 2, 2, 5, 0, 0, 2, 4});
  IndexInput(g, "send_sizes", {3, 2, 1, 2, 1, 4, 2, 1, 2, 0, 3, 3, 0, 2, 2, 4});
  IndexInput(g, "output_offsets", {0, 0, 0, 0, 3, 2, 1, 2, 4, 6, 3, 3, 6, 6, 6, 6});
  IndexInput(g, "recv_sizes", {3, 1, 2, 0, 2, 4, 0, 2, 1, 2, 3, 2, 2, 1, 3, 4});
  IndexInput(g, "back_in", {0, 3, 4, 6, 0, 2, 6, 6, 0, 1, 3, 6, 0, 2, 3, 6});
  IndexInput(g, "back_send", {3, 1, 2, 0, 2, 4, 0, 2, 1, 2, 3, 2, 2, 1, 3, 4});
  IndexInput(g, "back_out", {0, 0, 0, 0, 3, 1, 2, 0, 5, 5, 2, 2, 6, 7, 5, 4});
  IndexInput(g, "back_recv", {3, 2, 1, 2, 1, 4, 2, 1, 2, 0, 3, 3, 0, 2, 2, 4});
  std::vector<std::string> in = {"x", "buffer", "w1", "w2"};
  in.insert(in.end(), index_names.begin(), index_names.end());
  g.ShardMap(in, std::move(body).Build(), {"y"});
  g.Binary(OpKind::kAdd, "x", "y", "residual");
  g.Output("residual", P({{"ep"}}));
  for (const char* name : {"x", "w1", "w2", "y"}) g.Output(name, P({}));
  const ProgramSpec global = std::move(g).Build();

  Machine machine(BuildPreset("tpu-v5e", {4, 1}));
  Mesh mesh = PlaceMesh(machine, global.mesh_axes);
  const PartitionResult lowered = PartitionOnMachine(global, machine, mesh);
  int ragged = 0;
  for (const OpSpec& op : lowered.program.ops) ragged += op.kind == OpKind::kRaggedAllToAll;
  EXPECT_EQ(ragged, 2);
  ExpectNumericsPass(global, lowered, machine, mesh);
  // Each token comes back as its expert's FFN of it: device 0 sent its tokens 0-2 to expert 0,
  // 3-4 to expert 1, 5 to expert 2 and 6-7 to expert 3 (send_sizes 3, 2, 1, 2), so row t of y
  // is relu(x[t] @ w1[e]) @ w2[e], computed here from the reference's values.
  const std::map<std::string, Array> ref = GlobalReference(global, "");
  const Array& xs = ref.at("x");
  const Array& w1 = ref.at("w1");
  const Array& w2 = ref.at("w2");
  const Array& y = ref.at("y");
  for (const auto& [token, expert] :
       std::vector<std::pair<int, int>>{{0, 0}, {3, 1}, {5, 2}, {7, 3}}) {
    std::vector<double> hidden(32, 0.0);
    for (int f = 0; f < 32; ++f) {
      for (int d = 0; d < 16; ++d) {
        hidden[static_cast<size_t>(f)] +=
            xs.ValueAt(token * 16 + d) * w1.ValueAt((expert * 16 + d) * 32 + f);
      }
      hidden[static_cast<size_t>(f)] = std::max(0.0, hidden[static_cast<size_t>(f)]);
    }
    for (int d = 0; d < 16; ++d) {
      double want = 0;
      for (int f = 0; f < 32; ++f) {
        want += hidden[static_cast<size_t>(f)] * w2.ValueAt((expert * 32 + f) * 16 + d);
      }
      // float32 sums of 16 and 32 products of values below 3: within 1e-4.
      EXPECT_NEAR(y.ValueAt(token * 16 + d), want, 1e-4) << "token " << token << " dim " << d;
    }
  }
}

// A collective matmul's gathered operand stops varying along its axes: x (replicated) times
// the gathered w (rows over x) is the same on every device along x, so out_spec P() holds.
TEST(ShardMapTest, CollectiveMatmulResultIsReplicatedAlongItsGather) {
  ProgramBuilder body(kAxes);
  body.Input("x", {4, 8}, DType::kF32, P({}));
  body.Input("w", {8, 6}, DType::kF32, P({{"x"}}));
  OpSpec cm;
  cm.kind = OpKind::kAllgatherMatmul;
  cm.in = {"x", "w"};
  cm.out = {"z"};
  cm.axis_name = {"x"};
  cm.variant = "unidirectional";
  body.Add(cm);
  body.Output("z", P({}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {4, 8}, DType::kF32, P({}), Normal(1));
  g.Input("b", {8, 6}, DType::kF32, P({{"x"}}), Normal(2));
  g.ShardMap({"a", "b"}, std::move(body).Build(), {"z"});
  g.Output("z", P({}));
  ExpectNumericsPass(std::move(g).Build());
}

// A contraction left partial over x and read by a region and by tanh is summed once (one psum,
// the region then slicing its rows), not reduce-scattered for the region and psummed again.
TEST(ShardMapTest, PartialSumsReadTwiceAreSummedOnce) {
  ProgramBuilder body(kAxes);
  body.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  body.Unary(OpKind::kNeg, "p", "z");
  body.Output("z", P({{"x"}}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 16}, DType::kF32, P({{}, {"x"}}), Normal(1));
  g.Input("b", {16, 6}, DType::kF32, P({{"x"}}), Normal(2));
  g.Matmul("a", "b", "c");
  g.ShardMap({"c"}, std::move(body).Build(), {"z"});
  g.Unary(OpKind::kTanh, "c", "t");
  g.Output("z", P({{"x"}}));
  g.Output("t", P({}));
  const ProgramSpec global = std::move(g).Build();
  // One psum of c's [8, 6] f32 partial products (192 B a device).
  EXPECT_EQ(Collectives(global, Partition(global)),
            (std::vector<Inserted>{{OpKind::kPsum, {"x"}, 192}}));
  ExpectNumericsPass(global);
}

// jax.grad through a region on mesh {x: 4, y: 2}: loss = sum(s) + sum(q) with s the sum of a's
// four row blocks (out spec P(): eight copies) and q = a * a (P('x'): two copies), so
// d loss / d a = 1 + 2a (each element of a sits in one block of s once). The transpose gives
// each copy of s an eighth of its cotangent, psums it over x (psum's adjoint) and the input's
// cotangent over y (the in_spec P('x') replicates a along y): a wrong share or a missing psum
// is off by a factor of 2, 4 or 8. The expanded program partitions and its numerics pass.
TEST(ShardMapTest, GradThroughARegion) {
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, P({}), Arange());
  g.ShardMap({"a"}, SumAndSquareBody(), {"s", "q"});
  g.Binary(OpKind::kAdd, SumAll(g, "s"), SumAll(g, "q"), "loss");
  g.Grad("loss", {"a"}, {"da"});
  g.Output("da", P({}));
  const ProgramSpec global = std::move(g).Build();
  const Array da = GlobalReference(global, "").at("da");
  ASSERT_EQ(da.shape(), (Shape{8, 6}));
  for (int i = 0; i < 48; ++i) EXPECT_EQ(da.ValueAt(i), 1.0 + 2.0 * i) << i;
  ExpectNumericsPass(global);
}

// The backward region reads what the forward body made from saved residuals, as JAX saves
// them: the forward region gains one output (h, the product tanh's derivative reads), laid out
// over every mesh axis, and the backward body recomputes nothing (no matmul or tanh in it; its
// two einsums are the weight's and the input's gradients). Partitioned, saving and reading the
// residual moves no byte: the only collective is the weight gradient's psum over x and y (w is
// replicated).
TEST(ShardMapTest, GradSavesResidualsInsteadOfRecomputing) {
  ProgramBuilder body(kAxes);
  body.Input("x", {8, 4}, DType::kF32, P({{"x", "y"}}));
  body.Input("w", {4, 3}, DType::kF32, P({}));
  body.Matmul("x", "w", "h");
  body.Unary(OpKind::kTanh, "h", "t");
  body.Output("t", P({{"x", "y"}}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("x", {8, 4}, DType::kF32, P({{"x", "y"}}), Normal(1));
  g.Input("w", {4, 3}, DType::kF32, P({}), Normal(2));
  g.ShardMap({"x", "w"}, std::move(body).Build(), {"t"});
  SumAll(g, "t", "loss");
  g.Grad("loss", {"w"}, {"dw"});
  g.Output("dw", P({}));
  const ProgramSpec global = std::move(g).Build();
  const ProgramSpec expanded = ExpandGrads(global);
  std::vector<const OpSpec*> regions;
  for (const OpSpec& op : expanded.ops) {
    if (op.kind == OpKind::kShardMap) regions.push_back(&op);
  }
  ASSERT_EQ(regions.size(), 2u);
  ASSERT_EQ(regions[0]->out.size(), 2u);
  EXPECT_EQ(regions[0]->body->outputs[1].name, "h");
  EXPECT_NE(std::find(regions[1]->in.begin(), regions[1]->in.end(), regions[0]->out[1]),
            regions[1]->in.end());
  std::vector<OpKind> kinds;
  for (const OpSpec& op : regions[1]->body->ops) kinds.push_back(op.kind);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), OpKind::kMatmul), 0);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), OpKind::kTanh), 0);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), OpKind::kPsum), 1);
  // dw: f32[4, 3] = 48 B a device, psummed over x and y.
  EXPECT_EQ(Collectives(global, Partition(global)),
            (std::vector<Inserted>{{OpKind::kPsum, {"x", "y"}, 48}}));
  ExpectNumericsPass(global);
}

// A mesh axis of size 1 that an out_spec names and an in_spec leaves out: the input's cotangent
// is psummed over it too (a group of one: nothing moves), so the backward region passes the
// replication check (it was refused, at a key the user never wrote). loss = sum(a w), so
// da[i, k] = sum_j w[k, j].
TEST(ShardMapTest, GradWithASizeOneAxis) {
  const std::vector<MeshAxis> axes = {{"x", 8}, {"y", 1}};
  ProgramBuilder body(axes);
  body.Input("a", {8, 3}, DType::kF32, P({{"x"}}));
  body.Input("w", {3, 2}, DType::kF32, P({{}, {"y"}}));
  body.Matmul("a", "w", "y");
  body.Output("y", P({{"x"}, {"y"}}));
  ProgramBuilder g(axes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 3}, DType::kF32, P({}), Normal(1));
  g.Input("w", {3, 2}, DType::kF32, P({}), Arange());
  g.ShardMap({"a", "w"}, std::move(body).Build(), {"y"});
  SumAll(g, "y", "loss");
  g.Grad("loss", {"a"}, {"da"});
  g.Output("da", P({}));
  const ProgramSpec global = std::move(g).Build();
  const Array da = GlobalReference(global, "").at("da");
  ASSERT_EQ(da.shape(), (Shape{8, 3}));
  for (int i = 0; i < 8; ++i) {
    for (int k = 0; k < 3; ++k) EXPECT_EQ(da.ValueAt(i * 3 + k), 4.0 * k + 1) << i << "," << k;
  }
  ExpectNumericsPass(global);
}

// A body (built in C++) may return its input, twice: the reference assembles each from a free
// view of it (it crashed: an input's replicas are not all kept). q's element 5 is a's.
TEST(ShardMapTest, BodyReturningItsInputTwice) {
  ProgramBuilder body(kAxes);
  body.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  body.Output("p", P({{"x"}}));
  body.Output("p", P({{"x"}}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, P({}), Arange());
  g.ShardMap({"a"}, std::move(body).Build(), {"s", "q"});
  g.Output("s", P({}));
  g.Output("q", P({}));
  const ProgramSpec global = std::move(g).Build();
  const std::map<std::string, Array> ref = GlobalReference(global, "");
  EXPECT_EQ(ref.at("s").ValueAt(47), 47);
  EXPECT_EQ(ref.at("q").ValueAt(5), 5);
  ExpectNumericsPass(global);
}

// pmax has no derivative (JAX has none either): grad through a body that reads it on the path
// is refused at the grad op, naming the body op and its key.
TEST(ShardMapTest, GradThroughPmaxIsRefused) {
  ProgramBuilder body(kAxes);
  body.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  body.Reduce(OpKind::kPmax, "p", {"x"}, "m");
  body.Output("m", P({}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, P({}), Arange());
  g.ShardMap({"a"}, std::move(body).Build(), {"m"});
  g.Grad(SumAll(g, "m"), {"a"}, {"da"});
  g.Output("da", P({}));
  const ProgramSpec global = std::move(g).Build();
  try {
    ExpandGrads(global);
    FAIL() << "expanded";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "program.2");
    EXPECT_NE(std::string(e.what()).find("pmax 'm' (program.0.body.program.0) lies on the path"),
              std::string::npos)
        << e.what();
  }
}

// A body that does not check fails at its own op's key under the region's; an input of another
// type than the body array it stands for is refused at the region.
TEST(ShardMapTest, BodyErrorsAreLocated) {
  ProgramBuilder body(kAxes);
  body.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  body.Input("w", {4, 4}, DType::kF32, P({}));
  body.Matmul("p", "w", "z");  // [2, 6] @ [4, 4]
  body.Output("z", P({{"x"}}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, P({}));
  g.Input("w", {4, 4}, DType::kF32, P({}));
  g.ShardMap({"a", "w"}, std::move(body).Build(), {"z"});
  g.Output("z", P({}));
  {
    const Refused r = PartitionRefusal(std::move(g).Build());
    EXPECT_EQ(r.key, "program.0.body.program.0");
  }
  ProgramBuilder h(kAxes, {}, ProgramMode::kAuto);
  h.Input("a", {8, 4}, DType::kF32, P({}));
  h.ShardMap({"a"}, SumAndSquareBody(), {"s", "q"});
  h.Output("s", P({}));
  {
    const Refused r = PartitionRefusal(std::move(h).Build());
    EXPECT_EQ(r.key, "program.0");
    EXPECT_NE(
        r.message.find("input 0 is f32[8,4] but the body's array 'p' it stands for is f32[8,6]"),
        std::string::npos)
        << r.message;
  }
}

// An in_spec that cannot lay out its input is refused at the region's in_specs (not at a body
// array the file never wrote); a kernel's shape error names its op once.
TEST(ShardMapTest, InSpecAndShapeErrorsLocated) {
  ProgramBuilder body(kAxes);
  body.Input("g", {6, 4}, DType::kF32, P({{"x"}}));
  body.Unary(OpKind::kNeg, "g", "z");
  body.Output("z", P({{"x"}}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {6, 4}, DType::kF32, P({}));
  g.Unary(OpKind::kNeg, "a", "made");
  g.ShardMap({"made"}, std::move(body).Build(), {"z"});
  g.Output("z", P({}));
  {
    const Refused r = PartitionRefusal(std::move(g).Build());
    EXPECT_EQ(r.key, "program.1.in_specs.0");
    EXPECT_NE(r.message.find("in_spec of 'g'"), std::string::npos) << r.message;
  }
  ProgramBuilder m(kAxes, {}, ProgramMode::kAuto);
  m.Input("a", {8, 6}, DType::kF32, P({}));
  m.Matmul("a", "a", "y");
  m.Output("y", P({}));
  {
    const Refused r = PartitionRefusal(std::move(m).Build());
    EXPECT_TRUE(r.message.starts_with("matmul: inner dimensions differ")) << r.message;
  }
}

// The partitioned program names a region's values after its first result, whatever the op's
// own name (a run file may name it anything), and each result under its own name; a result the
// body left in host memory stays there (resharding it is refused, naming it).
TEST(ShardMapTest, ResultsKeepTheirNamesAndMemory) {
  ProgramSpec global = RegionProgram(P({}));
  global.ops[0].name = "a region";
  const PartitionResult lowered = Partition(global);
  for (const OpSpec& op : lowered.program.ops) {
    for (const std::string& name : op.out) {
      EXPECT_EQ(name.find(' '), std::string::npos) << name;
    }
  }
  bool s = false, q = false;
  for (const OpSpec& op : lowered.program.ops) {
    s = s || op.out[0] == "s";
    q = q || op.out[0] == "q";
  }
  EXPECT_TRUE(s && q);
  ProgramBuilder body(kAxes);
  body.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  OpSpec to_host;
  to_host.kind = OpKind::kMoveToHost;
  to_host.in = {"p"};
  to_host.out = {"h"};
  body.Add(to_host);
  body.Output("h", P({{"x"}}));
  ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
  g.Input("a", {8, 6}, DType::kF32, P({}));
  g.ShardMap({"a"}, std::move(body).Build(), {"h"});
  g.Output("h", P({}));
  {
    const Refused r = PartitionRefusal(std::move(g).Build());
    EXPECT_EQ(r.key, "outputs.h");
    EXPECT_TRUE(r.message.starts_with("'h' is in host memory")) << r.message;
  }
}

// JAX's replication check: an out_spec that leaves a mesh axis out says the result is the same
// on every device along it, which the body must make so (a psum or all_gather over it, or a
// value that never varied along it); otherwise the region is refused at that output's key
// (taking device 0's block silently would be wrong).
TEST(ShardMapTest, OutSpecsAreCheckedForReplication) {
  struct Case {
    const char* name;
    std::function<void(ProgramBuilder&)> body;  // Makes "z" from "p" (f32[8,6] rows over x).
    bool accepted;
  };
  const std::vector<Case> cases = {
      {"BlockItself", [](ProgramBuilder& b) { b.Unary(OpKind::kNeg, "p", "z"); }, false},
      {"Summed",
       [](ProgramBuilder& b) { b.Reduce(OpKind::kPsum, b.Unary(OpKind::kNeg, "p"), {"x"}, "z"); },
       true},
      {"Gathered", [](ProgramBuilder& b) { b.AllGather("p", {"x"}, 0, true, "z"); }, true},
      {"SummedOverAnotherAxis", [](ProgramBuilder& b) { b.Reduce(OpKind::kPsum, "p", {"y"}, "z"); },
       false},
      {"ScatteredAfterTheSum",
       [](ProgramBuilder& b) {
         b.PsumScatter(b.Reduce(OpKind::kPsum, "p", {"x"}), {"x"}, 0, true, "z");
       },
       false},
      {"ZerosLikeIt",
       [](ProgramBuilder& b) {
         OpSpec zeros;
         zeros.kind = OpKind::kFullLike;
         zeros.in = {"p"};
         zeros.out = {"z"};
         zeros.fill_value = 0;
         b.Add(zeros);
       },
       true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ProgramBuilder body(kAxes);
    body.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
    c.body(body);
    body.Output("z", P({}));
    ProgramBuilder g(kAxes, {}, ProgramMode::kAuto);
    g.Input("a", {8, 6}, DType::kF32, P({}), Arange());
    g.ShardMap({"a"}, std::move(body).Build(), {"z"});
    g.Output("z", P({}));
    const ProgramSpec global = std::move(g).Build();
    if (c.accepted) {
      ExpectNumericsPass(global);
      continue;
    }
    {
      const Refused r = PartitionRefusal(global);
      EXPECT_EQ(r.key, "program.0.body.outputs.z");
      EXPECT_NE(r.message.find("'z' may differ along mesh axis 'x'"), std::string::npos)
          << r.message;
    }
  }
}

// Regions belong in global programs, with a mode: manual body on the program's own mesh.
TEST(ShardMapTest, BuilderRefusals) {
  auto refusal = [](ProgramBuilder& b, ProgramSpec body) {
    try {
      b.ShardMap({"a"}, std::move(body));
    } catch (const SpecError& e) {
      return std::string(e.key()) + ": " + e.what();
    }
    return std::string("accepted");
  };
  ProgramBuilder manual(kAxes);
  manual.Input("a", {8, 6}, DType::kF32, P({}));
  EXPECT_NE(refusal(manual, SumAndSquareBody()).find("program.0.op: shard_map needs a global"),
            std::string::npos);
  ProgramBuilder global(kAxes, {}, ProgramMode::kAuto);
  global.Input("a", {8, 6}, DType::kF32, P({}));
  ProgramBuilder other({{"x", 8}});
  other.Input("p", {8, 6}, DType::kF32, P({{"x"}}));
  other.Output("p", P({{"x"}}));
  EXPECT_NE(refusal(global, std::move(other).Build()).find("its axes must be the program's"),
            std::string::npos);
  ProgramSpec auto_body = SumAndSquareBody();
  auto_body.mode = ProgramMode::kAuto;
  EXPECT_NE(refusal(global, auto_body).find("a shard_map body is a mode: manual program"),
            std::string::npos);
}

}  // namespace
}  // namespace shardsim::planner
