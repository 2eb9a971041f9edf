// The loader reads grad ops of global programs: `of` and `wrt` name values defined before the op,
// one output per wrt entry; bad names and counts get located one-line errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sim/cli/run_file.h"

namespace shardsim {
namespace {

// A temporary run file with `mode` and the program `ops` (YAML list entries, one a line, each
// on line 7 onwards) over arrays x: f32[8, 4] and w: f32[4, 2]; removed when the test ends.
class GradFile {
 public:
  GradFile(const std::string& mode, const std::vector<std::string>& ops,
           const std::string& outputs = "{g: \"P()\"}")
      : path_(std::filesystem::temp_directory_path() /
              ("shardsim_grad_file_" + std::to_string(getpid()) + ".yaml")) {
    std::ofstream file(path_);
    file << "hardware: {preset: tpu-v5e, shape: [2, 1]}\n"
         << "mode: " << mode << "\n"
         << "mesh: {axes: {d: 2}}\n"
         << "arrays:\n"
         << "  x: {shape: [8, 4], init: normal, sharding: \"P('d', None)\"}\n"
         << "  w: {shape: [4, 2], init: normal, seed: 1}\n"
         << "program:\n";
    for (const std::string& op : ops) file << "  - " << op << "\n";
    file << "outputs: " << outputs << "\n";
  }
  ~GradFile() { std::filesystem::remove(path_); }
  // The file's path.
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// The ops of a loss over x and w: y = x @ w, loss = sum(y * y) as an einsum.
const std::vector<std::string> kLoss = {"{op: matmul, in: [x, w], out: y}",
                                        "{op: einsum, in: [y, y], out: loss, spec: \"ab,ab->\"}"};

// `kLoss` followed by `op`.
std::vector<std::string> LossThen(const std::string& op) {
  std::vector<std::string> ops = kLoss;
  ops.push_back(op);
  return ops;
}

TEST(GradFileTest, LoadsGradWithItsNames) {
  GradFile file("auto", LossThen("{op: grad, of: loss, wrt: [w, x], out: [g, gx]}"));
  RunFile loaded = LoadRunFile(file.path());
  ASSERT_TRUE(loaded.program.has_value());
  const OpSpec& grad = loaded.program->ops.at(2);
  EXPECT_EQ(grad.kind, OpKind::kGrad);
  EXPECT_EQ(grad.of, "loss");
  EXPECT_EQ(grad.wrt, (std::vector<std::string>{"w", "x"}));
  EXPECT_EQ(grad.out, (std::vector<std::string>{"g", "gx"}));
  EXPECT_TRUE(grad.in.empty());
  EXPECT_EQ(loaded.program->mode, ProgramMode::kAuto);
  EXPECT_EQ(loaded.locations.at("program.2.of").line, 10);
}

// One bad grad entry (the program's third op, on line 10) and the error it must give.
struct BadGradCase {
  std::string name;      // Test name.
  std::string mode;      // The file's mode.
  std::string op;        // The grad entry.
  std::string key;       // The key the message names.
  std::string fragment;  // Text the message must contain.
};

void PrintTo(const BadGradCase& c, std::ostream* os) { *os << c.name; }

class BadGradTest : public testing::TestWithParam<BadGradCase> {};

TEST_P(BadGradTest, GivesLocatedOneLineError) {
  const BadGradCase& c = GetParam();
  GradFile file(c.mode, LossThen(c.op));
  std::string message;
  try {
    LoadRunFile(file.path());
  } catch (const InputError& e) {
    message = e.what();
  }
  EXPECT_TRUE(message.starts_with(file.path() + ":10:")) << message;
  EXPECT_TRUE(message.ends_with(" (key " + c.key + ")")) << message;
  EXPECT_NE(message.find(c.fragment), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Entries, BadGradTest,
    testing::Values(
        BadGradCase{"ManualMode", "manual", "{op: grad, of: loss, wrt: [w], out: [g]}",
                    "program.2.op", "grad works on global arrays: it needs mode: explicit or auto"},
        BadGradCase{"OfUndefined", "auto", "{op: grad, of: los, wrt: [w], out: [g]}",
                    "program.2.of", "'los' is not defined; did you mean 'loss'?"},
        BadGradCase{"WrtUndefined", "explicit", "{op: grad, of: loss, wrt: [w, v], out: [g, h]}",
                    "program.2.wrt.1", "'v' is not defined"},
        BadGradCase{"WrtIsItsOwnOutput", "auto", "{op: grad, of: loss, wrt: [g], out: [g]}",
                    "program.2.wrt.0", "'g' is not defined before this op (this op makes it)"},
        BadGradCase{"WrtEmpty", "auto", "{op: grad, of: loss, wrt: [], out: [g]}", "program.2.wrt",
                    "expected at least one value name, got an empty list"},
        BadGradCase{"WrtNotAList", "auto", "{op: grad, of: loss, wrt: w, out: [g]}",
                    "program.2.wrt", "expected a list of value names like [w1, w2]"},
        BadGradCase{"OutCount", "auto", "{op: grad, of: loss, wrt: [w, x], out: [g]}",
                    "program.2.out", "grad makes one output per wrt entry (2), got 1 names"},
        BadGradCase{"MissingOf", "auto", "{op: grad, wrt: [w], out: [g]}", "program.2.of",
                    "missing required key 'of'"},
        BadGradCase{"TakesNoIn", "auto", "{op: grad, in: loss, of: loss, wrt: [w], out: [g]}",
                    "program.2.in", "key 'in' does not apply to op grad"}),
    [](const testing::TestParamInfo<BadGradCase>& info) { return info.param.name; });

}  // namespace
}  // namespace shardsim
