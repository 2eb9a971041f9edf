// A shard_map program: the validated structs the run file's mesh/arrays/program/outputs
// sections become. Models take these, never YAML.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/partition_spec.h"

namespace shardsim {

struct ProgramSpec;

// How a global array's values are made (SPEC "init").
struct InitSpec {
  enum class Kind { kZeros, kOnes, kArange, kNormal, kUniform, kValue, kFile };
  Kind kind = Kind::kZeros;    // Which init.
  uint64_t seed = 0;           // normal / uniform.
  std::vector<double> values;  // value: flat, row-major (doubles: every i32 is exact).
  std::string file;            // file: a .npy path (resolved against the run file's folder).
  int64_t modulus = 0;         // arange: element i holds i mod modulus (0: i itself).
};

// One global array given to the shard_map (`arrays:`).
struct ArraySpec {
  std::string name;           // Its name in the program.
  Shape shape;                // Global shape.
  DType dtype = DType::kF32;  // Element type.
  InitSpec init;              // How values are made.
  PartitionSpec sharding;     // in_spec.
  std::string mesh;           // With several meshes: the mesh it lives on (`mesh:`).
  // A shard_map body's array that a run file declares by its in_spec alone: its shape and
  // dtype are those of the region's input it stands for, known once the program is typed.
  bool typed_by_input = false;
};

// The ops of SPEC's "Ops" table.
enum class OpKind {
  kPsum,
  kPmean,
  kPmax,
  kPmin,
  kPsumScatter,
  kAllGather,
  kAllToAll,
  kPpermute,
  kAxisIndex,
  kMatmul,
  kEinsum,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kRelu,
  kGelu,
  kExp,
  kTanh,
  kNeg,
  kReshape,
  kTranspose,
  kConcatenate,
  kSplit,
  kSlice,
  kAllgatherMatmul,
  kMatmulReduceScatter,
  // Internal ops that collective matmuls lower into (not written in run files):
  // kDynamicSlice takes block (block_scale * index + block_offset) mod sections of its input
  // along `axis`, index being axis_index over axis_name (jax.lax.dynamic_slice with an
  // axis_index-dependent start); kDynamicConcat concatenates its N inputs along `axis`,
  // input s landing at block (index + block_scale * s + block_offset) mod N (the
  // dynamic_update_slice loop of the seed notebook's collective matmuls).
  kDynamicSlice,
  kDynamicConcat,
  // Elementwise ops of SPEC's list beyond the first five.
  kSilu,
  kLog,
  kSqrt,
  kRsqrt,
  kSquare,
  kAbs,
  kSin,
  kCos,
  // jax.lax.convert_element_type: a cast to `dtype`.
  kConvert,
  // An opaque kernel for timing (XLA's custom-call): costs `flops` and `bytes`, makes a `dtype`
  // array of `shape` holding zeros. For model builders that price a kernel they do not spell
  // out (a fused attention, say); its values carry no meaning.
  kCustomCall,
  // Global programs only (mode: explicit | auto): jax.lax.with_sharding_constraint and
  // jax.sharding.reshard, each with `sharding`. Partitioning removes them.
  kShardingConstraint,
  kReshard,
  // Global programs only: jax.grad. Reverse mode over the ops before it, from the scalar `of`
  // to each value of `wrt`, one output per wrt entry. planner::ExpandGrads replaces it with
  // ordinary ops before partitioning.
  kGrad,
  // Ops reverse mode emits (collectives/grad_ops.h), also written in run files of any mode:
  // jnp.full_like(x, fill_value); jax.lax.broadcast_in_dim(x, shape, broadcast_dimensions);
  // jnp.pad with zeros along one axis (low before, high after); unary_grad, g * f'(x) for the
  // elementwise op `fn`; max_grad, g times where a is the maximum of (a, b) (half at ties).
  kFullLike,
  kBroadcastInDim,
  kPad,
  kUnaryGrad,
  kMaxGrad,
  // Array ops of global programs, local ops too (collectives/nn_ops.h): the reductions
  // jnp.sum, jnp.mean and jnp.max (`reduce_max`; `{op: max, in: x, axis: ...}` reads as it),
  // jax.nn.softmax and log_softmax, Flax's RMSNorm and LayerNorm, jnp.take, the mean of
  // optax.softmax_cross_entropy_with_integer_labels, jax.lax.top_k,
  // jax.nn.dot_product_attention and jax.nn.one_hot; moe_route, the token routing of a
  // mixture-of-experts layer with a capacity (collectives/moe_route.h).
  kSum,
  kMean,
  kReduceMax,
  kSoftmax,
  kLogSoftmax,
  kRmsNorm,
  kLayerNorm,
  kTake,
  kCrossEntropy,
  kTopK,
  kAttention,
  kOneHot,
  kMoeRoute,
  // The derivative ops of the array ops above (collectives/grad_ops.h), each the cotangent of
  // the forward op's input(s) from its output's cotangent g: reduce_max_grad (g split among the
  // maxima), softmax_grad and log_softmax_grad (from the forward output y), rms_norm_grad and
  // layer_norm_grad ([dx, g * xhat]), take_grad (a scatter-add into the table's rows),
  // cross_entropy_grad, top_k_grad (a scatter along the last axis), attention_grad ([dq, dk,
  // dv]).
  kReduceMaxGrad,
  kSoftmaxGrad,
  kLogSoftmaxGrad,
  kRmsNormGrad,
  kLayerNormGrad,
  kTakeGrad,
  kCrossEntropyGrad,
  kTopKGrad,
  kAttentionGrad,
  // jax.lax.ragged_all_to_all (collectives/ragged_all_to_all.h): inputs [operand, output,
  // input_offsets, send_sizes, output_offsets, recv_sizes], run as point-to-point messages of
  // the sizes its index data gives.
  kRaggedAllToAll,
  // jax.lax.ragged_dot (collectives/ragged_dot.h): [lhs, rhs, group_sizes], a grouped matmul.
  kRaggedDot,
  // ragged_dot's cotangent for rhs (collectives/ragged_dot.h): [lhs, g, group_sizes] -> per
  // group e, lhs_e^T g_e, [groups, k, n] (`size`: the groups).
  kRaggedDotRhsGrad,
  // jnp.take on one device's block of a table split along `axis` over axis_name (XLA's
  // partitioned gather): the ids index the whole table (`size` long along axis); ids in this
  // block's range take its rows, others give zeros (an id outside the table gives take's fill on
  // the first block only), so a psum over axis_name gives jnp.take of the whole table. The
  // partitioner emits it for a vocabulary-split embedding.
  kTakeShard,
  // jax.device_put between disjoint meshes (`meshes:`): the value, laid out by `in_sharding` on
  // its mesh, becomes the same global array laid out by `sharding` on mesh `mesh`, moved as
  // point-to-point transfers (collectives/device_put.h). Global programs write only `sharding`
  // and `mesh`; the partitioner fills in_sharding.
  kDevicePut,
  // Host offload (jax.device_put to memory_kind "pinned_host" and back; XLA's MoveToHost and
  // MoveToDevice): each device copies its block between its HBM and its host's memory over
  // the host link, on a DMA queue of that direction beside the compute stream. The value and
  // its layout are unchanged; a value in host memory takes no HBM.
  kMoveToHost,
  kMoveToDevice,
  // jax.shard_map inside a global program (mode: explicit | auto): OpSpec::body, a shard_map
  // body (mode: manual) on the program's mesh, runs on every device with the blocks of `in`
  // laid out by its arrays' shardings (the in_specs: body.arrays[i] stands for in[i], of its
  // global shape and dtype), and its outputs, assembled by their out specs, are `out`
  // (collectives/shard_map.h). The partitioner reshards each input to its in_spec and inlines
  // the body; no derivative rule (grad through it is refused).
  kShardMap,
  // jnp.cumsum along `axis` (norm_axis; default the last): inclusive prefix sums, in the input's
  // dtype (i32 wraps as JAX's int32 does); with `reverse`, suffix sums (lax.cumsum's). jnp.argsort
  // along `axis` (default the last), ascending and stable: the i32 indices that sort each row,
  // equal values in index order.
  kCumsum,
  kArgsort,
  // jnp.repeat(a, repeats, axis, total_repeat_length): each slice of `a` along `axis` repeated
  // as many times as the i32 vector `repeats` says, in order, the result cut or filled to
  // `total_repeat_length` slices along the axis (filled with a's last slice, as JAX's fill).
  kRepeat,
};

// The SPEC name of an op ("psum", "all_gather", ...).
const char* OpKindName(OpKind kind);
// Parses an op name; nullopt if unknown.
std::optional<OpKind> ParseOpKind(const std::string& name);
// All op names, for "did you mean" suggestions.
std::vector<std::string> OpKindNames();
// Whether the op communicates between devices.
bool IsCollective(OpKind kind);

// One op of the program, with JAX's parameter names. Fields an op does not use keep their
// defaults.
struct OpSpec {
  OpKind kind = OpKind::kAdd;             // Which op.
  std::string name;                       // Shown in the trace and summary ("op3" by default).
  std::string key;                        // Run-file key for errors: "program.3".
  std::vector<std::string> in;            // Input array names.
  std::vector<std::string> out;           // Output array names (split: several).
  std::vector<std::string> axis_name;     // Collectives: mesh axes, in the op's order.
  int64_t axis = 0;                       // all_gather axis; concatenate/split/slice axis.
  int64_t scatter_dimension = 0;          // psum_scatter, matmul_reduce_scatter.
  int64_t split_axis = 0;                 // all_to_all.
  int64_t concat_axis = 0;                // all_to_all.
  bool tiled = false;                     // psum_scatter, all_gather, all_to_all.
  std::vector<std::pair<int, int>> perm;  // ppermute: (source, destination) linear indices.
  std::optional<int> shift;               // ppermute: ring shift along the named tuple.
  std::optional<double> scalar;           // Binary ops with one array input.
  std::string spec;                       // einsum: "bd,df->bf".
  Shape shape;                            // reshape.
  // transpose (empty: reverse); sum, mean, reduce_max: the axes reduced (`axis`; empty: all).
  std::vector<int64_t> axes;
  int64_t sections = 0;        // split.
  int64_t start = 0;           // slice.
  int64_t size = 0;            // slice.
  std::string algorithm;       // Collective algorithm, "" for the run's default.
  std::string gather = "rhs";  // allgather_matmul: lhs | rhs.
  // Collective matmuls: blocking | unidirectional | bidirectional.
  std::string variant = "blocking";
  int64_t block_scale = 1;  // Internal dynamic ops: see OpKind.
  // Internal: a view or an in-place write XLA fuses away (the halves a collective matmul
  // slices off, the blocks it writes into its output): it takes no compute time.
  bool fused = false;
  int64_t block_offset = 0;     // Internal dynamic ops: see OpKind.
  std::string dtype;            // convert, custom_call: the result's dtype name.
  bool saturate = false;        // convert: clamp to the target's finite range first.
  std::optional<double> flops;  // custom_call: floating-point operations it costs.
  std::optional<double> bytes;  // custom_call: bytes of HBM traffic it costs.
  // Where the op runs: only on mesh positions whose coordinate along each named axis is the
  // given index (`where: {stage: 1}`: the devices of pipeline stage 1). Empty: everywhere.
  // This is how devices run different op sequences (pipeline stages, disjoint sub-meshes).
  std::vector<std::pair<std::string, int>> where;
  // With several meshes: the mesh the op runs on (device_put: the destination). Run files may
  // leave it out where the inputs tell; programs that reach lowering name it on every op.
  std::string mesh;
  // sharding_constraint, reshard: the sharding asked for; device_put: the destination's.
  PartitionSpec sharding;
  PartitionSpec in_sharding;  // device_put in a shard_map body: the input's layout on its mesh.
  // device_put that reverse mode made (global programs): lands on the mesh of this value, laid
  // out as it is (JAX's transpose of device_put returns the cotangent to its primal's layout);
  // `sharding` and `mesh` then stay empty and the partitioner fills them.
  std::string like;
  std::string of;                    // grad: the scalar value differentiated.
  std::vector<std::string> wrt;      // grad: the values it is differentiated with respect to.
  std::optional<double> fill_value;  // full_like: the value of every element.
  std::vector<int64_t> broadcast_dimensions;  // broadcast_in_dim: output dim of each input dim.
  int64_t low = 0;                            // pad: zeros before, along `axis`.
  int64_t high = 0;                           // pad: zeros after, along `axis`.
  std::string fn;                             // unary_grad: the elementwise op differentiated.
  bool keepdims = false;                      // sum, mean, reduce_max: keep reduced axes as size 1.
  bool reverse = false;                       // cumsum: sums from the end (lax.cumsum's reverse).
  // softmax, log_softmax, rms_norm, layer_norm: the axis normalized over (their `axis`, whose
  // default is the last; `axis` itself is take's and the data-movement ops').
  int64_t norm_axis = -1;
  std::optional<double> eps;  // rms_norm, layer_norm: added to the variance (unset: Flax's).
  int64_t k = 0;              // top_k: how many of the largest values to keep.
  bool causal = true;         // attention: each query sees only keys up to its position.
  // attention, attention_grad: flash (scores stay on chip) | unfused (materialized in HBM).
  std::string kernel = "flash";
  int64_t num_classes = 0;         // one_hot: the length of the new last axis.
  int64_t experts = 0;             // moe_route: the experts tokens are routed to.
  int64_t capacity = 0;            // moe_route: the slots of each expert per group.
  std::string priority = "token";  // moe_route: token | choice (which assignment fills first).
  // ragged_dot, ragged_dot_rhs_grad: the rows their groups are taken to fill where no data says
  // (timing-only runs; 0: every row of lhs). With data, the group sizes say. ragged_all_to_all:
  // the rows each pair is taken to move without data (0: a balanced routing).
  int64_t expected_rows = 0;
  // repeat: the result's length along `axis` (jnp.repeat's total_repeat_length; static, as jit
  // needs).
  int64_t total_repeat_length = 0;
  // shard_map: the body, a mode: manual program on the global program's mesh axes (shared,
  // never changed once built: copies of the op share it).
  std::shared_ptr<const ProgramSpec> body;

