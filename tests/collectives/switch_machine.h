// The machine the collectives tests price messages on by hand: `n` devices behind one switch,
// 450 GB/s per direction between each device and the switch, 500 ns a hop (2 hops a route),
// so a message of S bytes alone takes 1 us + S / 450 GB/s. Compute: 100 TFLOP/s f32, 2 TB/s
// HBM, 80 GiB.
#pragma once

#include "collectives/runtime/machine.h"
#include "topology/switch.h"

namespace shardsim {

inline Machine SwitchMachine(int n) {
  DeviceSpec device;
  device.flops["f32"] = FlopRate::PerSecond(100e12);
  device.hbm_bandwidth = Bandwidth::GBps(2000);
  device.hbm_capacity = Bytes::GiB(80);
  return Machine(BuildSwitch(n, Bandwidth::GBps(450), Time::Nanoseconds(500), LinkKind::kNvlink,
                             device, "switch"));
}

}  // namespace shardsim
