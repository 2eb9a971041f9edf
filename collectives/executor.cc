#include "collectives/executor.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include "collectives/algorithm.h"
#include "collectives/device_put.h"
#include "collectives/init.h"
#include "collectives/ir/op_registry.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/outputs.h"
#include "collectives/ragged_all_to_all.h"
#include "collectives/semantics.h"
#include "collectives/sharding.h"
#include "collectives/timing/timeline_cache.h"
#include "sim/fnv_hash.h"
#include "sim/intervals.h"
#include "sim/spec_error.h"

namespace shardsim {

std::string CommClassName(OpKind kind, const std::vector<std::string>& axes) {
  std::string name = std::string(OpKindName(kind)) + " over";
  for (const std::string& axis : axes) name += " " + axis;
  return name;
}
namespace {

int NormalizeAxis(int64_t axis, int rank) {
  return static_cast<int>(axis < 0 ? axis + rank : axis);
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

// Trace tracks of the executor on each device process; the network's start at 1.
constexpr int32_t kComputeTid = 0;
constexpr int32_t kCollectiveTid = 1 << 29;
constexpr int32_t kHostTid = (1 << 29) - 1;  // Host copies (both directions).
// A host copy's direction: 0 to host memory, 1 back to the device.
int HostDirection(const LoweredOp& op) { return op.spec->kind == OpKind::kMoveToHost ? 0 : 1; }

}  // namespace

struct Executor::GroupRun {
  CollectiveJob job;
  std::unique_ptr<CollectiveAlgorithm> algorithm;
  std::vector<std::vector<float>> in, out;
  std::vector<int> positions;
  std::vector<Array> inputs;  // Per member, numerics only (data moved into `in`).
  // ragged_all_to_all with numerics: per member its six inputs, and the messages they make.
  std::vector<std::vector<Array>> ragged_inputs;
  RaggedPlan plan;
  int arrived = 0;
  int finished = 0;
  Time start;
};

// One collective in flight on the cached path: its members finish when the progress through
// their standalone durations reaches them.
struct Executor::SharedRun {
  size_t op_index = 0;
  int group = 0;
  const CollectiveTiming* timing = nullptr;
  std::vector<std::pair<Time, int>> members;  // (standalone duration, member), ascending.
  size_t next = 0;                            // First member not finished.
  double progress_ps = 0;                     // Standalone time covered.
  Time updated;                               // When progress_ps was brought up to date.
  Time started;                               // When it was launched.
  double rate = 1;                            // Standalone picoseconds per picosecond.
  EventId event;
  bool scheduled = false;
};

struct Executor::Device {
  std::vector<Array> values;           // By value id; numerics only.
  std::vector<char> ready;             // By value id.
  std::vector<int32_t> pending;        // By value id: readers that have not finished.
  std::vector<char> absent;            // By value id: never made here (its op runs elsewhere).
  std::vector<char> taken;             // By value id: its buffer became an elementwise op's output.
  size_t compute_pc = 0;               // Next entry of compute_ops_.
  size_t comm_pc = 0;                  // Next entry of comm_ops_.
  bool busy = false;                   // The compute stream runs an op.
  int in_flight = 0;                   // Collectives issued and not finished.
  size_t host_pc[2] = {0, 0};          // Next entry of host_ops_, per direction.
  bool host_busy[2] = {false, false};  // The DMA queue of that direction copies.
  int64_t host_live = 0;               // Bytes in host memory.
  int64_t host_peak = 0;               // Most bytes in host memory at once.
  std::vector<std::pair<Time, Time>> host_spans;  // Copies, in order of their end.
  bool finished = false;
  int64_t live = 0;                    // Bytes of live buffers.
  int64_t peak = 0;                    // Most bytes live at once.
  const char* peak_op = "";            // Op started or issued when the peak was reached.
  std::vector<int64_t> phase_peak;     // Per memory phase: its peak.
  std::vector<int32_t> phase_peak_op;  // Per memory phase: the op allocating at its peak, or -1.
  std::vector<int64_t> phase_entry;    // Per memory phase: live bytes as its first compute began.
  std::vector<std::pair<Time, Time>> compute_spans;
  std::vector<std::pair<Time, Time>> comm_spans;
  std::vector<int> comm_span_class;  // Per comm span: its collective's class id.
};

Executor::Executor(Simulator& sim, Network& network, const Mesh& mesh, const ProgramSpec& program,
                   ExecutorConfig config, const LoweredProgram* lowered)
    : sim_(sim),
      network_(network),
      mesh_(mesh),
      program_(program),
      config_(std::move(config)),
      lowered_(lowered) {}

Executor::~Executor() = default;

void Executor::Start() {
  if (!lowered_) {
    own_lowered_ = LowerProgram(mesh_, program_, config_.algorithms);
    lowered_ = &own_lowered_;
  }
  const LoweredProgram& lp = *lowered_;
  // Its ops point into the program it was lowered from: that must be this one, still there.
  if (lp.program_ops != program_.ops.data()) {
    throw std::logic_error(
        "internal error: a lowered program runs with another program than "
        "the one it was lowered from");
  }
  const size_t num_values = lp.values.size();
  if (config_.collective_model) {
    if (config_.numerics) {
      throw std::logic_error("internal error: a collective cost model runs timing only");
    }
    BuildClasses();
  } else {
    agent_position_.resize(mesh_.size());
    agent_of_.resize(mesh_.size());
    for (int p = 0; p < mesh_.size(); ++p) agent_position_[p] = agent_of_[p] = p;
  }
  int n = static_cast<int>(agent_position_.size());

  // Buffer lifetimes: readers per value; inputs and final outputs are held to the end.
  readers_.assign(num_values, 0);
  held_.assign(num_values, 0);
  value_bytes_.resize(num_values);
  for (size_t v = 0; v < num_values; ++v) {
    value_bytes_[v] = lp.in_host[v] ? 0 : lp.values[v].bytes().count();
  }
  for (const LoweredOp& op : lp.ops) {
    for (size_t k = 0; k < op.in_values.size(); ++k) {
      int v = op.in_values[k];
      // An op reading one value twice is one reader.
      if (std::find(op.in_values.begin(), op.in_values.begin() + k, v) ==
          op.in_values.begin() + k) {
        ++readers_[v];
      }
    }
  }
  for (const auto& [name, v] : lp.inputs) held_[v] = !config_.donated_inputs.count(name);
  for (const OutputSpec& o : program_.outputs) held_[lp.final_values.at(o.name)] = 1;
  // Fused views: XLA's consumers read a fused transpose, slice or reshape of a buffer in place
  // (collective matmuls turn and slice their operands so), and a fused concatenation reads
  // its parts where they are (a shared gather's loop runs each product on its own weight). A
  // view held to the end (an output) is a buffer of its own.
  viewed_.assign(num_values, {});
  for (const LoweredOp& op : lp.ops) {
    const OpKind kind = op.spec->kind;
    const bool one_input =
        kind == OpKind::kTranspose || kind == OpKind::kSlice || kind == OpKind::kReshape;
    if (!op.spec->fused || op.collective || op.out_values.size() != 1 || op.in_values.empty() ||
        !(one_input ? op.in_values.size() == 1 : kind == OpKind::kConcatenate)) {
      continue;
    }
    const int out = op.out_values[0];
    bool in_place = !held_[out];
    for (int in : op.in_values) {
      in_place = in_place && !lp.in_host[in] && lp.values[in].dtype() == lp.values[out].dtype();
    }
    if (!in_place) continue;
    for (int in : op.in_values) {
      std::vector<int32_t>& parts = viewed_[static_cast<size_t>(out)];
      if (std::find(parts.begin(), parts.end(), in) == parts.end()) parts.push_back(in);
    }
    value_bytes_[out] = 0;
  }

  if (lp.has_where) {
    for (int a = 0; a < n; ++a) agent_coords_.push_back(mesh_.Coords(agent_position_[a]));
  }
  devices_.assign(n, Device{});
  std::vector<const LoweredOp*> puts;  // device_puts, whose results live on their destination.
  for (const LoweredOp& op : lp.ops) {
    if (op.to_part >= 0) puts.push_back(&op);
  }
  for (int a = 0; a < n; ++a) {
    Device& d = devices_[a];
    if (config_.numerics) d.values.resize(num_values);
    d.ready.assign(num_values, 0);
    d.absent.assign(num_values, 0);
    d.taken.assign(num_values, 0);
    d.pending = readers_;
    // The inputs of its mesh (with several meshes, the others' never exist here).
    const int part = mesh_.PartOf(agent_position_[a]);
    int64_t input_bytes = 0;
    for (const auto& [name, v] : lp.inputs) {
      if (lp.value_part[v] < 0 || lp.value_part[v] == part) {
        input_bytes += value_bytes_[v];
      } else {
        d.absent[v] = 1;
      }
    }
    // A device_put's result exists on its destination only.
    for (const LoweredOp* op : puts) {
      if (op->to_part != part) d.absent[op->out_values[0]] = 1;
    }
    d.live = d.peak = input_bytes;
    d.phase_peak.assign(config_.memory_phases.size() + 1, input_bytes);
    d.phase_peak_op.assign(config_.memory_phases.size() + 1, -1);
    d.phase_entry.assign(config_.memory_phases.size() + 1, -1);
    // Ops that do not run here do not read here.
    if (!lp.has_where) continue;
    for (const LoweredOp& op : lp.ops) {
      if (RunsHere(a, op)) continue;
      // Its outputs never exist here: collectives that read them see zeros, at once.
      for (int v : op.out_values) d.ready[v] = d.absent[v] = 1;
      for (size_t k = 0; k < op.in_values.size(); ++k) {
        int v = op.in_values[k];
        if (std::find(op.in_values.begin(), op.in_values.begin() + k, v) ==
            op.in_values.begin() + k) {
          --d.pending[v];
        }
      }
    }
  }
  for (const ArraySpec& spec : program_.arrays) {
    Array global;
    try {
      global = MakeInitialArray(spec, config_.numerics, config_.base_dir);
    } catch (const std::invalid_argument& e) {
      throw SpecError("arrays." + spec.name + ".init", e.what());
    }
    int id = -1;
    for (const auto& [name, value] : lp.inputs) {
      if (name == spec.name) id = value;
    }
    for (int p = 0; p < n; ++p) devices_[p].ready[id] = 1;
    if (config_.numerics) {
      // With several meshes, the array's blocks are its mesh's positions'.
      const int part = lp.value_part[id];
      const Mesh& home = part >= 0 ? mesh_.parts()[part] : mesh_;
      Sharding sharding(home, spec.sharding, spec.shape);
      for (int p = 0; p < n; ++p) {
        if (part >= 0 && mesh_.PartOf(p) != part) continue;
        devices_[p].values[id] = sharding.Shard(global, p - mesh_.PartOffset(std::max(part, 0)));
      }
    }
    inputs_[spec.name] = std::move(global);
  }
  op_timings_.assign(program_.ops.size(), OpTiming{});
  op_started_.assign(program_.ops.size(), false);
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    const OpSpec& op = program_.ops[i];
    op_timings_[i].name = op.name;
    op_timings_[i].op = OpKindName(op.kind);
    if (Op(op.kind).stream == OpStream::kComposite) op_timings_[i].algorithm = op.variant;
  }
  // Each row's bytes: its first input on one device.
  for (const LoweredOp& op : lp.ops) {
    OpTiming& row = op_timings_[op.source];
    if (row.bytes.count() == 0 && !op.in_values.empty()) {
      row.bytes = lp.values[op.in_values[0]].bytes();
    }
  }
  // Compute times, once per op: every position has the same local shapes.
  op_duration_.assign(lp.ops.size(), Time());
  data_priced_.assign(lp.ops.size(), Time());
  data_priced_seen_.assign(lp.ops.size(), 0);
  layout_of_op_.assign(lp.ops.size(), nullptr);
  phase_of_op_.assign(lp.ops.size(), 0);
  comm_class_of_op_.assign(lp.ops.size(), -1);
  compute_before_.assign(lp.ops.size(), 0);
  op_workspace_.assign(lp.ops.size(), 0);
  const std::vector<size_t>& marks = config_.memory_phases;
  std::map<std::string, int> class_ids;  // "psum over tensor" -> its index in comm_classes_.
  for (size_t i = 0; i < lp.ops.size(); ++i) {
    const LoweredOp& op = lp.ops[i];
    phase_of_op_[i] = static_cast<size_t>(std::upper_bound(marks.begin(), marks.end(), op.source) -
                                          marks.begin());
    compute_before_[i] = compute_ops_.size();
    if (op.def->stream == OpStream::kHostTransfer) {
      if (config_.host_bandwidth.bytes_per_second() <= 0) {
        throw SpecError(op.spec->key, std::string(op.def->name) +
                                          ": the hardware gives no host link bandwidth (set "
                                          "hardware.device.host_bandwidth)");
      }
      host_ops_[HostDirection(op)].push_back(i);
      const Bytes bytes = lp.values[op.in_values[0]].bytes();
      op_duration_[i] = config_.host_bandwidth.TransferTime(bytes);
      continue;
    }
    if (!op.collective) {
      compute_ops_.push_back(i);
      if (op.def->stream == OpStream::kCompute && !op.spec->fused) {
        std::vector<const Array*> ins, outs;
        for (int v : op.in_values) ins.push_back(&lp.values[v]);
        for (int v : op.out_values) outs.push_back(&lp.values[v]);
        OpCost cost = LocalOpCost(*op.spec, ins, outs);
        op_workspace_[i] = static_cast<int64_t>(std::ceil(cost.workspace));
        if (config_.compute_model) {
          op_duration_[i] =
              config_.compute_model->OpTime(op.spec->kind, cost, CostDType(*op.spec, ins, outs));
          op_timings_[op.source].compute += op_duration_[i];
        }
      }
      continue;
    }
    comm_ops_.push_back(i);
    std::string name = CommClassName(op.spec->kind, op.spec->axis_name);
    if (op.device_put) name = std::string(op.def->name) + " to " + op.spec->mesh;
    const auto [id, added] = class_ids.try_emplace(name, static_cast<int>(comm_classes_.size()));
    if (added) comm_classes_.push_back(name);
    comm_class_of_op_[i] = id->second;
    op_timings_[op.source].comm_class = name;
    // A device_put's one group: its source mesh's positions, then its destination's (keyed
    // apart from every tuple of axes by negative entries).
    const std::vector<int> key =
        op.device_put ? std::vector<int>{-1 - op.from_part, -1 - op.to_part} : op.axes;
    auto [it, made] = layouts_.try_emplace(key);
    if (made) {
      if (op.device_put) {
        std::vector<int> members;
        for (int part : {op.from_part, op.to_part}) {
          for (int p = 0; p < mesh_.parts()[part].size(); ++p) {
            members.push_back(mesh_.PartOffset(part) + p);
          }
        }
        it->second.groups = {members};
      } else if (config_.collective_model && agent_position_.size() == 1 && mesh_.parts().empty()) {
        // One class: one group of agents standing for every group of positions.
        it->second.groups = {{0}};
        it->second.position_groups.emplace_back(
            static_cast<size_t>(mesh_.size() / mesh_.GroupSize(op.axes)));
        std::iota(it->second.position_groups[0].begin(), it->second.position_groups[0].end(), 0);
      } else if (config_.collective_model) {
        // Agents' groups: the classes met in each group of positions (the same set for every
        // member of a class, by the refinement).
        std::map<std::vector<int>, int> seen;
        const std::vector<std::vector<int>>& position_groups = PositionGroups(op.axes);
        for (size_t pg = 0; pg < position_groups.size(); ++pg) {
          std::vector<int> agents;
          for (int p : position_groups[pg]) agents.push_back(agent_of_[p]);
          std::sort(agents.begin(), agents.end());
          agents.erase(std::unique(agents.begin(), agents.end()), agents.end());
          auto [at, fresh] = seen.emplace(agents, static_cast<int>(it->second.groups.size()));
          if (fresh) {
            it->second.groups.push_back(std::move(agents));
            it->second.position_groups.emplace_back();
          }
          it->second.position_groups[at->second].push_back(static_cast<int>(pg));
        }
      } else {
        it->second.groups = mesh_.Groups(op.axes);
      }
      it->second.membership.assign(n, {0, 0});
      for (size_t g = 0; g < it->second.groups.size(); ++g) {
        for (size_t m = 0; m < it->second.groups[g].size(); ++m) {
          it->second.membership[it->second.groups[g][m]] = {static_cast<int>(g),
                                                            static_cast<int>(m)};
        }
      }
    }
    layout_of_op_[i] = &it->second;
  }
  queued_.assign(n, 0);
  if (sim_.tracing()) DeclareTracks();
  sim_.Schedule(Time(), [this, n] {
    for (int p = 0; p < n; ++p) Wake(p);
  });
}

const std::vector<std::vector<int>>& Executor::PositionGroups(const std::vector<int>& axes) {
  auto [it, made] = position_groups_.try_emplace(axes);
  if (made) it->second = mesh_.Groups(axes);
  return it->second;
}

std::vector<std::pair<LinkId, Time>> Executor::LinkBusy() const {
  // Ops of one layer repeat: each distinct timing once, times how often it ran, in the order
  // the program first ran it (so the sums round alike in every run).
  std::map<const CollectiveTiming*, int> runs;
  for (const auto& timing : timings_) {
    if (timing) ++runs[timing.get()];
  }
  std::vector<double> busy_ps;
  for (const CollectiveTiming* timing : timing_by_index_) {
    const int count = runs[timing];
    const double longest = static_cast<double>(timing->longest().picoseconds()) * count;
    for (size_t k = 0; k < timing->profile->links.size(); ++k) {
      const auto l = static_cast<size_t>(timing->profile->links[k]);
      if (l >= busy_ps.size()) busy_ps.resize(l + 1, 0.0);
      busy_ps[l] += timing->profile->link_share[k] * longest;
    }
  }
  std::vector<std::pair<LinkId, Time>> out;
  for (size_t l = 0; l < busy_ps.size(); ++l) {
    if (busy_ps[l] > 0) {
      out.push_back({static_cast<LinkId>(l),
                     Time::Picoseconds(static_cast<int64_t>(std::llround(busy_ps[l])))});
    }
  }
  return out;
}

// Colour refinement (1-dimensional Weisfeiler-Leman) over positions. A position's signature is
// its colour, then per distinct (axes, timing) of the program's collectives its duration and
// the sorted set of colours in its group; positions with equal signatures get one colour,
// numbered by first appearance (so runs are deterministic). Refinement stops when the number
// of colours stops growing.
void Executor::BuildClasses() {
  const LoweredProgram& lp = *lowered_;
  const int positions = mesh_.size();
  timings_.assign(lp.ops.size(), nullptr);
  std::vector<std::pair<const std::vector<int>*, const CollectiveTiming*>> distinct;
  std::map<std::pair<std::vector<int>, const CollectiveTiming*>, int> seen;
  // Every collective's request, in program order, told to the model before it is asked for
  // them one by one (it may price them ahead, on several threads).
  std::vector<CollectiveRequest> requests;
  std::vector<size_t> asked_by;  // The op of each request.
  for (size_t i = 0; i < lp.ops.size(); ++i) {
    const LoweredOp& op = lp.ops[i];
    if (!op.collective) continue;
    if (op.device_put) {
      throw SpecError(op.spec->key,
                      "device_put: the cached timing path prices collectives within "
                      "one mesh; a program moving arrays between meshes runs with "
                      "--timing network");
    }
    CollectiveRequest request;
    request.kind = op.def->collective;
    request.reduce = op.def->reduce;
    const Array& input = lp.values[op.in_values[0]];
    request.dtype = input.dtype();
    request.elements = input.size();
    if (op.spec->kind == OpKind::kRaggedAllToAll) {
      // Timing only: the balanced routing LaunchGroup assumes without data, G blocks.
      const Shape& output = lp.values[op.in_values[1]].shape();
      request.elements =
          BalancedRaggedBlock(input.shape(), output, op.group_size, op.spec->expected_rows) *
          op.group_size;
    }
    request.algorithm = op.algorithm;
    request.axes = op.axes;
    request.destination = op.destination;
    request.chunk_size = config_.chunk_size;
    requests.push_back(std::move(request));
    asked_by.push_back(i);
  }
  // A model answers equal requests alike (a layer's collectives repeat in every layer): each
  // distinct request is asked once, by the first op that makes it.
  std::vector<size_t> same_as(requests.size());
  std::vector<CollectiveRequest> distinct_requests;
  {
    std::unordered_map<uint64_t, std::vector<size_t>> by_hash;
    for (size_t r = 0; r < requests.size(); ++r) {
      const CollectiveRequest& q = requests[r];
      // Hashed by what tells a step's collectives apart; equality decides.
      FnvHash h;
      h.Mix(static_cast<uint64_t>(q.kind));
      h.Mix(static_cast<uint64_t>(q.elements));
      for (int a : q.axes) h.Mix(static_cast<uint64_t>(a));
      std::vector<size_t>& same = by_hash[h.value()];
      same_as[r] = r;
      for (size_t earlier : same) {
        if (requests[earlier] == q) same_as[r] = earlier;
      }
      if (same_as[r] == r) {
        same.push_back(r);
        distinct_requests.push_back(q);
      }
    }
  }
  config_.collective_model->Prepare(mesh_, distinct_requests);
  for (size_t r = 0; r < requests.size(); ++r) {
    const size_t i = asked_by[r];
    const LoweredOp& op = lp.ops[i];
    try {
      timings_[i] = same_as[r] != r ? timings_[asked_by[same_as[r]]]
                                    : config_.collective_model->Estimate(mesh_, requests[r]);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.spec->algorithm.empty() ? op.spec->key : op.spec->key + ".algorithm",
                      std::string(op.def->name) + ": " + e.what());
    }
    if (timing_index_.emplace(timings_[i].get(), timing_by_index_.size()).second) {
      timing_by_index_.push_back(timings_[i].get());
      timing_owner_.push_back(timings_[i]);
    }
    auto [it, made] = seen.try_emplace({op.axes, timings_[i].get()}, 0);
    if (made) distinct.push_back({&it->first.first, timings_[i].get()});
  }
  std::vector<char> used;  // The mesh axes `where` clauses name.
  if (lp.has_where) {
    used.assign(mesh_.axes().size(), 0);
    for (const LoweredOp& op : lp.ops) {
      for (const auto& [axis, index] : op.where) used[axis] = 1;
    }
  }
  // One mesh, no `where`, and every collective ending at one instant for all its members (a
  // slowest-member model's timings): every position's signature below is the same from the
  // first round (colour 0, each timing's one duration, each group's colour set {0}), so all
  // positions are one class, found without the round's pass over groups and signatures.
  bool uniform = mesh_.parts().empty() && !lp.has_where;
  for (size_t k = 0; uniform && k < distinct.size(); ++k) {
    const std::vector<Time>& times = distinct[k].second->member_time;
    uniform = std::all_of(times.begin(), times.end(), [&](Time t) { return t == times.front(); });
  }
  if (uniform) {
    SetClasses(std::vector<int>(static_cast<size_t>(positions), 0));
    return;
  }
  // Across runs (a search's), the same collectives on the same mesh give the same classes.
  TimelineCache* kept = config_.collective_model->timeline_cache();
  TimelineCache::ClassesKey kept_key;
  if (kept) {
    // The axis sizes and, on a union of meshes, where each part's axes start (as -1 - index):
    // together they fix every position's coordinates and groups.
    std::vector<int>& shape = std::get<0>(kept_key);
    for (const MeshAxis& axis : mesh_.axes()) shape.push_back(axis.size);
    for (size_t part = 0; part < mesh_.parts().size(); ++part) {
      shape.push_back(-1 - mesh_.PartFirstAxis(static_cast<int>(part)));
    }
    std::get<1>(kept_key) = used;
    for (const auto& entry : seen) std::get<2>(kept_key).push_back(entry.first);
    if (const std::vector<int>* known = kept->FindClasses(kept_key)) {
      SetClasses(*known);
      return;
    }
  }
  // Initial colours: positions that run different op sequences (`where`) differ from the start.
  std::vector<int> color(positions, 0);
  int colors = 1;
  if (lp.has_where) {
    std::map<std::vector<int>, int> ids;
    for (int p = 0; p < positions; ++p) {
      std::vector<int> coords = mesh_.Coords(p), key;
      for (size_t a = 0; a < used.size(); ++a) {
        if (used[a]) key.push_back(coords[a]);
      }
      color[p] = ids.emplace(key, static_cast<int>(ids.size())).first->second;
    }
    colors = static_cast<int>(ids.size());
  }
  while (!distinct.empty() || colors > 1) {
    // The colour set of every group, per distinct collective (empty for the positions of other
    // meshes, which no group of it holds).
    static const std::vector<int> kNone;
    std::vector<std::vector<const std::vector<int>*>> group_colors(distinct.size());
    std::vector<std::vector<std::vector<int>>> sets(distinct.size());
    for (size_t k = 0; k < distinct.size(); ++k) {
      const std::vector<std::vector<int>>& groups = PositionGroups(*distinct[k].first);
      group_colors[k].assign(positions, &kNone);
      sets[k].resize(groups.size());
      for (size_t g = 0; g < groups.size(); ++g) {
        std::vector<int>& set = sets[k][g];
        for (int p : groups[g]) set.push_back(color[p]);
        std::sort(set.begin(), set.end());
        set.erase(std::unique(set.begin(), set.end()), set.end());
        for (int p : groups[g]) group_colors[k][p] = &set;
      }
    }
    // Equal signatures are found by hash, then compared whole with each class's first one
    // (kept end to end in `known`), so classes are numbered by first appearance.
    std::unordered_map<uint64_t, std::vector<int>> by_hash;
    std::vector<int64_t> known, signature;
    std::vector<size_t> known_start = {0};
    std::vector<int> next(positions);
    int count = 0;
    for (int p = 0; p < positions; ++p) {
      signature.assign(1, color[p]);
      for (size_t k = 0; k < distinct.size(); ++k) {
        signature.push_back(distinct[k].second->member_time[p].picoseconds());
        const std::vector<int>& set = *group_colors[k][p];
        signature.push_back(static_cast<int64_t>(set.size()));
        signature.insert(signature.end(), set.begin(), set.end());
      }
      uint64_t hash = 0x9e3779b97f4a7c15ULL;
      for (int64_t v : signature) {
        hash = (hash ^ static_cast<uint64_t>(v)) * 0xff51afd7ed558ccdULL;
        hash ^= hash >> 32;
      }
      std::vector<int>& candidates = by_hash[hash];
      int found = -1;
      for (int c : candidates) {
        if (std::equal(signature.begin(), signature.end(), known.begin() + known_start[c],
                       known.begin() + known_start[c + 1])) {
          found = c;
          break;
        }
      }
      if (found < 0) {
        found = count++;
        candidates.push_back(found);
        known.insert(known.end(), signature.begin(), signature.end());
        known_start.push_back(known.size());
      }
      next[p] = found;
    }
    color = std::move(next);
    if (count == colors) break;
    colors = count;
  }
  if (kept) {
    std::vector<std::shared_ptr<const CollectiveTiming>> owners;
    for (const auto& entry : seen) {
      owners.push_back(timing_owner_[static_cast<size_t>(timing_index_.at(entry.first.second))]);
    }
    kept->InsertClasses(std::move(kept_key), color, owners);
  }
  SetClasses(color);
}