  // Every field equal (a shard_map's body by identity).
  bool operator==(const OpSpec&) const = default;
};

// One output (`outputs:`): an out_spec.
struct OutputSpec {
  std::string name;    // Array name.
  PartitionSpec spec;  // How local blocks form the global array.
  std::string key;     // Run-file key for errors: "outputs.y".
  // A global program's output that may stay an unreduced partial sum over the mesh axes its
  // spec does not split (JAX's unreduced out sharding): its reader sums it, so the partitioner
  // inserts no psum for it. Timing only (it has no global value to check).
  bool unreduced = false;
};

// Who writes the communication (SPEC "Partitioning modes").
enum class ProgramMode {
  kManual,    // A shard_map body: local blocks, every collective written.
  kExplicit,  // Global arrays; each op's sharding rule gives its result's sharding.
  kAuto,      // Global arrays; the partitioner propagates shardings and inserts collectives.
};

// The SPEC name of a mode ("manual", "explicit", "auto").
const char* ProgramModeName(ProgramMode mode);
// Every mode, in SPEC order.
inline constexpr ProgramMode kProgramModes[] = {ProgramMode::kManual, ProgramMode::kExplicit,
                                                ProgramMode::kAuto};

// One of several disjoint meshes (`meshes:` NAME: {axes, devices}).
struct MeshSpec {
  std::string name;            // Its name, which arrays and ops give as `mesh:`.
  std::vector<MeshAxis> axes;  // Its axes, in order.
  std::vector<int> devices;    // Its devices, or empty: the next devices no earlier mesh took.
};

// A whole program on a mesh: a shard_map body (manual) or a global program (explicit, auto).
struct ProgramSpec {
  ProgramMode mode = ProgramMode::kManual;  // `mode:`
  // `mesh.axes`, in order; with several meshes, every mesh's axes in turn (names are distinct).
  std::vector<MeshAxis> mesh_axes;
  std::vector<int> mesh_devices;  // `mesh.devices`, or empty for the default placement.
  // `meshes:` several disjoint meshes, in order (empty: the one mesh above). Positions of the
  // program's Mesh (Mesh::Union) are each mesh's in turn.
  std::vector<MeshSpec> meshes;
  std::vector<ArraySpec> arrays;    // `arrays:`
  std::vector<OpSpec> ops;          // `program:`
  std::vector<OutputSpec> outputs;  // `outputs:`
};

// `program` without its ops: what a pass that makes the ops anew starts from (copying the
// ops only to drop them costs a 15,000-op step milliseconds).
ProgramSpec WithoutOps(const ProgramSpec& program);

// The index in program.meshes of the mesh called `name`, or -1.
int MeshIndex(const ProgramSpec& program, const std::string& name);

}  // namespace shardsim
