#include "collectives/executor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "collectives/algorithm.h"
#include "collectives/init.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/outputs.h"
#include "collectives/semantics.h"
#include "collectives/sharding.h"
#include "sim/intervals.h"
#include "sim/spec_error.h"

namespace shardsim {
namespace {

int NormalizeAxis(int64_t axis, int rank) {
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

CollectiveKind KindOf(OpKind op) {
  switch (op) {
    case OpKind::kPsumScatter:
      return CollectiveKind::kReduceScatter;
    case OpKind::kAllGather:
      return CollectiveKind::kAllGather;
    case OpKind::kAllToAll:
      return CollectiveKind::kAllToAll;
    case OpKind::kPpermute:
      return CollectiveKind::kPermute;
    default:
      return CollectiveKind::kAllReduce;
  }
}

ReduceOp ReduceOf(OpKind op) {
  if (op == OpKind::kPmax) return ReduceOp::kMax;
  if (op == OpKind::kPmin) return ReduceOp::kMin;
  return ReduceOp::kSum;
}

// The chunks a reduce-scatter or all-to-all splits its input into: G slices along `axis`,
// each flattened, back to back.
std::vector<float> ChunkedInput(const Array& x, int64_t axis, int g) {
  if (NormalizeAxis(axis, x.rank()) == 0) return x.values();  // Already contiguous.
  std::vector<float> flat;
  flat.reserve(static_cast<size_t>(x.size()));
  for (const Array& part : Split(x, g, axis)) {
    flat.insert(flat.end(), part.values().begin(), part.values().end());
  }
  return flat;
}

// G arrays of `shape` cut from a flat buffer.
std::vector<Array> Blocks(const std::vector<float>& flat, const Shape& shape, DType dtype, int g) {
  std::vector<Array> blocks;
  int64_t n = NumElements(shape);
  for (int j = 0; j < g; ++j) {
    blocks.push_back(Array::FromValues(
        dtype, shape, std::vector<float>(flat.begin() + j * n, flat.begin() + (j + 1) * n)));
  }
  return blocks;
}

Shape WithoutDim(Shape s, int d) {
  s.erase(s.begin() + d);
  return s;
}

// Builds member output from the flat result of a collective, in JAX's layout.
Array CollectiveOutput(const OpSpec& op, const Array& in, std::vector<float> flat, int g) {
  DType dt = in.dtype();
  const Shape& shape = in.shape();
  switch (op.kind) {
    case OpKind::kAllGather: {
      std::vector<Array> blocks = Blocks(flat, shape, dt, g);
      return op.tiled ? ConcatAlong(blocks, static_cast<int>(op.axis))
                      : Stack(blocks, static_cast<int>(op.axis));
    }
    case OpKind::kPsumScatter: {
      int d = NormalizeAxis(op.scatter_dimension, in.rank());
      Shape chunk = shape;
      chunk[d] /= g;
      if (!op.tiled) chunk = WithoutDim(chunk, d);
      return Array::FromValues(dt, chunk, std::move(flat));
    }
    case OpKind::kAllToAll: {
      int s = NormalizeAxis(op.split_axis, in.rank());
      Shape chunk = shape;
      chunk[s] /= g;
      std::vector<Array> blocks = Blocks(flat, chunk, dt, g);
      if (op.tiled) return ConcatAlong(blocks, static_cast<int>(op.concat_axis));
      for (Array& b : blocks) b = Reshape(b, WithoutDim(chunk, s));
      return Stack(blocks, static_cast<int>(op.concat_axis));
    }
    case OpKind::kPmean:
      for (float& v : flat) {  // An i32 pmean is f32: the wrapped int sum over g.
        v = (dt == DType::kI32 ? static_cast<float>(WordToInt(v)) : v) / static_cast<float>(g);
      }
      return Array::FromValues(CollectiveOutputDType(op, dt), shape, std::move(flat));
    default:
      return Array::FromValues(dt, shape, std::move(flat));
  }
}

// Ops that cost nothing on the compute stream: relabellings, the dynamic slices and
// concatenations collective matmuls lower into and their fused views and in-place writes
// (XLA fuses them into the consuming matmul or writes in place), and axis_index.
bool IsFree(const OpSpec& op) {
  return op.fused || op.kind == OpKind::kReshape || op.kind == OpKind::kDynamicSlice ||
         op.kind == OpKind::kDynamicConcat || op.kind == OpKind::kAxisIndex;
}

// Trace tracks of the executor on each device process; the network's start at 1.
constexpr int32_t kComputeTid = 0;
constexpr int32_t kCollectiveTid = 1 << 29;

}  // namespace

struct Executor::GroupRun {
  CollectiveJob job;
  std::unique_ptr<CollectiveAlgorithm> algorithm;
  std::vector<std::vector<float>> in, out;
  std::vector<int> positions;
  std::vector<Array> inputs;  // Per member (shape and dtype; data moved into `in`).
  int arrived = 0;
  int finished = 0;
  Time start;
};

struct Executor::Device {
  std::vector<Array> values;  // By value id.
  std::vector<char> ready;    // By value id.
  size_t compute_pc = 0;      // Next entry of compute_ops_.
  size_t comm_pc = 0;         // Next entry of comm_ops_.
  bool busy = false;          // The compute stream runs an op.
  int in_flight = 0;          // Collectives issued and not finished.
  bool finished = false;
  std::vector<std::pair<Time, Time>> compute_spans;
  std::vector<std::pair<Time, Time>> comm_spans;
};

Executor::Executor(Simulator& sim, Network& network, const Mesh& mesh, const ProgramSpec& program,
                   ExecutorConfig config)
    : sim_(sim), network_(network), mesh_(mesh), program_(program), config_(std::move(config)) {}

Executor::~Executor() = default;

void Executor::Start() {
  lowered_ = LowerProgram(mesh_, program_);
  int n = mesh_.size();
  devices_.assign(n, Device{});
  for (Device& d : devices_) {
    d.values.resize(lowered_.values.size());
    d.ready.assign(lowered_.values.size(), 0);
  }
  for (const ArraySpec& spec : program_.arrays) {
    Array global;
    try {
      global = MakeInitialArray(spec, config_.numerics, config_.base_dir);
    } catch (const std::invalid_argument& e) {
      throw SpecError("arrays." + spec.name + ".init", e.what());
    }
    int id = -1;
    for (const auto& [name, value] : lowered_.inputs) {
      if (name == spec.name) id = value;
    }
    Sharding sharding(mesh_, spec.sharding, spec.shape);
    for (int p = 0; p < n; ++p) {
      devices_[p].values[id] = sharding.Shard(global, p);
      devices_[p].ready[id] = 1;
    }
    inputs_[spec.name] = std::move(global);
  }
  op_timings_.assign(program_.ops.size(), OpTiming{});
  op_started_.assign(program_.ops.size(), false);
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    const OpSpec& op = program_.ops[i];
    op_timings_[i].name = op.name;
    op_timings_[i].op = OpKindName(op.kind);
    if (op.kind == OpKind::kAllgatherMatmul || op.kind == OpKind::kMatmulReduceScatter) {
      op_timings_[i].algorithm = op.variant;
    }
  }
  // Each row's bytes: its first input on one device.
  for (const LoweredOp& op : lowered_.ops) {
    OpTiming& row = op_timings_[op.source];
    if (row.bytes.count() == 0 && !op.in_values.empty()) {
      row.bytes = lowered_.values[op.in_values[0]].bytes();
    }
  }
  membership_.assign(lowered_.ops.size(), {});
  group_lists_.assign(lowered_.ops.size(), {});
  for (size_t i = 0; i < lowered_.ops.size(); ++i) {
    const LoweredOp& op = lowered_.ops[i];
    if (!op.collective) {
      compute_ops_.push_back(i);
      continue;
    }
    comm_ops_.push_back(i);
    std::vector<std::vector<int>> groups = mesh_.Groups(ResolveCollectiveAxes(op.spec, mesh_));
    membership_[i].assign(n, {0, 0});
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t m = 0; m < groups[g].size(); ++m) {
        membership_[i][groups[g][m]] = {static_cast<int>(g), static_cast<int>(m)};
      }
    }
    group_lists_[i] = std::move(groups);
  }
  if (sim_.tracing()) DeclareTracks();
  sim_.Schedule(Time(), [this, n] {
    for (int p = 0; p < n; ++p) Try(p);
  });
}

