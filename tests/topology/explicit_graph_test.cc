#include "topology/explicit_graph.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "sim/spec_error.h"

namespace shardsim {
namespace {

ExplicitLinkSpec L(int src, int dst, double gbps = 10, bool bidirectional = true) {
  ExplicitLinkSpec l;
  l.src = src;
  l.dst = dst;
  l.bandwidth = Bandwidth::GBps(gbps);
  l.latency = Time::Microseconds(1);
  l.bidirectional = bidirectional;
  return l;
}

CustomTopologySpec Graph(int devices, std::vector<ExplicitLinkSpec> links) {
  CustomTopologySpec s;
  s.kind = "graph";
  s.devices = devices;
  s.links = std::move(links);
  return s;
}

// The key of the SpecError `spec` raises, and its message in `message`.
std::string ErrorKey(const CustomTopologySpec& spec, std::string* message = nullptr) {
  try {
    BuildExplicitGraph(spec, DeviceSpec{});
  } catch (const SpecError& e) {
    if (message) *message = e.what();
    return e.key();
  }
  return "(no error)";
}

TEST(ExplicitGraphTest, BuildsLinksInOrder) {
  Topology t = BuildExplicitGraph(Graph(3, {L(0, 1, 10), L(1, 2, 20), L(2, 0, 30, false)}),
                                  DeviceSpec{}, "tri");
  EXPECT_EQ(t.num_devices(), 3);
  EXPECT_EQ(t.num_switches(), 0);
  EXPECT_EQ(t.num_physical_links(), 3);
  EXPECT_EQ(t.links().size(), 5u);
  EXPECT_EQ(t.link(*t.FindLink(2, 1)).bandwidth, Bandwidth::GBps(20));
  EXPECT_TRUE(t.FindLink(2, 0).has_value());
  EXPECT_FALSE(t.FindLink(0, 2).has_value());
  EXPECT_EQ(t.name(), "tri");
}

struct BadGraphCase {
  std::string what;
  CustomTopologySpec spec;
  std::string key;
  std::string message_part;
};

class BadGraphTest : public testing::TestWithParam<BadGraphCase> {};

TEST_P(BadGraphTest, ThrowsSpecError) {
  std::string message;
  EXPECT_EQ(ErrorKey(GetParam().spec, &message), GetParam().key);
  EXPECT_NE(message.find(GetParam().message_part), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadGraphTest,
    testing::Values(BadGraphCase{"no devices", Graph(0, {}), "hardware.topology.devices",
                                 "devices >= 1"},
                    BadGraphCase{"dst out of range", Graph(2, {L(0, 2)}), "hardware.topology.links",
                                 "links[0]: device 2 is out of range"},
                    BadGraphCase{"negative src", Graph(2, {L(0, 1), L(-1, 1)}),
                                 "hardware.topology.links", "links[1]"},
                    BadGraphCase{"self-loop", Graph(2, {L(1, 1)}), "hardware.topology.links",
                                 "two different devices"},
                    BadGraphCase{"zero bandwidth", Graph(2, {L(0, 1, 0)}),
                                 "hardware.topology.links", "bandwidth must be positive"},
                    BadGraphCase{"disconnected", Graph(4, {L(0, 1), L(2, 3)}),
                                 "hardware.topology.links", "no route from device 0 to device 2"},
                    BadGraphCase{"one-way only", Graph(2, {L(0, 1, 10, false)}),
                                 "hardware.topology.links", "no route from device 1 to device 0"}),
    [](const testing::TestParamInfo<BadGraphCase>& info) {
      std::string name;
      for (char c : info.param.what) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(ExplicitGraphTest, OneWayCycleIsConnected) {
  Topology t = BuildExplicitGraph(
      Graph(3, {L(0, 1, 10, false), L(1, 2, 10, false), L(2, 0, 10, false)}), DeviceSpec{});
  EXPECT_EQ(t.links().size(), 3u);
}

TEST(ExplicitGraphTest, SingleDeviceNeedsNoLinks) {
  Topology t = BuildExplicitGraph(Graph(1, {}), DeviceSpec{});
  EXPECT_EQ(t.num_devices(), 1);
}

}  // namespace
}  // namespace shardsim
