// `shardsim run` on global programs (mode: explicit | auto) and `shardsim lower`: every
// example in configs/jit/ passes its numerics check, lowers to a mode: manual run file, and
// the lowered file runs to the same simulated time with the same outputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/cli/subprocess.h"

namespace shardsim::cli_test {
namespace {

class LowerCliTest : public CliFixture {};

TEST_F(LowerCliTest, EveryJitExampleRoundTrips) {
  int examples = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(SourceDir()) / "configs" / "jit")) {
    if (entry.path().extension() != ".yaml") continue;
    ++examples;
    const std::string file = entry.path().string();
    SCOPED_TRACE(file);
    const std::string stem = entry.path().stem().string();
    const std::string json = (out() / (stem + ".json")).string();
    const std::string dump = (out() / (stem + "_dump")).string();
    RunOk({"run", file, "--numerics", "on", "--json", json, "--dump", dump});
    nlohmann::json original = nlohmann::json::parse(ReadFile(json));
    EXPECT_EQ(original["numerics"]["passed"], true);
    const std::string lowered = (out() / (stem + "_lowered.yaml")).string();
    RunOk({"lower", file, "-o", lowered});
    EXPECT_NE(ReadFile(lowered).find("mode: manual"), std::string::npos);
    const std::string json2 = (out() / (stem + "_lowered.json")).string();
    const std::string dump2 = (out() / (stem + "_lowered_dump")).string();
    RunOk({"run", lowered, "--numerics", "on", "--json", json2, "--dump", dump2});
    nlohmann::json again = nlohmann::json::parse(ReadFile(json2));
    EXPECT_EQ(again["simulated_time_s"], original["simulated_time_s"]);
    EXPECT_EQ(again["ops"].size(), original["ops"].size());
    for (const auto& npy : fs::directory_iterator(dump)) {
      EXPECT_EQ(ReadFile((fs::path(dump2) / npy.path().filename()).string()),
                ReadFile(npy.path().string()))
          << npy.path().filename();
    }
  }
  EXPECT_GE(examples, 3);
}

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

const char* kHead = "hardware: {preset: tpu-v5e, shape: [2, 1]}\nmesh: {axes: {d: 2}}\n"
                    "arrays: {x: {shape: [4, 4], sharding: \"P('d')\"}}\n";

TEST_F(LowerCliTest, ModesKeepTheirOwnOps) {
  std::string manual = WriteInput(
      "m.yaml", std::string(kHead) +
                    "program:\n  - {op: reshard, in: x, out: y, sharding: \"P()\"}\noutputs: {y: "
                    "\"P()\"}\n");
  Result r = Run({"run", manual});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_NE(r.err.find("m.yaml:5:10: reshard works on global arrays: it needs mode: explicit or auto"),
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
