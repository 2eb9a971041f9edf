#include "collectives/sharding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/partition_spec.h"

namespace shardsim {
namespace {

Mesh Iota(std::vector<MeshAxis> axes) {
  int n = 1;
  for (const MeshAxis& axis : axes) n *= axis.size;
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  return Mesh(std::move(axes), std::move(devices));
}

// 0, 1, 2, ... in row-major order.
Array Arange(Shape shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i);
  return Array::FromValues(DType::kF32, std::move(shape), std::move(values));
}

std::vector<float> Range(float start, float end) {
  std::vector<float> values;
  for (float v = start; v < end; ++v) values.push_back(v);
  return values;
}

std::vector<Array> ShardAll(const Sharding& sharding, const Array& global) {
  std::vector<Array> locals;
  for (int p = 0; p < sharding.mesh().size(); ++p) locals.push_back(sharding.Shard(global, p));
  return locals;
}

TEST(ShardingTest, RowBlocks) {
  const Sharding sharding(Iota({{"dp", 4}}), ParsePartitionSpec("P('dp', None)"), {8, 4});
  EXPECT_EQ(sharding.LocalShape(), (Shape{2, 4}));
  EXPECT_EQ(sharding.BlockOffset(2), (std::vector<int64_t>{4, 0}));
  const Array block = sharding.Shard(Arange({8, 4}), 2);
  EXPECT_EQ(block.shape(), (Shape{2, 4}));
  EXPECT_EQ(block.values(), Range(16, 24));  // Rows 4..5.
}

// Each dimension over the product of its axes' sizes, computed by hand; the same as a
// Sharding's LocalShape.
TEST(ShardingTest, LocalShapeOfDividesByTheAxesSizes) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 3}, {"pp", 5}});
  const PartitionSpec spec = ParsePartitionSpec("P(('dp', 'pp'), None, 'tp')");
  const Shape global = {40, 7, 9};
  EXPECT_EQ(Sharding::LocalShapeOf(mesh, spec, global), (Shape{40 / 10, 7, 9 / 3}));
  EXPECT_EQ(Sharding(mesh, spec, global).LocalShape(), (Shape{4, 7, 3}));
  // Fewer entries than dimensions: the rest whole.
  EXPECT_EQ(Sharding::LocalShapeOf(mesh, ParsePartitionSpec("P('tp')"), {6, 4}), (Shape{2, 4}));
}

TEST(ShardingTest, TwoDimensionalBlocks) {
  const Sharding sharding(Iota({{"dp", 2}, {"tp", 2}}), ParsePartitionSpec("P('dp', 'tp')"),
                          {4, 4});
  // Position 1 is dp=0, tp=1: rows 0..1, columns 2..3.
  EXPECT_EQ(sharding.BlockOffset(1), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(sharding.Shard(Arange({4, 4}), 1).values(), (std::vector<float>{2, 3, 6, 7}));
  // Position 2 is dp=1, tp=0: rows 2..3, columns 0..1.
  EXPECT_EQ(sharding.Shard(Arange({4, 4}), 2).values(), (std::vector<float>{8, 9, 12, 13}));
}

TEST(ShardingTest, TupleAxesSplitInTheTuplesOrder) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 2}});
  const Sharding dp_tp(mesh, ParsePartitionSpec("P(('dp', 'tp'))"), {8});
  const Sharding tp_dp(mesh, ParsePartitionSpec("P(('tp', 'dp'))"), {8});
  const Array global = Arange({8});
  // Position 1: dp=0, tp=1. Block dp*2+tp = 1 vs tp*2+dp = 2.
  EXPECT_EQ(dp_tp.Shard(global, 1).values(), (std::vector<float>{2, 3}));
  EXPECT_EQ(tp_dp.Shard(global, 1).values(), (std::vector<float>{4, 5}));
  // Position 2: dp=1, tp=0. Block 2 vs 1.
  EXPECT_EQ(dp_tp.Shard(global, 2).values(), (std::vector<float>{4, 5}));
  EXPECT_EQ(tp_dp.Shard(global, 2).values(), (std::vector<float>{2, 3}));
  EXPECT_EQ(tp_dp.BlockIndex(1), (std::vector<int64_t>{2}));
}