void Executor::SetClasses(const std::vector<int>& classes) {
  agent_of_ = classes;
  int count = 0;
  for (int c : classes) count = std::max(count, c + 1);
  agent_position_.assign(count, -1);
  for (int p = 0; p < static_cast<int>(classes.size()); ++p) {
    if (agent_position_[classes[p]] < 0) agent_position_[classes[p]] = p;
  }
}

void Executor::DeclareTracks() {
  for (int a = 0; a < static_cast<int>(agent_position_.size()); ++a) {
    int p = agent_position_[a];
    int32_t pid = network_.ProcessOf(network_.topology().device_vertex(mesh_.device(p)));
    sim_.DeclareThread(pid, kComputeTid, "compute", -2);
    sim_.DeclareThread(pid, kCollectiveTid, "collectives", -1);
    if (!host_ops_[0].empty() || !host_ops_[1].empty()) {
      sim_.DeclareThread(pid, kHostTid, "host copies", 0);
    }
  }
}

bool Executor::finished() const {
  return finished_positions_ == static_cast<int>(agent_position_.size());
}

bool Executor::Ready(int position, const LoweredOp& op) const {
  const Device& d = devices_[position];
  for (int v : op.in_values) {
    if (!d.ready[v]) return false;
  }
  return true;
}

void Executor::Allocate(int position, size_t op_index) {
  const LoweredOp& op = lowered_->ops[op_index];
  const char* name = op.spec->name.c_str();
  Device& d = devices_[position];
  for (int v : op.out_values) {
    if (!d.absent[v]) d.live += value_bytes_[v];
  }
  // Writing in place over a dying input of the same size allocates nothing new: the first
  // input this op is the last reader of here, not the caller's and made here.
  for (int r : op.reusable_inputs) {
    // A view has no buffer to write over.
    if (!held_[r] && !d.absent[r] && !d.taken[r] && d.pending[r] == 1 && viewed_[r].empty()) {
      d.live -= value_bytes_[r];
      d.taken[r] = 1;
      break;
    }
  }
  // While it runs the op also holds its workspace (OpCost::workspace), freed as it ends.
  const int64_t running = d.live + op_workspace_[op_index];
  if (running > d.peak) {
    d.peak = running;
    d.peak_op = name;
  }
  const size_t phase = phase_of_op_[op_index];
  if (running > d.phase_peak[phase]) {
    d.phase_peak[phase] = running;
    d.phase_peak_op[phase] = static_cast<int32_t>(op_index);
  }
}

