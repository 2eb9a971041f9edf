// The array ops of global programs in run files: the loader reads their attributes (an axis or
// a list of axes, top_k's two outputs, eps), reads `{op: max, in: x, axis: ...}` as the
// reduction reduce_max, and a manual-mode program of them runs through the real binary with
// values that match closed forms and a passing numerics check.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collectives/npy.h"
#include "sim/cli/run_file.h"
#include "tests/cli/subprocess.h"

namespace shardsim {
namespace {

namespace fs = std::filesystem;
using cli_test::CliFixture;
using cli_test::ReadFile;
using cli_test::Result;

// A manual-mode run file on two devices with x f32[4, 6] (arange), s f32[6] and ids i32[3],
// all replicated, whose program is `ops` (YAML list entries, one per line) and whose outputs
// are `outputs` (a YAML mapping's body).
std::string RunFileWith(const std::string& ops, const std::string& outputs = "y: \"P()\"") {
  return "hardware: {preset: tpu-v5e, shape: [2, 1]}\n"
         "mesh: {axes: {dp: 2}}\n"
         "arrays:\n"
         "  x: {shape: [4, 6], init: arange}\n"
         "  s: {shape: [6], init: ones}\n"
         "  ids: {shape: [3], dtype: i32, init: {value: [0, 2, 3]}}\n"
         "program:\n" +
         ops + "outputs: {" + outputs + "}\n";
}

class NnOpsRunFileTest : public CliFixture {
 protected:
  // Loads a run file holding `ops`.
  RunFile Load(const std::string& ops, const std::string& outputs = "y: \"P()\"") {
    return LoadRunFile(WriteInput("f.yaml", RunFileWith(ops, outputs)));
  }
  // The loader's one-line message for a run file holding `ops`, or "" when it loads.
  std::string LoadMessage(const std::string& ops, const std::string& outputs = "y: \"P()\"") {
    try {
      Load(ops, outputs);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
};

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(NnOpsRunFileTest, MaxOfOneInputWithAxisOrKeepdimsIsReduceMax) {
  RunFile f = Load("  - {op: max, in: x, out: y, axis: 1}\n");
  const OpSpec& op = f.program->ops.at(0);
  EXPECT_EQ(op.kind, OpKind::kReduceMax);
  EXPECT_EQ(op.axes, (std::vector<int64_t>{1}));
  EXPECT_EQ(op.name, "y");
  // keepdims alone (false included) asks for the reduction over every axis, jnp.max(x).
  f = Load("  - {op: max, in: [x], out: y, keepdims: false}\n");
  EXPECT_EQ(f.program->ops.at(0).kind, OpKind::kReduceMax);
  EXPECT_TRUE(f.program->ops.at(0).axes.empty());
  // The elementwise max stays itself.
  EXPECT_EQ(Load("  - {op: max, in: [x, x], out: y}\n").program->ops.at(0).kind, OpKind::kMax);
  EXPECT_EQ(Load("  - {op: max, in: x, scalar: 0, out: y}\n").program->ops.at(0).kind,
            OpKind::kMax);
  EXPECT_EQ(Load("  - {op: reduce_max, in: x, out: y, axis: [0, 1], keepdims: true}\n")
                .program->ops.at(0)
                .keepdims,
            true);
}

TEST_F(NnOpsRunFileTest, MaxMessagesSayWhichMaxTakesWhat) {
  EXPECT_TRUE(Contains(LoadMessage("  - {op: max, in: [x, x], out: y, axis: 0}\n"),
                       "key 'axis' does not apply to op max with 2 inputs; the reduction max "
                       "(reduce_max) takes one input and no scalar (key program.0.axis)"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: max, in: x, scalar: 1, out: y, keepdims: true}\n"),
                       "key 'keepdims' does not apply to op max with 1 input and scalar:"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: max, in: x, out: y}\n"),
                       "max takes in: [a, b], or in: a with scalar:, got 1 input and no scalar "
                       "(the reduction max of one input needs axis: or keepdims:, or is "
                       "reduce_max)"));
}

TEST_F(NnOpsRunFileTest, ReadsAnAxisOrAListOfAxes) {
  EXPECT_EQ(Load("  - {op: sum, in: x, out: y, axis: -1}\n").program->ops.at(0).axes,
            (std::vector<int64_t>{-1}));
  EXPECT_EQ(Load("  - {op: mean, in: x, out: y, axis: [0, -1]}\n").program->ops.at(0).axes,
            (std::vector<int64_t>{0, -1}));
  EXPECT_TRUE(Load("  - {op: sum, in: x, out: y}\n").program->ops.at(0).axes.empty());
  EXPECT_TRUE(Contains(LoadMessage("  - {op: sum, in: x, out: y, axis: []}\n"),
                       "expected at least one axis; leave axis out to reduce all"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: sum, in: x, out: y, axis: {a: 1}}\n"),
                       "expected an axis or a list of axes like [0, -1]"));
}

TEST_F(NnOpsRunFileTest, ReadsTheOtherOpsAttributes) {
  RunFile f = Load(
      "  - {op: softmax, in: x, out: p}\n"
      "  - {op: log_softmax, in: x, out: q, axis: 0}\n"
      "  - {op: layer_norm, in: [x, s], out: n, eps: 0.5}\n"
      "  - {op: take, in: [x, ids], out: t, axis: 1}\n"
      "  - {op: top_k, in: x, out: [v, i], k: 2}\n"
      "  - {op: reshape, in: x, out: h, shape: [1, 4, 2, 3]}\n"
      "  - {op: attention, in: [h, h, h], out: y, causal: false}\n");
  const std::vector<OpSpec>& ops = f.program->ops;
  EXPECT_EQ(ops[0].norm_axis, -1);  // The default, the last axis.
  EXPECT_EQ(ops[1].norm_axis, 0);
  EXPECT_EQ(ops[2].eps, 0.5);
  EXPECT_EQ(ops[3].axis, 1);
  EXPECT_EQ(ops[4].k, 2);
  EXPECT_EQ(ops[4].out, (std::vector<std::string>{"v", "i"}));
  EXPECT_FALSE(ops[6].causal);
  EXPECT_TRUE(Load("  - {op: attention, in: [x, x, x], out: y}\n").program->ops.at(0).causal);
}

TEST_F(NnOpsRunFileTest, RefusesBadCountsAndValues) {
  EXPECT_TRUE(Contains(LoadMessage("  - {op: top_k, in: x, out: y, k: 2}\n"),
                       "top_k makes 2 outputs, got 1 names (key program.0.out)"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: top_k, in: x, out: [y, i], k: 0}\n"),
                       "must be positive, got 0 (key program.0.k)"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: attention, in: [x, x], out: y}\n"),
                       "attention takes 3 inputs (in: [a, b, c]), got 2"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: rms_norm, in: [x, s], out: y, eps: -1}\n"),
                       "eps must be a finite number >= 0, got -1"));
  EXPECT_TRUE(Contains(LoadMessage("  - {op: cross_entropy, in: x, out: y}\n"),
                       "cross_entropy takes 2 inputs (in: [a, b]), got 1"));
}

// Shapes through the ops are lowering's to check: a bad one is one located line, exit 2.
TEST_F(NnOpsRunFileTest, ShapeErrorsAreOneLineAtTheOp) {
  const std::string path =
      WriteInput("bad.yaml", RunFileWith("  - {op: rms_norm, in: [x, ids], out: y}\n"));
  Result r = Run({"run", path});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_TRUE(cli_test::IsOneErrorLine(r.err)) << r;
  EXPECT_TRUE(Contains(r.err, "rms_norm: x must be a float array") ||
              Contains(r.err, "rms_norm: scale must be a float array"))
      << r;
  EXPECT_TRUE(Contains(r.err, "(key program.0)")) << r;
}

// Two devices, each with two rows [0, ln 2] (x) and labels [1, 0].
constexpr char kProgram[] = R"yaml(hardware: {preset: tpu-v5e, shape: [2, 1]}
mesh: {axes: {dp: 2}}
arrays:
  x: {shape: [4, 2], sharding: "P('dp', None)",
      init: {value: [0, 0.6931471805599453, 0, 0.6931471805599453,
                     0, 0.6931471805599453, 0, 0.6931471805599453]}}
  labels: {shape: [4], dtype: i32, init: {value: [1, 0, 1, 0]}, sharding: "P('dp')"}
  ones: {shape: [2], init: ones}
  ids: {shape: [1], dtype: i32, init: {value: [1]}}