void Executor::DeclareTracks() {
  for (int p = 0; p < mesh_.size(); ++p) {
    int32_t pid = network_.ProcessOf(network_.topology().device_vertex(mesh_.device(p)));
    sim_.DeclareThread(pid, kComputeTid, "compute", -2);
    sim_.DeclareThread(pid, kCollectiveTid, "collectives", -1);
  }
}

bool Executor::finished() const { return finished_positions_ == mesh_.size(); }

bool Executor::Ready(int position, const LoweredOp& op) const {
  const Device& d = devices_[position];
  for (int v : op.in_values) {
    if (!d.ready[v]) return false;
  }
  return true;
}

void Executor::Record(size_t op_index, Time start, Time end) {
  size_t source = lowered_.ops[op_index].source;
  OpTiming& t = op_timings_[source];
  if (!op_started_[source]) {
    op_started_[source] = true;
    t.start = start;
  } else {
    t.start = std::min(t.start, start);
  }
  t.end = std::max(t.end, end);
}

void Executor::Try(int position) {
  Device& d = devices_[position];
  bool progress = true;
  while (progress) {
    progress = false;
    // Collectives issue in program order, each as soon as its input is ready.
    while (d.comm_pc < comm_ops_.size() && Ready(position, lowered_.ops[comm_ops_[d.comm_pc]])) {
      size_t i = comm_ops_[d.comm_pc++];
      ++d.in_flight;
      Arrive(position, i);
      progress = true;
    }
    // The compute stream runs local ops in program order, one at a time.
    if (!d.busy && d.compute_pc < compute_ops_.size() &&
        Ready(position, lowered_.ops[compute_ops_[d.compute_pc]])) {
      StartCompute(position, compute_ops_[d.compute_pc++]);
      progress = true;
    }
  }
  if (!d.finished && !d.busy && d.in_flight == 0 && d.compute_pc == compute_ops_.size() &&
      d.comm_pc == comm_ops_.size()) {
    d.finished = true;
    ++finished_positions_;
    end_ = std::max(end_, sim_.Now());
  }
}

