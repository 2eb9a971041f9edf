// Runs a shard_map program on the simulated machine: local ops on each device's real blocks,
// collectives as algorithms scheduled on the network.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/collective.h"
#include "collectives/compute_model.h"
#include "collectives/lowering.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "sim/simulator.h"
#include "sim/time.h"
#include "topology/network.h"

namespace shardsim {

// How a program runs.
struct ExecutorConfig {
  bool numerics = true;  // Carry real data (else shapes only: timing runs).
  // Default algorithm per collective: keys are JAX op names (psum, all_gather, ...) or
  // generic kinds (all_reduce, reduce_scatter, all_gather, all_to_all, permute).
  std::map<std::string, std::string> algorithms;
  std::string base_dir;  // Folder that relative `init: {file: ...}` paths start from.
  // Prices local ops (not owned; null: local ops take no time).
  const ComputeModel* compute_model = nullptr;
  // Compute that starts while the device has a collective in flight runs this fraction
  // slower (GPU communication kernels take SMs; 0 on TPUs).
  double comm_compute_slowdown = 0.0;
  Bytes chunk_size = Bytes::MiB(1);  // The tree algorithm's pipelining unit.
};

// When one op of the program ran, over all devices.
struct OpTiming {
  std::string name;       // The op's name.
  std::string op;         // Its SPEC op name.
  Bytes bytes;            // Bytes of its (first) input on one device.
  Time start;             // First device started it.
  Time end;               // Last device finished it.
  std::string algorithm;  // Collective algorithm used ("" for local ops).
};

// Per-device time accounting of a run.
struct DeviceTiming {
  int device = 0;     // Physical device.
  Time compute;       // Busy computing.
  Time comm;          // Inside collectives (union of intervals).
  Time exposed_comm;  // Communication not hidden under compute.
  Time idle;          // Neither.
};

// Runs a program on every mesh position, event by event. Each device has a compute stream
// and communication engines: local ops run on the stream in program order, each starting when
// the stream is free and its inputs are ready; collectives are issued in program order as soon
// as their input is ready, several may be in flight at once (XLA's async collectives), and a
// collective's transfers start once every member of its group issued it. Data dependencies
// are exact: an op waits for the values it reads, not for everything before it, so a ppermute
// and an independent matmul overlap.
class Executor {
 public:
  // `sim`, `network` and `mesh` must outlive the executor.
  Executor(Simulator& sim, Network& network, const Mesh& mesh, const ProgramSpec& program,
           ExecutorConfig config);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Makes the inputs and schedules the program's start at the current time.
  void Start();
  // True once every device ran every op (after the simulator drained).
  bool finished() const;
  // When the last device finished.
  Time end_time() const { return end_; }
  // Per-op timing, one row per op of the run file, in program order.
  const std::vector<OpTiming>& op_timings() const { return op_timings_; }
  // Per-device accounting (call after the run), ordered by mesh position.
  std::vector<DeviceTiming> DeviceTimings() const;
  // The outputs as global arrays (assembled by their out specs). Throws SpecError
  // ("outputs.NAME") when replicas of an output differ along an axis its spec does not name.
  std::map<std::string, Array> Outputs() const;
  // Local ops run over all devices (for benchmarks).
  int64_t local_ops_run() const { return local_ops_run_; }
  // The global input arrays Start() made (with data when numerics are on).
  const std::map<std::string, Array>& inputs() const { return inputs_; }

 private:
  struct GroupRun;
  struct Device;
  void Try(int position);
  bool Ready(int position, const LoweredOp& op) const;
  void StartCompute(int position, size_t op_index);
  void FinishCompute(int position, size_t op_index, Time started);
  void Arrive(int position, size_t op_index);
  void LaunchGroup(size_t op_index, int group);
  void MemberDone(size_t op_index, int group, int member);
  void Record(size_t op_index, Time start, Time end);
  void DeclareTracks();

  Simulator& sim_;
  Network& network_;
  const Mesh& mesh_;
  const ProgramSpec& program_;
  ExecutorConfig config_;
  LoweredProgram lowered_;
  std::vector<size_t> compute_ops_;  // Lowered op indices on the compute stream, in order.
  std::vector<size_t> comm_ops_;     // Lowered collective op indices, in order.
  std::vector<Device> devices_;
  std::vector<OpTiming> op_timings_;
  std::vector<bool> op_started_;
  std::map<std::pair<size_t, int>, std::unique_ptr<GroupRun>> groups_;
  // Per lowered collective: group of each position and the position's index in it.
  std::vector<std::vector<std::pair<int, int>>> membership_;
  std::vector<std::vector<std::vector<int>>> group_lists_;
  int finished_positions_ = 0;
  int64_t local_ops_run_ = 0;
  std::map<std::string, Array> inputs_;
  Time end_;
};

// Checks a program before it runs: names, shapes, dtypes and parameters of every op, on the
// local shapes of the mesh. Throws SpecError naming the op's key ("program.3") or the array's
// ("arrays.x.sharding", "outputs.y").
void CheckProgram(const Mesh& mesh, const ProgramSpec& program);

}  // namespace shardsim