std::vector<Bytes> Executor::PhaseForcedPeaks() const {
  const LoweredProgram& lp = *lowered_;
  // With `where` or several meshes, values are absent from some devices.
  if (lp.has_where || !mesh_.parts().empty()) return {};
  const size_t num_values = lp.values.size();
  std::vector<int32_t> producer(num_values, -1);
  std::vector<std::vector<int32_t>> readers(num_values);
  for (size_t i = 0; i < lp.ops.size(); ++i) {
    for (int v : lp.ops[i].out_values) producer[v] = static_cast<int32_t>(i);
    for (int v : lp.ops[i].in_values) readers[v].push_back(static_cast<int32_t>(i));
  }
  int64_t input_bytes = 0;
  for (const auto& [name, v] : lp.inputs) input_bytes += value_bytes_[v];
  // The bytes live as op `x` allocates in every order of the ops: the values made before it
  // (by its ancestors: an order runs them first) or by it, or the inputs, that it or one of
  // its descendants (run after it) reads, or that are held to the end; its workspace; less the
  // most that writing over a dying input can save (Allocate).
  std::map<int32_t, int64_t> forced;
  auto forced_at = [&](int32_t x) {
    if (x < 0) return input_bytes;  // The phase peaked at the start: the inputs alone.
    if (auto it = forced.find(x); it != forced.end()) return it->second;
    // The ops `x` reaches (itself included) through each op's `next` ops: its ancestors
    // through the makers of what it reads, its descendants through the readers of what it
    // makes.
    auto reached = [&](const auto& next) {
      std::vector<char> seen(lp.ops.size(), 0);
      seen[static_cast<size_t>(x)] = 1;
      std::vector<int32_t> stack = {x};
      while (!stack.empty()) {
        const LoweredOp& op = lp.ops[static_cast<size_t>(stack.back())];
        stack.pop_back();
        next(op, [&](int32_t o) {
          if (o >= 0 && !seen[static_cast<size_t>(o)]) {
            seen[static_cast<size_t>(o)] = 1;
            stack.push_back(o);
          }
        });
      }
      return seen;
    };
    const std::vector<char> before = reached([&](const LoweredOp& op, const auto& visit) {
      for (int v : op.in_values) visit(producer[static_cast<size_t>(v)]);
    });
    const std::vector<char> after = reached([&](const LoweredOp& op, const auto& visit) {
      for (int v : op.out_values) {
        for (int32_t r : readers[static_cast<size_t>(v)]) visit(r);
      }
    });
    int64_t live = op_workspace_[static_cast<size_t>(x)];
    for (size_t v = 0; v < num_values; ++v) {
      const int32_t p = producer[v];
      if (p >= 0 && !before[static_cast<size_t>(p)]) continue;
      bool needed = held_[v] || p == x;  // An op's outputs are allocated as it starts.
      for (int32_t r : readers[v]) needed = needed || after[static_cast<size_t>(r)];
      if (needed) live += value_bytes_[v];
    }
    int64_t reused = 0;
    for (int r : lp.ops[static_cast<size_t>(x)].reusable_inputs) {
      if (!held_[r] && viewed_[r].empty()) reused = std::max(reused, value_bytes_[r]);
    }
    return forced[x] = live - reused;
  };
  std::vector<Bytes> peaks(config_.memory_phases.size() + 1);
  for (const Device& d : devices_) {
    for (size_t phase = 0; phase < peaks.size(); ++phase) {
      peaks[phase] = std::max(peaks[phase], Bytes(forced_at(d.phase_peak_op[phase])));
    }
  }
  return peaks;
}

void Executor::FreeValue(int position, int value) {
  Device& d = devices_[position];
  if (held_[value] || d.absent[value]) return;
  d.live -= value_bytes_[value];
  if (config_.numerics) d.values[value] = Array();
}

void Executor::Release(int position, const LoweredOp& op) {
  Device& d = devices_[position];
  // A view keeps its inputs until the view dies (Dies).
  const bool view = op.out_values.size() == 1 && !viewed_[op.out_values[0]].empty();
  for (size_t k = 0; k < op.in_values.size() && !view; ++k) {
    int v = op.in_values[k];
    if (std::find(op.in_values.begin(), op.in_values.begin() + k, v) != op.in_values.begin() + k) {
      continue;
    }
    if (--d.pending[v] > 0) continue;
    Dies(position, v);
  }
  // Outputs no op reads here die at once.
  for (int v : op.out_values) {
    if (d.pending[v] == 0) Dies(position, v);
  }
}

void Executor::Dies(int position, int value) {
  Device& d = devices_[position];
  if (d.taken[value]) {
    // Its buffer became the output's: nothing to free (the data itself is dropped).
    if (config_.numerics) d.values[value] = Array();
  } else {
    FreeValue(position, value);
  }
  // An absent view (its op does not run here) gave up its inputs' readings at the start.
  if (d.absent[value]) return;
  for (int viewed : viewed_[value]) {
    if (--d.pending[viewed] == 0) Dies(position, viewed);
  }
}

