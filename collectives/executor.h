// Runs a shard_map program on the simulated machine: local ops on each device's real blocks,
// collectives as algorithms scheduled on the network.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/array.h"
#include "collectives/collective.h"
#include "collectives/compute_model.h"
#include "collectives/lowering.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "collectives/timing/collective_cost_model.h"
#include "collectives/timing/sharing_costs.h"
#include "collectives/timing/timeline_cache.h"
#include "sim/simulator.h"
#include "sim/time.h"
#include "topology/network.h"

namespace shardsim {

// The default of ExecutorConfig::max_collectives_in_flight (see there).
inline constexpr int kDefaultCollectivesInFlight = 2;

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
  // Asynchronous collectives a device may have in flight at once (0: unbounded). XLA's
  // latency-hiding scheduler bounds overlapping async collectives (its SchedulerConfig keeps
  // one of each kind by default); shardsim counts all kinds together and allows two, so the
  // two directions of a bidirectional ppermute loop overlap while an FSDP program prefetches
  // one layer's weights ahead instead of issuing every layer's all-gather at once.
  int max_collectives_in_flight = kDefaultCollectivesInFlight;
  // Prices collectives instead of simulating them on the network (not owned; null: every
  // collective runs its algorithm on the network). With a model the run is timing-only and
  // devices with provably identical timelines are simulated once (see Executor).
  CollectiveCostModel* collective_model = nullptr;
  // Program op indices where memory phases begin, ascending (a training step's backward
  // passes, say): each device also keeps its peak within each phase (DeviceTiming::
  // phase_peaks), by the op whose buffers it was allocating. Empty: one phase.
  std::vector<size_t> memory_phases;
  // Inputs whose buffers the run frees after their last reader, as jax.jit frees donated
  // arguments (donate_argnums: a training step's parameters and optimizer state, which its
  // updated outputs replace). Others stay live to the end.
  std::set<std::string> donated_inputs;
  // Each device's link to its host's memory, one way (move_to_host and move_to_device copy
  // at this rate; zero: the hardware gives none, and a program moving data refuses to run).
  Bandwidth host_bandwidth;
  SharingPass sharing_pass = SharingPass::kByOrbit;  // With a collective model: for tests.
};

// When one op of the program ran, over all devices.
struct OpTiming {
  std::string name;       // The op's name.
  std::string op;         // Its SPEC op name.
  Bytes bytes;            // Bytes of its (first) input on one device.
  Time start;             // First device started it.
  Time end;               // Last device finished it.
  std::string algorithm;  // Collective algorithm used ("" for local ops).
  // Local ops: the compute model's time on one device, no slowdown (ops priced from their data,
  // OpDef::cost_reads_data: on the busiest device).
  Time compute;
  // Collectives: their class, "psum over tensor" (as DeviceTiming::exposed_by_collective keys
  // it); "" for local ops.
  std::string comm_class;
};

// The class a collective's time and bytes are reported under: "<op> over <axes>" ("psum over
// data fsdp"), OpTiming::comm_class.
std::string CommClassName(OpKind kind, const std::vector<std::string>& axes);

// Per-device time accounting of a run.
struct DeviceTiming {
  int device = 0;     // Physical device.
  Time compute;       // Busy computing.
  Time comm;          // Inside collectives (union of intervals).
  Time exposed_comm;  // Communication not hidden under compute.
  Time idle;          // Neither.
  // Memory: the most bytes of live buffers the device held at once (program inputs, which
  // the caller owns, included), and the op that was being started or issued when it did.
  Bytes peak_memory;
  std::string peak_op;
  // Per memory phase (ExecutorConfig::memory_phases: the ops before the first mark, then from
  // each mark to the next), the most bytes live while allocating for an op of the phase.
  std::vector<Bytes> phase_peaks;
  // Per memory phase, the bytes live as its first local op started (at a backward pass's
  // start: the parameters and every value the forward kept for it).
  std::vector<Bytes> phase_entry_live;
  // exposed_comm by collective, keyed "psum over tensor" (the op's name over its mesh axes):
  // each stretch of exposed communication split evenly among the collectives in flight then.
  std::map<std::string, Time> exposed_by_collective;
  Time host_transfer;  // Copying between HBM and host memory (union over both directions).
  Bytes host_peak;     // Most bytes held in host memory at once (move_to_host's values).
};

