// Overlapped collective matmuls against closed forms derived from their lowering
// (collective_matmul.cc): a ppermute loop whose per-step compute exceeds its per-step transfer
// is compute-bound (N steps of compute), the reverse is transfer-bound (N - 1 transfers plus one
// step of compute). Every case runs on a 4-device ring with wraparound and a hand-made roofline,
// so each op's time and each shift's time are known exactly and the forms below are exact (the
// 2% tolerance only absorbs picosecond rounding).
//
// Machine: n = 4 devices on a ring with wraparound (BuildTorus({4}, {true})), link bandwidth W
// (chosen per case), hop latency a = 1 us. Roofline: f32 peak P = 100 TFLOP/s, HBM H = 1 TB/s,
// efficiencies 1, op_overhead 0. All arrays f32 (4 bytes).
//
// Op prices (LocalOpCost + RooflineModel, op time = max(FLOPs / P, bytes / H)):
//   matmul [m,k]@[k,f]:  max(2mkf / P, 4(mk + kf + mf) / H)
//   add of e elements:   max(e / P, 12e / H) = 12e / H             (memory-bound)
//   slice to e elements: 2 * 4e / H                                 (read + write of the output)
//   concatenate:         4(in elements + out elements) / H
//   dynamic_slice, dynamic_concat, reshape: free (0).
// Shifts (ppermute by +-1, the direct algorithm): every device sends S bytes one hop to its
// neighbour at once; each directed link carries exactly one transfer, so a shift takes
// T = a + S / W. The two halves of a bidirectional step go +1 and -1: opposite directions of
// every link, no contention, so each takes Th = a + (S/2) / W as if alone.
// Blocking variants use the auto algorithm, bidirectional_ring on a closed ring: n - 1 steps
// of a + (block/2) / W (each member's block split in two halves going opposite ways).
//
// Executor rules that fix the schedules: one compute stream per device running local ops in
// program order, each when the stream is free and its inputs are ready; ppermutes issue in
// program order as soon as their input is ready (a shift whose input is the previous shift's
// output therefore runs back to back with it, independently of compute). All devices are
// symmetric, so every device follows the same schedule and the run ends when device 0 does.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "collectives/compute_model.h"
#include "collectives/lowering.h"
#include "collectives/numerics_check.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "tests/support/specs.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

constexpr int kN = 4;              // Devices on the ring.
constexpr double kPeak = 100e12;   // f32 FLOP/s.
constexpr double kHbm = 1e12;      // Bytes/s.
constexpr double kLatency = 1e-6;  // Per hop, seconds.

RooflineConfig HandRoofline() {
  RooflineConfig c;
  c.peak_flops_f32 = FlopRate::PerSecond(kPeak);
  c.peak_flops_bf16 = FlopRate::PerSecond(kPeak);
  c.peak_flops_f16 = FlopRate::PerSecond(kPeak);
  c.peak_flops_i32 = FlopRate::PerSecond(kPeak);
  c.hbm_bandwidth = Bandwidth::BytesPerSecond(kHbm);
  c.matmul_efficiency = 1.0;
  c.memory_efficiency = 1.0;
  c.op_overhead = Time();
  return c;
}

// Op times in seconds, the roofline written out.
double Matmul(double m, double k, double f) {
  return std::max(2 * m * k * f / kPeak, 4 * (m * k + k * f + m * f) / kHbm);
}
double Add(double elements) { return std::max(elements / kPeak, 12 * elements / kHbm); }
double Slice(double out_elements) { return 2 * 4 * out_elements / kHbm; }
double Concat(double in_elements, double out_elements) {
  return 4 * (in_elements + out_elements) / kHbm;
}
// One shift of `bytes` over one hop of a link of `gbps` GB/s.
double Shift(double bytes, double gbps) { return kLatency + bytes / (gbps * 1e9); }

// The exact matmul time the simulator charges (whole picoseconds).
Time MatmulTime(const RooflineModel& model, double m, double k, double f) {
  OpCost cost{2 * m * k * f, 4 * (m * k + k * f + m * f)};
  return model.OpTime(OpKind::kMatmul, cost, DType::kF32);
}

ArraySpec MakeArray(std::string name, Shape shape, PartitionSpec sharding) {
  ArraySpec a;
  a.name = std::move(name);
  a.shape = std::move(shape);
  a.sharding = std::move(sharding);
  return a;
}