void Executor::Record(size_t op_index, Time start, Time end) {
  size_t source = lowered_->ops[op_index].source;
  OpTiming& t = op_timings_[source];
  if (!op_started_[source]) {
    op_started_[source] = true;
    t.start = start;
  } else {
    t.start = std::min(t.start, start);
  }
  t.end = std::max(t.end, end);
}

// Positions are tried from a worklist, never recursively: a collective over a group of one
// finishes inside its launch, and 20,000 of them in a row must not nest 20,000 calls deep.
void Executor::Wake(int position) {
  if (!queued_[position]) {
    queued_[position] = 1;
    work_.push_back(position);
  }
  if (draining_) return;
  draining_ = true;
  for (size_t i = 0; i < work_.size(); ++i) {
    int p = work_[i];
    queued_[p] = 0;
    Try(p);
  }
  work_.clear();
  draining_ = false;
}

void Executor::Try(int position) {
  Device& d = devices_[position];
  const LoweredProgram& lp = *lowered_;
  int limit = config_.max_collectives_in_flight;
  bool progress = true;
  while (progress) {
    progress = false;
    // Collectives issue in program order, each as soon as its input is ready and the device
    // has fewer than `limit` in flight.
    while (d.comm_pc < comm_ops_.size() && !RunsHere(position, lp.ops[comm_ops_[d.comm_pc]])) {
      ++d.comm_pc;
    }
    while (d.compute_pc < compute_ops_.size() &&
           !RunsHere(position, lp.ops[compute_ops_[d.compute_pc]])) {
      ++d.compute_pc;
    }
    while (d.comm_pc < comm_ops_.size() && (limit <= 0 || d.in_flight < limit) &&
           Ready(position, lp.ops[comm_ops_[d.comm_pc]])) {
      size_t i = comm_ops_[d.comm_pc++];
      ++d.in_flight;
      Allocate(position, i);
      Arrive(position, i);
      progress = true;
      while (d.comm_pc < comm_ops_.size() && !RunsHere(position, lp.ops[comm_ops_[d.comm_pc]])) {
        ++d.comm_pc;
      }
    }
    // Each DMA queue copies in program order, one copy at a time, each once the compute
    // stream has reached it and its input is ready.
    for (int dir = 0; dir < 2; ++dir) {
      const std::vector<size_t>& queue = host_ops_[dir];
      size_t& pc = d.host_pc[dir];
      while (pc < queue.size() && !RunsHere(position, lp.ops[queue[pc]])) ++pc;
      if (!d.host_busy[dir] && pc < queue.size() && d.compute_pc >= compute_before_[queue[pc]] &&
          Ready(position, lp.ops[queue[pc]])) {
        StartHostCopy(position, dir, queue[pc++]);
        progress = true;
      }
    }
    // The compute stream runs local ops in program order, one at a time.
    if (!d.busy && d.compute_pc < compute_ops_.size() &&
        Ready(position, lp.ops[compute_ops_[d.compute_pc]])) {
      StartCompute(position, compute_ops_[d.compute_pc++]);
      progress = true;
      while (d.compute_pc < compute_ops_.size() &&
             !RunsHere(position, lp.ops[compute_ops_[d.compute_pc]])) {
        ++d.compute_pc;
      }
    }
  }
  if (!d.finished && !d.busy && d.in_flight == 0 && d.compute_pc == compute_ops_.size() &&
      d.comm_pc == comm_ops_.size() && !d.host_busy[0] && !d.host_busy[1] &&
      d.host_pc[0] == host_ops_[0].size() && d.host_pc[1] == host_ops_[1].size()) {
    d.finished = true;
    ++finished_positions_;
    end_ = std::max(end_, sim_.Now());
  }
}

void Executor::StartCompute(int position, size_t op_index) {
  Device& d = devices_[position];
  const LoweredOp& op = lowered_->ops[op_index];
  const size_t phase = phase_of_op_[op_index];
  if (d.phase_entry[phase] < 0) d.phase_entry[phase] = d.live;
  Allocate(position, op_index);
  Time duration = op_duration_[op_index];
  if (config_.numerics) {
    std::vector<const Array*> inputs;
    for (int v : op.in_values) inputs.push_back(&d.values[v]);
    std::vector<Array> outputs;
    try {
      outputs = ApplyLocalOp(*op.spec, inputs, mesh_, position);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.spec->key, std::string(op.def->name) + ": " + e.what());
    }
    if (op.def->cost_reads_data && config_.compute_model && duration > Time()) {
      // This device's data prices it (ragged_dot: the rows its groups fill).
      std::vector<const Array*> outs;
      for (const Array& a : outputs) outs.push_back(&a);
      const OpCost cost = LocalOpCost(*op.spec, inputs, outs);
      duration =
          config_.compute_model->OpTime(op.spec->kind, cost, CostDType(*op.spec, inputs, outs));
      // The op's row reports the busiest device's time instead of the balanced estimate.
      Time& most = data_priced_[op_index];
      if (!data_priced_seen_[op_index] || duration > most) {
        const Time before = data_priced_seen_[op_index] ? most : op_duration_[op_index];
        op_timings_[op.source].compute += duration - before;
        most = duration;
        data_priced_seen_[op_index] = 1;
      }
    }
    for (size_t k = 0; k < outputs.size() && k < op.out_values.size(); ++k) {
      d.values[op.out_values[k]] = std::move(outputs[k]);
    }
  }
  // GPU communication kernels take SMs: compute that starts beside a collective is slower.
  if (duration > Time() && d.in_flight > 0 && config_.comm_compute_slowdown > 0) {
    duration = Time::FromSecondsCeil(duration.seconds() * (1 + config_.comm_compute_slowdown));
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
    Wake(position);
  });
}

