#include "planner/partitioner.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "collectives/ir/op_registry.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "planner/grad.h"
#include "planner/reshard.h"
#include "planner/rules/sharding_rule.h"
#include "sim/fnv_hash.h"
#include "sim/spec_error.h"

namespace shardsim::planner {

// One operand of an op as its choice of layout sees it.
struct ChoiceOperand {
  Shape shape;  // Global.
  DType dtype = DType::kF32;
  ValueSharding sharding;
  bool host = false;
  // The layouts it was resharded to already in this pass (their reshards cost nothing more),
  // ascending.
  std::vector<ValueSharding> resharded;
  bool operator==(const ChoiceOperand&) const = default;
};

struct PartitionChoices::Impl {
  // One choice: what it was made for, and the strategy chosen.
  struct Entry {
    OpSpec op;  // Its names cleared (ClearNames).
    std::vector<ChoiceOperand> operands;
    std::optional<PartitionSpec> hint;
    uint64_t whole = 0;  // A DimSet.
    Strategy chosen;
  };

  // Binds the choices to `costs` over `axes`: kept if they are what the choices were made
  // for, else forgotten.
  void Bind(const PartitionCosts& costs, const std::vector<MeshAxis>& mesh_axes) {
    std::vector<std::pair<std::string, int>> named;
    for (const MeshAxis& a : mesh_axes) named.emplace_back(a.name, a.size);
    const bool same_devices = costs.mesh ? costs.mesh->devices() == devices : devices.empty();
    const bool same = bound && named == axes && same_devices && costs.collectives == collectives &&
                      costs.compute == compute && costs.device_in_bytes_per_second == in_rate &&
                      costs.machine == machine;
    if (same) return;
    bound = true;
    axes = std::move(named);
    devices = costs.mesh ? costs.mesh->devices() : std::vector<int>{};
    shape_mesh = ShapeMesh(mesh_axes);
    collectives = costs.collectives;
    compute = costs.compute;
    in_rate = costs.device_in_bytes_per_second;
    machine = costs.machine;
    entries.clear();
    step_times.clear();
    size = 0;
  }

  // The fields of `op` that name values or locate it (a repeated op's differ).
  template <typename Op>
  static auto NameFields(Op& op) {
    return std::tie(op.name, op.key, op.in, op.out, op.like, op.of, op.wrt);
  }
  // Gives `op` the names of `from`.
  static void SetNames(OpSpec& op, const OpSpec& from) { NameFields(op) = NameFields(from); }
  // `op` without names.
  static void ClearNames(OpSpec& op) {
    std::apply([](auto&... field) { (field.clear(), ...); }, NameFields(op));
  }

  // A mesh of `axes` whose position p is device p: the partitioner infers shapes on it.
  static Mesh ShapeMesh(const std::vector<MeshAxis>& axes) {
    int n = 1;
    for (const MeshAxis& a : axes) n *= a.size;
    std::vector<int> devices(static_cast<size_t>(n));
    std::iota(devices.begin(), devices.end(), 0);
    return Mesh(axes, std::move(devices));
  }

  // What the choices were made for.
  bool bound = false;
  std::vector<std::pair<std::string, int>> axes;  // Names and sizes.
  std::vector<int> devices;                       // The mesh's placement (empty: no mesh).
  const CollectiveCostModel* collectives = nullptr;
  const ComputeModel* compute = nullptr;
  double in_rate = 0;
  const Machine* machine = nullptr;

  std::unordered_map<uint64_t, std::vector<Entry>> entries;  // By FindChoice's hash.
  size_t size = 0;
  int64_t reused = 0;
  // Reshard steps' times by (kind, dtype, elements, axes): a function of the mesh and model.
  std::map<std::vector<int64_t>, double> step_times;
  // ShapeMesh of the axes bound (shared by the partitions of the plan).
  std::optional<Mesh> shape_mesh;
};

PartitionChoices::PartitionChoices() : impl_(std::make_unique<Impl>()) {}
PartitionChoices::~PartitionChoices() = default;
size_t PartitionChoices::size() const { return impl_->size; }
int64_t PartitionChoices::reused() const { return impl_->reused; }

namespace {

// Dimension `d` of an array in a set of dimensions held as bits (a DimSet: dimension d is bit
// d). Arrays have far fewer than 64 dimensions: another is a broken invariant.
uint64_t DimBit(int d) {
  if (d < 0 || d >= 64) {
    throw std::logic_error("internal error: dimension " + std::to_string(d) + " in a DimSet");
  }
  return uint64_t{1} << d;
}

// The layout a partial value laid out as `v` is summed into beside an operand of its shape
// laid out as `w`: each of v's splits kept, extended on that dimension by w's next axes that v
// is partial over (a reduce-scatter over them), so the sum never gathers what v holds split
// (an axis w splits that v is not partial over is sliced by the reader instead, and a
// dimension w splits other than as v does keeps v's split). None when no axis is added.
// Valid: v's axes are distinct and not partial; the added ones are partial and distinct in w.
std::optional<ValueSharding> SumTarget(const ValueSharding& v, const ValueSharding& w) {
  ValueSharding to = v;
  to.partial.clear();
  bool added = false;
  for (size_t d = 0; d < to.dims.size() && d < w.dims.size(); ++d) {
    std::vector<int>& dim = to.dims[d];
    const std::vector<int>& want = w.dims[d];
    if (want.size() <= dim.size() || !std::equal(dim.begin(), dim.end(), want.begin())) continue;
    for (size_t k = dim.size(); k < want.size(); ++k) {
      if (std::find(v.partial.begin(), v.partial.end(), want[k]) == v.partial.end()) break;
      dim.push_back(want[k]);
      added = true;
    }
  }
  if (!added) return std::nullopt;
  return to;
}

// One definition of a global value.
struct Value {
  Shape shape;  // Global shape.
  DType dtype = DType::kF32;
  ValueSharding sharding;  // As the lowered program holds it.
  std::string local;       // Its name in the lowered program.
  bool host = false;       // In host memory (move_to_host made it): never resharded.
};

}  // namespace

struct PartitionAnalysis::Impl {
  // What is known of each global op, by its position in the program.
  struct OpInfo {
    std::vector<int> in_ids, out_ids;  // The name ids of its operands and results.
    std::vector<int> uses;             // Readers of each operand's value.
    // Auto mode: the layout wanted of its first result (a hint: a spec of the program), and
    // the dimensions of it a later reader wants whole (a DimSet).
    const PartitionSpec* hint = nullptr;
    uint64_t whole = 0;
    // Auto mode: its operands' global shapes and its results' (shape-only arrays), when known.
    bool shapes_known = false;
    std::vector<Shape> in_shapes;
    bool outs_known = false;
    std::vector<Array> out_shapes;
  };

  // Whether this is what partitioning `program` (in mode `explicit_mode`) over `axes` reads.
  bool Serves(const ProgramSpec& program, bool explicit_mode,
              const std::vector<MeshAxis>& axes) const {
    if (this->program != &program || info.size() != program.ops.size() ||
        this->explicit_mode != explicit_mode) {
      return false;
    }
    if (mesh_free) return true;
    return std::equal(axes.begin(), axes.end(), this->axes.begin(), this->axes.end(),
                      [](const MeshAxis& a, const MeshAxis& b) { return a.size == b.size; });
  }

