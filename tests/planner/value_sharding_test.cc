#include "planner/value_sharding.h"

#include <gtest/gtest.h>

namespace shardsim::planner {
namespace {

const std::vector<MeshAxis> kAxes = {{"dp", 4}, {"tp", 2}};

TEST(ValueShardingTest, SpecRoundTripAndTypeNotation) {
  ValueSharding s = FromSpec(ParsePartitionSpec("P(('dp', 'tp'), None)"), 3, kAxes);
  EXPECT_EQ(s.dims, (std::vector<std::vector<int>>{{0, 1}, {}, {}}));
  EXPECT_EQ(FormatPartitionSpec(ToSpec(s, kAxes)), "P(('dp', 'tp'),)");
  EXPECT_EQ(LocalShape({16, 3, 5}, s, kAxes), (Shape{2, 3, 5}));
  s.partial = {};
  EXPECT_EQ(FormatType(DType::kF32, {16, 3, 5}, s, kAxes), "f32[16@(dp,tp),3,5]");
  ValueSharding p = FromSpec(ParsePartitionSpec("P(None, 'dp')"), 2, kAxes);
  p.partial = {1};
  EXPECT_EQ(FormatType(DType::kBF16, {8, 8}, p, kAxes), "bf16[8,8@dp]{partial: tp}");
  EXPECT_EQ(SplitAxes(s), (std::vector<int>{0, 1}));
}

TEST(ValueShardingTest, RefusesWhatDoesNotFit) {
  EXPECT_THROW(FromSpec(ParsePartitionSpec("P('dp', None, None)"), 2, kAxes),
               std::invalid_argument);
  EXPECT_THROW(FromSpec(ParsePartitionSpec("P('ep')"), 2, kAxes), std::invalid_argument);
  EXPECT_THROW(LocalShape({6, 2}, FromSpec(ParsePartitionSpec("P('dp')"), 2, kAxes), kAxes),
               std::invalid_argument);
}

}  // namespace
}  // namespace shardsim::planner