using test::P;

// The ring of kN chips with links of `gbps` GB/s, priced by the hand roofline.
Topology Ring(double gbps) {
  DeviceSpec dev;
  dev.platform = "TPU";
  return BuildTorus({kN}, {true}, Bandwidth::GBps(gbps), Time::Microseconds(1), LinkKind::kIci, dev,
                    "ring");
}

// Runs `program` (timing only) on the ring with links of `gbps` GB/s.
RunResult RunOnRing(const ProgramSpec& program, double gbps, double slowdown = 0.0) {
  Machine machine(Ring(gbps), std::make_unique<RooflineModel>(HandRoofline()), slowdown);
  Mesh mesh = PlaceMesh(machine, program.mesh_axes);
  CheckProgram(mesh, program);
  return RunProgram(machine, mesh, program, RunConfig{});
}

// allgather_matmul gather rhs: x[B, K] replicated, w[K, F] sharded by rows (block kb = K/n).
constexpr int64_t kRhsB = 1024, kRhsKb = 4096, kRhsF = 512;
// allgather_matmul gather lhs: x[n Bl, K] sharded by rows, w[K, F] replicated.
constexpr int64_t kLhsBl = 1024, kLhsK = 4096, kLhsF = 512;
// matmul_reduce_scatter: x[B, n Kl] sharded by columns, w[n Kl, F] by rows, scatter rows.
constexpr int64_t kRsB = 4096, kRsKl = 4096, kRsF = 512;

// y = allgather_matmul(x, w) over axis r, the program's only op.
OpSpec AllgatherMatmulOp(const std::string& gather, const std::string& variant, int64_t axis) {
  OpSpec op;
  op.kind = OpKind::kAllgatherMatmul;
  op.in = {"x", "w"};
  op.out = {"y"};
  op.axis_name = {"r"};
  op.gather = gather;
  op.axis = axis;
  op.variant = variant;
  op.name = "y";
  op.key = "program.0";
  return op;
}

ProgramSpec AllgatherMatmul(const std::string& gather, const std::string& variant) {
  ProgramSpec p;
  p.mesh_axes = {{"r", kN}};
  const OpSpec op = AllgatherMatmulOp(gather, variant, 0);
  if (gather == "rhs") {
    p.arrays = {MakeArray("x", {kRhsB, kN * kRhsKb}, P({})),
                MakeArray("w", {kN * kRhsKb, kRhsF}, P({{"r"}}))};
    p.outputs = {{"y", P({}), "outputs.y"}};
  } else {
    p.arrays = {MakeArray("x", {kN * kLhsBl, kLhsK}, P({{"r"}})),
                MakeArray("w", {kLhsK, kLhsF}, P({}))};
    p.outputs = {{"y", P({}), "outputs.y"}};
  }
  p.ops = {op};
  return p;
}

ProgramSpec MatmulReduceScatter(const std::string& variant) {
  ProgramSpec p;
  p.mesh_axes = {{"r", kN}};
  OpSpec op;
  op.kind = OpKind::kMatmulReduceScatter;
  op.in = {"x", "w"};
  op.out = {"y"};
  op.axis_name = {"r"};
  op.scatter_dimension = 0;
  op.variant = variant;
  op.name = "y";
  op.key = "program.0";
  p.arrays = {MakeArray("x", {kRsB, kN * kRsKl}, P({{}, {"r"}})),
              MakeArray("w", {kN * kRsKl, kRsF}, P({{"r"}}))};
  p.outputs = {{"y", P({{"r"}}), "outputs.y"}};
  p.ops = {op};
  return p;
}

void ExpectWithin2Percent(Time got, double want_s, const std::string& what) {
  EXPECT_NEAR(got.seconds(), want_s, 0.02 * want_s)
      << what << ": simulated " << got.microseconds() << " us, derived " << want_s * 1e6 << " us";
}

// ---------------------------------------------------------------------------------------------
// allgather_matmul, gather rhs.
// Unidirectional lowering, compute stream: mm0, (mm_s, add_s) for s = 1..n-1, where mm_s is
// x[:, block] [B, kb] @ w block [kb, F] (time M) and add_s accumulates [B, F] (time A). Shifts:
// shift k moves the w block received at shift k - 1 (S = 4 kb F bytes), so shifts run back to
// back and the block for step s arrives at s T. mm_s starts at max(end of step s-1, s T):
//   e_0 = M, e_s = max(e_{s-1}, s T) + M + A.
//   compute-bound (M >= T):      n M + (n - 1) A
//   transfer-bound (T >= M + A): (n - 1) T + M + A
// Bidirectional lowering: Slice top, Slice bottom (each Ls = 8 (kb/2) F / H), then per step
// mm_top, mm_bottom ([B, kb/2] @ [kb/2, F], time Mh each), add(top, bottom) (A) and, for
// s >= 1, add(acc, part) (A). Top shifts (S/2 bytes, +1) start when the top slice is done (Ls)
// and run back to back: top block s arrives at Ls + s Th; bottom ones (-1, opposite link
// direction) start at 2 Ls: bottom block s arrives at 2 Ls + s Th.
//   compute-bound (Th <= 2 Mh + A): 2 Ls + n (2 Mh + A) + (n - 1) A
//   transfer-bound (Th >= Ls + 2 Mh + A, Mh >= Ls: the last step starts when its top half
//   arrives, its bottom half is already there when mm_top ends):
//                                   Ls + (n - 1) Th + 2 Mh + 2 A
// Blocking: all_gather of w (bidirectional ring, n - 1 steps of a + (S/2) / W) then the full
// matmul [B, n kb] @ [n kb, F] (Mf): (n - 1) Th + Mf.

const double kRhsM = Matmul(kRhsB, kRhsKb, kRhsF);
const double kRhsA = Add(kRhsB * kRhsF);
const double kRhsMh = Matmul(kRhsB, kRhsKb / 2, kRhsF);
// The halves are fused views (OpSpec::fused): free. Slice() is what a real copy would cost.
const double kRhsLs = 0 * Slice(kRhsKb / 2 * kRhsF);
constexpr int64_t kRhsK = kN * kRhsKb;
const double kRhsMf = Matmul(kRhsB, kRhsK, kRhsF);
const double kRhsS = 4.0 * kRhsKb * kRhsF;

TEST(OverlapTest, AllgatherMatmulRhsUnidirectional) {
  // Compute-bound: W = 300 GB/s, T = 1 + 27.96 = 28.96 us < M = 42.95 us (A = 6.29 us).
  {
    double t = Shift(kRhsS, 300);
    ASSERT_LT(t, kRhsM);
    double want = kN * kRhsM + (kN - 1) * kRhsA;  // 190.7 us
    Time got = RunOnRing(AllgatherMatmul("rhs", "unidirectional"), 300).end;
    ExpectWithin2Percent(got, want, "rhs uni compute-bound");
    double blocking_want = (kN - 1) * Shift(kRhsS / 2, 300) + kRhsMf;  // 216.7 us
    Time blocking = RunOnRing(AllgatherMatmul("rhs", "blocking"), 300).end;
    ExpectWithin2Percent(blocking, blocking_want, "rhs blocking");
    EXPECT_LT(got, blocking);
  }
  // Transfer-bound: W = 100 GB/s, T = 84.89 us > M + A = 49.24 us.
  {
    double t = Shift(kRhsS, 100);
    ASSERT_GT(t, kRhsM + kRhsA);
    double want = (kN - 1) * t + kRhsM + kRhsA;  // 303.9 us
    ExpectWithin2Percent(RunOnRing(AllgatherMatmul("rhs", "unidirectional"), 100).end, want,
                         "rhs uni transfer-bound");
  }
}