void Executor::FinishCompute(int position, size_t op_index, Time started) {
  Device& d = devices_[position];
  const LoweredOp& op = lowered_->ops[op_index];
  for (int v : op.out_values) d.ready[v] = 1;
  Release(position, op);
  Time now = sim_.Now();
  if (now > started) {
    d.compute_spans.push_back({started, now});
    TraceOp(position, kComputeTid, op, "compute", started, now);
  }
  Record(op_index, started, now);
}

void Executor::TraceOp(int position, int32_t tid, const LoweredOp& op, const char* category,
                       Time start, Time end) {
  if (!sim_.tracing()) return;
  SliceRecord s;
  s.pid = network_.ProcessOf(
      network_.topology().device_vertex(mesh_.device(agent_position_[position])));
  s.tid = tid;
  s.name = op.spec->name;
  s.category = category;
  s.start = start;
  s.end = end;
  s.args = {{"op", op.def->name}};
  sim_.ReportSlice(s);
}

void Executor::StartHostCopy(int position, int dir, size_t op_index) {
  Device& d = devices_[position];
  const LoweredOp& op = lowered_->ops[op_index];
  Allocate(position, op_index);  // move_to_device's result in HBM; a host value takes none.
  if (dir == 0) {
    d.host_live += lowered_->values[op.out_values[0]].bytes().count();
    d.host_peak = std::max(d.host_peak, d.host_live);
  }
  if (config_.numerics) d.values[op.out_values[0]] = d.values[op.in_values[0]];
  d.host_busy[dir] = true;
  const Time started = sim_.Now();
  sim_.Schedule(op_duration_[op_index], [this, position, dir, op_index, started] {
    Device& dev = devices_[position];
    const LoweredOp& copy = lowered_->ops[op_index];
    dev.host_busy[dir] = false;
    dev.ready[copy.out_values[0]] = 1;
    // The host copy a move_to_device read is freed with its last reader.
    if (dir == 1 && dev.pending[copy.in_values[0]] == 1 && !held_[copy.in_values[0]]) {
      dev.host_live -= lowered_->values[copy.in_values[0]].bytes().count();
    }
    Release(position, copy);
    // A host copy no op reads here dies at once, as Release frees such outputs.
    if (dir == 0 && dev.pending[copy.out_values[0]] == 0 && !held_[copy.out_values[0]]) {
      dev.host_live -= lowered_->values[copy.out_values[0]].bytes().count();
    }
    const Time now = sim_.Now();
    dev.host_spans.push_back({started, now});
    if (now > started) TraceOp(position, kHostTid, copy, "host", started, now);
    Record(op_index, started, now);
    Wake(position);
  });
}

void Executor::Arrive(int position, size_t op_index) {
  const GroupLayout& layout = *layout_of_op_[op_index];
  auto [g, m] = layout.membership[position];
  std::unique_ptr<GroupRun>& slot = groups_[{op_index, g}];
  if (!slot) {
    slot = std::make_unique<GroupRun>();
    slot->positions = layout.groups[g];
    if (config_.numerics) slot->inputs.resize(slot->positions.size());
  }
  GroupRun& run = *slot;
  const LoweredOp& op = lowered_->ops[op_index];
  if (config_.numerics) {
    // A value this position never made (its op runs elsewhere) takes part as zeros.
    auto value = [&](int v) {
      const Array& in = devices_[position].values[v];
      const Array& shape = lowered_->values[v];
      return in.has_data() ? in
                           : Array::FromValues(shape.dtype(), shape.shape(),
                                               std::vector<float>(shape.size(), 0.0f));
    };
    if (op.device_put) {
      if (m < op.device_put->sources) run.inputs[m] = value(op.in_values[0]);
    } else if (op.spec->kind == OpKind::kRaggedAllToAll) {
      // Its result starts as `output` (input 1): the layout CollectiveOutput keeps.
      run.ragged_inputs.resize(run.positions.size());
      for (int v : op.in_values) run.ragged_inputs[m].push_back(value(v));
      run.inputs[m] = run.ragged_inputs[m][1];
    } else {
      run.inputs[m] = value(op.in_values[0]);
    }
  }
  // A collective's transfers start when its whole group has issued it: XLA's collectives are
  // synchronous across their replica group.
  if (++run.arrived == static_cast<int>(run.positions.size())) LaunchGroup(op_index, g);
}

void Executor::LaunchGroup(size_t op_index, int group) {
  GroupRun& run = *groups_.at({op_index, group});
  const LoweredOp& lowered = lowered_->ops[op_index];
  const OpSpec& op = *lowered.spec;
  const Array& input = lowered_->values[lowered.in_values[0]];
  int g = static_cast<int>(run.positions.size());
  run.start = sim_.Now();
  OpTiming& row = op_timings_[lowered.source];
  if (config_.collective_model) {
    // Each member agent finishes after its own duration from the model, stretched while other
    // collectives share its links.
    const CollectiveTiming& timing = *timings_[op_index];
    if (row.algorithm.empty()) row.algorithm = timing.algorithm;
    auto shared = std::make_unique<SharedRun>();
    shared->op_index = op_index;
    shared->group = group;
    shared->timing = &timing;
    shared->updated = shared->started = sim_.Now();
    for (int m = 0; m < g; ++m) {
      shared->members.push_back({timing.member_time[agent_position_[run.positions[m]]], m});
    }
    std::sort(shared->members.begin(), shared->members.end());
    unscheduled_.push_back(shared.get());
    shared_.push_back(std::move(shared));
    Reshare(++ops_in_flight_[op_index] == 1);
    return;
  }
  CollectiveJob& job = run.job;
  job.kind = lowered.def->collective;
  job.reduce = lowered.def->reduce;
  job.dtype = input.dtype();
  job.numerics = config_.numerics;
  for (int p : run.positions) {
    job.members.push_back(network_.topology().device_vertex(mesh_.device(p)));
  }
  int64_t size = input.size();
  job.total = size;
  job.block = job.kind == CollectiveKind::kReduceScatter || job.kind == CollectiveKind::kAllToAll
                  ? size / g
                  : size;
  if (job.kind == CollectiveKind::kPermute) job.destination = lowered.destination;
  const bool ragged = op.kind == OpKind::kRaggedAllToAll;
  if (ragged && !job.numerics) {
    // No index data: every pair moves the balanced share (BalancedRaggedBlock).
    const Shape& output = lowered_->values[lowered.in_values[1]].shape();
    job.block = BalancedRaggedBlock(input.shape(), output, g, op.expected_rows);
  }
  if (ragged && job.numerics) {
    std::vector<std::vector<const Array*>> views(g);
    for (int m = 0; m < g; ++m) {
      for (const Array& a : run.ragged_inputs[m]) views[m].push_back(&a);
    }
    try {
      run.plan = PlanRaggedAllToAll(views);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key, std::string("ragged_all_to_all: ") + e.what());
    }
    job.ragged = &run.plan;
    run.in.resize(g);
    run.out.resize(g);
    for (int m = 0; m < g; ++m) {
      run.in[m] = run.ragged_inputs[m][0].TakeValues();
      run.out[m] = run.ragged_inputs[m][1].TakeValues();
    }
    run.ragged_inputs.clear();
    job.in = &run.in;
    job.out = &run.out;
  } else if (job.numerics) {
    // (A device_put's destinations bring no input: theirs stay empty.)
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
  std::string resolved = lowered.algorithm;
  if (lowered.device_put) {
    // One message per (source, destination) pair sharing a box of the array, the destinations'
    // blocks assembled from what arrives.
    run.algorithm = MakeDevicePutTransfers(network_, job, *lowered.device_put);
  } else {
    try {
      run.algorithm = MakeAlgorithm(lowered.algorithm, network_, job, lowered.axis_sizes, &resolved,
                                    config_.chunk_size);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.algorithm.empty() ? op.key : op.key + ".algorithm",
                      std::string(lowered.def->name) + ": " + e.what());
    }
  }
  if (row.algorithm.empty()) row.algorithm = resolved;
  run.algorithm->Start();
  run.in.clear();
  run.in.shrink_to_fit();
}