  const ProgramSpec* program = nullptr;  // What it was made for (null: nothing yet).
  bool explicit_mode = false;
  std::vector<MeshAxis> axes;  // The sizes its shapes were inferred over.
  // No op names mesh axes (takes_axis_name): a global shape reads the mesh only through the
  // axes its op names (take_shard, axis_index, the dynamic ops), so these shapes hold at any
  // sizes. (No op that names axes has a sharding rule: such a program does not partition.)
  bool mesh_free = false;
  // Every name the program binds or reads, by id (views of the program's names).
  std::unordered_map<std::string_view, int> name_ids;
  std::vector<OpInfo> info;  // Per op.
  int made = 0;
};

PartitionAnalysis::PartitionAnalysis() : impl_(std::make_unique<Impl>()) {}
PartitionAnalysis::~PartitionAnalysis() = default;
int PartitionAnalysis::made() const { return impl_->made; }

namespace {

class Partitioner {
  using OpInfo = PartitionAnalysis::Impl::OpInfo;

 public:
  Partitioner(const ProgramSpec& global, const std::vector<MeshAxis>& axes,
              const PartitionCosts& costs, std::vector<size_t> pass_starts,
              PartitionChoices* choices, PartitionAnalysis* analysis)
      : global_(global),
        pass_starts_(std::move(pass_starts)),
        costs_(costs),
        axes_(axes),
        explicit_(global.mode == ProgramMode::kExplicit) {
    if (choices && !explicit_) {
      choices_ = &choices->impl();
      choices_->Bind(costs, axes);
      step_times_ = &choices_->step_times;
      shape_mesh_ = &*choices_->shape_mesh;
    } else {
      own_shape_mesh_ = PartitionChoices::Impl::ShapeMesh(axes);
      shape_mesh_ = &*own_shape_mesh_;
    }
    // Room for every name up front (with a fifth more for the reshards' fresh names): no
    // rehashing of tables of tens of thousands of names as they fill.
    const size_t names = (global.arrays.size() + global.ops.size()) * 6 / 5;
    fresh_.reserve(names / 5);
    values_.reserve(names);
    result_.program.ops.reserve(names);
    result_.reasons.reserve(names);
    result_.types.reserve(names);
    if (!analysis) {
      own_analysis_ = std::make_unique<PartitionAnalysis>();
      analysis = own_analysis_.get();
    }
    PartitionAnalysis::Impl& a = analysis->impl();
    if (!a.Serves(global, explicit_, axes)) Analyze(a, names);
    name_ids_ = &a.name_ids;
    info_ = &a.info;
    current_.assign(name_ids_->size(), -1);
  }

  PartitionResult Run() {
    result_.program.mode = ProgramMode::kManual;
    result_.program.mesh_axes = axes_;
    result_.program.mesh_devices = global_.mesh_devices;
    result_.program.arrays = global_.arrays;
    for (const ArraySpec& a : global_.arrays) {
      Value v;
      v.shape = a.shape;
      v.dtype = a.dtype;
      v.sharding = FromSpec(a.sharding, static_cast<int>(a.shape.size()), axes_);
      v.local = a.name;
      Define(a.name, std::move(v));
    }
    result_.program.meshes = global_.meshes;
    for (const ArraySpec& a : global_.arrays) mesh_of_[a.name] = a.mesh;
    size_t next_pass = 0;
    for (size_t i = 0; i < global_.ops.size(); ++i) {
      // A backward pass starts or ends: autodiff saved the program's values, not the copies
      // the partitioner resharded them into, so each pass makes its reshards anew (FSDP
      // gathers each weight in the forward and again in the backward, as JAX under jit does;
      // the next microbatch's forward gathers again).
      while (next_pass < pass_starts_.size() && pass_starts_[next_pass] == i) {
        reshards_.clear();
        ++next_pass;
      }
      const OpSpec& op = global_.ops[i];
      const size_t first = result_.program.ops.size();
      Emit(op);
      if (global_.meshes.empty()) continue;
      const std::string mesh = MeshOf(op);
      for (const std::string& name : op.out) mesh_of_[name] = mesh;
      Tag(first, mesh);
    }
    for (const OutputSpec& o : global_.outputs) {
      const size_t first = result_.program.ops.size();
      EmitOutput(o);
      if (!global_.meshes.empty()) Tag(first, mesh_of_[o.name]);
    }
    return std::move(result_);
  }

 private:
  // With several meshes: the mesh `op` runs on, its own or (for ops reverse mode made) its
  // inputs'; every input of an op but device_put must live there. "" on one mesh.
  std::string MeshOf(const OpSpec& op) {
    if (global_.meshes.empty()) return "";
    std::string mesh = op.mesh;
    if (mesh.empty() && !op.like.empty()) mesh = mesh_of_[op.like];  // Made by grad.
    if (mesh.empty() && !op.in.empty()) mesh = mesh_of_[op.in[0]];
    if (op.kind == OpKind::kDevicePut) return mesh;
    for (const std::string& name : op.in) {
      if (mesh_of_[name] != mesh) {
        throw SpecError(op.key + ".in", std::string(OpKindName(op.kind)) + ": '" + name +
                                            "' lives on mesh '" + mesh_of_[name] +
                                            "' but the op runs on mesh '" + mesh +
                                            "'; device_put it there first");
      }
    }
    return mesh;
  }

  // Names mesh `mesh` on the ops emitted from index `first` on that name none.
  void Tag(size_t first, const std::string& mesh) {
    for (size_t k = first; k < result_.program.ops.size(); ++k) {
      if (result_.program.ops[k].mesh.empty()) result_.program.ops[k].mesh = mesh;
    }
  }

  // The layout `spec` gives a value of global `shape`, checked to split it evenly; a SpecError at
  // `key` otherwise.
  ValueSharding Layout(const PartitionSpec& spec, const Shape& shape,
                       const std::string& key) const {
    try {
      ValueSharding to = FromSpec(spec, static_cast<int>(shape.size()), axes_);
      LocalShape(shape, to, axes_);
      return to;
    } catch (const std::invalid_argument& e) {
      throw SpecError(key, e.what());
    }
  }

  // Rebinds name id `name` to its value with its partial sums summed (one reshard, whose
  // reason `why()` gives), laid out as `to` when given (no partial axes), else as it is.
  template <typename Why>
  void SumPartials(int name, const Why& why,
                   const std::optional<ValueSharding>& to = std::nullopt) {
    const int id = Current(name);
    Value reduced = values_[static_cast<size_t>(id)];
    reduced.sharding = to ? *to : Reduced(reduced.sharding);
    reduced.local = EmitReshard(id, reduced.sharding, why);
    Define(name, std::move(reduced));
  }

  // device_put: the value, summed first if it holds partial sums, moves as it is laid out to
  // the destination's sharding.
  void EmitDevicePut(const OpSpec& op) {
    if (!values_[static_cast<size_t>(Current(op.in[0]))].sharding.partial.empty()) {
      const size_t first = result_.program.ops.size();
      SumPartials(name_ids_->at(op.in[0]),
                  [&] { return op.in[0] + " holds partial sums: summed before device_put"; });
      Tag(first, mesh_of_[op.in[0]]);  // On the value's own mesh.
    }
    const Value& v = values_[static_cast<size_t>(Current(op.in[0]))];
    // One grad made lands as its primal is laid out (never partial: a partial value is summed
    // before it leaves its mesh).
    const ValueSharding to = op.like.empty()
                                 ? Layout(op.sharding, v.shape, op.key + ".sharding")
                                 : Reduced(values_[static_cast<size_t>(Current(op.like))].sharding);
    OpSpec put = op;
    put.in = {v.local};
    put.in_sharding = ToSpec(v.sharding, axes_);
    if (!op.like.empty()) {
      put.sharding = ToSpec(to, axes_);
      put.mesh = mesh_of_[op.like];
      put.like.clear();
    }
    result_.program.ops.push_back(std::move(put));
    Describe("", [&] { return FormatType(v.dtype, v.shape, to, axes_); });
    Value out = v;
    out.sharding = to;
    out.local = op.out[0];
    Define(op.out[0], std::move(out));
  }

  // A partial value read by several ops is summed once, up front, rather than carried
  // partial through a linear op and summed again by another reader (Adam reads a gradient
  // both scaled and squared: one psum, as XLA's all-reduce after the dot; a shard_map region
  // and an op beside it reading one contraction).
  // `in_ids`: the op's operands' name ids; `uses`: how many ops read each.
  void SumSharedPartials(const OpSpec& op, const std::vector<int>& in_ids,
                         const std::vector<int>& uses) {
    for (size_t i = 0; i < op.in.size(); ++i) {
      const Value& v = values_[static_cast<size_t>(Current(in_ids[i]))];
      // Copies of a partial host value each carry the partial sums to their readers.
      if (v.sharding.partial.empty() || uses[i] < 2 || v.host) continue;
      // An elementwise op with a split operand of the same shape sums it into that layout
      // where the split takes the partial axes (SumTarget): a reduce-scatter, never more bytes
      // than the all-reduce (a reader wanting it whole gathers the rest, which the all-reduce
      // moves anyway). A residual add of a tensor-parallel projection into a stream split over
      // the same axis, read again by remat's recompute, so reduce-scatters once.
      std::optional<ValueSharding> to;
      std::string like;
      for (size_t j = 0; j < op.in.size() && Op(op.kind).elementwise && !to; ++j) {
        const Value& w = values_[static_cast<size_t>(Current(in_ids[j]))];
        if (j != i && w.sharding.partial.empty() && w.shape == v.shape) {
          to = SumTarget(v.sharding, w.sharding);
          if (to) like = ", split as " + op.in[j] + " is";
        }
      }
      SumPartials(
          in_ids[i],
          [&] {
            return op.in[i] + " is read by " + std::to_string(uses[i]) +
                   " ops: its partial sums are summed once" + like;
          },
          to);
    }
  }

  // shard_map: each input resharded to its in_spec (its body array's sharding), as jit does
  // around a shard_map; then the body's ops as they are, on those blocks, its temporaries
  // under fresh names; each result is the body output it stands for, laid out by its out spec.
  void EmitShardMap(const OpSpec& op) {
    const OpInfo& info = Info(op);
    SumSharedPartials(op, info.in_ids, info.uses);
    const ProgramSpec& body = *op.body;
    std::vector<const Value*> in;
    for (int name : info.in_ids) in.push_back(&values_[static_cast<size_t>(Current(name))]);
    std::vector<Array> inferred;
    const std::vector<Array>& outs =
        info.outs_known ? info.out_shapes : (inferred = InferShapes(op, in));
    std::unordered_map<std::string, std::string> local;  // Body name -> the program's name.
    std::unordered_set<std::string> in_host;             // Body names bound by move_to_host.
    // The body op binding each result last writes it under the result's own name, as any
    // op's result is named in the partitioned program (messages then name it as written).
    std::unordered_map<std::string, std::pair<size_t, std::string>> result_name;
    for (size_t r = 0; r < op.out.size(); ++r) {
      for (size_t k = body.ops.size(); k-- > 0;) {
        const std::vector<std::string>& outs_k = body.ops[k].out;
        if (std::find(outs_k.begin(), outs_k.end(), body.outputs[r].name) == outs_k.end()) continue;
        result_name.emplace(body.outputs[r].name, std::make_pair(k, op.out[r]));
        break;
      }
    }
    for (size_t i = 0; i < op.in.size(); ++i) {
      const int id = Current(info.in_ids[i]);
      const Value& v = values_[static_cast<size_t>(id)];
      const ValueSharding to = Layout(body.arrays[i].sharding, v.shape, op.key + ".in");
      local[body.arrays[i].name] = EmitReshard(id, to, [&] {
        return "shard_map " + op.name + " takes " + op.in[i] + " as " +
               FormatType(v.dtype, v.shape, to, axes_) + " (its in_spec)";
      });
    }
    for (size_t k = 0; k < body.ops.size(); ++k) {
      const OpSpec& b = body.ops[k];
      OpSpec inlined = b;
      for (std::string& name : inlined.in) name = local.at(name);
      for (std::string& name : inlined.out) {
        // Named after the region's first result (a valid name, as the op's name need not be),
        // or the result's own name where this op binds it last.
        const auto last = result_name.find(name);
        const std::string fresh = last != result_name.end() && last->second.first == k
                                      ? last->second.second
                                      : Fresh(op.out[0] + "_" + name);
        local[name] = fresh;
        if (b.kind == OpKind::kMoveToHost) {
          in_host.insert(name);
        } else {
          in_host.erase(name);
        }
        name = fresh;
      }
      inlined.name = inlined.out[0];
      result_.program.ops.push_back(std::move(inlined));
      Describe("", [&] { return "per device (shard_map " + op.name + ")"; });
    }
    for (size_t r = 0; r < op.out.size(); ++r) {
      const OutputSpec& o = body.outputs[r];
      Value v{outs[r].shape(), outs[r].dtype(), Layout(o.spec, outs[r].shape(), o.key),
              local.at(o.name)};
      v.host = in_host.count(o.name) > 0;
      Define(info.out_ids[r], std::move(v));
    }
  }

  // How many ops (and outputs) read the value each operand of each op names: one count per
  // definition, names being rebindable.
  void CountUses() {
    std::vector<int> def(name_ids_->size(), -1);  // Name id -> its current definition.
    std::vector<int> uses;
    auto define = [&](int name) {
      def[static_cast<size_t>(name)] = static_cast<int>(uses.size());
      uses.push_back(0);
    };
    for (const ArraySpec& a : global_.arrays) define(name_ids_->at(a.name));
    std::vector<std::vector<int>> read(global_.ops.size());
    for (size_t k = 0; k < global_.ops.size(); ++k) {
      for (int name : (*info_)[k].in_ids) {
        const int d = def[static_cast<size_t>(name)];
        read[k].push_back(d);
        // full_like reads only the shape: it needs no sum.
        const bool reads = global_.ops[k].kind != OpKind::kFullLike;
        if (d >= 0 && reads) ++uses[static_cast<size_t>(d)];
      }
      for (int name : (*info_)[k].out_ids) define(name);
    }
    for (const OutputSpec& o : global_.outputs) {
      const int d = def[static_cast<size_t>(name_ids_->at(o.name))];
      if (d >= 0) ++uses[static_cast<size_t>(d)];
    }
    for (size_t k = 0; k < read.size(); ++k) {
      std::vector<int> counts;
      for (int d : read[k]) counts.push_back(d < 0 ? 0 : uses[static_cast<size_t>(d)]);
      (*info_)[k].uses = std::move(counts);
    }
  }

  // Makes `a` what partitioning the program over axes_ reads (room for `names` names).
  void Analyze(PartitionAnalysis::Impl& a, size_t names) {
    a.program = nullptr;  // Set last: made whole or not at all.
    a.name_ids.clear();
    a.name_ids.reserve(names);
    a.info.assign(global_.ops.size(), {});
    name_ids_ = &a.name_ids;
    info_ = &a.info;
    // Every name the program binds or reads gets an id once: the passes below index tables by
    // it rather than hashing the name again at each use.
    for (const ArraySpec& array : global_.arrays) NameId(array.name);
    for (size_t k = 0; k < global_.ops.size(); ++k) {
      for (const std::string& name : global_.ops[k].in) a.info[k].in_ids.push_back(NameId(name));
      for (const std::string& name : global_.ops[k].out) a.info[k].out_ids.push_back(NameId(name));
    }
    for (const OutputSpec& o : global_.outputs) NameId(o.name);
    CountUses();
    if (!explicit_) Hints();
    // An op's global shape reads the mesh only through the axes it names (ApplyLocalOp).
    a.mesh_free = std::none_of(global_.ops.begin(), global_.ops.end(),
                               [](const OpSpec& op) { return Op(op.kind).takes_axis_name; });
    a.explicit_mode = explicit_;
    a.axes = axes_;
    ++a.made;
    a.program = &global_;
  }

  // The id of `name`, a new one if it has none.
  int NameId(const std::string& name) {
    return name_ids_->emplace(name, static_cast<int>(name_ids_->size())).first->second;
  }

  // The value name id `name` is bound to now; an internal error if none (the builder and the
  // loaders check that every name is bound before it is read).
  int Current(int name) const {
    const int id = current_[static_cast<size_t>(name)];
    if (id < 0) throw std::logic_error("internal error: a name is read before it is bound");
    return id;
  }
  int Current(const std::string& name) const { return Current(name_ids_->at(name)); }

  // Binds name id `name` to value `v`.
  void Define(int name, Value v) {
    current_[static_cast<size_t>(name)] = static_cast<int>(values_.size());
    values_.push_back(std::move(v));
  }
  void Define(const std::string& name, Value v) { Define(name_ids_->at(name), std::move(v)); }

  // A name no value of the program has, from `base`.
  std::string Fresh(const std::string& base) {
    for (int k = 1;; ++k) {
      std::string name = base + "_" + std::to_string(k);
      if (!name_ids_->count(name) && fresh_.insert(name).second) return name;
    }
  }

  // Global result shapes of `op` from its operands' global shapes.
  std::vector<Array> InferShapes(const OpSpec& op, const std::vector<const Value*>& in) const {
    std::vector<Array> arrays;
    for (const Value* v : in) arrays.push_back(Array::ShapeOnly(v->dtype, v->shape));
    std::vector<const Array*> ptrs;
    for (const Array& a : arrays) ptrs.push_back(&a);
    try {
      return ApplyLocalOp(op, ptrs, *shape_mesh_, 0);
    } catch (const std::invalid_argument& e) {
      throw SpecError(op.key, NamedOnce(op, e.what()));
    }
  }

  // Global shapes of every op's results, inferred once up front: auto mode's hints read the
  // shapes of values not partitioned yet, and Emit reuses them. Stops quietly at an op whose
  // shapes do not infer (Emit reports it, in program order).
  void InferAllShapes() {
    std::vector<std::optional<Value>> defined(name_ids_->size());  // Per name id.
    for (const ArraySpec& a : global_.arrays) {
      defined[static_cast<size_t>(name_ids_->at(a.name))] = Value{a.shape, a.dtype, {}, ""};
    }
    for (const OpSpec& op : global_.ops) {
      OpInfo& info = Info(op);
      std::vector<const Value*> in;
      for (int name : info.in_ids) {
        const std::optional<Value>& v = defined[static_cast<size_t>(name)];
        if (!v) return;
        in.push_back(&*v);
      }
      info.shapes_known = true;
      std::vector<Shape>& shapes = info.in_shapes;
      for (const Value* v : in) shapes.push_back(v->shape);
      if (op.kind == OpKind::kShardingConstraint || op.kind == OpKind::kReshard ||
          op.kind == OpKind::kDevicePut) {
        defined[static_cast<size_t>(info.out_ids[0])] = *in[0];
        continue;
      }
      std::vector<Array> outs;
      try {
        outs = InferShapes(op, in);
      } catch (const std::exception&) {
        return;
      }
      for (size_t r = 0; r < op.out.size() && r < outs.size(); ++r) {
        defined[static_cast<size_t>(info.out_ids[r])] =
            Value{outs[r].shape(), outs[r].dtype(), {}, ""};
      }
      info.out_shapes = std::move(outs);
      info.outs_known = true;
    }
  }

  // Auto mode's hints, carried backwards from the ops that want them:
  // - a layout: outputs' out_shardings and constraints, carried through ops whose operands
  //   take their result's layout (elementwise ops, constraints);
  // - dimensions to keep whole: those a row op or attention reads whole (its rows, the
  //   sequences), carried through elementwise ops of the same rank, so a producer does not
  //   split what its reader would gather at once (sequence parallelism's q, k and v).
  void Hints() {
    InferAllShapes();
    // Per name id: the hint (a spec of the program) and the dimensions wanted whole (DimSets).
    std::vector<const PartitionSpec*> hint_specs(name_ids_->size());
    std::vector<uint64_t> whole_dims(name_ids_->size());
    for (const OutputSpec& o : global_.outputs) {
      hint_specs[static_cast<size_t>(name_ids_->at(o.name))] = &o.spec;
    }
    for (auto it = global_.ops.rbegin(); it != global_.ops.rend(); ++it) {
      const OpSpec& op = *it;
      const PartitionSpec* want = nullptr;
      if (op.kind == OpKind::kShardingConstraint || op.kind == OpKind::kReshard) {
        want = &op.sharding;
      }
      OpInfo& info = Info(op);
      if (!want) want = hint_specs[static_cast<size_t>(info.out_ids[0])];
      // A shard_map's in_specs are the layouts its inputs are wanted in (a constraint each).
      if (op.kind == OpKind::kShardMap) {
        for (size_t i = 0; i < info.in_ids.size() && i < op.body->arrays.size(); ++i) {
          const PartitionSpec*& hint = hint_specs[static_cast<size_t>(info.in_ids[i])];
          if (!hint) hint = &op.body->arrays[i].sharding;
        }
      }
      info.hint = want;
      const bool passes = Op(op.kind).elementwise || op.kind == OpKind::kShardingConstraint;
      if (want && passes) {
        for (int in : info.in_ids) {
          const PartitionSpec*& hint = hint_specs[static_cast<size_t>(in)];
          if (!hint) hint = want;  // The last reader's hint wins (the first found, backwards).
        }
      }
      if (!info.shapes_known) continue;
      const uint64_t whole = whole_dims[static_cast<size_t>(info.out_ids[0])];
      info.whole = whole;
      const std::vector<std::vector<int>> reads = WholeOperandDims(op, info.in_shapes);
      for (size_t i = 0; i < op.in.size(); ++i) {
        uint64_t& dims = whole_dims[static_cast<size_t>(info.in_ids[i])];
        for (int d : reads[i]) dims |= DimBit(d);
        if (Op(op.kind).elementwise && info.outs_known &&
            info.in_shapes[i].size() == info.out_shapes[0].shape().size()) {
          dims |= whole;
        }
      }
    }
  }

  // The time of moving a value of `shape` and `dtype` from `from` to `to` (0 when equal, or
  // when value `id`'s reshard to `to` was emitted already and will be reused).
  // With `bound`, a lower bound of it: each communicating step's bytes a device must receive
  // over the most bytes per second its links bring in.
  double ReshardCost(const Shape& shape, DType dtype, const ValueSharding& from,
                     const ValueSharding& to, int id = -1, bool bound = false) {
    if (from == to) return 0;
    if (id >= 0 && reshards_.count(ReshardKey(id, to))) return 0;
    std::vector<ReshardStep> steps = PlanReshard(shape, from, to, axes_);
    double total = 0;
    for (const ReshardStep& step : steps) {
      total += bound ? StepLowerBound(step, dtype) : StepTime(step, dtype);
    }
    return total;
  }

  // A lower bound of StepTime: the bytes each device must receive over the device's inbound
  // link capacity. (n - 1)/n of what it ends with for a gather and an all_to_all (the n - 1
  // parts of its result that other members hold, which nothing can combine); for a psum,
  // (n - 1)/n of its block (its reduced result needs every other member's contribution to
  // each element); for a psum_scatter, likewise of the block it ends with. Latency is ignored,
  // so every algorithm on the fluid network takes at least this long.
  double StepLowerBound(const ReshardStep& step, DType dtype) const {
    if (!StepCommunicates(step)) return 0;
    int64_t n = 1;
    for (int a : step.axes) n *= axes_[static_cast<size_t>(a)].size;
    double bytes = static_cast<double>(NumElements(step.local_in)) * DTypeSize(dtype);
    if (step.kind == ReshardStep::Kind::kAllGather) bytes *= static_cast<double>(n);
    if (step.kind == ReshardStep::Kind::kPsumScatter) bytes /= static_cast<double>(n);
    const double received = bytes * static_cast<double>(n - 1) / static_cast<double>(n);
    return received / costs_.device_in_bytes_per_second * 1e12;
  }

  // The time of one reshard step (0 for a local slice).
  double StepTime(const ReshardStep& step, DType dtype) {
    if (!StepCommunicates(step)) return 0;
    const int64_t elements = NumElements(step.local_in);
    if (!costs_.collectives || !costs_.mesh) {
      // Bytes each device sends (ring algorithms): (n-1)/n of the data it ends with.
      int64_t n = 1;
      for (int a : step.axes) n *= axes_[static_cast<size_t>(a)].size;
      const double bytes = static_cast<double>(elements) * DTypeSize(dtype);
      switch (step.kind) {
        case ReshardStep::Kind::kAllGather:
          return bytes * static_cast<double>(n - 1);
        case ReshardStep::Kind::kPsum:
          return 2 * bytes * static_cast<double>(n - 1) / static_cast<double>(n);
        default:
          return bytes * static_cast<double>(n - 1) / static_cast<double>(n);
      }
    }
    // The same step on the same mesh costs the same: ask the model once per distinct step.
    std::vector<int64_t> key = {static_cast<int64_t>(step.kind), static_cast<int64_t>(dtype),
                                elements};
    key.insert(key.end(), step.axes.begin(), step.axes.end());
    if (auto it = step_times_->find(key); it != step_times_->end()) return it->second;
    CollectiveRequest request;
    request.kind = Op(ReshardOp(step, "", "", axes_).kind).collective;
    request.dtype = dtype;
    request.elements = elements;
    request.axes = step.axes;
    const Time longest = costs_.collectives->Estimate(*costs_.mesh, request)->longest();
    return (*step_times_)[key] = static_cast<double>(longest.picoseconds());
  }

  // The time of running `op` locally under `s` (0 without a compute model).
  double ComputeCost(const OpSpec& op, const std::vector<const Value*>& in,
                     const Shape& result_shape, const Strategy& s) {
    if (!costs_.compute) return 0;
    std::vector<Array> arrays;
    for (size_t i = 0; i < in.size(); ++i) {
      arrays.push_back(
          Array::ShapeOnly(in[i]->dtype, LocalShape(in[i]->shape, s.operands[i], axes_)));
    }
    std::vector<const Array*> ptrs;
    for (const Array& a : arrays) ptrs.push_back(&a);
    // The op itself where its attributes are the same locally (most ops): no copy to price it.
    std::optional<OpSpec> made;
    if (LocalDiffers(op, s)) made = LocalOp(op, result_shape, s);
    const OpSpec& local = made ? *made : op;
    std::vector<Array> outs = ApplyLocalOp(local, ptrs, *shape_mesh_, 0);
    std::vector<const Array*> out_ptrs;
    for (const Array& a : outs) out_ptrs.push_back(&a);
    const OpCost cost = LocalOpCost(local, ptrs, out_ptrs);
    const DType dtype = CostDType(local, ptrs, out_ptrs);
    return static_cast<double>(costs_.compute->OpTime(op.kind, cost, dtype).picoseconds());
  }

  // Whether `op` runs under `s` as another op, or with attributes other than its global ones
  // (a shape): what LocalOp changes.
  static bool LocalDiffers(const OpSpec& op, const Strategy& s) {
    return s.local_op || op.kind == OpKind::kReshape || op.kind == OpKind::kBroadcastInDim;
  }

  // `op` (first result of global `result_shape`) with the attributes that depend on global
  // shapes made local under `s`.
  OpSpec LocalOp(const OpSpec& op, const Shape& result_shape, const Strategy& s) const {
    OpSpec local = s.local_op ? *s.local_op : op;
    MakeLocal(local, op, result_shape, s);
    return local;
  }

  // Makes `local`, a copy of `s.local_op` if it has one and else of `op`, LocalOp's op.
  void MakeLocal(OpSpec& local, const OpSpec& op, const Shape& result_shape,
                 const Strategy& s) const {
    if (s.local_op) {  // Another kind on the blocks: the op's values and names, its attributes.
      local.name = op.name;
      local.key = op.key;
      local.in = op.in;
      local.out = op.out;
      local.where = op.where;
      return;
    }
    if (LocalDiffers(op, s)) local.shape = LocalShape(result_shape, s.results[0], axes_);
  }

  // The key of value `id`'s reshard to `to` among those emitted (a value's shape and dtype are
  // its id's).
  using ReshardKeyType = std::tuple<int, std::vector<std::vector<int>>, std::vector<int>>;
  static ReshardKeyType ReshardKey(int id, const ValueSharding& to) {
    return {id, to.dims, to.partial};
  }

  // Emits `op` (kind and attributes set) on value `v`'s local block, into a fresh name it
  // returns; `reason` is the table's (empty for a local op), a string or a callable giving it.
  template <typename Why>
  std::string EmitLocal(OpSpec op, const Value& v, const Why& reason) {
    const std::string out = Fresh(v.local);
    op.in = {v.local};
    op.out = {out};
    op.name = out;
    op.key = "program";
    result_.program.ops.push_back(std::move(op));
    Describe(reason, [&] { return FormatType(v.dtype, v.shape, v.sharding, axes_); });
    return out;
  }

  // Appends the last emitted op's reason and type: `why()` and `type()`, or empty strings
  // when the result describes nothing (PartitionCosts::describe). `why` may be a string.
  template <typename Why, typename Type>
  void Describe(const Why& why, const Type& type) {
    if (!costs_.describe) {
      result_.reasons.emplace_back();
      result_.types.emplace_back();
      return;
    }
    if constexpr (std::is_invocable_v<const Why&>) {
      result_.reasons.push_back(why());
    } else {
      result_.reasons.push_back(why);
    }
    result_.types.push_back(type());
  }

  static std::string Joined(const std::vector<std::string>& names) {
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : ",") + n;
    return text;
  }