void Executor::StartCompute(int position, size_t op_index) {
  Device& d = devices_[position];
  const LoweredOp& op = lowered_.ops[op_index];
  std::vector<const Array*> inputs;
  for (int v : op.in_values) inputs.push_back(&d.values[v]);
  std::vector<Array> outputs;
  try {
    outputs = ApplyLocalOp(op.spec, inputs, mesh_, position);
  } catch (const std::invalid_argument& e) {
    throw SpecError(op.spec.key, std::string(OpKindName(op.spec.kind)) + ": " + e.what());
  }
  Time duration;
  if (config_.compute_model && !IsFree(op.spec)) {
    std::vector<const Array*> outs;
    for (const Array& a : outputs) outs.push_back(&a);
    OpCost cost = LocalOpCost(op.spec.kind, inputs, outs, op.spec.spec);
    duration = config_.compute_model->OpTime(op.spec.kind, cost, outputs[0].dtype());
    // GPU communication kernels take SMs: compute that starts beside a collective is slower.
    if (d.in_flight > 0 && config_.comm_compute_slowdown > 0) {
      duration = Time::FromSecondsCeil(duration.seconds() * (1 + config_.comm_compute_slowdown));
    }
  }
  for (size_t k = 0; k < outputs.size() && k < op.out_values.size(); ++k) {
    d.values[op.out_values[k]] = std::move(outputs[k]);
  }
  ++local_ops_run_;
  Time started = sim_.Now();
  if (duration == Time()) {
    FinishCompute(position, op_index, started);
    return;
  }
  d.busy = true;
  sim_.Schedule(duration, [this, position, op_index, started] {
    devices_[position].busy = false;
    FinishCompute(position, op_index, started);
    Try(position);
  });
}

