// Running a program on a machine: the one way commands, tests and benchmarks run programs.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/executor.h"
#include "collectives/lowering.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "collectives/runtime/machine.h"
#include "collectives/timing/collective_cost_model.h"
#include "sim/observer.h"
#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {

// How collectives are timed.
enum class TimingPath {
  kNetwork,  // Every collective runs its algorithm on the simulated network (traces, data).
  kCached,   // Collectives priced by a (cached) cost model; one device per timeline class.
};

// How a program runs.
struct RunConfig {
  bool numerics = false;  // Move and compute real data (kNetwork only).
  // Default algorithm per collective (JAX op names or generic kinds).
  std::map<std::string, std::string> algorithms;
  std::string base_dir;              // Folder relative `init: {file: ...}` paths start from.
  Bytes chunk_size = Bytes::MiB(1);  // The tree algorithm's pipelining unit.
  int max_collectives_in_flight = kDefaultCollectivesInFlight;  // 0: unbounded.
  TimingPath timing = TimingPath::kNetwork;                     // How collectives are timed.
  // kCached: the model to ask (not owned; null: a cache over the network model, private to
  // this run). Share one across runs to reuse its answers.
  CollectiveCostModel* collective_model = nullptr;
  // kCached without a collective_model: threads that price the program's distinct collectives
  // before it runs, each simulating on its own router (CachedCollectiveModel::Prepare). The
  // answers, and so the run, are the same for any number.
  int jobs = 1;
  Observer* observer = nullptr;          // Receives the trace (not owned; null: untraced).
  std::vector<size_t> memory_phases;     // ExecutorConfig::memory_phases.
  std::set<std::string> donated_inputs;  // ExecutorConfig::donated_inputs.
  // Fill RunResult::per_device, a row per mesh position (8,960 copies of a few classes' rows on
  // a pod); a search reads per_simulated_device alone.
  bool device_rows = true;
  // Fill RunResult::link_busy (kCached): a pass over every distinct collective's links, which a
  // search's screening, keeping no per-link figures, skips.
  bool link_busy = true;
  SharingPass sharing_pass = SharingPass::kByOrbit;  // ExecutorConfig::sharing_pass.
};

// What a run gives.
struct RunResult {
  Time end;                              // When the last device finished.
  uint64_t events = 0;                   // Events the engine dispatched.
  int simulated_devices = 0;             // Devices simulated (classes on kCached).
  std::vector<OpTiming> ops;             // One row per op of the program.
  std::vector<DeviceTiming> per_device;  // By mesh position (RunConfig::device_rows).
  // Its distinct rows, one per simulated device: Executor::SimulatedDeviceTimings.
  std::vector<DeviceTiming> per_simulated_device;
  std::map<std::string, Array> outputs;  // Global outputs (shapes only without numerics).
  std::map<std::string, Array> inputs;   // Global inputs made (with data under numerics).
  Bytes peak_memory;                     // The largest per-device peak.
  Bytes host_peak;                 // The most bytes one device held in host memory (host offload).
  Time host_transfer;              // The most time one device spent copying to or from host memory.
  int peak_device = 0;             // The device where it occurred.
  std::string peak_op;             // The op being started there when it did.
  std::vector<Bytes> phase_peaks;  // Per memory phase, the largest per-device peak.
  std::vector<Bytes> phase_entry_live;  // Per memory phase, the most live at its start.
  // Per memory phase, what no order of the program's ops can peak below
  // (Executor::PhaseForcedPeaks); empty where not known (`where`, several meshes).
  std::vector<Bytes> phase_forced_peaks;
  Bytes hbm_capacity;  // Per device, from the machine.
  bool fits = true;    // peak_memory <= hbm_capacity.
  // kCached: per directed link, its collectives' bytes / its bandwidth (Executor::LinkBusy).
  std::vector<std::pair<LinkId, Time>> link_busy;
};

// Lowers `program` (unless `lowered` is given: lower once, run many times) and runs it on
// `mesh` of `machine` with a fresh simulator and network. Throws SpecError for bad programs
// and std::logic_error ("internal error: ...") if devices are left waiting.
RunResult RunProgram(const Machine& machine, const Mesh& mesh, const ProgramSpec& program,
                     const RunConfig& config, const LoweredProgram* lowered = nullptr);

}  // namespace shardsim
