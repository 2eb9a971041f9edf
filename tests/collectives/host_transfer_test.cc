// Host offload in the executor: move_to_host and move_to_device copy a device's block over its
// host link (tpu presets: 1.6e10 B/s each way, hardware.md) on one DMA queue per direction,
// issued in program order beside the compute stream; a value in host memory takes no HBM; only
// move_to_device may read it; the values pass through unchanged.
#include <gtest/gtest.h>

#include <string>

#include "collectives/ir/program_builder.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "sim/spec_error.h"
#include "tests/support/specs.h"
#include "topology/presets.h"
#include "topology/switch.h"

namespace shardsim {
namespace {

using test::Arange;
using test::P;

// 4 MiB per device: f32[2048, 1024] split over dp = 2.
constexpr int64_t kBlock = 4 << 20;
// One such block over the 1.6e10 B/s host link: 4194304 / 1.6e10 s = 262.144 us (the unit
// conversion rounds up to the next picosecond; checked against the closed form below).
const Time kCopy = Bandwidth::BytesPerSecond(1.6e10).TransferTime(Bytes(kBlock));

TEST(HostTransferTest, CopyTimeIsTheClosedForm) {
  EXPECT_NEAR(static_cast<double>(kCopy.picoseconds()), 262144e3, 1.0);
}

std::string Move(ProgramBuilder& b, OpKind kind, const std::string& in, const std::string& out) {
  OpSpec op;
  op.kind = kind;
  op.in = {in};
  op.out = {out};
  return b.Add(std::move(op));
}

const OpTiming& TimingOf(const RunResult& r, const std::string& name) {
  for (const OpTiming& t : r.ops) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no op " << name;
  return r.ops.front();
}

Machine TpuMachine() { return Machine(BuildPreset("tpu-v5e", {2, 1})); }

// x to host and back, then relu: the copies take one block over the link each, in turn (the
// second reads the first's result); HBM holds x (an input) and the fetched copy d, which relu
// overwrites in place (its last reader), so the peak is 2 blocks, never 3: the host copy takes
// no HBM. Host memory holds one block at most. The values come back unchanged.
TEST(HostTransferTest, RoundTripTakesTheLinkTimeEachWayAndNoHbm) {
  Machine machine = TpuMachine();
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {2048, 1024}, DType::kF32, P({{"dp"}}), Arange());
  Move(b, OpKind::kMoveToHost, "x", "h");
  Move(b, OpKind::kMoveToDevice, "h", "d");
  b.Unary(OpKind::kRelu, "d", "y");
  b.Output("y", P({{"dp"}}));
  const ProgramSpec program = std::move(b).Build();
  const Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  for (bool numerics : {false, true}) {
    SCOPED_TRACE(numerics ? "numerics" : "timing");
    RunConfig config;
    config.numerics = numerics;
    const RunResult r = RunProgram(machine, mesh, program, config);
    EXPECT_EQ(TimingOf(r, "h").start, Time());
    EXPECT_EQ(TimingOf(r, "h").end, kCopy);
    EXPECT_EQ(TimingOf(r, "d").start, kCopy);
    EXPECT_EQ(TimingOf(r, "d").end, kCopy + kCopy);
    EXPECT_EQ(TimingOf(r, "y").start, kCopy + kCopy);
    EXPECT_EQ(r.peak_memory.count(), 2 * kBlock);
    EXPECT_EQ(r.host_peak.count(), kBlock);
    EXPECT_EQ(r.host_transfer, kCopy + kCopy);
    if (numerics) {
      const NumericsReport report = CheckNumerics(r.outputs, mesh, program, "", &r.inputs);
      EXPECT_TRUE(report.passed) << report.worst_output;
      EXPECT_EQ(report.max_abs_error, 0.0);
    }
  }
  RunConfig cached;
  cached.timing = TimingPath::kCached;
  const RunResult fast = RunProgram(machine, mesh, program, cached);
  EXPECT_EQ(fast.end, RunProgram(machine, mesh, program, RunConfig{}).end);
  EXPECT_EQ(fast.host_peak.count(), kBlock);
}

// One DMA queue per direction: two copies to the host run one after the other, while a copy
// back (the other direction) runs beside the second.
TEST(HostTransferTest, EachDirectionCopiesOneAtATime) {
  Machine machine = TpuMachine();
  ProgramBuilder b({{"dp", 2}});
  b.Input("x1", {2048, 1024}, DType::kF32, P({{"dp"}}), Arange());
  b.Input("x2", {2048, 1024}, DType::kF32, P({{"dp"}}), Arange());
  Move(b, OpKind::kMoveToHost, "x1", "h1");
  Move(b, OpKind::kMoveToHost, "x2", "h2");
  Move(b, OpKind::kMoveToDevice, "h1", "d1");
  Move(b, OpKind::kMoveToDevice, "h2", "d2");
  b.Binary(OpKind::kAdd, "d1", "d2", "y");
  b.Output("y", P({{"dp"}}));
  const ProgramSpec program = std::move(b).Build();
  const RunResult r = RunProgram(machine, PlaceMesh(machine, program.mesh_axes), program, {});
  EXPECT_EQ(TimingOf(r, "h1").end, kCopy);
  EXPECT_EQ(TimingOf(r, "h2").start, kCopy);
  EXPECT_EQ(TimingOf(r, "d1").start, kCopy);  // Beside h2.
  EXPECT_EQ(TimingOf(r, "d2").start, kCopy + kCopy);
  EXPECT_EQ(TimingOf(r, "d2").end, kCopy * 3);
  EXPECT_EQ(r.host_peak.count(), 2 * kBlock);  // h1 and h2 from T (h2's start) to 2T.
  // Busy copying from 0 to 3T without a gap: the union of both queues' copies.
  EXPECT_EQ(r.host_transfer, kCopy * 3);
}

// A copy is issued at its place in program order: one written after a matmul and a relu waits
// until the compute stream starts the relu (its input was ready at 0), and runs beside it; a
// copy written first runs beside the compute that follows it.
TEST(HostTransferTest, CopiesIssueInProgramOrderBesideCompute) {
  Machine machine = TpuMachine();
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {2048, 1024}, DType::kF32, P({{"dp"}}), Arange());
  b.Input("w", {1024, 1024}, DType::kF32, P({}), Arange());
  Move(b, OpKind::kMoveToHost, "x", "early");
  b.Matmul("x", "w", "a");
  b.Unary(OpKind::kRelu, "a", "r");
  Move(b, OpKind::kMoveToHost, "x", "late");
  b.Output("r", P({{"dp"}}));
  const ProgramSpec program = std::move(b).Build();
  const RunResult r = RunProgram(machine, PlaceMesh(machine, program.mesh_axes), program, {});
  EXPECT_EQ(TimingOf(r, "early").start, Time());
  EXPECT_EQ(TimingOf(r, "a").start, Time());
  EXPECT_GT(TimingOf(r, "a").end, Time());
  EXPECT_EQ(TimingOf(r, "late").start, std::max(TimingOf(r, "r").start, kCopy));
}