void Executor::FinishCompute(int position, size_t op_index, Time started) {
  Device& d = devices_[position];
  const LoweredOp& op = lowered_.ops[op_index];
  for (int v : op.out_values) d.ready[v] = 1;
  Time now = sim_.Now();
  if (now > started) {
    d.compute_spans.push_back({started, now});
    if (sim_.tracing()) {
      SliceRecord s;
      s.pid = network_.ProcessOf(network_.topology().device_vertex(mesh_.device(position)));
      s.tid = kComputeTid;
      s.name = op.spec.name;
      s.category = "compute";
      s.start = started;
      s.end = now;
      s.args = {{"op", OpKindName(op.spec.kind)}};
      sim_.ReportSlice(s);
    }
  }
  Record(op_index, started, now);
}

void Executor::Arrive(int position, size_t op_index) {
  auto [g, m] = membership_[op_index][position];
  std::unique_ptr<GroupRun>& slot = groups_[{op_index, g}];
  if (!slot) {
    slot = std::make_unique<GroupRun>();
    slot->positions = group_lists_[op_index][g];
    slot->inputs.resize(slot->positions.size());
  }
  GroupRun& run = *slot;
  const LoweredOp& op = lowered_.ops[op_index];
  run.inputs[m] = devices_[position].values[op.in_values[0]];
  // A collective's transfers start when its whole group has issued it: XLA's collectives are
  // synchronous across their replica group.
  if (++run.arrived == static_cast<int>(run.positions.size())) LaunchGroup(op_index, g);
}

void Executor::LaunchGroup(size_t op_index, int group) {
  GroupRun& run = *groups_.at({op_index, group});
  const OpSpec& op = lowered_.ops[op_index].spec;
  int g = static_cast<int>(run.positions.size());
  run.start = sim_.Now();
  const Array& first = run.inputs[0];
  CollectiveJob& job = run.job;
  job.kind = KindOf(op.kind);
  job.reduce = ReduceOf(op.kind);
  job.dtype = first.dtype();
  job.numerics = config_.numerics && first.has_data();
  for (int p : run.positions) {
    job.members.push_back(network_.topology().device_vertex(mesh_.device(p)));
  }
  int64_t size = first.size();
  job.total = size;
  job.block = job.kind == CollectiveKind::kReduceScatter || job.kind == CollectiveKind::kAllToAll
                  ? size / g
                  : size;
  if (job.kind == CollectiveKind::kPermute) job.destination = ResolvePermutation(op, mesh_);
  if (job.numerics) {
    run.in.resize(g);
    run.out.resize(g);
    for (int m = 0; m < g; ++m) {
      Array& x = run.inputs[m];  // The group's own copy: its data can move.
      if (job.kind == CollectiveKind::kReduceScatter) {
        run.in[m] = ChunkedInput(x, op.scatter_dimension, g);
        x.TakeValues();
      } else if (job.kind == CollectiveKind::kAllToAll) {
        run.in[m] = ChunkedInput(x, op.split_axis, g);
        x.TakeValues();
      } else {
        run.in[m] = x.TakeValues();
      }
    }
    job.in = &run.in;
    job.out = &run.out;
  }
  job.label = op.name;
  job.on_member_done = [this, op_index, group](int member) { MemberDone(op_index, group, member); };
  std::vector<int> axes = ResolveCollectiveAxes(op, mesh_);
  std::vector<int> axis_sizes;
  for (int a : axes) axis_sizes.push_back(mesh_.axes()[a].size);
  std::string name = op.algorithm;
  if (name.empty()) {
    auto by_op = config_.algorithms.find(OpKindName(op.kind));
    auto by_kind = config_.algorithms.find(CollectiveKindName(job.kind));
    if (by_op != config_.algorithms.end()) {
      name = by_op->second;
    } else if (by_kind != config_.algorithms.end()) {
      name = by_kind->second;
    } else {
      name = "auto";
    }
  }
  std::string resolved;
  try {
    run.algorithm = MakeAlgorithm(name, network_, job, axis_sizes, &resolved, config_.chunk_size);
  } catch (const std::invalid_argument& e) {
    throw SpecError(op.algorithm.empty() ? op.key : op.key + ".algorithm",
                    std::string(OpKindName(op.kind)) + ": " + e.what());
  }
  OpTiming& row = op_timings_[lowered_.ops[op_index].source];
  if (row.algorithm.empty()) row.algorithm = resolved;
  run.algorithm->Start();
  run.in.clear();
  run.in.shrink_to_fit();
}