TEST(OverlapTest, AllgatherMatmulRhsBidirectional) {
  // Mh = 21.47 us, Ls = 8.39 us, A = 6.29 us.
  // Compute-bound: W = 100 GB/s, Th = 1 + 41.94 = 42.94 us <= 2 Mh + A = 49.24 us.
  {
    double th = Shift(kRhsS / 2, 100);
    ASSERT_LE(th, 2 * kRhsMh + kRhsA);
    double want = 2 * kRhsLs + kN * (2 * kRhsMh + kRhsA) + (kN - 1) * kRhsA;  // 232.6 us
    Time got = RunOnRing(AllgatherMatmul("rhs", "bidirectional"), 100).end;
    ExpectWithin2Percent(got, want, "rhs bi compute-bound");
    double blocking_want = (kN - 1) * th + kRhsMf;  // 300.6 us
    Time blocking = RunOnRing(AllgatherMatmul("rhs", "blocking"), 100).end;
    ExpectWithin2Percent(blocking, blocking_want, "rhs blocking");
    EXPECT_LT(got, blocking);
  }
  // Transfer-bound: W = 40 GB/s, Th = 105.86 us >= Ls + 2 Mh + A = 57.63 us.
  {
    double th = Shift(kRhsS / 2, 40);
    ASSERT_GE(th, kRhsLs + 2 * kRhsMh + kRhsA);
    ASSERT_GE(kRhsMh, kRhsLs);
    double want = kRhsLs + (kN - 1) * th + 2 * kRhsMh + 2 * kRhsA;  // 381.5 us
    ExpectWithin2Percent(RunOnRing(AllgatherMatmul("rhs", "bidirectional"), 40).end, want,
                         "rhs bi transfer-bound");
  }
}

// ---------------------------------------------------------------------------------------------
// allgather_matmul, gather lhs.
// Unidirectional lowering, compute stream: mm_s = x block [Bl, K] @ w [K, F] (time M) for
// s = 0..n-1, then a dynamic_concat (free); no adds. Shifts of S = 4 Bl K bytes back to back;
// block s arrives at s T. e_s = max(e_{s-1}, s T) + M:
//   compute-bound (M >= T):  n M
//   transfer-bound (T >= M): (n - 1) T + M
// Bidirectional lowering: Slice top, Slice bottom (Ls = 8 (Bl/2) K / H each), per step mm_top,
// mm_bottom ([Bl/2, K] @ [K, F], Mh), at the end two dynamic_concats and reshapes (free) and a
// Concatenate of two [n, Bl/2, F] into [n, Bl, F] (Cc = 4 (2 n Bl F) / H). Shift timing as rhs.
//   compute-bound (Th <= 2 Mh):                   2 Ls + 2 n Mh + Cc
//   transfer-bound (Th >= Ls + 2 Mh, Mh >= Ls):   Ls + (n - 1) Th + 2 Mh + Cc
// Blocking: (n - 1) Th + Mf, Mf = [n Bl, K] @ [K, F].

const double kLhsM = Matmul(kLhsBl, kLhsK, kLhsF);
const double kLhsMh = Matmul(kLhsBl / 2, kLhsK, kLhsF);
const double kLhsLs = 0 * Slice(kLhsBl / 2 * kLhsK);  // Fused view: free.
constexpr int64_t kLhsOut = kN * kLhsBl * kLhsF;      // Elements of y.
const double kLhsCc = 0 * Concat(kLhsOut, kLhsOut);   // In-place block writes: free.
const double kLhsMf = Matmul(kN * kLhsBl, kLhsK, kLhsF);
const double kLhsS = 4.0 * kLhsBl * kLhsK;

TEST(OverlapTest, AllgatherMatmulLhsUnidirectional) {
  // Compute-bound: W = 700 GB/s, T = 1 + 23.97 = 24.97 us < M = 42.95 us.
  {
    double t = Shift(kLhsS, 700);
    ASSERT_LT(t, kLhsM);
    double want = kN * kLhsM;  // 171.8 us
    Time got = RunOnRing(AllgatherMatmul("lhs", "unidirectional"), 700).end;
    ExpectWithin2Percent(got, want, "lhs uni compute-bound");
    double blocking_want = (kN - 1) * Shift(kLhsS / 2, 700) + kLhsMf;  // 210.7 us
    Time blocking = RunOnRing(AllgatherMatmul("lhs", "blocking"), 700).end;
    ExpectWithin2Percent(blocking, blocking_want, "lhs blocking");
    EXPECT_LT(got, blocking);
  }
  // Transfer-bound: W = 200 GB/s, T = 84.89 us > M.
  {
    double t = Shift(kLhsS, 200);
    ASSERT_GT(t, kLhsM);
    double want = (kN - 1) * t + kLhsM;  // 297.6 us
    ExpectWithin2Percent(RunOnRing(AllgatherMatmul("lhs", "unidirectional"), 200).end, want,
                         "lhs uni transfer-bound");
  }
}