TEST(ShardingTest, ShardThenAssembleRoundTrips) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 3}});
  const Array global = Arange({12, 6, 2});
  for (const std::string text :
       {"P()", "P('dp')", "P('tp', 'dp')", "P('dp', 'tp', None)", "P(None, ('tp', 'dp'))",
        "P(('dp', 'tp'), None, None)", "P(('tp', 'dp'))", "P(None, None, 'dp')"}) {
    const Sharding sharding(mesh, ParsePartitionSpec(text), global.shape());
    std::string axis = "unset";
    const Array back = sharding.Assemble(ShardAll(sharding, global), &axis);
    EXPECT_EQ(axis, "") << text;
    EXPECT_EQ(back.shape(), global.shape()) << text;
    EXPECT_EQ(back.values(), global.values()) << text;
  }
}

TEST(ShardingTest, ScalarsAndShapeOnlyArrays) {
  const Mesh mesh = Iota({{"dp", 2}});
  const Sharding scalar(mesh, PartitionSpec{}, {});
  const Array seven = Array::FromValues(DType::kF32, {}, {7});
  EXPECT_EQ(scalar.Shard(seven, 1).values(), (std::vector<float>{7}));
  EXPECT_EQ(scalar.Assemble(ShardAll(scalar, seven)).values(), (std::vector<float>{7}));

  const Sharding rows(mesh, ParsePartitionSpec("P('dp')"), {6, 2});
  const Array shape_only = Array::ShapeOnly(DType::kBF16, {6, 2});
  const Array block = rows.Shard(shape_only, 1);
  EXPECT_FALSE(block.has_data());
  EXPECT_EQ(block.shape(), (Shape{3, 2}));
  EXPECT_EQ(block.dtype(), DType::kBF16);
  const Array back = rows.Assemble({block, block});
  EXPECT_FALSE(back.has_data());
  EXPECT_EQ(back.shape(), (Shape{6, 2}));
}

TEST(ShardingTest, AssembleDetectsReplicaMismatch) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 2}});
  const Sharding sharding(mesh, ParsePartitionSpec("P('dp', None)"), {4, 2});
  std::vector<Array> locals = ShardAll(sharding, Arange({4, 2}));
  // A rounding-level difference between replicas is tolerated.
  locals[1].data()[1] = std::nextafter(locals[1].at(1), 2.0f);
  locals[1].data()[0] = 1e-7f;  // Cancellation near zero, relative to the block's scale.
  std::string axis;
  sharding.Assemble(locals, &axis);
  EXPECT_EQ(axis, "");
  // Position 3 (dp=1, tp=1) disagrees with position 2 (dp=1, tp=0).
  locals[3].data()[1] += 1;
  const Array built = sharding.Assemble(locals, &axis);
  EXPECT_EQ(axis, "tp");
  EXPECT_EQ(built.values(), Arange({4, 2}).values());  // From the first replicas.
  try {
    sharding.Assemble(locals);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "values differ along mesh axis 'tp' (devices 2 and 3 hold different blocks), "
              "which P('dp', None) leaves replicated");
  }
}

TEST(ShardingTest, AssembleRejectsWrongBlocks) {
  const Sharding sharding(Iota({{"dp", 2}}), ParsePartitionSpec("P('dp')"), {4});
  EXPECT_THROW(sharding.Assemble({Arange({2})}), std::invalid_argument);
  EXPECT_THROW(sharding.Assemble({Arange({2}), Arange({4})}), std::invalid_argument);
  EXPECT_THROW(sharding.Shard(Arange({6}), 0), std::invalid_argument);
  EXPECT_THROW(Sharding(Iota({{"dp", 2}}), ParsePartitionSpec("P('dp')"), {5}),
               std::invalid_argument);
}

TEST(ShardingTest, TypeStrings) {
  const Mesh mesh = Iota({{"dp", 4}, {"tp", 2}});
  const Sharding rows(mesh, ParsePartitionSpec("P('dp', None)"), {1024, 4096});
  EXPECT_EQ(rows.GlobalType(DType::kF32), "f32[1024@dp,4096]");
  EXPECT_EQ(rows.LocalType(DType::kF32), "f32[256,4096]{dp}");
  const Sharding tuple(mesh, ParsePartitionSpec("P(('dp', 'tp'), None)"), {1024, 4096});
  EXPECT_EQ(tuple.GlobalType(DType::kBF16), "bf16[1024@(dp,tp),4096]");
  EXPECT_EQ(tuple.LocalType(DType::kBF16), "bf16[128,4096]{dp,tp}");
  const Sharding both(mesh, ParsePartitionSpec("P('tp', 'dp')"), {8, 8});
  EXPECT_EQ(both.GlobalType(DType::kI32), "i32[8@tp,8@dp]");
  EXPECT_EQ(both.LocalType(DType::kI32), "i32[4,2]{dp,tp}");  // Mesh order.
  const Sharding replicated(mesh, ParsePartitionSpec("P()"), {1024, 4096});
  EXPECT_EQ(replicated.GlobalType(DType::kF32), "f32[1024,4096]");
  EXPECT_EQ(replicated.LocalType(DType::kF32), "f32[1024,4096]");
}

TEST(ShardingTest, VisualizesTwoDimensionalBlocks) {
  const Sharding sharding(Iota({{"dp", 2}, {"tp", 2}}), ParsePartitionSpec("P('dp', 'tp')"),
                          {8, 8});
  EXPECT_EQ(VisualizeSharding(sharding),
            "+---------+---------+\n"
            "|         |         |\n"
            "|    0    |    1    |\n"
            "|         |         |\n"
            "+---------+---------+\n"
            "|         |         |\n"
            "|    2    |    3    |\n"
            "|         |         |\n"
            "+---------+---------+\n");
}

TEST(ShardingTest, VisualizesReplicasAndPartialSharding) {
  const Mesh mesh = Iota({{"dp", 2}, {"tp", 2}});
  EXPECT_EQ(VisualizeSharding(Sharding(mesh, ParsePartitionSpec("P()"), {16}), "TPU "),
            "+-----------+\n"
            "|  TPU 0-3  |\n"
            "+-----------+\n");
  EXPECT_EQ(VisualizeSharding(Sharding(mesh, ParsePartitionSpec("P('tp')"), {16}), "TPU "),
            "+-----------+-----------+\n"
            "|  TPU 0,2  |  TPU 1,3  |\n"
            "+-----------+-----------+\n");
  const Mesh custom({{"dp", 2}, {"tp", 2}}, {3, 2, 1, 0});
  EXPECT_EQ(VisualizeSharding(Sharding(custom, ParsePartitionSpec("P(None, 'dp')"), {4, 4})),
            "+---------+---------+\n"
            "|         |         |\n"
            "|   2,3   |   0,1   |\n"
            "|         |         |\n"
            "+---------+---------+\n");
}

TEST(ShardingTest, VisualizationFitsTheWidth) {
  const Sharding sharding(Iota({{"x", 16}}), ParsePartitionSpec("P('x')"), {16});
  const std::string grid = VisualizeSharding(sharding, "TPU ", 80);
  const std::string first_line = grid.substr(0, grid.find('\n'));
  EXPECT_EQ(first_line.size(), 65u);               // 16 cells of 3 columns.
  EXPECT_EQ(grid.find("TPU"), std::string::npos);  // The prefix is dropped to fit.
  EXPECT_NE(grid.find("| 0 | 1 |"), std::string::npos);
  EXPECT_NE(grid.find("|15 |"), std::string::npos);

  const Sharding replicated(Mesh({{"x", 4}}, {0, 2, 4, 6}), PartitionSpec{}, {4});
  EXPECT_EQ(VisualizeSharding(replicated, "", 8),
            "+------+\n"
            "|0,2,..|\n"
            "+------+\n");
  EXPECT_THROW(VisualizeSharding(Sharding(Iota({{"x", 2}}), PartitionSpec{}, {2, 2, 2})),
               std::invalid_argument);
}

}  // namespace
}  // namespace shardsim
