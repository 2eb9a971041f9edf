// Multi-slice machines (topology/multi_slice.h, hardware.slices): slices of a torus joined by a
// DCN switch; routes inside a slice are the torus's, across slices chip -> DCN -> chip; the
// TPU presets build them with hardware.md's DCN bandwidth per chip, and refuse what they cannot.
#include "topology/multi_slice.h"

#include <gtest/gtest.h>

#include "sim/spec_error.h"
#include "topology/presets.h"
#include "topology/routing.h"
#include "topology/torus.h"

namespace shardsim {
namespace {

MultiSliceParams TwoSlicesOf4x4() {
  MultiSliceParams p;
  p.slices = 2;
  p.shape = {4, 4};
  p.wraparound = {true, true};
  p.ici = Bandwidth::GBps(45);
  p.ici_latency = Time::Microseconds(1);
  p.dcn = Bandwidth::BytesPerSecond(3.125e9);
  p.dcn_latency = Time::Microseconds(10);
  return p;
}

TEST(MultiSliceTest, SlicesAreToriJoinedByOneDcnSwitch) {
  const Topology t = BuildMultiSlice(TwoSlicesOf4x4(), DeviceSpec{}, "ms");
  EXPECT_EQ(t.num_devices(), 32);
  EXPECT_EQ(t.num_switches(), 1);
  // Per slice a wrapping 4x4 torus: 16 x 2 duplex ICI links; then 32 duplex DCN links.
  int ici = 0, dcn = 0;
  for (const Link& l : t.links()) {
    ici += l.kind == LinkKind::kIci;
    dcn += l.kind == LinkKind::kDcn;
    if (l.kind == LinkKind::kIci) {
      // ICI never crosses slices; its dimensions count from 1.
      EXPECT_EQ(t.node(l.src).device / 16, t.node(l.dst).device / 16);
      EXPECT_GE(l.dimension, 1);
    } else {
      EXPECT_EQ(l.bandwidth, Bandwidth::BytesPerSecond(3.125e9));
      EXPECT_EQ(l.latency, Time::Microseconds(10));
    }
  }
  EXPECT_EQ(ici, 2 * 2 * 32);
  EXPECT_EQ(dcn, 2 * 32);
  ASSERT_TRUE(t.torus().has_value());
  EXPECT_EQ(t.torus()->shape, (std::vector<int>{2, 4, 4}));
  EXPECT_EQ(t.torus()->wraparound, (std::vector<bool>{false, true, true}));
  EXPECT_TRUE(t.torus()->dcn_slices);
  // Device 21 is slice 1, torus position 5 = (1, 1).
  EXPECT_EQ(t.node(t.device_vertex(21)).coords, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(TorusIndex(t.torus()->shape, {1, 1, 1}), 21);
}

// Inside a slice a route is the slice's dimension-order route (the same hops as on a lone 4x4
// torus); across slices it is the source's DCN link up and the destination's down, whatever
// their torus positions.
TEST(MultiSliceTest, RoutesStayInTheSliceOrCrossTheDcn) {
  const Topology t = BuildMultiSlice(TwoSlicesOf4x4(), DeviceSpec{}, "ms");
  const Topology lone = BuildTorus({4, 4}, {true, true}, Bandwidth::GBps(45), Time::Microseconds(1),
                                   LinkKind::kIci, DeviceSpec{}, "t");
  auto router = MakeRouter(t);
  auto lone_router = MakeRouter(lone);
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 16; ++b) {
      for (int slice : {0, 1}) {
        const std::vector<LinkId> route =
            router->Route(t.device_vertex(slice * 16 + a), t.device_vertex(slice * 16 + b));
        const std::vector<LinkId>& want =
            lone_router->Route(lone.device_vertex(a), lone.device_vertex(b));
        ASSERT_EQ(route.size(), want.size()) << a << " " << b;
        for (size_t i = 0; i < route.size(); ++i) {
          EXPECT_EQ(t.node(t.link(route[i]).src).device,
                    slice * 16 + lone.node(lone.link(want[i]).src).device);
          EXPECT_EQ(t.link(route[i]).kind, LinkKind::kIci);
        }
      }
    }
  }
  const std::vector<LinkId> across = router->Route(t.device_vertex(3), t.device_vertex(16 + 9));
  ASSERT_EQ(across.size(), 2u);
  EXPECT_EQ(t.link(across[0]).kind, LinkKind::kDcn);
  EXPECT_EQ(t.node(t.link(across[0]).src).device, 3);
  EXPECT_EQ(t.link(across[1]).src, t.link(across[0]).dst);
  EXPECT_EQ(t.node(t.link(across[1]).dst).device, 25);
}

// hardware.slices on the TPU presets: v5p slices carry 6.25e9 B/s of DCN per chip
// (hardware.md); one slice is the plain torus; v4 (no DCN figure), GPU presets and a negative
// count are located errors.
TEST(MultiSliceTest, PresetsBuildSlicesWithTheirDcnBandwidth) {
  HardwareSpec spec;
  spec.preset = "tpu-v5p";
  spec.shape = {4, 4, 4};
  spec.slices = 2;
  const Topology t = BuildPreset(spec);
  EXPECT_EQ(t.num_devices(), 128);
  for (const Link& l : t.links()) {
    if (l.kind == LinkKind::kDcn) {
      EXPECT_EQ(l.bandwidth, Bandwidth::BytesPerSecond(6.25e9));
      EXPECT_EQ(l.latency, kDcnLatency);
    }
  }
  spec.slices = 1;
  EXPECT_EQ(BuildPreset(spec).num_switches(), 0);
  spec.preset = "tpu-v4";
  spec.slices = 2;
  try {
    BuildPreset(spec);
    ADD_FAILURE() << "v4 has no DCN figure";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), "hardware.slices");
  }
  spec.preset = "h100-dgx";
  spec.shape.clear();
  EXPECT_THROW(BuildPreset(spec), SpecError);
  spec.preset = "tpu-v5e";
  spec.shape = {4, 4};
  spec.slices = -1;
  EXPECT_THROW(BuildPreset(spec), SpecError);
}

}  // namespace
}  // namespace shardsim