// Host memory holds data only: an op other than move_to_device reading a host value, a
// move_to_device of a device value, and a move_to_host of a host value are refused, keyed by
// the op.
TEST(HostTransferTest, OnlyMoveToDeviceReadsHostMemory) {
  Machine machine = TpuMachine();
  struct Case {
    OpKind kind;
    bool from_host;
    const char* message;
  };
  for (const Case& c :
       {Case{OpKind::kRelu, true, "ops read device memory (move_to_device it first)"},
        Case{OpKind::kMoveToDevice, false, "is in device memory already"},
        Case{OpKind::kMoveToHost, true, "'h' is in host memory already"}}) {
    ProgramBuilder b({{"dp", 2}});
    b.Input("x", {2048, 1024}, DType::kF32, P({{"dp"}}), Arange());
    Move(b, OpKind::kMoveToHost, "x", "h");
    OpSpec op;
    op.kind = c.kind;
    op.in = {c.from_host ? "h" : "x"};
    op.out = {"y"};
    b.Add(std::move(op));
    b.Output("y", P({{"dp"}}));
    const ProgramSpec program = std::move(b).Build();
    try {
      RunProgram(machine, PlaceMesh(machine, program.mesh_axes), program, {});
      ADD_FAILURE() << "ran: " << c.message;
    } catch (const SpecError& e) {
      EXPECT_EQ(e.key(), "program.1.in");
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

// A machine whose devices have no host link (GPU presets: hardware.md gives none) refuses a
// program that copies, naming the key that gives one.
TEST(HostTransferTest, NoHostLinkRefusesCopies) {
  DeviceSpec device;
  device.flops["f32"] = FlopRate::PerSecond(100e12);
  device.hbm_bandwidth = Bandwidth::GBps(2000);
  device.hbm_capacity = Bytes::GiB(80);
  Machine machine(BuildSwitch(2, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink,
                              device, "switch"));
  ProgramBuilder b({{"dp", 2}});
  b.Input("x", {2048, 1024}, DType::kF32, P({{"dp"}}), Arange());
  Move(b, OpKind::kMoveToHost, "x", "h");
  Move(b, OpKind::kMoveToDevice, "h", "y");
  b.Output("y", P({{"dp"}}));
  const ProgramSpec program = std::move(b).Build();
  try {
    RunProgram(machine, PlaceMesh(machine, program.mesh_axes), program, {});
    ADD_FAILURE() << "ran without a host link";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("hardware.device.host_bandwidth"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardsim
