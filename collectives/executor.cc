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
#include "collectives/semantics.h"
#include "collectives/sharding.h"
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
      for (float& v : flat) v /= static_cast<float>(g);
      return Array::FromValues(dt, shape, std::move(flat));
    default:
      return Array::FromValues(dt, shape, std::move(flat));
  }
}

}  // namespace

struct Executor::GroupRun {
  CollectiveJob job;
  std::unique_ptr<CollectiveAlgorithm> algorithm;
  std::vector<std::vector<float>> in, out;
  std::vector<int> positions;
  std::vector<Array> inputs;  // Per member (shape and dtype; data moved into `in`).
  int arrived = 0;
  Time start;
};

Executor::Executor(Simulator& sim, Network& network, const Mesh& mesh, const ProgramSpec& program,
                   ExecutorConfig config)
    : sim_(sim), network_(network), mesh_(mesh), program_(program), config_(std::move(config)) {}

Executor::~Executor() = default;

void Executor::Start() {
  int n = mesh_.size();
  env_.assign(n, {});
  pc_.assign(n, 0);
  comm_spans_.assign(n, {});
  for (const ArraySpec& spec : program_.arrays) {
    Array global;
    try {
      global = MakeInitialArray(spec, config_.numerics, config_.base_dir);
    } catch (const std::invalid_argument& e) {
      throw SpecError("arrays." + spec.name + ".init", e.what());
    }
    Sharding sharding(mesh_, spec.sharding, spec.shape);
    for (int p = 0; p < n; ++p) env_[p][spec.name] = sharding.Shard(global, p);
  }
  op_timings_.assign(program_.ops.size(), OpTiming{});
  op_started_.assign(program_.ops.size(), false);
  membership_.assign(program_.ops.size(), {});
  group_lists_.assign(program_.ops.size(), {});
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    const OpSpec& op = program_.ops[i];
    op_timings_[i].name = op.name;
    op_timings_[i].op = OpKindName(op.kind);
    if (!IsCollective(op.kind)) continue;
    std::vector<std::vector<int>> groups = mesh_.Groups(ResolveCollectiveAxes(op, mesh_));
    membership_[i].assign(n, {0, 0});
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t m = 0; m < groups[g].size(); ++m) {
        membership_[i][groups[g][m]] = {static_cast<int>(g), static_cast<int>(m)};
      }
    }
    group_lists_[i] = std::move(groups);
  }
  sim_.Schedule(Time(), [this, n] {
    for (int p = 0; p < n; ++p) Advance(p);
  });
}

bool Executor::finished() const { return finished_positions_ == mesh_.size(); }

void Executor::Advance(int position) {
  while (pc_[position] < program_.ops.size()) {
    size_t i = pc_[position];
    const OpSpec& op = program_.ops[i];
    if (IsCollective(op.kind)) {
      Arrive(position, i);
      return;
    }
    OpTiming& t = op_timings_[i];
    if (!op_started_[i]) {
      op_started_[i] = true;
      t.start = sim_.Now();
      if (!op.in.empty()) t.bytes = env_[position].at(op.in[0]).bytes();
    }
    RunLocal(position, op);
    t.end = std::max(t.end, sim_.Now());
    ++pc_[position];
  }
  ++finished_positions_;
  end_ = std::max(end_, sim_.Now());
}

void Executor::RunLocal(int position, const OpSpec& op) {
  std::vector<const Array*> inputs;
  for (const std::string& name : op.in) inputs.push_back(&env_[position].at(name));
  std::vector<Array> outputs;
  try {
    outputs = ApplyLocalOp(op, inputs, mesh_, position);
  } catch (const std::invalid_argument& e) {
    throw SpecError(op.key, std::string(OpKindName(op.kind)) + ": " + e.what());
  }
  for (size_t k = 0; k < outputs.size() && k < op.out.size(); ++k) {
    env_[position][op.out[k]] = std::move(outputs[k]);
  }
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
  const OpSpec& op = program_.ops[op_index];
  run.inputs[m] = env_[position].at(op.in.at(0));
  OpTiming& t = op_timings_[op_index];
  if (!op_started_[op_index]) {
    op_started_[op_index] = true;
    t.start = sim_.Now();
    t.bytes = run.inputs[m].bytes();
  }
  // A collective starts when its whole group has arrived: XLA's collectives are synchronous
  // across their replica group.
  if (++run.arrived == static_cast<int>(run.positions.size())) LaunchGroup(op_index, g);
}

void Executor::LaunchGroup(size_t op_index, int group) {
  GroupRun& run = *groups_.at({op_index, group});
  const OpSpec& op = program_.ops[op_index];
  int g = static_cast<int>(run.positions.size());
  run.start = sim_.Now();
  const Array& first = run.inputs[0];
  CollectiveJob& job = run.job;
  job.kind = KindOf(op.kind);
  job.reduce = ReduceOf(op.kind);
  job.dtype = first.dtype();
  job.numerics = config_.numerics && first.has_data();
  for (int p : run.positions)
    job.members.push_back(network_.topology().device_vertex(mesh_.device(p)));
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
      const Array& x = run.inputs[m];
      if (job.kind == CollectiveKind::kReduceScatter) {
        run.in[m] = ChunkedInput(x, op.scatter_dimension, g);
      } else if (job.kind == CollectiveKind::kAllToAll) {
        run.in[m] = ChunkedInput(x, op.split_axis, g);
      } else {
        run.in[m] = x.values();
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
  try {
    run.algorithm =
        MakeAlgorithm(name, network_, job, axis_sizes, &op_timings_[op_index].algorithm);
  } catch (const std::invalid_argument& e) {
    throw SpecError(op.algorithm.empty() ? op.key : op.key + ".algorithm",
                    std::string(OpKindName(op.kind)) + ": " + e.what());
  }
  run.algorithm->Start();
  run.in.clear();
  run.in.shrink_to_fit();
}

void Executor::MemberDone(size_t op_index, int group, int member) {
  GroupRun& run = *groups_.at({op_index, group});
  const OpSpec& op = program_.ops[op_index];
  int g = static_cast<int>(run.positions.size());
  int position = run.positions[member];
  const Array& in = run.inputs[member];
  Shape out_shape = CollectiveOutputShape(op, in.shape(), g, in.dtype());
  Array result;
  if (run.job.numerics) {
    result = CollectiveOutput(op, in, std::move(run.out[member]), g);
    run.out[member] = {};
    assert(result.shape() == out_shape);
  } else {
    result = Array::ShapeOnly(in.dtype(), out_shape);
  }
  env_[position][op.out.at(0)] = std::move(result);
  comm_spans_[position].push_back({run.start, sim_.Now()});
  op_timings_[op_index].end = std::max(op_timings_[op_index].end, sim_.Now());
  ++pc_[position];
  Advance(position);
}

std::vector<DeviceTiming> Executor::DeviceTimings() const {
  std::vector<DeviceTiming> out;
  for (int p = 0; p < mesh_.size(); ++p) {
    std::vector<std::pair<Time, Time>> spans = comm_spans_[p];
    std::sort(spans.begin(), spans.end());
    Time busy, covered;
    for (const auto& [a, b] : spans) {
      Time s = std::max(a, covered);
      if (b > s) busy += b - s;
      covered = std::max(covered, b);
    }
    DeviceTiming d;
    d.device = mesh_.device(p);
    d.comm = busy;
    d.exposed_comm = busy;  // Nothing computes concurrently yet: all of it is exposed.
    d.idle = end_ - busy;
    out.push_back(d);
  }
  return out;
}

namespace {

// Global shape of an output from its local shape and out spec.
Shape GlobalShapeOf(const Shape& local, const PartitionSpec& spec, const Mesh& mesh) {
  Shape global = local;
  for (size_t d = 0; d < spec.dims.size() && d < global.size(); ++d) {
    for (const std::string& axis : spec.dims[d]) {
      int a = mesh.AxisIndex(axis);
      if (a >= 0) global[d] *= mesh.axes()[a].size;
    }
  }
  return global;
}

std::map<std::string, Array> AssembleOutputs(const Mesh& mesh, const ProgramSpec& program,
                                             const std::vector<std::map<std::string, Array>>& env) {
  std::map<std::string, Array> out;
  for (const OutputSpec& o : program.outputs) {
    std::vector<Array> locals;
    for (int p = 0; p < mesh.size(); ++p) locals.push_back(env[p].at(o.name));
    Shape global = GlobalShapeOf(locals[0].shape(), o.spec, mesh);
    Sharding sharding(mesh, o.spec, global);
    std::string axis;
    Array assembled = sharding.Assemble(locals, &axis);
    if (!axis.empty()) {
      throw SpecError(o.key, "output " + o.name + " differs along mesh axis '" + axis +
                                 "', which its out spec " + FormatPartitionSpec(o.spec) +
                                 " does not name: replicas must hold the same values");
    }
    out[o.name] = std::move(assembled);
  }
  return out;
}

}  // namespace

std::map<std::string, Array> Executor::Outputs() const {
  return AssembleOutputs(mesh_, program_, env_);
}

void CheckProgram(const Mesh& mesh, const ProgramSpec& program) {
  std::map<std::string, Array> env;  // Local shapes (every position has the same).
  for (const ArraySpec& spec : program.arrays) {
    try {
      ValidatePartitionSpec(spec.sharding, spec.shape, mesh);
    } catch (const std::invalid_argument& e) {
      throw SpecError("arrays." + spec.name + ".sharding", "array " + spec.name + ": " + e.what());
    }
    env[spec.name] =
        Array::ShapeOnly(spec.dtype, Sharding(mesh, spec.sharding, spec.shape).LocalShape());
  }
  for (const OpSpec& op : program.ops) {
    std::vector<const Array*> inputs;
    for (const std::string& name : op.in) {
      auto it = env.find(name);
      if (it == env.end()) throw SpecError(op.key + ".in", "'" + name + "' is not defined");
      inputs.push_back(&it->second);
    }
    try {
      if (op.kind == OpKind::kAllgatherMatmul || op.kind == OpKind::kMatmulReduceScatter) {
        throw std::invalid_argument("collective matmuls are not implemented yet");
      }
      if (IsCollective(op.kind)) {
        std::vector<int> axes = ResolveCollectiveAxes(op, mesh);
        int g = mesh.GroupSize(axes);
        if (inputs.size() != 1) throw std::invalid_argument("takes one input");
        if (op.kind == OpKind::kPpermute) ResolvePermutation(op, mesh);
        env[op.out.at(0)] =
            Array::ShapeOnly(inputs[0]->dtype(),
                             CollectiveOutputShape(op, inputs[0]->shape(), g, inputs[0]->dtype()));
        if (!op.algorithm.empty() && op.algorithm != "auto" && op.algorithm != "direct" &&
            (op.kind == OpKind::kAllToAll || op.kind == OpKind::kPpermute)) {
          throw std::invalid_argument(op.algorithm + " does not implement " + OpKindName(op.kind) +
                                      "; use direct");
        }
      } else {
        std::vector<Array> outs = ApplyLocalOp(op, inputs, mesh, 0);
        for (size_t k = 0; k < outs.size() && k < op.out.size(); ++k) env[op.out[k]] = outs[k];
      }
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key, std::string(OpKindName(op.kind)) + ": " + e.what());
    }
  }
  for (const OutputSpec& o : program.outputs) {
    auto it = env.find(o.name);
    if (it == env.end()) throw SpecError(o.key, "output '" + o.name + "' is never produced");
    Shape global = GlobalShapeOf(it->second.shape(), o.spec, mesh);
    try {
      ValidatePartitionSpec(o.spec, global, mesh);
    } catch (const std::invalid_argument& e) {
      throw SpecError(o.key, "output " + o.name + ": " + e.what());
    }
  }
}

std::map<std::string, Array> ReferenceOutputs(const Mesh& mesh, const ProgramSpec& program,
                                              const std::string& base_dir) {
  int n = mesh.size();
  std::vector<std::map<std::string, Array>> env(n);
  for (const ArraySpec& spec : program.arrays) {
    Array global = MakeInitialArray(spec, /*with_data=*/true, base_dir);
    Sharding sharding(mesh, spec.sharding, spec.shape);
    for (int p = 0; p < n; ++p) env[p][spec.name] = sharding.Shard(global, p);
  }
  for (const OpSpec& op : program.ops) {
    if (IsCollective(op.kind)) {
      std::vector<Array> inputs;
      for (int p = 0; p < n; ++p) inputs.push_back(env[p].at(op.in.at(0)));
      std::vector<Array> outs = ReferenceCollective(op, mesh, inputs);
      for (int p = 0; p < n; ++p) env[p][op.out.at(0)] = std::move(outs[p]);
      continue;
    }
    for (int p = 0; p < n; ++p) {
      std::vector<const Array*> inputs;
      for (const std::string& name : op.in) inputs.push_back(&env[p].at(name));
      std::vector<Array> outs = ApplyLocalOp(op, inputs, mesh, p);
      for (size_t k = 0; k < outs.size() && k < op.out.size(); ++k) {
        env[p][op.out[k]] = std::move(outs[k]);
      }
    }
  }
  return AssembleOutputs(mesh, program, env);
}

namespace {

double Epsilon(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::ldexp(1.0, -23);
    case DType::kBF16:
      return std::ldexp(1.0, -7);
    case DType::kF16:
      return std::ldexp(1.0, -10);
    case DType::kI32:
      return 0.0;
  }
  return 0.0;
}

}  // namespace

NumericsReport CompareOutputs(const std::map<std::string, Array>& simulated,
                              const std::map<std::string, Array>& reference, int mesh_size) {
  NumericsReport report;
  report.checked = true;
  double worst_ratio = -1;
  for (const auto& [name, ref] : reference) {
    const Array& got = simulated.at(name);
    if (!got.has_data() || !ref.has_data()) {
      report.checked = false;
      continue;
    }
    double max_ref = 0, max_err = 0;
    for (int64_t i = 0; i < ref.size(); ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref.at(i))));
      double err = std::fabs(static_cast<double>(got.at(i)) - static_cast<double>(ref.at(i)));
      if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
      max_err = std::max(max_err, err);
    }
    // Two units in the last place of the output dtype (the simulated and reference sums may
    // round to neighbours), plus one float32 rounding per device of the simulated
    // accumulation (the reference accumulates in double).
    double scale = std::max(1.0, max_ref);
    double tol = (2 * Epsilon(ref.dtype()) + (mesh_size + 1) * std::ldexp(1.0, -24)) * scale;
    if (ref.dtype() == DType::kI32) tol = 0.5;
    report.max_abs_error = std::max(report.max_abs_error, max_err);
    double ratio = max_err / tol;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      report.worst_output = name;
      report.tolerance = tol;
    }
    if (max_err > tol) report.passed = false;
  }
  return report;
}

}  // namespace shardsim
