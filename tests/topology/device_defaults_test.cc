// The roofline figures every preset carries (matmul and memory efficiency, op overhead,
// comm/compute slowdown) and their run-file overrides.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "sim/spec_error.h"
#include "topology/build.h"
#include "topology/overrides.h"
#include "topology/presets.h"

namespace shardsim {
namespace {

// The defaults topology/presets.cc documents for one preset.
struct DefaultsCase {
  std::string preset;
  double matmul_efficiency;
  double memory_efficiency;
  Time op_overhead;
  double comm_compute_slowdown;
  std::optional<double> attention_efficiency;  // Unset: the matmul efficiency.
};

void PrintTo(const DefaultsCase& c, std::ostream* os) { *os << c.preset; }

class PresetDefaultsTest : public testing::TestWithParam<DefaultsCase> {};

TEST_P(PresetDefaultsTest, CarriesDocumentedDefaults) {
  const DefaultsCase& c = GetParam();
  for (const DeviceSpec& d : {PresetDeviceSpec(c.preset), [&] {
                                HardwareSpec s;
                                s.preset = c.preset;
                                return BuildHardware(s).device_spec();
                              }()}) {
    EXPECT_EQ(d.matmul_efficiency, c.matmul_efficiency);
    EXPECT_EQ(d.memory_efficiency, c.memory_efficiency);
    EXPECT_EQ(d.op_overhead, c.op_overhead);
    EXPECT_EQ(d.comm_compute_slowdown, c.comm_compute_slowdown);
    EXPECT_EQ(d.attention_efficiency, c.attention_efficiency);
  }
}

// TPUs: 0.85 / 0.9 / 1 us / 0 (the issue fixes TPU slowdown at 0: DMA engines move data).
// GPUs: 0.8 / 0.9 / 2 us / 0.1 (NCCL channels occupy SMs); the A100's fused attention 0.6
// (FlashAttention-2's 50-73% of its peak).
std::vector<DefaultsCase> DefaultsTable() {
  return {DefaultsCase{"tpu-v4", 0.85, 0.9, Time::Microseconds(1), 0.0, std::nullopt},
          DefaultsCase{"tpu-v5e", 0.85, 0.9, Time::Microseconds(1), 0.0, std::nullopt},
          DefaultsCase{"tpu-v5p", 0.85, 0.9, Time::Microseconds(1), 0.0, std::nullopt},
          DefaultsCase{"tpu-v6e", 0.85, 0.9, Time::Microseconds(1), 0.0, std::nullopt},
          DefaultsCase{"a100-dgx", 0.8, 0.9, Time::Microseconds(2), 0.1, 0.6},
          DefaultsCase{"h100-dgx", 0.8, 0.9, Time::Microseconds(2), 0.1, std::nullopt},
          DefaultsCase{"h200-dgx", 0.8, 0.9, Time::Microseconds(2), 0.1, std::nullopt},
          DefaultsCase{"b200-dgx", 0.8, 0.9, Time::Microseconds(2), 0.1, std::nullopt},
          DefaultsCase{"gb200-nvl72", 0.8, 0.9, Time::Microseconds(2), 0.1, std::nullopt}};
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetDefaultsTest, testing::ValuesIn(DefaultsTable()),
                         [](const testing::TestParamInfo<DefaultsCase>& info) {
                           std::string name = info.param.preset;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

TEST(PresetDefaultsTest, TableCoversEveryPreset) {
  std::vector<std::string> names;
  for (const DefaultsCase& c : DefaultsTable()) names.push_back(c.preset);
  EXPECT_EQ(names, PresetNames());
}

TEST(DeviceOverrideTest, OverridesApply) {
  HardwareSpec s;
  s.preset = "h100-dgx";
  s.device.matmul_efficiency = 0.6;
  s.device.memory_efficiency = 1.0;
  s.device.op_overhead = Time::Nanoseconds(500);
  s.device.comm_compute_slowdown = 0.25;
  const DeviceSpec d = BuildHardware(s).device_spec();
  EXPECT_EQ(d.matmul_efficiency, 0.6);
  EXPECT_EQ(d.memory_efficiency, 1.0);
  EXPECT_EQ(d.op_overhead, Time::Nanoseconds(500));
  EXPECT_EQ(d.comm_compute_slowdown, 0.25);
  EXPECT_EQ(d.flops.at("bf16").per_second(), 9.9e14);  // Untouched figures are kept.

  // One override leaves the other defaults alone; 0 overhead and 0 slowdown are allowed.
  HardwareSpec one;
  one.preset = "tpu-v5p";
  one.device.op_overhead = Time();
  one.device.comm_compute_slowdown = 0.0;
  const DeviceSpec t = BuildHardware(one).device_spec();
  EXPECT_EQ(t.op_overhead, Time());
  EXPECT_EQ(t.matmul_efficiency, 0.85);
  EXPECT_EQ(t.memory_efficiency, 0.9);

  // A custom topology takes its device from a preset and applies the same overrides.
  HardwareSpec custom;
  custom.topology = CustomTopologySpec{};
  custom.topology->kind = "ring";
  custom.topology->size = 4;
  custom.device.matmul_efficiency = 0.7;
  EXPECT_EQ(BuildHardware(custom).device_spec().matmul_efficiency, 0.7);
}

// One invalid override, with the SpecError key and a part of the message.
struct BadOverrideCase {
  std::string name;
  DeviceOverride device;
  std::string key;
  std::string message_part;
};

void PrintTo(const BadOverrideCase& c, std::ostream* os) { *os << c.name; }

class BadDeviceOverrideTest : public testing::TestWithParam<BadOverrideCase> {};

TEST_P(BadDeviceOverrideTest, ThrowsSpecErrorWithKey) {
  const BadOverrideCase& c = GetParam();
  try {
    ApplyDeviceOverride(PresetDeviceSpec("tpu-v5e"), c.device);
    ADD_FAILURE() << "expected a SpecError";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.key(), c.key);
    EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << e.what();
  }
}

DeviceOverride Matmul(double x) {
  DeviceOverride d;
  d.matmul_efficiency = x;
  return d;
}
DeviceOverride Memory(double x) {
  DeviceOverride d;
  d.memory_efficiency = x;
  return d;
}
DeviceOverride Overhead(Time t) {
  DeviceOverride d;
  d.op_overhead = t;
  return d;
}
DeviceOverride Slowdown(double x) {
  DeviceOverride d;
  d.comm_compute_slowdown = x;
  return d;
}

INSTANTIATE_TEST_SUITE_P(
    Overrides, BadDeviceOverrideTest,
    testing::Values(
        BadOverrideCase{"MatmulZero", Matmul(0), "hardware.device.matmul_efficiency",
                        "matmul_efficiency must be in (0, 1] (a fraction of the peak), got 0"},
        BadOverrideCase{"MatmulAboveOne", Matmul(1.5), "hardware.device.matmul_efficiency",
                        "got 1.5"},
        BadOverrideCase{"MatmulNan", Matmul(std::nan("")), "hardware.device.matmul_efficiency",
                        "got nan"},
        BadOverrideCase{"MemoryNegative", Memory(-0.5), "hardware.device.memory_efficiency",
                        "memory_efficiency must be in (0, 1] (a fraction of the peak), got -0.5"},
        BadOverrideCase{"OverheadNegative", Overhead(Time() - Time::Microseconds(1)),
                        "hardware.device.op_overhead", "op overhead must not be negative"},
        BadOverrideCase{"SlowdownNegative", Slowdown(-0.1), "hardware.device.comm_compute_slowdown",
                        "got -0.1"},
        BadOverrideCase{"SlowdownInfinite", Slowdown(std::numeric_limits<double>::infinity()),
                        "hardware.device.comm_compute_slowdown", "finite number >= 0"}),
    [](const testing::TestParamInfo<BadOverrideCase>& info) { return info.param.name; });

}  // namespace
}  // namespace shardsim