TEST(OverlapTest, AllgatherMatmulLhsBidirectional) {
  // Mh = 21.47 us, Ls = 16.78 us, Cc = 16.78 us.
  // Compute-bound: W = 300 GB/s, Th = 1 + 27.96 = 28.96 us <= 2 Mh = 42.95 us.
  {
    double th = Shift(kLhsS / 2, 300);
    ASSERT_LE(th, 2 * kLhsMh);
    double want = 2 * kLhsLs + 2 * kN * kLhsMh + kLhsCc;  // 222.1 us
    Time got = RunOnRing(AllgatherMatmul("lhs", "bidirectional"), 300).end;
    ExpectWithin2Percent(got, want, "lhs bi compute-bound");
    double blocking_want = (kN - 1) * th + kLhsMf;  // 258.7 us
    Time blocking = RunOnRing(AllgatherMatmul("lhs", "blocking"), 300).end;
    ExpectWithin2Percent(blocking, blocking_want, "lhs blocking");
    EXPECT_LT(got, blocking);
  }
  // Transfer-bound: W = 100 GB/s, Th = 84.89 us >= Ls + 2 Mh = 59.73 us.
  {
    double th = Shift(kLhsS / 2, 100);
    ASSERT_GE(th, kLhsLs + 2 * kLhsMh);
    ASSERT_GE(kLhsMh, kLhsLs);
    double want = kLhsLs + (kN - 1) * th + 2 * kLhsMh + kLhsCc;  // 331.2 us
    ExpectWithin2Percent(RunOnRing(AllgatherMatmul("lhs", "bidirectional"), 100).end, want,
                         "lhs bi transfer-bound");
  }
}

// ---------------------------------------------------------------------------------------------
// matmul_reduce_scatter, scatter rows.
// Unidirectional lowering, compute stream: mm0, then (mm_s, add_s) for s = 1..n-1, mm_s =
// x rows [B/n, Kl] @ w [Kl, F] (M), add_s = received partial sum + mm_s ([B/n, F], A). Shift
// k + 1 moves the sum made by add_k (or mm0), S = 4 (B/n) F bytes, so here the shifts wait for
// compute: with e_s the end of add_s (e_0 = M), mm_{s+1} runs [e_s, e_s + M] while the sum
// travels [e_s, e_s + T], and add_{s+1} starts at e_s + max(M, T):
//   e_s = e_{s-1} + max(M, T) + A, end = M + (n - 1)(max(M, T) + A)
//   compute-bound (M >= T):  n M + (n - 1) A
//   transfer-bound (T >= M): M + (n - 1)(T + A)   (the adds are on the transfer chain)
// Bidirectional lowering: per step mm_top, mm_bottom ([B/2n, Kl] @ [Kl, F], Mh), for s >= 1
// add_top, add_bottom ([B/2n, F], Ah), shifts of S/2 bytes (+1 for top, -1 for bottom), and a
// final Concatenate of the two halves (Cc = 4 (2 (B/2n) F + (B/n) F) / H). The top chain's
// first sum is ready at Mh, the bottom's at 2 Mh.
//   compute-bound (Th <= 2 Mh + Ah):  2 n Mh + 2 (n - 1) Ah + Cc
//   transfer-bound (Th >= 3 Mh, Mh >= Ah): the bottom chain is critical, its sums end at
//   b_s = 2 Mh + s (Th + Ah):         2 Mh + (n - 1)(Th + Ah) + Cc
// Blocking: full matmul [B, Kl] @ [Kl, F] (Mf), then psum_scatter of V = 4 B F bytes
// (bidirectional ring: n - 1 steps of a + (V / 2n) / W = Th): Mf + (n - 1) Th.

const double kRsM = Matmul(kRsB / kN, kRsKl, kRsF);
const double kRsA = Add(kRsB / kN * kRsF);
const double kRsMh = Matmul(kRsB / kN / 2, kRsKl, kRsF);
const double kRsAh = Add(kRsB / kN / 2 * kRsF);
const double kRsCc = 0 * Concat(kRsB / kN * kRsF, kRsB / kN * kRsF);  // In place: free.
const double kRsMf = Matmul(kRsB, kRsKl, kRsF);
const double kRsS = 4.0 * kRsB / kN * kRsF;

