// Run files on several meshes (SPEC "Several disjoint meshes"): what the loader reads, and every
// refusal as a located one-line error at the key it blames.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "sim/cli/run_file.h"

namespace shardsim {
namespace {

// The teacher/student layout: mesh infer {tp: 4} on devices 0-3, train {dp: 4} on 4-7, one
// array on each, and the program lines given.
std::string File(const std::string& program, const std::string& meshes = "",
                 const std::string& arrays = "", const std::string& outputs = "") {
  return "hardware: {preset: tpu-v5e, shape: [4, 2]}\n"
         "mode: manual\n" +
         (meshes.empty() ? "meshes:\n"
                           "  infer: {axes: {tp: 4}, devices: [0, 1, 2, 3]}\n"
                           "  train: {axes: {dp: 4}, devices: [4, 5, 6, 7]}\n"
                         : meshes) +
         (arrays.empty() ? "arrays:\n"
                           "  t: {shape: [8, 4], mesh: infer, sharding: \"P('tp', None)\"}\n"
                           "  w: {shape: [8, 4], mesh: train, sharding: \"P()\"}\n"
                         : arrays) +
         "program:\n" + program + (outputs.empty() ? "outputs: {y: \"P()\"}\n" : outputs);
}

// A temporary run file; removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& text)
      : path_(std::filesystem::temp_directory_path() /
              ("shardsim_meshes_" + std::to_string(getpid()) + ".yaml")) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// The loader's one-line message for `text` ("" when it loads), with the file's path cut to
// "F" so cases read as they would print.
std::string Error(const std::string& text) {
  TempFile file(text);
  try {
    LoadRunFile(file.path());
  } catch (const InputError& e) {
    std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (message.rfind(file.path(), 0) == 0) message = "F" + message.substr(file.path().size());
    return message;
  }
  return "";
}

constexpr char kPut[] =
    "  - {op: device_put, in: t, out: u, sharding: \"P('dp', None)\", in_sharding: \"P('tp', "
    "None)\", mesh: train}\n";

TEST(MeshesFileTest, LoadsMeshesAndEachOpsMesh) {
  TempFile file(File(std::string(kPut) + "  - {op: add, in: [u, w], out: y}\n"));
  const RunFile loaded = LoadRunFile(file.path());
  const ProgramSpec& p = *loaded.program;
  ASSERT_EQ(p.meshes.size(), 2u);
  EXPECT_EQ(p.meshes[1].name, "train");
  EXPECT_EQ(p.meshes[1].devices, (std::vector<int>{4, 5, 6, 7}));
  ASSERT_EQ(p.mesh_axes.size(), 2u);  // tp, then dp.
  EXPECT_EQ(p.mesh_axes[1].name, "dp");
  EXPECT_EQ(p.arrays[0].mesh, "infer");
  EXPECT_EQ(p.ops[0].mesh, "train");
  EXPECT_EQ(p.ops[1].mesh, "train");  // From its inputs.
}

// Gradients whose names swap their parameters': each lives on its own parameter's mesh (every
// parameter's mesh is read before the outputs rebind the names), so gw2, named w1, takes b's dp.
TEST(MeshesFileTest, GradientsNamedAsOtherParametersLiveOnTheirOwnParametersMesh) {
  EXPECT_EQ(Error("hardware: {preset: tpu-v5e, shape: [4, 2]}\nmode: auto\nmeshes:\n  a: {axes: "
                  "{x: 4}}\n  b: {axes: {y: 4}}\narrays:\n  w1: {shape: [8, 4], mesh: a}\n  w2: "
                  "{shape: [8, 4], mesh: b}\nprogram:\n  - {op: device_put, in: w1, out: u, "
                  "sharding: \"P()\", mesh: b}\n  - {op: mul, in: [u, w2], out: z}\n  - {op: sum, "
                  "in: z, out: l}\n  - {op: grad, of: l, wrt: [w1, w2], out: [w2, w1]}\n  - {op: "
                  "add, in: [w1, w1], out: v}\noutputs: {w1: \"P('y', None)\", w2: \"P('x', "
                  "None)\", v: \"P()\"}\n"),
            "");
}

struct BadCase {
  const char* name;
  std::string text;
  std::string message;  // The whole line, the path written F.
};

class MeshesBadFileTest : public testing::TestWithParam<BadCase> {};

TEST_P(MeshesBadFileTest, GivesLocatedOneLineError) {
  EXPECT_EQ(Error(GetParam().text), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, MeshesBadFileTest,
    testing::Values(
        BadCase{"OpReadsAnotherMeshsValue",
                File(std::string(kPut) + "  - {op: add, in: [t, w], out: y}\n"),
                "F:11:23: 'w' lives on mesh 'train' but the op runs on mesh 'infer'; device_put it "
                "there first (key program.1.in.1)"},
        BadCase{"OpMixesMeshes", File("  - {op: add, in: [w, t], out: y}\n"),
                "F:10:23: 't' lives on mesh 'infer' but the op runs on mesh 'train'; device_put it "
                "there first (key program.0.in.1)"},
        BadCase{"CollectiveOverAnotherMeshsAxis",
                File("  - {op: psum, in: w, out: y, axis_name: tp}\n"),
                "F:10:42: 'tp' is not a mesh axis; did you mean 'dp'? (key program.0.axis_name)"},
        BadCase{"ArrayWithoutMesh",
                File("  - {op: neg, in: w, out: y}\n", "",
                     "arrays:\n  t: {shape: [8, 4]}\n  w: {shape: [8, 4], "
                     "mesh: train}\n"),
                "F:7:6: missing required key 'mesh' (the array's mesh, one of infer, train) (key "
                "arrays.t.mesh)"},
        BadCase{"ArrayShardedOverAnotherMesh",
                File("  - {op: neg, in: w, out: y}\n", "",
                     "arrays:\n  t: {shape: [8, 4], mesh: infer, sharding: \"P('dp')\"}\n  w: "
                     "{shape: [8, 4], mesh: train}\n"),
                "F:7:45: 'dp' is not a mesh axis; did you mean 'tp'? (key arrays.t.sharding)"},
        BadCase{"AxisInTwoMeshes",
                File("  - {op: neg, in: w, out: y}\n",
                     "meshes:\n  infer: {axes: {dp: 4}}\n  train: {axes: {dp: 4}}\n"),
                "F:5:18: mesh axis 'dp' is an axis of mesh 'infer' too; give each mesh's axes "
                "their own names (key meshes.train.axes.dp)"},
        BadCase{"DeviceInTwoMeshes",
                File("  - {op: neg, in: w, out: y}\n",
                     "meshes:\n  infer: {axes: {tp: 4}, devices: [0, 1, 2, 3]}\n  train: {axes: "
                     "{dp: 4}, devices: [3, 4, 5, 6]}\n"),
                "F:5:36: device 3 is in mesh 'infer' too; meshes are disjoint (key "
                "meshes.train.devices.0)"},
        BadCase{"UnknownMesh", File("  - {op: neg, in: w, out: y, mesh: trian}\n"),
                "F:10:36: 'trian' is not a mesh; did you mean 'train'? (key program.0.mesh)"},
        BadCase{"DevicePutWithoutDestination",
                File("  - {op: device_put, in: t, out: y, sharding: \"P()\"}\n"),
                "F:10:5: missing required key 'mesh' (the destination mesh, one of infer, train) "
                "(key program.0.mesh)"},
        BadCase{"DevicePutToItsOwnMesh",
                File("  - {op: device_put, in: t, out: y, sharding: \"P()\", mesh: infer}\n"),
                "F:10:26: 't' is on mesh 'infer' already; device_put moves it to another mesh (key "
                "program.0.in)"},
        BadCase{"DevicePutShardingOverTheSource",
                File("  - {op: device_put, in: t, out: y, sharding: \"P('tp')\", mesh: train}\n"),
                "F:10:47: 'tp' is not an axis of mesh 'train'; did you mean 'dp'? (key "
                "program.0.sharding)"},
        BadCase{"InShardingInAGlobalProgram",
                "hardware: {preset: tpu-v5e, shape: [4, 2]}\nmode: auto\nmeshes:\n  a: {axes: "
                "{x: 4}}\n  b: {axes: {y: 4}}\narrays:\n  t: {shape: [8, 4], mesh: a}\nprogram:\n"
                "  - {op: device_put, in: t, out: y, sharding: \"P()\", in_sharding: \"P()\", "
                "mesh: b}\noutputs: {y: \"P()\"}\n",
                "F:9:54: in_sharding: a global program's device_put moves its input as it is laid "
                "out; only a shard_map body (mode: manual) writes it (key program.0.in_sharding)"},
        BadCase{"DevicePutOnOneMesh",
                "hardware: {preset: tpu-v5e, shape: [4, 2]}\nmesh: {axes: {x: 8}}\narrays:\n  t: "
                "{shape: [8, 4]}\nprogram:\n  - {op: device_put, in: t, out: y, sharding: "
                "\"P()\"}\noutputs: {y: \"P()\"}\n",
                "F:6:5: device_put moves arrays between meshes; the run has one mesh (write "
                "meshes: to have several) (key program.0.mesh)"},
        BadCase{"MeshAndMeshes",
                "hardware: {preset: tpu-v5e, shape: [4, 2]}\nmesh: {axes: {x: 8}}\nmeshes: {a: "
                "{axes: {x: 8}}}\narrays:\n  t: {shape: [8, 4]}\nprogram:\n  - {op: neg, in: t, "
                "out: y}\noutputs: {y: \"P()\"}\n",
                "F:3:1: give mesh: (one mesh) or meshes: (several), not both (key meshes)"},
        // A gradient lives on its parameter's mesh: gw on b has no axis x (gt, on a, has).
        BadCase{"GradientOnItsParametersMesh",
                "hardware: {preset: tpu-v5e, shape: [4, 2]}\nmode: auto\nmeshes:\n  a: {axes: "
                "{x: 4}}\n  b: {axes: {y: 4}}\narrays:\n  t: {shape: [8, 4], mesh: a}\n  w: "
                "{shape: [8, 4], mesh: b}\nprogram:\n  - {op: device_put, in: t, out: u, "
                "sharding: \"P()\", mesh: b}\n  - {op: mul, in: [u, w], out: z}\n  - {op: sum, "
                "in: z, out: l}\n  - {op: grad, of: l, wrt: [w, t], out: [gw, gt]}\noutputs: "
                "{gt: \"P('x', None)\", gw: \"P('x', None)\"}\n",
                "F:14:35: 'x' is not a mesh axis (mesh axes: y) (key outputs.gw)"}),
    [](const testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace shardsim