  // Emits the steps taking value `v` to `to`; returns the local name holding it. A value
  // resharded once to a layout is reused by later ops of the same pass that want the same
  // layout (a backward pass makes its own).
  // `reason()` gives the reason (made only where a step is emitted and described).
  template <typename Why>
  std::string EmitReshard(int id, const ValueSharding& to, const Why& reason,
                          const std::string& final_name = "") {
    const Value& v = values_[static_cast<size_t>(id)];
    if (v.sharding == to && final_name.empty()) return v.local;
    const ReshardKeyType key = ReshardKey(id, to);
    if (final_name.empty()) {
      if (auto it = reshards_.find(key); it != reshards_.end()) return it->second;
    }
    std::vector<ReshardStep> steps = PlanReshard(v.shape, v.sharding, to, axes_);
    if (v.host && !steps.empty()) {
      throw SpecError(key_, "'" + v.local + "' is in host memory as " +
                                FormatType(v.dtype, v.shape, v.sharding, axes_) +
                                ", and host memory is not resharded (" + reason() +
                                "): move_to_device it first, or reshard it before move_to_host");
    }
    std::string name = v.local;
    ValueSharding cur = v.sharding;
    for (size_t k = 0; k < steps.size(); ++k) {
      const bool last = k + 1 == steps.size();
      const std::string out = last && !final_name.empty() ? final_name : Fresh(v.local);
      OpSpec op = ReshardOp(steps[k], name, out, axes_);
      op.name = out;
      op.key = "program";
      result_.program.ops.push_back(std::move(op));
      Describe([&] { return reason() + ": " + DescribeStep(steps[k], axes_); },
               [&] { return FormatType(v.dtype, v.shape, to, axes_); });
      name = out;
    }
    if (final_name.empty()) reshards_[key] = name;
    return name;
  }

  // Host memory holds data only: only move_to_device reads a value there (lowering checks the
  // same); refused at the op, before any reshard of the value is emitted for it.
  void CheckMemoryKinds(const OpSpec& op, const std::vector<int>& in_ids) const {
    for (size_t i = 0; i < op.in.size(); ++i) {
      const int id = current_[static_cast<size_t>(in_ids[i])];
      if (id < 0 || !values_[static_cast<size_t>(id)].host) continue;
      const std::string error = CheckMemoryKind(op, op.in[i], /*in_host=*/true);
      if (!error.empty()) throw SpecError(op.key + ".in", error);
    }
  }

