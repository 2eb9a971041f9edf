#include "collectives/runtime/run_program.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "sim/simulator.h"
#include "topology/network.h"

namespace shardsim {

RunResult RunProgram(const Machine& machine, const Mesh& mesh, const ProgramSpec& program,
                     const RunConfig& config, const LoweredProgram* lowered) {
  Simulator sim;
  if (config.observer) sim.AddObserver(config.observer);
  Network network(sim, machine.topology(), machine.router());
  ExecutorConfig exec;
  exec.numerics = config.numerics;
  exec.algorithms = config.algorithms;
  exec.base_dir = config.base_dir;
  exec.compute_model = machine.compute_model();
  exec.comm_compute_slowdown = machine.comm_compute_slowdown();
  exec.chunk_size = config.chunk_size;
  exec.max_collectives_in_flight = config.max_collectives_in_flight;
  exec.memory_phases = config.memory_phases;
  exec.donated_inputs = config.donated_inputs;
  exec.host_bandwidth = machine.topology().device_spec().host_bandwidth;
  exec.sharing_pass = config.sharing_pass;
  std::unique_ptr<NetworkCollectiveModel> network_model;
  std::unique_ptr<CachedCollectiveModel> cache;
  std::vector<std::unique_ptr<NetworkCollectiveModel>> helpers;
  if (config.timing == TimingPath::kCached) {
    if (config.numerics) {
      throw std::invalid_argument("the cached timing path runs without numerics");
    }
    exec.collective_model = config.collective_model;
    if (!exec.collective_model) {
      network_model = std::make_unique<NetworkCollectiveModel>(machine);
      cache = std::make_unique<CachedCollectiveModel>(*network_model);
      for (int j = 1; j < config.jobs; ++j) {
        helpers.push_back(
            std::make_unique<NetworkCollectiveModel>(machine, NetworkCollectiveModel::OwnRouter{}));
        cache->AddHelper(*helpers.back());
      }
      exec.collective_model = cache.get();
    }
  }
  Executor executor(sim, network, mesh, program, exec, lowered);
  executor.Start();
  sim.Run();
  if (!executor.finished()) {
    // Lowering checks every group can assemble and every input is made where it is read, so
    // a device left waiting is a broken invariant.
    throw std::logic_error("internal error: the program deadlocked: some devices never finished");
  }
  RunResult result;
  result.end = executor.end_time();
  result.events = sim.events_dispatched();
  result.simulated_devices = executor.simulated_devices();
  result.ops = executor.op_timings();
  result.per_simulated_device = executor.SimulatedDeviceTimings();
  if (config.device_rows) {
    result.per_device.reserve(mesh.size());
    for (int p = 0; p < mesh.size(); ++p) {
      result.per_device.push_back(result.per_simulated_device[executor.class_of(p)]);
      result.per_device.back().device = mesh.device(p);
    }
  }
  if (config.link_busy) result.link_busy = executor.LinkBusy();
  result.outputs = executor.Outputs();
  result.inputs = executor.inputs();
  result.hbm_capacity = machine.hbm_capacity();
  // Over the simulated devices' rows: the first position with the largest peak is the first
  // position of the first simulated device with it (they are numbered by first position).
  for (const DeviceTiming& d : result.per_simulated_device) {
    result.phase_peaks.resize(std::max(result.phase_peaks.size(), d.phase_peaks.size()));
    for (size_t p = 0; p < d.phase_peaks.size(); ++p) {
      result.phase_peaks[p] = std::max(result.phase_peaks[p], d.phase_peaks[p]);
    }
    result.phase_entry_live.resize(
        std::max(result.phase_entry_live.size(), d.phase_entry_live.size()));
    for (size_t p = 0; p < d.phase_entry_live.size(); ++p) {
      result.phase_entry_live[p] = std::max(result.phase_entry_live[p], d.phase_entry_live[p]);
    }
    result.host_peak = std::max(result.host_peak, d.host_peak);
    result.host_transfer = std::max(result.host_transfer, d.host_transfer);
    if (d.peak_memory > result.peak_memory) {
      result.peak_memory = d.peak_memory;
      result.peak_device = d.device;
      result.peak_op = d.peak_op;
    }
  }
  result.phase_forced_peaks = executor.PhaseForcedPeaks();
  result.fits = result.hbm_capacity.count() == 0 || result.peak_memory <= result.hbm_capacity;
  return result;
}

}  // namespace shardsim