// Runs a program on every mesh position, event by event. Each device has a compute stream
// and communication engines: local ops run on the stream in program order, each starting when
// the stream is free and its inputs are ready; collectives are issued in program order as soon
// as their input is ready, up to max_collectives_in_flight at once (XLA's async collectives),
// and a collective's transfers start once every member of its group issued it. Copies between
// HBM and host memory (move_to_host, move_to_device) run on a DMA queue per direction, one at
// a time, each issued at its place in program order (once the compute stream has started the
// local ops before it) and its input ready, as XLA's copy-start is scheduled. Data
// dependencies are exact: an op waits for the values it reads, not for everything before it,
// so a ppermute and an independent matmul overlap.
// Memory follows XLA's buffer lifetimes: an op's outputs are allocated when it starts (a
// collective's when it is issued) and a buffer is freed when its last reader finished;
// an elementwise op writes over an input of its output's size when it is that input's last
// reader; a local op's workspace (OpCost::workspace: an unfused attention's scores) counts
// while it runs; program inputs (the caller's arrays) and outputs stay live to the end. Without
// numerics no arrays exist: shapes, costs and groups are resolved once when it starts.
// With a collective cost model (the timing path for search), each collective op's duration per
// member comes from the model, and devices are partitioned into classes by colour refinement:
// two devices share a class when they have the same collective durations and, for every
// collective, groups whose members fall into the same classes, repeated until stable. By
// induction over events, members of one class start and finish every op at the same times,
// so one representative per class is simulated (one for every device of a symmetric SPMD
// program) and its timings stand for the class. Collectives of different ops in flight at once
// share links. Each op's standalone simulation tells, per group and per link, for what fraction
// d of its time transfers of it held the link, how many at once, and at what rate each moved
// (LinkUse). Collectives issued together run in lockstep phases (every ring step sends at
// once), so on a shared link group g of op I holds it while op J does for min(d_g, d_J) of its
// time; ops issued at different instants have independent phases and overlap for d_g * d_J.
// While they overlap, g's transfers there get the max-min fair rate the link leaves them
// beside J's (each set of transfers as many and as fast as alone, so transfers held back by a
// bottleneck elsewhere leave the rest to the others), r' instead of r alone: each overlap costs
// g (r / r' - 1) of its time. Group g progresses through its standalone times at rate
// 1 / (1 + max over its links of the sum over the other ops J in flight). Two bandwidth-bound
// ops sharing a ring (d = 1, r' = r / 2) each run at half speed; latency-bound ones (small d)
// barely slow each other; an op whose transfers are throttled by its own bottleneck is not
// slowed where another op only takes the bandwidth it left, while the other op's groups there
// are.
class Executor {
 public:
  // `sim`, `network` and `mesh` must outlive the executor.
  // `lowered`, when given, is `program` already lowered with config.algorithms (lower once, run
  // many times); it must outlive the executor.
  Executor(Simulator& sim, Network& network, const Mesh& mesh, const ProgramSpec& program,
           ExecutorConfig config, const LoweredProgram* lowered = nullptr);
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
  // Per-device accounting (call after the run), one row per simulated device (a class with a
  // collective model, else a mesh position), numbered in order of their first mesh positions,
  // whose devices the rows name. Every position of a class has its row (class_of).
  std::vector<DeviceTiming> SimulatedDeviceTimings() const;
  // The outputs as global arrays (assembled by their out specs). Throws SpecError
  // ("outputs.NAME") when replicas of an output differ along an axis its spec does not name.
  std::map<std::string, Array> Outputs() const;
  // Local ops run over all devices (for benchmarks).
  int64_t local_ops_run() const { return local_ops_run_; }
  // The simulated device (SimulatedDeviceTimings' row) that mesh position `p` is.
  int class_of(int p) const { return agent_of_[p]; }
  // Devices simulated: one per class with a collective model, else every mesh position.
  int simulated_devices() const { return static_cast<int>(agent_position_.size()); }
  // With a collective cost model: per directed link, the time its bytes in this program's
  // collectives take at the link's full bandwidth (each op's share of the link times its
  // longest member time: bytes / bandwidth), ascending by link; empty otherwise.
  std::vector<std::pair<LinkId, Time>> LinkBusy() const;
  // Per memory phase (ExecutorConfig::memory_phases), over the simulated devices (call after
  // the run), the bytes that every order of the program's ops holds live at the op where a
  // device's phase peaked: the inputs and the values made by that op or before it (by its
  // ancestors), that it or an op after it (a descendant) reads, or that are held to the end,
  // with its workspace, less the most that writing over a dying input saves. So no schedule of
  // the same ops peaks lower (the scheduling passes only reorder). Empty with `where` or
  // several meshes.
  std::vector<Bytes> PhaseForcedPeaks() const;
  // The global input arrays Start() made (with data when numerics are on).
  const std::map<std::string, Array>& inputs() const { return inputs_; }