void Executor::MemberDone(size_t op_index, int group, int member) {
  GroupRun& run = *groups_.at({op_index, group});
  const LoweredOp& lowered = lowered_.ops[op_index];
  const OpSpec& op = lowered.spec;
  int g = static_cast<int>(run.positions.size());
  int position = run.positions[member];
  const Array& in = run.inputs[member];
  Array result;
  if (run.job.numerics) {
    result = CollectiveOutput(op, in, std::move(run.out[member]), g);
    run.out[member] = {};
  } else {
    result = Array::ShapeOnly(CollectiveOutputDType(op, in.dtype()),
                              CollectiveOutputShape(op, in.shape(), g, in.dtype()));
  }
  run.inputs[member] = Array();
  Device& d = devices_[position];
  d.values[lowered.out_values[0]] = std::move(result);
  d.ready[lowered.out_values[0]] = 1;
  --d.in_flight;
  d.comm_spans.push_back({run.start, sim_.Now()});
  if (sim_.tracing()) {
    SliceRecord s;
    s.pid = network_.ProcessOf(network_.topology().device_vertex(mesh_.device(position)));
    s.tid = kCollectiveTid;
    s.name = op.name;
    s.category = "collective";
    s.start = run.start;
    s.end = sim_.Now();
    s.args = {{"op", OpKindName(op.kind)}};
    sim_.ReportSlice(s);
  }
  Record(op_index, run.start, sim_.Now());
  if (++run.finished == g) {
    // Free the group's state once nothing runs inside it: members can finish synchronously
    // inside algorithm->Start(), so the erase waits for the current event to end.
    sim_.Schedule(Time(), [this, op_index, group] { groups_.erase({op_index, group}); });
  }
  Try(position);
}

std::vector<DeviceTiming> Executor::DeviceTimings() const {
  std::vector<DeviceTiming> out;
  for (int p = 0; p < mesh_.size(); ++p) {
    const Device& d = devices_[p];
    std::vector<std::pair<Time, Time>> both = d.compute_spans;
    both.insert(both.end(), d.comm_spans.begin(), d.comm_spans.end());
    DeviceTiming t;
    t.device = mesh_.device(p);
    t.compute = CoveredTime(d.compute_spans);
    t.comm = CoveredTime(d.comm_spans);
    Time busy = CoveredTime(both);
    // Communication not hidden under compute: what the union adds beyond compute.
    t.exposed_comm = busy - t.compute;
    t.idle = end_ - busy;
    out.push_back(t);
  }
  return out;
}

std::map<std::string, Array> Executor::Outputs() const {
  std::vector<std::map<std::string, Array>> env(mesh_.size());
  for (const OutputSpec& o : program_.outputs) {
    int id = lowered_.final_values.at(o.name);
    for (int p = 0; p < mesh_.size(); ++p) env[p][o.name] = devices_[p].values[id];
  }
  return AssembleOutputs(mesh_, program_, std::move(env));
}

void CheckProgram(const Mesh& mesh, const ProgramSpec& program) {
  LoweredProgram lowered = LowerProgram(mesh, program);
  for (const OutputSpec& o : program.outputs) {
    const Array& local = lowered.values[lowered.final_values.at(o.name)];
    Shape global = GlobalShapeOf(local.shape(), o.spec, mesh);
    try {
      ValidatePartitionSpec(o.spec, global, mesh);
    } catch (const std::invalid_argument& e) {
      throw SpecError(o.key, "output " + o.name + ": " + e.what());
    }
  }
}

}  // namespace shardsim