TEST(OverlapTest, MatmulReduceScatterUnidirectional) {
  // Compute-bound: W = 80 GB/s, T = 1 + 26.21 = 27.21 us < M = 42.95 us (A = 6.29 us).
  {
    double t = Shift(kRsS, 80);
    ASSERT_LT(t, kRsM);
    double want = kN * kRsM + (kN - 1) * kRsA;  // 190.7 us
    Time got = RunOnRing(MatmulReduceScatter("unidirectional"), 80).end;
    ExpectWithin2Percent(got, want, "rs uni compute-bound");
    double blocking_want = kRsMf + (kN - 1) * Shift(kRsS / 2, 80);  // 214.1 us
    Time blocking = RunOnRing(MatmulReduceScatter("blocking"), 80).end;
    ExpectWithin2Percent(blocking, blocking_want, "rs blocking");
    EXPECT_LT(got, blocking);
  }
  // Transfer-bound: W = 20 GB/s, T = 105.86 us > M.
  {
    double t = Shift(kRsS, 20);
    ASSERT_GT(t, kRsM);
    double want = kRsM + (kN - 1) * (t + kRsA);  // 379.4 us
    ExpectWithin2Percent(RunOnRing(MatmulReduceScatter("unidirectional"), 20).end, want,
                         "rs uni transfer-bound");
  }
}

TEST(OverlapTest, MatmulReduceScatterBidirectional) {
  // Mh = 21.47 us, Ah = 3.15 us, Cc = 4.19 us.
  // Compute-bound: W = 40 GB/s, Th = 1 + 26.21 = 27.21 us <= 2 Mh + Ah = 46.1 us.
  {
    double th = Shift(kRsS / 2, 40);
    ASSERT_LE(th, 2 * kRsMh + kRsAh);
    double want = 2 * kN * kRsMh + 2 * (kN - 1) * kRsAh + kRsCc;  // 194.9 us
    Time got = RunOnRing(MatmulReduceScatter("bidirectional"), 40).end;
    ExpectWithin2Percent(got, want, "rs bi compute-bound");
    double blocking_want = kRsMf + (kN - 1) * th;  // 253.4 us
    Time blocking = RunOnRing(MatmulReduceScatter("blocking"), 40).end;
    ExpectWithin2Percent(blocking, blocking_want, "rs blocking");
    EXPECT_LT(got, blocking);
  }
  // Transfer-bound: W = 10 GB/s, Th = 105.86 us >= 3 Mh = 64.4 us.
  {
    double th = Shift(kRsS / 2, 10);
    ASSERT_GE(th, 3 * kRsMh);
    ASSERT_GE(kRsMh, kRsAh);
    double want = 2 * kRsMh + (kN - 1) * (th + kRsAh) + kRsCc;  // 374.2 us
    ExpectWithin2Percent(RunOnRing(MatmulReduceScatter("bidirectional"), 10).end, want,
                         "rs bi transfer-bound");
  }
}

// ---------------------------------------------------------------------------------------------
// GPU communication slowdown: compute that starts while the device has a collective in flight
// runs (1 + 0.1) times longer (Time::FromSecondsCeil(M * 1.1)). Case: lhs unidirectional,
// W = 700 GB/s: T = 24.97 us, M = 42.95 us; the shifts occupy [0, T], [T, 2T], [2T, 3T] and
// 3T = 74.9 us. mm0 starts at 0 (shift 1 issued first at time 0): slowed, ends at 1.1 M =
// 47.2 us; mm1 starts at 47.2 us < 3T (shift 3 in flight): slowed, ends at 2.2 M = 94.5 us;
// mm2 starts at 94.5 us > 3T, nothing in flight: full speed; so is mm3. Every block is there
// before its matmul (s T <= start), so the run ends at exactly 2 ceil(1.1 M) + 2 M.
TEST(OverlapTest, CommComputeSlowdownStretchesMatmulsStartedBesideAShift) {
  RooflineModel model(HandRoofline());
  Time m = MatmulTime(model, kLhsBl, kLhsK, kLhsF);
  Time slow = Time::FromSecondsCeil(m.seconds() * (1 + 0.1));
  double t = Shift(kLhsS, 700);
  ASSERT_LT(slow.seconds(), 3 * t);      // mm1 starts with a shift in flight.
  ASSERT_GT(2 * slow.seconds(), 3 * t);  // mm2 starts after the last shift.
  Time got = RunOnRing(AllgatherMatmul("lhs", "unidirectional"), 700, 0.1).end;
  EXPECT_EQ(got, slow + slow + m + m) << got.microseconds() << " us";
  // Without the slowdown: 4 M exactly.
  EXPECT_EQ(RunOnRing(AllgatherMatmul("lhs", "unidirectional"), 700).end, m + m + m + m);
}