 private:
  struct GroupRun;
  struct Device;
  void Wake(int position);
  void Try(int position);
  bool Ready(int position, const LoweredOp& op) const;
  void Allocate(int position, size_t op_index);
  void Release(int position, const LoweredOp& op);
  // Value `value`, read by its last reader here (or by none), dies: its buffer is freed
  // (unless an op took it over), and a view's death releases what it viewed.
  void Dies(int position, int value);
  void FreeValue(int position, int value);
  void StartCompute(int position, size_t op_index);
  void FinishCompute(int position, size_t op_index, Time started);
  // Runs host copy `op_index` on `position`'s DMA queue of direction `dir` (0: to host).
  void StartHostCopy(int position, int dir, size_t op_index);
  // Reports op `op`'s slice [start, end) on `position`'s track `tid` when tracing.
  void TraceOp(int position, int32_t tid, const LoweredOp& op, const char* category, Time start,
               Time end);
  void Arrive(int position, size_t op_index);
  void LaunchGroup(size_t op_index, int group);
  void MemberDone(size_t op_index, int group, int member);
  void Record(size_t op_index, Time start, Time end);
  void DeclareTracks();
  void BuildClasses();
  // Makes `classes` (a class per mesh position, numbered by first position) the timeline
  // classes.
  void SetClasses(const std::vector<int>& classes);
  struct SharedRun;
  void Reshare(bool ops_changed);
  const std::vector<double>& SharedRates(const SharedRun& run,
                                         const std::vector<const SharedRun*>& ops);
  void FinishShared(SharedRun* run);
  struct GroupLayout;
  // SharedRates' end: `rates` (of `layout`'s groups, keyed `key` beside `others`) from each
  // simulated group's worst cost, kept under `shared_key` in the model's timeline cache if
  // it has one.
  const std::vector<double>& KeepRates(const GroupLayout& layout, const std::vector<int64_t>& key,
                                       const std::vector<std::pair<int64_t, int64_t>>& others,
                                       std::vector<double> worst,
                                       TimelineCache::RatesKey shared_key,
                                       std::vector<double>& rates);
  // Each entry of `rates` (one per group of `layout`) lowered to the slowest of the simulated
  // groups (`group_rate`) it stands for.
  static void SpreadGroupRates(const GroupLayout& layout, const std::vector<double>& group_rate,
                               std::vector<double>& rates);

  const std::vector<std::vector<int>>& PositionGroups(const std::vector<int>& axes);