// The rates of an op's groups in flight beside other ops: 1 / (1 + the group's worst cost,
// WorstSharingCosts); a group of agents takes the slowest of the groups of positions it stands
// for.
const std::vector<double>& Executor::SharedRates(const SharedRun& run,
                                                 const std::vector<const SharedRun*>& ops) {
  // Timings are named by their index in program order (not their address), and the other ops
  // taken in that order, so the sums below, and the rates, are the same in every run.
  std::vector<std::pair<int64_t, int64_t>> others;  // (timing index, launched together).
  for (const SharedRun* other : ops) {
    if (other->op_index == run.op_index) continue;
    others.push_back({timing_index_.at(other->timing), other->started == run.started});
  }
  std::sort(others.begin(), others.end());
  std::vector<int64_t> key = {timing_index_.at(run.timing)};
  for (auto [timing, aligned] : others) key.insert(key.end(), {timing, aligned});
  const GroupLayout& layout = *layout_of_op_[run.op_index];
  auto [it, made] = rates_.try_emplace(key, layout.groups.size(), 1.0);
  if (!made || others.empty()) return it->second;
  const CollectiveTiming& t = *run.timing;
  // Across runs (a search's), the same ops in flight in the same order give the same rates.
  TimelineCache* shared_rates = config_.collective_model->timeline_cache();
  TimelineCache::RatesKey shared_key;
  if (shared_rates) {
    shared_key.push_back({run.timing, false});
    for (auto [index, aligned] : others) {
      shared_key.push_back({timing_by_index_[static_cast<size_t>(index)], aligned != 0});
    }
    if (const std::vector<double>* known = shared_rates->FindRates(shared_key)) {
      SpreadGroupRates(layout, *known, it->second);
      return it->second;
    }
  }
  // With one other op, its worst costs may have been found beside this op's (below).
  if (others.size() == 1 && partner_worst_ && partner_worst_->first == key) {
    std::vector<double> group_rate = std::move(partner_worst_->second);
    partner_worst_.reset();
    return KeepRates(layout, key, others, std::move(group_rate), std::move(shared_key), it->second);
  }
  // With one other op whose rates beside this one are not known either, its worst costs may
  // be found in the same pass (kept for its own call, partner_worst_).
  std::vector<SharingOther> sharing;
  for (auto [index, aligned] : others) {
    sharing.push_back({timing_by_index_[static_cast<size_t>(index)]->profile.get(), aligned != 0});
  }
  std::vector<int64_t> partner_key;
  bool partner_wanted = false;
  if (others.size() == 1) {
    partner_key = {others[0].first, key[0], others[0].second};
    const CollectiveTiming* partner = timing_by_index_[static_cast<size_t>(others[0].first)];
    partner_wanted =
        rates_.count(partner_key) == 0 &&
        !(shared_rates &&
          shared_rates->FindRates({{partner, false}, {run.timing, others[0].second != 0}}));
  }
  std::vector<double> partner_worst;
  std::vector<double> worst =
      WorstSharingCosts(network_.topology(), *t.profile, sharing, config_.sharing_pass,
                        partner_wanted ? &partner_worst : nullptr);
  if (!partner_worst.empty()) {
    partner_worst_.emplace(std::move(partner_key), std::move(partner_worst));
  }
  return KeepRates(layout, key, others, std::move(worst), std::move(shared_key), it->second);
}

const std::vector<double>& Executor::KeepRates(
    const GroupLayout& layout, const std::vector<int64_t>& key,
    const std::vector<std::pair<int64_t, int64_t>>& others, std::vector<double> worst,
    TimelineCache::RatesKey shared_key, std::vector<double>& rates) {
  // Each group's rate, in place of its worst cost.
  std::vector<double>& group_rate = worst;
  for (double& w : group_rate) w = 1.0 / (1.0 + w);
  SpreadGroupRates(layout, group_rate, rates);
  if (TimelineCache* shared_rates = config_.collective_model->timeline_cache()) {
    std::vector<std::shared_ptr<const CollectiveTiming>> owners = {
        timing_owner_[static_cast<size_t>(key[0])]};
    for (auto [index, aligned] : others)
      owners.push_back(timing_owner_[static_cast<size_t>(index)]);
    shared_rates->InsertRates(std::move(shared_key), std::move(group_rate), owners);
  }
  return rates;
}

void Executor::SpreadGroupRates(const GroupLayout& layout, const std::vector<double>& group_rate,
                                std::vector<double>& rates) {
  for (size_t a = 0; a < layout.groups.size(); ++a) {
    for (int pg : layout.position_groups[a]) rates[a] = std::min(rates[a], group_rate[pg]);
  }
}

// Schedules the next member completion of the runs that have none. When the set of ops in
// flight changed, first brings every run's progress up to now, recomputes the rates, and
// reschedules the runs whose rate changed; otherwise rates stand and events stay valid.
void Executor::Reshare(bool ops_changed) {
  Time now = sim_.Now();
  if (ops_changed) {
    // Each op once (its first run stands for it): its groups were simulated together, so one
    // op's timing covers them all.
    std::vector<const SharedRun*> ops;
    for (auto& run : shared_) {
      run->progress_ps += run->rate * static_cast<double>((now - run->updated).picoseconds());
      run->updated = now;
      bool seen = false;
      for (const SharedRun* o : ops) seen = seen || o->op_index == run->op_index;
      if (!seen) ops.push_back(run.get());
    }
    op_rates_.clear();
    for (const SharedRun* op : ops) op_rates_[op->op_index] = &SharedRates(*op, ops);
    partner_worst_.reset();  // Found for an op whose own call found its rates known after all.
    for (auto& run : shared_) {
      double rate = (*op_rates_[run->op_index])[run->group];
      if (run->scheduled && rate != run->rate) {
        sim_.Cancel(run->event);
        run->scheduled = false;
      }
      run->rate = rate;
      if (!run->scheduled) unscheduled_.push_back(run.get());
    }
  }
  for (SharedRun* run : unscheduled_) {
    if (run->scheduled || run->next == run->members.size()) continue;
    if (!ops_changed) {
      run->progress_ps += run->rate * static_cast<double>((now - run->updated).picoseconds());
      run->updated = now;
      run->rate = (*op_rates_[run->op_index])[run->group];
    }
    double left =
        static_cast<double>(run->members[run->next].first.picoseconds()) - run->progress_ps;
    Time delay =
        Time::Picoseconds(static_cast<int64_t>(std::ceil(std::max(0.0, left) / run->rate)));
    run->event = sim_.Schedule(delay, [this, run] { FinishShared(run); });
    run->scheduled = true;
  }
  unscheduled_.clear();
}

void Executor::FinishShared(SharedRun* run) {
  Time now = sim_.Now();
  run->scheduled = false;
  run->progress_ps += run->rate * static_cast<double>((now - run->updated).picoseconds());
  run->updated = now;
  // Members whose standalone duration is covered (half a picosecond absorbs rounding).
  std::vector<int> done;
  while (run->next < run->members.size() &&
         static_cast<double>(run->members[run->next].first.picoseconds()) <=
             run->progress_ps + 0.5) {
    done.push_back(run->members[run->next++].second);
  }
  std::unique_ptr<SharedRun> finished;
  size_t op_index = run->op_index;
  int group = run->group;
  bool ops_changed = false;
  if (run->next == run->members.size()) {
    auto it = std::find_if(shared_.begin(), shared_.end(),
                           [run](const auto& r) { return r.get() == run; });
    finished = std::move(*it);
    shared_.erase(it);
    if (--ops_in_flight_[op_index] == 0) {
      ops_in_flight_.erase(op_index);
      ops_changed = true;
    }
  } else {
    unscheduled_.push_back(run);
  }
  for (int member : done) MemberDone(op_index, group, member);
  Reshare(ops_changed);
}

