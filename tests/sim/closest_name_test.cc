#include "sim/closest_name.h"

#include <gtest/gtest.h>

namespace shardsim {
namespace {

TEST(SuggestKeyTest, NearMissesAndPrefixes) {
  const std::vector<std::string> keys = {"bandwidth", "latency"};
  EXPECT_EQ(SuggestKey("bandwith", keys), "bandwidth");
  EXPECT_EQ(SuggestKey("bandwdith", keys), "bandwidth");  // A transposition.
  EXPECT_EQ(SuggestKey("band", keys), "bandwidth");       // A prefix.
  EXPECT_EQ(SuggestKey("latnecy", keys), "latency");
  EXPECT_EQ(SuggestKey("memory", keys), "");
  EXPECT_EQ(SuggestKey("of", {"auto", "on", "off"}), "off");
  EXPECT_EQ(EditDistance("ab", "ba"), 1);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
}

TEST(ClosestNameTest, SuggestsPresetsAndRefusesNoise) {
  const std::vector<std::string> presets = {"tpu-v4", "tpu-v5e", "tpu-v5p", "h100-dgx"};
  EXPECT_EQ(ClosestName("tpu-v5", presets), "tpu-v5e");  // Longer shared prefix wins the tie.
  EXPECT_EQ(ClosestName("H100-DGX", presets), "h100-dgx");
  EXPECT_EQ(ClosestName("quantum-computer", presets), "");
  EXPECT_EQ(JoinNames({"a", "b", "c"}), "a, b, c");
}

}  // namespace
}  // namespace shardsim
