#include "topology/graphviz.h"

#include <gtest/gtest.h>

#include <sstream>

#include "topology/build.h"
#include "topology/ring.h"

namespace shardsim {
namespace {

int Count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::string Dot(const Topology& t) {
  std::ostringstream out;
  WriteGraphviz(t, out);
  return out.str();
}

TEST(GraphvizTest, GpuNodeHasSwitchBoxAndLabelledEdges) {
  HardwareSpec s;
  s.preset = "h100-dgx";
  std::string dot = Dot(BuildHardware(s));
  EXPECT_NE(dot.find("digraph"), std::string::npos);
  EXPECT_NE(dot.find("label=\"nvswitch\", shape=box"), std::string::npos);
  EXPECT_NE(dot.find("label=\"GPU 3\", shape=ellipse"), std::string::npos);
  EXPECT_EQ(Count(dot, "label=\"450 GB/s, 500 ns (NVLink)\", dir=both"), 8);  // One per link.
  EXPECT_NE(dot.find("label=\"h100-dgx\""), std::string::npos);
}

TEST(GraphvizTest, TorusLabels) {
  HardwareSpec s;
  s.preset = "tpu-v5e";
  s.shape = {2, 2};
  std::string dot = Dot(BuildHardware(s));
  EXPECT_NE(dot.find("label=\"TPU 3 (1,1)\""), std::string::npos);
  EXPECT_EQ(Count(dot, "label=\"45 GB/s, 1 us\""), 4);
  EXPECT_EQ(Count(dot, "->"), 4);
}

TEST(GraphvizTest, OneWayLinksHaveOneArrow) {
  std::string dot =
      Dot(BuildRing(3, false, Bandwidth::GBps(10), Time::Microseconds(2), LinkKind::kIci, {}));
  EXPECT_EQ(Count(dot, "->"), 3);
  EXPECT_EQ(Count(dot, "dir=both"), 0);
  EXPECT_NE(dot.find("10 GB/s, 2 us"), std::string::npos);
}

}  // namespace
}  // namespace shardsim
