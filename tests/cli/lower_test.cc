// `shardsim run` on global programs (mode: explicit | auto) and `shardsim lower`: reasons,
// modes' own ops. The examples' round trips are in jit_examples_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class LowerCliTest : public CliFixture {};

// Inserted collectives carry their reason in the JSON summary.
TEST_F(LowerCliTest, InsertedCollectivesSayWhy) {
  const std::string json = (out() / "s.json").string();
  RunOk({"run", (fs::path(SourceDir()) / "configs/jit/einsum_auto.yaml").string(), "--numerics",
         "off", "--json", json});
  nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  ASSERT_EQ(j["ops"].size(), 3u);
  EXPECT_EQ(j["ops"][2]["op"], "psum");
  EXPECT_EQ(j["ops"][2]["reason"], "output out as P('X', None): psum over Y");
  EXPECT_FALSE(j["ops"][1].contains("reason"));
}

const char* kHead =
    "hardware: {preset: tpu-v5e, shape: [2, 1]}\nmesh: {axes: {d: 2}}\n"
    "arrays: {x: {shape: [4, 4], sharding: \"P('d')\"}}\n";

TEST_F(LowerCliTest, ModesKeepTheirOwnOps) {
  std::string manual = WriteInput(
      "m.yaml", std::string(kHead) +
                    "program:\n  - {op: reshard, in: x, out: y, sharding: \"P()\"}\noutputs: {y: "
                    "\"P()\"}\n");
  Result r = Run({"run", manual});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(
      r.err.find("m.yaml:5:10: reshard works on global arrays: it needs mode: explicit or auto"),
      std::string::npos)
      << r;
  std::string global = WriteInput(
      "g.yaml", std::string(kHead) +
                    "mode: auto\nprogram:\n  - {op: psum, in: x, out: y, axis_name: d}\noutputs: "
                    "{y: \"P()\"}\n");
  r = Run({"run", global});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("psum names mesh axes, which only a shard_map body (mode: manual) can"),
            std::string::npos)
      << r;
  r = Run({"lower", manual});
  EXPECT_EQ(r.exit_code, 2) << r;
}

}  // namespace
}  // namespace shardsim::cli_test