  void Emit(const OpSpec& op) {
    key_ = op.key;
    const OpInfo& info = Info(op);
    CheckMemoryKinds(op, info.in_ids);
    if (op.kind == OpKind::kShardingConstraint || op.kind == OpKind::kReshard) {
      const int id = Current(info.in_ids[0]);
      Value v = values_[static_cast<size_t>(id)];
      const ValueSharding to = Layout(op.sharding, v.shape, op.key + ".sharding");
      if (explicit_ && op.kind == OpKind::kShardingConstraint && !(Reduced(v.sharding) == to)) {
        throw SpecError(op.key, "sharding_constraint: " + op.in[0] + " is " +
                                    FormatType(v.dtype, v.shape, v.sharding, axes_) + ", not " +
                                    FormatPartitionSpec(op.sharding) +
                                    "; in explicit mode change a sharding with reshard");
      }
      Value out = v;
      out.local = EmitReshard(id, to, [&] {
        return std::string(OpKindName(op.kind)) + " " + op.name + " to " +
               FormatPartitionSpec(op.sharding);
      });
      out.sharding = to;
      Define(info.out_ids[0], std::move(out));
      return;
    }
    if (op.kind == OpKind::kDevicePut) {
      EmitDevicePut(op);
      return;
    }
    if (op.kind == OpKind::kShardMap) {
      EmitShardMap(op);
      return;
    }
    if (op.kind == OpKind::kCustomCall) {
      throw SpecError(op.key,
                      "custom_call has no sharding rule: its cost is per device, so "
                      "write it in a mode: manual program");
    }
    ShardingRule rule = FindShardingRule(op.kind);
    if (!rule) {
      throw SpecError(op.key, std::string(OpKindName(op.kind)) +
                                  " has no sharding rule yet (partitioning it is not supported)");
    }
    SumSharedPartials(op, info.in_ids, info.uses);
    std::vector<const Value*> in;
    std::vector<int> ids;
    for (int name : info.in_ids) {
      ids.push_back(Current(name));
      in.push_back(&values_[static_cast<size_t>(ids.back())]);
    }
    // The shapes the analysis inferred up front where it could, else inferred now.
    std::vector<Array> inferred;
    const std::vector<Array>& outs =
        info.outs_known ? info.out_shapes : (inferred = InferShapes(op, in));
    if (const Strategy* kept = FindChoice(op, info, in, ids)) {
      EmitStrategy(op, info, in, ids, outs, *kept);
      return;
    }
    RuleContext ctx{op, {}, {}, {}, {}, axes_, std::nullopt};
    for (const Value* v : in) {
      ctx.in_shapes.push_back(v->shape);
      ctx.in_dtypes.push_back(v->dtype);
      ctx.in.push_back(v->sharding);
    }
    for (const Array& a : outs) ctx.out_shapes.push_back(a.shape());
    if (info.hint) {
      try {
        ctx.preferred = FromSpec(*info.hint, static_cast<int>(ctx.out_shapes[0].size()), axes_);
        LocalShape(ctx.out_shapes[0], *ctx.preferred, axes_);
      } catch (const std::invalid_argument&) {
        ctx.preferred.reset();  // A hint that does not fit this value is no hint.
      }
    }
    std::vector<Strategy> candidates;
    try {
      candidates = rule(ctx, explicit_);
    } catch (const RuleError& e) {
      throw SpecError(op.key, std::string(OpKindName(op.kind)) + " " + op.name + ": " + e.what());
    }
    // Drop candidates whose layouts do not divide the shapes.
    std::vector<Strategy> valid;
    for (Strategy& s : candidates) {
      bool ok = true;
      try {
        for (size_t i = 0; i < in.size(); ++i) LocalShape(in[i]->shape, s.operands[i], axes_);
        for (size_t r = 0; r < outs.size(); ++r) LocalShape(outs[r].shape(), s.results[r], axes_);
      } catch (const std::invalid_argument&) {
        ok = false;
      }
      if (ok) valid.push_back(std::move(s));
    }
    if (valid.empty()) {
      throw SpecError(op.key, std::string(OpKindName(op.kind)) + " " + op.name +
                                  ": no layout of its operands divides their shapes");
    }
    size_t best = 0;
    if (!explicit_ && valid.size() > 1) {
      // Each candidate's cost (compute, its operands' reshards, its result's later reshard),
      // exact or a lower bound; candidates are priced exactly in order of their bounds until
      // the next bound exceeds the best exact cost (ties: the earlier candidate, as pricing
      // every one in order would pick).
      // A candidate's compute time is the same in its bound and its exact cost: found once.
      std::vector<std::optional<double>> compute(valid.size());
      auto cost_of = [&](size_t c, bool bound) {
        if (!compute[c]) compute[c] = ComputeCost(op, in, outs[0].shape(), valid[c]);
        double cost = *compute[c];
        for (size_t i = 0; i < in.size(); ++i) {
          cost += ReshardCost(in[i]->shape, in[i]->dtype, in[i]->sharding, valid[c].operands[i],
                              ids[i], bound);
        }
        // The result's later reshard: to the layout wanted later, or else out of partial
        // sums (what any nonlinear consumer needs first).
        const ValueSharding& result = valid[c].results[0];
        ValueSharding later = ctx.preferred ? *ctx.preferred : Reduced(result);
        if (!ctx.preferred) {
          for (int d = 0; d < static_cast<int>(later.dims.size()); ++d) {
            if (info.whole & DimBit(d)) later = Unsplit(later, d);
          }
        }
        return cost + ReshardCost(outs[0].shape(), outs[0].dtype(), result, later, -1, bound);
      };
      std::vector<std::pair<double, size_t>> bounds;
      for (size_t c = 0; c < valid.size(); ++c) {
        bounds.push_back({costs_.device_in_bytes_per_second > 0 ? cost_of(c, true) : 0.0, c});
      }
      std::stable_sort(bounds.begin(), bounds.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      double best_cost = std::numeric_limits<double>::infinity();
      for (const auto& [bound, c] : bounds) {
        if (bound > best_cost) break;
        const double cost = cost_of(c, false);
        if (cost < best_cost || (cost == best_cost && c < best)) {
          best_cost = cost;
          best = c;
        }
      }
    }
    if (choices_) KeepChoice(info, in, ids, valid[best]);
    EmitStrategy(op, info, in, ids, outs, valid[best]);
  }

  // The choice kept for `op` (its operands `in`, value ids `ids`) as it stands now, or null.
  const Strategy* FindChoice(const OpSpec& op, const OpInfo& info,
                             const std::vector<const Value*>& in, const std::vector<int>& ids) {
    if (!choices_) return nullptr;
    FnvHash hash;
    hash.Mix(static_cast<uint64_t>(op.kind));
    for (size_t i = 0; i < in.size(); ++i) {
      for (int64_t d : in[i]->shape) hash.Mix(static_cast<uint64_t>(d));
      for (const std::vector<int>& dim : in[i]->sharding.dims) {
        hash.Mix(dim.size());
        for (int a : dim) hash.Mix(static_cast<uint64_t>(a));
      }
      hash.Mix(in[i]->sharding.partial.size());
    }
    hash.Mix((info.hint != nullptr) + 2 * info.whole);
    choice_hash_ = hash.value();
    const auto bucket = choices_->entries.find(choice_hash_);
    if (bucket == choices_->entries.end()) return nullptr;
    for (PartitionChoices::Impl::Entry& e : bucket->second) {
      const bool same_hint = info.hint ? e.hint == *info.hint : !e.hint;
      if (!same_hint || e.whole != info.whole || !SameOperands(e.operands, in, ids)) {
        continue;
      }
      // The op's attributes: the entry's op with this op's names is this op.
      PartitionChoices::Impl::SetNames(e.op, op);
      const bool same = e.op == op;
      PartitionChoices::Impl::ClearNames(e.op);
      if (same) {
        ++choices_->reused;
        return &e.chosen;
      }
    }
    return nullptr;
  }

  // Whether `operands` are the values `in` (ids `ids`) as they stand now.
  bool SameOperands(const std::vector<ChoiceOperand>& operands, const std::vector<const Value*>& in,
                    const std::vector<int>& ids) const {
    if (operands.size() != in.size()) return false;
    for (size_t i = 0; i < in.size(); ++i) {
      const ChoiceOperand& o = operands[i];
      const Value& v = *in[i];
      if (o.shape != v.shape || o.dtype != v.dtype || o.host != v.host ||
          !(o.sharding == v.sharding)) {
        return false;
      }
      auto it = reshards_.lower_bound({ids[i], {}, {}});
      for (const ValueSharding& r : o.resharded) {
        if (it == reshards_.end() || std::get<0>(it->first) != ids[i] ||
            std::get<1>(it->first) != r.dims || std::get<2>(it->first) != r.partial) {
          return false;
        }
        ++it;
      }
      if (it != reshards_.end() && std::get<0>(it->first) == ids[i]) return false;
    }
    return true;
  }

  // Keeps `chosen` for the op FindChoice last looked up (its operands `in`, value ids `ids`).
  void KeepChoice(const OpInfo& info, const std::vector<const Value*>& in,
                  const std::vector<int>& ids, const Strategy& chosen) {
    PartitionChoices::Impl::Entry e;
    e.op = global_.ops[static_cast<size_t>(&info - info_->data())];
    PartitionChoices::Impl::ClearNames(e.op);
    for (size_t i = 0; i < in.size(); ++i) {
      ChoiceOperand& o = e.operands.emplace_back();
      o.shape = in[i]->shape;
      o.dtype = in[i]->dtype;
      o.sharding = in[i]->sharding;
      o.host = in[i]->host;
      for (auto it = reshards_.lower_bound({ids[i], {}, {}});
           it != reshards_.end() && std::get<0>(it->first) == ids[i]; ++it) {
        o.resharded.push_back(ValueSharding{std::get<1>(it->first), std::get<2>(it->first)});
      }
    }
    if (info.hint) e.hint = *info.hint;
    e.whole = info.whole;
    e.chosen = chosen;
    choices_->entries[choice_hash_].push_back(std::move(e));
    ++choices_->size;
  }

  // Emits `op` (its operands `in`, value ids `ids`, global results `outs`) under strategy `s`.
  void EmitStrategy(const OpSpec& op, const OpInfo& info, const std::vector<const Value*>& in,
                    const std::vector<int>& ids, const std::vector<Array>& outs,
                    const Strategy& s) {
    // Operands resharded as the strategy needs (emitted first, before the op).
    std::vector<std::string> local_in(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i]->sharding == s.operands[i]) {
        local_in[i] = in[i]->local;  // As it is: no reshard (and no reason to format).
        continue;
      }
      local_in[i] = EmitReshard(ids[i], s.operands[i], [&] {
        return std::string(OpKindName(op.kind)) + " " + op.name + " (" + s.why + ") needs " +
               op.in[i] + " as " + FormatType(in[i]->dtype, in[i]->shape, s.operands[i], axes_);
      });
    }
    // The op made in place, at the program's end: no copy of it moved there.
    OpSpec& local = result_.program.ops.emplace_back(s.local_op ? *s.local_op : op);
    MakeLocal(local, op, outs[0].shape(), s);
    for (size_t i = 0; i < in.size(); ++i) local.in[i] = std::move(local_in[i]);
    Describe("", [&] { return FormatType(outs[0].dtype(), outs[0].shape(), s.results[0], axes_); });
    for (size_t r = 0; r < op.out.size(); ++r) {
      Value v{outs[r].shape(), outs[r].dtype(), s.results[r], op.out[r]};
      v.host = op.kind == OpKind::kMoveToHost;
      if (!s.result_max_over.empty()) {
        OpSpec pmax;
        pmax.kind = OpKind::kPmax;
        pmax.axis_name = AxisNames(s.result_max_over, axes_);
        const std::vector<std::string> over = pmax.axis_name;
        v.local = EmitLocal(std::move(pmax), v, [&] {
          return std::string(OpKindName(op.kind)) + " " + op.name + " (" + s.why +
                 ") takes the maximum over " + Joined(over);
        });
      }
      if (s.result_scale != 1) {
        OpSpec scale;
        scale.kind = OpKind::kMul;
        scale.scalar = s.result_scale;
        v.local = EmitLocal(std::move(scale), v, "");
      }
      Define(info.out_ids[r], std::move(v));
    }
    // Explicit mode's types hold no partial sums: a contraction over a split dimension is
    // summed right away (JAX inserts that all-reduce itself).
    if (explicit_) {
      for (int name : info.out_ids) {
        const int id = Current(name);
        Value v = values_[static_cast<size_t>(id)];
        if (v.sharding.partial.empty()) continue;
        const ValueSharding to = Reduced(v.sharding);
        const std::string reduced = EmitReshard(
            id, to,
            [&] {
              return std::string(OpKindName(op.kind)) + " " + op.name +
                     " sums its partial products";
            },
            v.local);
        v.sharding = to;
        v.local = reduced;
        Define(name, std::move(v));
      }
    }
  }