program:
  - {op: softmax, in: x, out: p}
  - {op: log_softmax, in: x, out: lp}
  - {op: max, in: x, out: m, axis: 1}
  - {op: sum, in: p, out: ps, axis: -1}
  - {op: mean, in: x, out: mx, keepdims: true}
  - {op: cross_entropy, in: [x, labels], out: ce}
  - {op: pmean, in: ce, out: loss, axis_name: dp}
  - {op: top_k, in: x, out: [tv, ti], k: 1}
  - {op: rms_norm, in: [x, ones], out: n, eps: 0}
  - {op: take, in: [x, ids], out: t}
  - {op: reshape, in: x, out: h, shape: [1, 2, 1, 2]}
  - {op: attention, in: [h, h, h], out: att}
outputs:
  p: "P('dp', None)"
  lp: "P('dp', None)"
  m: "P('dp')"
  ps: "P('dp')"
  mx: "P('dp', None)"
  loss: "P()"
  tv: "P('dp', None)"
  ti: "P('dp', None)"
  n: "P('dp', None)"
  t: "P('dp', None)"
  att: "P('dp', None, None, None)"
)yaml";

// The dumped output `name`, read back.
Array Dumped(const fs::path& dir, const std::string& name) {
  return ReadNpy((dir / (name + ".npy")).string());
}

// Every element of `a` within a float32 ulp of the repeating pattern `want`.
void ExpectPattern(const Array& a, const std::vector<double>& want) {
  ASSERT_GT(a.size(), 0);
  for (int64_t i = 0; i < a.size(); ++i) {
    const double w = want[static_cast<size_t>(i) % want.size()];
    EXPECT_NEAR(a.ValueAt(i), w, 1.2e-7 * std::max(1.0, std::fabs(w))) << "element " << i;
  }
}

TEST_F(NnOpsRunFileTest, ManualProgramRunsThroughTheBinary) {
  const std::string path = WriteInput("nn.yaml", kProgram);
  const fs::path dump = out() / "D";
  const fs::path summary = out() / "S.json";
  RunOk({"run", path, "--dump", dump.string(), "--json", summary.string()});
  nlohmann::json s = nlohmann::json::parse(ReadFile(summary));
  EXPECT_EQ(s["numerics"]["checked"], true) << s.dump();
  EXPECT_EQ(s["numerics"]["passed"], true) << s.dump();
  std::vector<std::string> kinds;
  for (const auto& op : s["ops"]) kinds.push_back(op["op"]);
  EXPECT_EQ(kinds.at(2), "reduce_max");  // Written `max` with an axis.

  const double ln2 = std::log(2.0), ln3 = std::log(3.0);
  ExpectPattern(Dumped(dump, "p"), {1.0 / 3, 2.0 / 3});
  ExpectPattern(Dumped(dump, "lp"), {-ln3, ln2 - ln3});
  ExpectPattern(Dumped(dump, "m"), {ln2});
  ExpectPattern(Dumped(dump, "ps"), {1});
  EXPECT_EQ(Dumped(dump, "mx").shape(), (Shape{2, 1}));  // [1, 1] per device.
  ExpectPattern(Dumped(dump, "mx"), {ln2 / 2});
  EXPECT_EQ(Dumped(dump, "loss").shape(), Shape{});
  ExpectPattern(Dumped(dump, "loss"), {(std::log(1.5) + ln3) / 2});
  ExpectPattern(Dumped(dump, "tv"), {ln2});
  const Array ti = Dumped(dump, "ti");
  EXPECT_EQ(ti.dtype(), DType::kI32);
  EXPECT_EQ(ti.shape(), (Shape{4, 1}));
  ExpectPattern(ti, {1});  // ln 2 > 0 at index 1 of every row.
  // rms of [0, ln 2] is ln 2 / sqrt(2): [0, sqrt(2)].
  ExpectPattern(Dumped(dump, "n"), {0, std::sqrt(2.0)});
  EXPECT_EQ(Dumped(dump, "t").shape(), (Shape{2, 2}));  // Row 1 of each block.
  ExpectPattern(Dumped(dump, "t"), {0, ln2});
  // Every key equals every query: the values' mean, [0, ln 2], with or without the mask.
  EXPECT_EQ(Dumped(dump, "att").shape(), (Shape{2, 2, 1, 2}));
  ExpectPattern(Dumped(dump, "att"), {0, ln2});
}

}  // namespace
}  // namespace shardsim