void Executor::MemberDone(size_t op_index, int group, int member) {
  GroupRun& run = *groups_.at({op_index, group});
  const LoweredOp& lowered = lowered_->ops[op_index];
  const OpSpec& op = *lowered.spec;
  int g = static_cast<int>(run.positions.size());
  int position = run.positions[member];
  Device& d = devices_[position];
  if (config_.numerics && lowered.device_put) {
    const DevicePutPlan& plan = *lowered.device_put;
    if (member >= plan.sources) {
      d.values[lowered.out_values[0]] =
          Array::FromValues(lowered_->values[lowered.out_values[0]].dtype(), plan.to_block,
                            std::move(run.out[member]));
    }
    run.out[member] = {};
    run.inputs[member] = Array();
  } else if (config_.numerics) {
    d.values[lowered.out_values[0]] =
        CollectiveOutput(op, run.inputs[member], std::move(run.out[member]), g);
    run.out[member] = {};
    run.inputs[member] = Array();
  }
  d.ready[lowered.out_values[0]] = 1;
  Release(position, lowered);
  --d.in_flight;
  d.comm_spans.push_back({run.start, sim_.Now()});
  d.comm_span_class.push_back(comm_class_of_op_[op_index]);
  if (sim_.tracing()) {
    SliceRecord s;
    s.pid = network_.ProcessOf(
        network_.topology().device_vertex(mesh_.device(agent_position_[position])));
    s.tid = kCollectiveTid;
    s.name = op.name;
    s.category = "collective";
    s.start = run.start;
    s.end = sim_.Now();
    s.args = {{"op", lowered.def->name}};
    sim_.ReportSlice(s);
  }
  Record(op_index, run.start, sim_.Now());
  if (++run.finished == g) {
    // Free the group's state once nothing runs inside it: members can finish synchronously
    // inside algorithm->Start(), so the erase waits for the current event to end.
    sim_.Schedule(Time(), [this, op_index, group] { groups_.erase({op_index, group}); });
  }
  Wake(position);
}

namespace {

// Exposed communication by class: sweeping the spans' ends in time order, each stretch with
// no compute running and k collective spans in flight adds its length / k to each of their
// classes.
// `compute` is in time order (a device computes one op at a time) and `by_start` lists the comm
// spans in order of their starts, so the edges are merged rather than sorted. Edges at one
// instant may come in any order: only the stretches between distinct instants add time, and the
// counts after an instant's last edge are the same in every order.
std::vector<Time> ExposedByClass(const std::vector<std::pair<Time, Time>>& compute,
                                 const std::vector<std::pair<Time, Time>>& comm,
                                 const std::vector<int>& by_start,
                                 const std::vector<int>& comm_class, size_t classes) {
  struct Edge {
    Time at;
    int delta;  // +1 start, -1 end.
    int span;   // Comm span index, or -1 for compute.
  };
  auto before = [](const Edge& a, const Edge& b) { return a.at < b.at; };
  std::vector<Edge> compute_edges, starts, ends;
  compute_edges.reserve(2 * compute.size());
  for (const auto& [start, end] : compute) {
    compute_edges.push_back({start, 1, -1});
    compute_edges.push_back({end, -1, -1});
  }
  starts.reserve(comm.size());
  for (int s : by_start) starts.push_back({comm[static_cast<size_t>(s)].first, 1, s});
  ends.reserve(comm.size());
  for (size_t s = 0; s < comm.size(); ++s)
    ends.push_back({comm[s].second, -1, static_cast<int>(s)});
  // Spans are recorded as they end, so their ends are usually in order already.
  if (!std::is_sorted(ends.begin(), ends.end(), before)) {
    std::stable_sort(ends.begin(), ends.end(), before);
  }
  std::vector<Edge> comm_edges(starts.size() + ends.size());
  std::merge(starts.begin(), starts.end(), ends.begin(), ends.end(), comm_edges.begin(), before);
  std::vector<Edge> edges(compute_edges.size() + comm_edges.size());
  std::merge(compute_edges.begin(), compute_edges.end(), comm_edges.begin(), comm_edges.end(),
             edges.begin(), before);
  std::vector<double> ps(classes, 0.0);
  std::vector<int> in_flight(classes, 0);
  int computing = 0, collectives = 0;
  Time last;
  for (const Edge& e : edges) {
    if (computing == 0 && collectives > 0 && e.at > last) {
      const double share = static_cast<double>((e.at - last).picoseconds()) / collectives;
      for (size_t c = 0; c < classes; ++c) ps[c] += share * in_flight[c];
    }
    last = e.at;
    if (e.span < 0) {
      computing += e.delta;
    } else {
      collectives += e.delta;
      in_flight[static_cast<size_t>(comm_class[static_cast<size_t>(e.span)])] += e.delta;
    }
  }
  std::vector<Time> out;
  for (double p : ps) out.push_back(Time::Picoseconds(std::llround(p)));
  return out;
}

}  // namespace

std::vector<DeviceTiming> Executor::SimulatedDeviceTimings() const {
  std::vector<DeviceTiming> per_agent;
  for (const Device& d : devices_) {
    // Compute spans are in time order (one op at a time); comm spans are sorted once here.
    if (!std::is_sorted(d.compute_spans.begin(), d.compute_spans.end())) {
      throw std::logic_error("internal error: a device's compute spans are out of order");
    }
    std::vector<int> by_start(d.comm_spans.size());
    for (size_t s = 0; s < by_start.size(); ++s) by_start[s] = static_cast<int>(s);
    std::sort(by_start.begin(), by_start.end(),
              [&](int a, int b) { return d.comm_spans[a] < d.comm_spans[b]; });
    std::vector<std::pair<Time, Time>> comm;
    comm.reserve(by_start.size());
    for (int s : by_start) comm.push_back(d.comm_spans[static_cast<size_t>(s)]);
    std::vector<std::pair<Time, Time>> both(d.compute_spans.size() + comm.size());
    std::merge(d.compute_spans.begin(), d.compute_spans.end(), comm.begin(), comm.end(),
               both.begin());
    DeviceTiming t;
    t.compute = CoveredTimeOfSorted(d.compute_spans);
    t.comm = CoveredTimeOfSorted(comm);
    Time busy = CoveredTimeOfSorted(both);
    // Communication not hidden under compute: what the union adds beyond compute.
    t.exposed_comm = busy - t.compute;
    t.idle = end_ - busy;
    t.peak_memory = Bytes(d.peak);
    t.peak_op = d.peak_op;
    std::vector<std::pair<Time, Time>> host = d.host_spans;
    std::sort(host.begin(), host.end());
    t.host_transfer = CoveredTimeOfSorted(host);
    t.host_peak = Bytes(d.host_peak);
    for (int64_t p : d.phase_peak) t.phase_peaks.push_back(Bytes(p));
    for (int64_t p : d.phase_entry) t.phase_entry_live.push_back(Bytes(std::max<int64_t>(p, 0)));
    const std::vector<Time> exposed = ExposedByClass(d.compute_spans, d.comm_spans, by_start,
                                                     d.comm_span_class, comm_classes_.size());
    for (size_t c = 0; c < exposed.size(); ++c) {
      if (exposed[c] > Time()) t.exposed_by_collective[comm_classes_[c]] = exposed[c];
    }
    t.device = mesh_.device(agent_position_[per_agent.size()]);
    per_agent.push_back(std::move(t));
  }
  return per_agent;
}

std::map<std::string, Array> Executor::Outputs() const {
  if (!config_.numerics) {
    // Shapes only: every position's block has the lowered shape.
    std::map<std::string, Array> out;
    for (const OutputSpec& o : program_.outputs) {
      const Array& local = lowered_->values[lowered_->final_values.at(o.name)];
      out[o.name] = Array::ShapeOnly(local.dtype(), GlobalShapeOf(local.shape(), o.spec, mesh_));
    }
    return out;
  }
  std::vector<std::map<std::string, Array>> env(mesh_.size());
  std::vector<int> parts;  // Per output: its mesh, with several.
  for (const OutputSpec& o : program_.outputs) {
    int id = lowered_->final_values.at(o.name);
    parts.push_back(lowered_->value_part[id]);
    for (int p = 0; p < mesh_.size(); ++p) {
      if (devices_[p].absent[id]) continue;
      env[p][o.name] = devices_[p].values[id];
    }
  }
  return AssembleOutputs(mesh_, program_, std::move(env),
                         mesh_.parts().empty() ? std::vector<int>{} : parts);
}

}  // namespace shardsim
