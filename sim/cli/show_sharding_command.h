// `shardsim show-sharding`: an array's sharded type and which devices hold which block.
#pragma once

#include <string>

namespace shardsim {

// What `shardsim show-sharding` was asked.
struct ShowShardingOptions {
  std::string mesh;           // --mesh dp=4,tp=2
  std::string shape;          // --shape 1024x4096
  std::string spec;           // --spec "P('dp', None)"
  std::string dtype = "f32";  // --dtype
  std::string hardware;       // --hardware PRESET (optional: topology-aware placement)
  std::string hw_shape;       // --hw-shape 4x2 (with --hardware)
};

// The --dtype values, for usage text: "f32, bf16, ... or f8e5m2".
std::string ShowShardingDTypeChoices();

// Prints the global type (f32[1024@dp,4096]), the local block type (f32[256,4096]{dp}) and,
// for 1D and 2D arrays, the grid of devices per block. Throws InputError for bad input.
void RunShowShardingCommand(const ShowShardingOptions& options);

}  // namespace shardsim
