// `shardsim collective` blames the flag at fault when the op or algorithm is refused.
#include <gtest/gtest.h>

#include <string>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class CollectiveFlagsTest : public CliFixture {};

TEST_F(CollectiveFlagsTest, RefusedAlgorithmNamesTheAlgorithmFlag) {
  Result r = Run({"collective", "--hardware", "tpu-v5e", "--shape", "2x3", "--mesh", "x=6", "--op",
                  "psum", "--axis", "x", "--sizes", "1MiB", "--algorithm", "halving_doubling"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(IsOneErrorLine(r.err)) << r;
  EXPECT_NE(r.err.find("error: --algorithm halving_doubling: psum: halving_doubling needs a "
                       "power-of-two group, got 6 devices"),
            std::string::npos)
      << r;
}

TEST_F(CollectiveFlagsTest, UnknownAlgorithmNamesTheAlgorithmFlag) {
  Result r = Run({"collective", "--hardware", "tpu-v5e", "--shape", "2x2", "--mesh", "x=4", "--op",
                  "psum", "--axis", "x", "--sizes", "1MiB", "--algorithm", "bogus"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("--algorithm bogus"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("--op.algorithm"), std::string::npos) << r;
}

}  // namespace
}  // namespace shardsim::cli_test
