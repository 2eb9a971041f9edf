// The compute and memory figures of one device (chip or GPU).
#pragma once

#include <map>
#include <string>

#include "sim/units.h"

namespace shardsim {

// What one accelerator can do; later issues' cost models read it.
struct DeviceSpec {
  std::string chip;                       // Marketing name, e.g. "TPU v5p", "H100 SXM".
  std::string platform;                   // "TPU" or "GPU": names trace processes.
  std::map<std::string, FlopRate> flops;  // Peak dense rate per dtype ("bf16", "f32", ...).
  Bandwidth hbm_bandwidth;                // HBM bandwidth.
  Bytes hbm_capacity;                     // HBM capacity.
};

}  // namespace shardsim
