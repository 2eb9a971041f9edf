// The data flow the scheduling passes read: made from name ids after a reordering, it equals
// the graph read off the reordered program's names by a plain reference.
#include "planner/name_bindings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace shardsim::planner {
namespace {

// `ops` ops, each reading one to three names and binding one or two, all drawn from a pool
// of 12 names of which 3 are input arrays: names are rebound, read before they are bound
// and never bound (what GraphOf must get right in any order).
ProgramSpec RandomProgram(std::mt19937& rng, int ops) {
  auto name = [&] { return "v" + std::to_string(rng() % 12); };
  ProgramSpec p;
  p.mode = ProgramMode::kManual;
  for (int a = 0; a < 3; ++a) {
    ArraySpec array;
    array.name = "v" + std::to_string(a);
    array.shape = {2};
    p.arrays.push_back(std::move(array));
  }
  for (int i = 0; i < ops; ++i) {
    OpSpec op;
    op.kind = OpKind::kAdd;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) op.in.push_back(name());
    for (int k = 0, n = 1 + static_cast<int>(rng() % 2); k < n; ++k) op.out.push_back(name());
    op.name = op.out[0];
    p.ops.push_back(std::move(op));
  }
  return p;
}

// The graph read off the names directly (BindingsOf's table): the reference.
OpGraph ByNames(const ProgramSpec& program) {
  const NameBindings names = BindingsOf(program);
  const size_t n = program.ops.size();
  OpGraph g;
  g.output_once.assign(n, 1);
  g.bound_once.assign(n, 1);
  g.readers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    g.input_start.push_back(g.input_maker.size());
    for (const std::string& in : program.ops[i].in) {
      const NameBindings::Binding* b = names.Find(in);
      const size_t m = b ? b->maker : NameBindings::kNoMaker;
      g.input_maker.push_back(m);
      g.input_once.push_back(b && b->count == 1);
      g.bound_once[i] =
          g.bound_once[i] && g.input_once.back() && (m == NameBindings::kNoMaker || m < i);
      if (m != NameBindings::kNoMaker && m < i) g.readers[m].push_back(i);
    }
    for (const std::string& out : program.ops[i].out) {
      g.output_once[i] = g.output_once[i] && names.Once(out);
    }
    g.bound_once[i] = g.bound_once[i] && g.output_once[i];
  }
  g.input_start.push_back(g.input_maker.size());
  return g;
}

TEST(NameBindingsTest, GraphFromIdsEqualsGraphFromNamesInAnyOrder) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const ProgramSpec program = RandomProgram(rng, 1 + static_cast<int>(rng() % 16));
    const OpNameIds ids = NameIdsOf(program);
    std::vector<size_t> order(program.ops.size());
    std::iota(order.begin(), order.end(), size_t{0});
    EXPECT_EQ(GraphOf(ids, order), ByNames(program)) << "round " << round << ", as made";
    EXPECT_EQ(GraphOf(program), ByNames(program)) << "round " << round;
    std::shuffle(order.begin(), order.end(), rng);
    ProgramSpec reordered = program;
    for (size_t k = 0; k < order.size(); ++k) reordered.ops[k] = program.ops[order[k]];
    EXPECT_EQ(GraphOf(ids, order), ByNames(reordered)) << "round " << round << ", reordered";
  }
}

// By hand: x is an array; a = f(x); a = g(a, u) rebinds a and reads u, which nothing binds;
// b = h(a). Only x and b are bound once; a name's maker is its last binding (g's a), which
// h reads after it and g itself at its own place (no earlier maker: no reader edge).
TEST(NameBindingsTest, RebindingAndUnboundNames) {
  ProgramSpec p;
  ArraySpec x;
  x.name = "x";
  x.shape = {2};
  p.arrays.push_back(std::move(x));
  auto op = [](std::vector<std::string> in, std::string out) {
    OpSpec o;
    o.kind = OpKind::kAdd;
    o.in = std::move(in);
    o.out = {std::move(out)};
    return o;
  };
  p.ops = {op({"x"}, "a"), op({"a", "u"}, "a"), op({"a"}, "b")};
  const OpGraph g = GraphOf(NameIdsOf(p), {0, 1, 2});
  EXPECT_EQ(g, ByNames(p));
  EXPECT_EQ(g, GraphOf(p));
  const size_t none = NameBindings::kNoMaker;
  EXPECT_EQ(g.input_maker, (std::vector<size_t>{none, 1, none, 1}));
  EXPECT_EQ(g.input_once, (std::vector<char>{1, 0, 0, 0}));
  EXPECT_EQ(g.output_once, (std::vector<char>{0, 0, 1}));
  EXPECT_EQ(g.readers[1], (std::vector<size_t>{2}));
  EXPECT_TRUE(g.readers[0].empty());
}

}  // namespace
}  // namespace shardsim::planner