  Simulator& sim_;
  Network& network_;
  const Mesh& mesh_;
  const ProgramSpec& program_;
  ExecutorConfig config_;
  LoweredProgram own_lowered_;               // When no lowered program was given.
  const LoweredProgram* lowered_ = nullptr;  // The program that runs.
  std::vector<Time> op_duration_;            // Per lowered op: compute time before any slowdown.
  // Per lowered op priced from its data: the longest time a device has run it (its op row
  // reports it once some device has), and whether one has.
  std::vector<Time> data_priced_;
  std::vector<char> data_priced_seen_;
  std::vector<int64_t> op_workspace_;  // Per lowered op: OpCost::workspace, in bytes.
  std::vector<int32_t> readers_;       // Per value: lowered ops that read it.
  std::vector<char> held_;             // Per value: an input or output, never freed.
  std::vector<int64_t> value_bytes_;   // Per value: bytes of its local block.
  // Per value: the values it is a fused view of (a fused transpose, slice or reshape of one, or
  // a fused concatenation of several: its readers read those buffers in place, so it holds no
  // buffer of its own and keeps them alive until it dies itself), each once; empty if none.
  std::vector<std::vector<int32_t>> viewed_;
  std::vector<int> work_;     // Positions woken and not yet tried.
  std::vector<char> queued_;  // Per position: in work_.
  bool draining_ = false;
  std::vector<size_t> compute_ops_;  // Lowered op indices on the compute stream, in order.
  std::vector<size_t> comm_ops_;     // Lowered collective op indices, in order.
  // Lowered host copies, in order: [0] to host, [1] to device.
  std::vector<size_t> host_ops_[2];
  // Per lowered op: how many entries of compute_ops_ come before it in program order (a host
  // copy issues once the compute stream has started that many).
  std::vector<size_t> compute_before_;
  std::vector<Device> devices_;
  std::vector<OpTiming> op_timings_;
  std::vector<bool> op_started_;
  std::map<std::pair<size_t, int>, std::unique_ptr<GroupRun>> groups_;
  // The groups of one tuple of mesh axes: each group's positions, and per position its group
  // and index in it. Made once per distinct tuple and shared by every op over it.
  struct GroupLayout {
    std::vector<std::vector<int>> groups;
    std::vector<std::pair<int, int>> membership;
    // With a collective model: per group of agents, the groups of positions (Mesh::Groups
    // order) it stands for.
    std::vector<std::vector<int>> position_groups;
  };
  std::map<std::vector<int>, GroupLayout> layouts_;
  std::vector<const GroupLayout*> layout_of_op_;  // Per lowered op (collectives only).
  // Simulated devices ("agents"): the mesh position each stands for, and each position's
  // agent. Without a collective model agent == position.
  std::vector<int> agent_position_;
  std::vector<int> agent_of_;
  std::vector<std::vector<int>> agent_coords_;  // Per agent, when some op has `where`.
  bool RunsHere(int agent, const LoweredOp& op) const {
    return (op.where.empty() && op.to_part < 0) || RunsAt(op, agent_coords_[agent]);
  }
  std::map<std::vector<int>, std::vector<std::vector<int>>> position_groups_;
  // Per lowered collective, with a collective model: its timing per position.
  std::vector<std::shared_ptr<const CollectiveTiming>> timings_;
  std::vector<std::unique_ptr<SharedRun>> shared_;  // Collectives in flight (model path).
  std::map<size_t, int> ops_in_flight_;             // Lowered op -> its runs in flight.
  std::vector<std::string> comm_classes_;           // "psum over tensor", by class id.
  std::vector<int> comm_class_of_op_;               // Per lowered op: its class id (-1: local).
  std::vector<size_t> phase_of_op_;                 // Per lowered op: its memory phase.
  // Lowered op in flight -> the rate of each of its groups (entries of rates_).
  std::map<size_t, const std::vector<double>*> op_rates_;
  std::vector<SharedRun*> unscheduled_;  // Runs waiting for their next event.
  // SharedRates beside one other op: that op's worst costs per simulated group, found in the
  // same pass, with its own key (the other op's call takes them).
  std::optional<std::pair<std::vector<int64_t>, std::vector<double>>> partner_worst_;
  // SharedRates' answers (per group of the op's layout) by (own timing, other ops' timings and
  // alignment), timings named by their index in program order.
  std::map<std::vector<int64_t>, std::vector<double>> rates_;
  std::map<const CollectiveTiming*, int64_t> timing_index_;
  std::vector<const CollectiveTiming*> timing_by_index_;
  std::vector<std::shared_ptr<const CollectiveTiming>> timing_owner_;  // By index, as above.
  int finished_positions_ = 0;
  int64_t local_ops_run_ = 0;
  std::map<std::string, Array> inputs_;
  Time end_;
};

}  // namespace shardsim
