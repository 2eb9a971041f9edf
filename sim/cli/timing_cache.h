// `plan --cache DIR`: the store of collective timings the command keeps across runs. (Model runs
// and compare gain little from it: on the pod's model run the network simulations are 2 of its
// 20 s, measured, so only plan takes the flag.)
#pragma once

#include <memory>
#include <string>

#include "collectives/timing/timing_store.h"
#include "topology/topology.h"

namespace shardsim {

// The store in `dir` of `topo`'s timings for this build (named by a hash of the running
// executable's bytes, so a store never answers for code that changed since). Throws InputError
// "--cache: ..." when the executable cannot be read or the directory cannot be used.
std::unique_ptr<TimingStore> OpenTimingStore(const std::string& dir, const Topology& topo);

}  // namespace shardsim