// ---------------------------------------------------------------------------------------------
// Per-device accounting, lhs unidirectional. Spans per device: matmuls [0, M], [sT, sT + M]
// (transfer-bound) and shifts [(k-1)T, kT] back to back, so comm = union = [0, 3T] and the run
// ends at 3T + M.
//   compute      = sum of the op times = 4 M (the free dynamic_concat adds nothing)
//   comm         = 3T = end - M
//   busy         = union of both = [0, 3T + M] = end, so idle = 0
//   exposed_comm = busy - compute = end - 4 M = 3 (T - M)
// Compute-bound (W = 700 GB/s): the shifts end at 3T < 4 M under the matmuls: exposed = 0.
TEST(OverlapTest, DeviceTimingsSplitComputeFromExposedCommunication) {
  RooflineModel model(HandRoofline());
  Time m = MatmulTime(model, kLhsBl, kLhsK, kLhsF);
  {
    double t = Shift(kLhsS, 200);
    RunResult run = RunOnRing(AllgatherMatmul("lhs", "unidirectional"), 200);
    ASSERT_EQ(run.per_device.size(), static_cast<size_t>(kN));
    for (const DeviceTiming& d : run.per_device) {
      EXPECT_EQ(d.compute, m + m + m + m) << "device " << d.device;
      EXPECT_EQ(d.idle, Time()) << "device " << d.device;
      EXPECT_EQ(d.exposed_comm, run.end - d.compute) << "device " << d.device;
      EXPECT_EQ(d.comm, run.end - m) << "device " << d.device;
      ExpectWithin2Percent(d.comm, (kN - 1) * t, "comm");
      ExpectWithin2Percent(d.exposed_comm, (kN - 1) * (t - m.seconds()), "exposed comm");
    }
  }
  {
    double t = Shift(kLhsS, 700);
    RunResult run = RunOnRing(AllgatherMatmul("lhs", "unidirectional"), 700);
    for (const DeviceTiming& d : run.per_device) {
      EXPECT_EQ(d.compute, m + m + m + m) << "device " << d.device;
      EXPECT_EQ(d.compute, run.end) << "device " << d.device;
      EXPECT_EQ(d.exposed_comm, Time()) << "device " << d.device;
      EXPECT_EQ(d.idle, Time()) << "device " << d.device;
      ExpectWithin2Percent(d.comm, (kN - 1) * t, "comm");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// allgather_matmul along the other dimension (axis 1): lhs gathered along its contracting
// dimension (the Scaling Book's A[B_X, D_Y] @ W[D, F_Y]) and rhs along its columns.

// x and w of the axis-1 forms over `n` devices: lhs: x[B, n Kb] sharded by columns, w[n Kb, F]
// replicated; rhs: x[B, K] replicated, w[K, n Fb] sharded by columns.
ProgramSpec AllgatherMatmulAxis1(const std::string& gather, const std::string& variant, int n,
                                 int64_t b, int64_t k, int64_t f) {
  ProgramSpec p;
  p.mesh_axes = {{"r", n}};
  const OpSpec op = AllgatherMatmulOp(gather, variant, 1);
  if (gather == "lhs") {
    p.arrays = {MakeArray("x", {b, n * k}, P({{}, {"r"}})), MakeArray("w", {n * k, f}, P({}))};
  } else {
    p.arrays = {MakeArray("x", {b, k}, P({})), MakeArray("w", {k, n * f}, P({{}, {"r"}}))};
  }
  for (ArraySpec& a : p.arrays) {
    a.init.kind = InitSpec::Kind::kNormal;
    a.init.seed = a.name == "x" ? 1 : 2;
  }
  p.outputs = {{"y", P({}), "outputs.y"}};
  p.ops = {op};
  return p;
}

// Every variant of both forms computes x @ w (the numerics check's reference, within its
// bound) on rings of 2, 3 and 4 devices, odd blocks included where the variant allows.
TEST(CollectiveMatmulAxis1Test, ComputesTheProduct) {
  for (int n : {2, 3, 4}) {
    for (const char* gather : {"lhs", "rhs"}) {
      for (const char* variant : {"blocking", "unidirectional", "bidirectional"}) {
        SCOPED_TRACE(std::string(gather) + " " + variant + " over " + std::to_string(n));
        const int64_t inner = std::string(variant) == "bidirectional" ? 6 : 5;
        ProgramSpec program = AllgatherMatmulAxis1(gather, variant, n, 7, inner, inner);
        Machine machine(BuildTorus({n}, {true}, Bandwidth::GBps(45), Time::Microseconds(1),
                                   LinkKind::kIci, DeviceSpec{}, "ring"),
                        std::make_unique<RooflineModel>(HandRoofline()), 0.0);
        Mesh mesh = PlaceMesh(machine, program.mesh_axes);
        CheckProgram(mesh, program);
        RunConfig config;
        config.numerics = true;
        RunResult r = RunProgram(machine, mesh, program, config);
        NumericsReport report = CheckNumerics(r.outputs, mesh, program, "", &r.inputs);
        EXPECT_TRUE(report.checked);
        EXPECT_TRUE(report.passed) << report.worst_output << " error " << report.max_abs_error;
        EXPECT_EQ(r.outputs.at("y").shape(),
                  (Shape{7, std::string(gather) == "lhs" ? inner : n * inner}));
      }
    }
  }
}

// Gather lhs along K, unidirectional: the x column blocks travel like rhs's w blocks (S =
// 4 B Kb bytes a shift); step s multiplies [B, Kb] @ [Kb, F] (M) and accumulates [B, F] (A),
// so the forms are rhs's: compute-bound n M + (n - 1) A, transfer-bound (n - 1) T + M + A.
TEST(CollectiveMatmulAxis1Test, GatherLhsContractingOverlaps) {
  const int64_t b = 1024, kb = 4096, f = 512;
  const double m = Matmul(b, kb, f), a = Add(b * f), bytes = 4.0 * b * kb;
  {
    ASSERT_LT(Shift(bytes, 700), m);
    const double want = kN * m + (kN - 1) * a;
    Time got = RunOnRing(AllgatherMatmulAxis1("lhs", "unidirectional", kN, b, kb, f), 700).end;
    ExpectWithin2Percent(got, want, "lhs contracting uni compute-bound");
    Time blocking = RunOnRing(AllgatherMatmulAxis1("lhs", "blocking", kN, b, kb, f), 700).end;
    EXPECT_LT(got, blocking);
  }
  {
    const double t = Shift(bytes, 100);
    ASSERT_GT(t, m + a);
    const double want = (kN - 1) * t + m + a;
    ExpectWithin2Percent(
        RunOnRing(AllgatherMatmulAxis1("lhs", "unidirectional", kN, b, kb, f), 100).end, want,
        "lhs contracting uni transfer-bound");
  }
}

// Gather rhs along F, unidirectional: the w column blocks travel (S = 4 K Fb bytes); step s
// is [B, K] @ [K, Fb] (M) and the blocks are placed by a free dynamic concatenation: lhs's
// forms, compute-bound n M, transfer-bound (n - 1) T + M.
TEST(CollectiveMatmulAxis1Test, GatherRhsFreeOverlaps) {
  const int64_t b = 1024, k = 4096, fb = 1024;
  const double m = Matmul(b, k, fb), bytes = 4.0 * k * fb;
  {
    ASSERT_LT(Shift(bytes, 700), m);
    ExpectWithin2Percent(
        RunOnRing(AllgatherMatmulAxis1("rhs", "unidirectional", kN, b, k, fb), 700).end, kN * m,
        "rhs free uni compute-bound");
  }
  {
    const double t = Shift(bytes, 100);
    ASSERT_GT(t, m);
    ExpectWithin2Percent(
        RunOnRing(AllgatherMatmulAxis1("rhs", "unidirectional", kN, b, k, fb), 100).end,
        (kN - 1) * t + m, "rhs free uni transfer-bound");
  }
}

}  // namespace
}  // namespace shardsim