  void EmitOutput(const OutputSpec& o) {
    key_ = o.key;
    const int id = Current(o.name);
    const Value& v = values_[static_cast<size_t>(id)];
    ValueSharding to = Layout(o.spec, v.shape, o.key);
    if (o.unreduced) {
      // Still partial over the axes the spec does not split (over one it splits, the sum is
      // scattered as the spec asks).
      const std::vector<int> split = SplitAxes(to);
      for (int a : v.sharding.partial) {
        if (std::find(split.begin(), split.end(), a) == split.end()) to.partial.push_back(a);
      }
    }
    if (v.sharding == to && v.local == o.name) return;
    if (v.sharding == to) {
      // Same layout under another local name: a free relabel to the output's name.
      OpSpec op;
      op.kind = OpKind::kReshape;
      op.in = {v.local};
      op.out = {o.name};
      op.name = o.name;
      op.key = "program";
      op.shape = LocalShape(v.shape, to, axes_);
      result_.program.ops.push_back(std::move(op));
      Describe([&] { return "output " + o.name + " named"; },
               [&] { return FormatType(v.dtype, v.shape, to, axes_); });
    } else {
      EmitReshard(
          id, to, [&] { return "output " + o.name + " as " + FormatPartitionSpec(o.spec); },
          o.name);
    }
  }

  const ProgramSpec& global_;
  const std::vector<size_t> pass_starts_;  // Where each backward pass starts and ends.
  PartitionCosts costs_;
  std::vector<MeshAxis> axes_;
  bool explicit_;
  std::optional<Mesh> own_shape_mesh_;  // Without kept choices: the shape mesh made here.
  const Mesh* shape_mesh_ = nullptr;    // The mesh shapes are inferred on (Impl::ShapeMesh).
  std::vector<Value> values_;
  // Every name of the program (viewing the global program's) -> its id.
  // The analysis's tables (PartitionAnalysis::Impl): name ids, and per op what is known of it.
  std::unordered_map<std::string_view, int>* name_ids_ = nullptr;
  std::vector<OpInfo>* info_ = nullptr;
  std::unique_ptr<PartitionAnalysis> own_analysis_;  // Without one given: this partition's.
  std::vector<int> current_;               // Per name id: the value it is bound to now, or -1.
  std::unordered_set<std::string> fresh_;  // The names Fresh gave (the program's: name_ids_).
  std::map<ReshardKeyType, std::string> reshards_;
  std::unordered_map<std::string, std::string> mesh_of_;  // With several meshes: each name's mesh.
  std::string key_;  // The run-file key of the op or output being emitted (errors locate there).

  OpInfo& Info(const OpSpec& op) { return (*info_)[static_cast<size_t>(&op - global_.ops.data())]; }
  // StepTime by (kind, dtype, size, axes): own_step_times_, or the choices' (shared by the
  // partitions they serve).
  std::map<std::vector<int64_t>, double> own_step_times_;
  std::map<std::vector<int64_t>, double>* step_times_ = &own_step_times_;
  PartitionChoices::Impl* choices_ = nullptr;  // Auto mode's kept choices, or null.
  uint64_t choice_hash_ = 0;                   // FindChoice's hash of the op looked up.
  PartitionResult result_;
};

}  // namespace

void Reorder(PartitionResult& result, const std::vector<size_t>& order) {
  const size_t n = result.program.ops.size();
  if (order.size() != n) throw std::logic_error("internal error: a reordering drops or adds ops");
  result.reasons.resize(n);
  result.types.resize(n);
  // In place, cycle by cycle: each op moves once (an op that keeps its place not at all), and
  // no second list of ops is made.
  const bool origins = !result.origin.empty();
  if (origins && result.origin.size() != n) {
    throw std::logic_error("internal error: ops numbered for another program");
  }
  std::vector<char> placed(n, 0);
  for (size_t k = 0; k < n; ++k) placed[k] = order[k] == k;
  for (size_t start = 0; start < n; ++start) {
    if (placed[start]) continue;
    OpSpec op = std::move(result.program.ops[start]);
    std::string reason = std::move(result.reasons[start]);
    std::string type = std::move(result.types[start]);
    const size_t origin = origins ? result.origin[start] : 0;
    size_t k = start;
    for (;;) {
      placed[k] = 1;
      const size_t from = order[k];
      if (from >= n || placed[from] != (from == start)) {
        throw std::logic_error("internal error: a reordering is not a permutation of the ops");
      }
      if (from == start) break;
      result.program.ops[k] = std::move(result.program.ops[from]);
      result.reasons[k] = std::move(result.reasons[from]);
      result.types[k] = std::move(result.types[from]);
      if (origins) result.origin[k] = result.origin[from];
      k = from;
    }
    result.program.ops[k] = std::move(op);
    result.reasons[k] = std::move(reason);
    result.types[k] = std::move(type);
    if (origins) result.origin[k] = origin;
  }
}

void KeepOrigin(PartitionResult& result) {
  result.origin.resize(result.program.ops.size());
  std::iota(result.origin.begin(), result.origin.end(), size_t{0});
}

void RestoreOrder(PartitionResult& result) {
  // The op now at k was op origin[k]: back there, op j is the one now at the k with origin j.
  std::vector<size_t> order(result.origin.size());
  for (size_t k = 0; k < order.size(); ++k) order[result.origin[k]] = k;
  Reorder(result, order);
  result.origin.clear();
}

PartitionResult Partition(const ProgramSpec& global, const PartitionCosts& costs) {
  if (global.mode == ProgramMode::kManual) {
    throw SpecError("mode", "the program is already a shard_map body (mode: manual)");
  }
  // Reverse mode first: the backward pass is partitioned like any other ops.
  std::vector<size_t> pass_starts;
  const ProgramSpec expanded = ExpandGrads(global, &pass_starts);
  return PartitionExpanded(expanded, std::move(pass_starts), costs);
}

PartitionResult PartitionExpanded(const ProgramSpec& expanded, std::vector<size_t> pass_starts,
                                  const PartitionCosts& costs, const std::vector<MeshAxis>* sizes,
                                  PartitionChoices* choices, PartitionAnalysis* analysis) {
  if (expanded.mode == ProgramMode::kManual) {
    throw SpecError("mode", "the program is already a shard_map body (mode: manual)");
  }
  const std::vector<MeshAxis>& axes = sizes ? *sizes : expanded.mesh_axes;
  bool same_names = axes.size() == expanded.mesh_axes.size();
  for (size_t a = 0; same_names && a < axes.size(); ++a) {
    same_names = axes[a].name == expanded.mesh_axes[a].name;
  }
  if (!same_names) {
    throw std::logic_error("internal error: a program is partitioned over other mesh axes");
  }
  PartitionResult result =
      Partitioner(expanded, axes, costs, std::move(pass_starts), choices, analysis).Run();
  // Outputs keep the global program's out specs.
  result.program.outputs = expanded.outputs;
  return result;
}

PartitionResult PartitionOnMachine(const ProgramSpec& global, const Machine& machine,
                                   const Mesh& mesh) {
  NetworkCollectiveModel network(machine);
  CachedCollectiveModel cache(network);
  return Partition(global, PartitionCosts{&mesh, &cache, machine.compute_model(),
                                          DeviceInBytesPerSecond(machine), &machine});
}

double DeviceInBytesPerSecond(const Machine& machine) {
  return machine.device_in_bandwidth().bytes_per_second();
}

}  // namespace shardsim::planner
