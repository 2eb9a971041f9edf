// The op registry: one entry per op of the program IR, the single source of truth for its
// name, arity, typed attributes (run-file keys), whether it communicates (and as which collective),
// and how it is costed. The YAML loader, lowering, the executors and the timing engine read it;
// none of them keeps its own list of op names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "collectives/collective.h"
#include "collectives/program.h"

namespace shardsim {

// How many inputs an op takes.
enum class OpArity {
  kNone,        // No array input (axis_index).
  kOne,         // One input.
  kTwo,         // Exactly two inputs (matmul, einsum, collective matmuls).
  kThree,       // Exactly three inputs (max_grad; attention: q, k, v).
  kFour,        // Exactly four inputs (attention_grad: g, q, k, v).
  kSix,         // Exactly six inputs (ragged_all_to_all).
  kBinary,      // Two inputs, or one input with `scalar:` (add, sub, mul, div, max).
  kAtLeastTwo,  // Two or more (concatenate).
  kOneOrMore,   // One or more (custom_call: the values it depends on).
};

// How an op is scheduled on a device.
enum class OpStream {
  kCompute,       // Runs on the compute stream, priced by the compute model.
  kFree,          // Runs on the compute stream but costs nothing (relabelling, fused views).
  kCollective,    // Runs on the communication engines as a collective over a group.
  kComposite,     // Expands at lowering into primitives (collective matmuls).
  kHostTransfer,  // A copy between HBM and host memory on the device's DMA queue of its
                  // direction (one copy at a time each way), priced by the host link.
};

// The type of an op attribute: how its run-file value is read and what values it takes.
enum class AttrType {
  kInt,             // Any integer (axes may count from the end).
  kNonNegativeInt,  // An integer >= 0.
  kPositiveInt,     // An integer >= 1.
  kBool,            // true or false.
  kIntList,         // A list of integers like [1, 0].
  kShape,           // A reshape target: sizes >= 1, at most one -1 (the rest).
  kString,          // A string (the attribute's check may refuse some).
  kOneOf,           // One of the attribute's `values`.
  kNumber,          // A number.
  kBytes,           // A size: "64 MiB" or a bare count of bytes (stored as a number).
  kPerm,            // [[source, destination], ...]: indices into the op's group, each once.
  kSharding,        // A PartitionSpec: "P('dp', None)" or [dp, null], over the mesh's axes.
  kValueName,       // The name of a value defined before the op (an array or an op's output).
  kValueNames,      // A non-empty list of such names, like [w1, w2].
  kAxisList,        // An axis or a non-empty list of axes (0, [0, -1]), stored as a list.
};

// Where an attribute's value is stored: a member of OpSpec of the type its AttrType reads.
using AttrField =
    std::variant<int64_t OpSpec::*, bool OpSpec::*, std::optional<int> OpSpec::*,
                 std::optional<double> OpSpec::*, std::string OpSpec::*,
                 std::vector<int64_t> OpSpec::*, std::vector<std::pair<int, int>> OpSpec::*,
                 PartitionSpec OpSpec::*, std::vector<std::string> OpSpec::*>;

// A value read for an attribute, before it is stored in OpSpec.
using AttrValue =
    std::variant<int64_t, bool, double, std::string, std::vector<int64_t>,
                 std::vector<std::pair<int, int>>, PartitionSpec, std::vector<std::string>>;

// One attribute (run-file key) of an op.
struct AttrDef {
  const char* name;                 // Run-file key ("split_axis").
  AttrType type;                    // How its value is read.
  bool required;                    // Must be given.
  AttrField field;                  // Where the value goes in OpSpec.
  std::vector<const char*> values;  // kOneOf: the allowed values.
  const char* expected;             // List types: what a value of the wrong form should be.
  const char* doc;                  // One line for usage text.
  // Extra check of the stored value: "" or what is wrong (einsum's operand count).
  std::string (*check)(const OpSpec& op) = nullptr;
};

// Attributes of one op of which exactly one must be given (ppermute: perm or shift).
struct ExactlyOneOf {
  // The attributes; the loader's "give either a or b, not both" names the first two given.
  std::vector<const char*> names;
  const char* missing;  // Message when none is given.
};

// One op of the registry.
struct OpDef {
  OpKind kind;       // The op.
  const char* name;  // SPEC name ("psum").
  // Written in run files through its attributes (false: internal lowering ops, and shard_map,
  // whose body and spec lists the run-file reader reads itself).
  bool user_visible;
  OpArity arity;  // Inputs it takes.
  // Makes several outputs: as many as output_count says (split, grad), or `outputs` (top_k).
  bool multi_output;
  OpStream stream;             // How it is scheduled.
  CollectiveKind collective;   // kCollective: what the algorithms run.
  ReduceOp reduce;             // kCollective reductions: how partial values combine.
  bool takes_axis_name;        // Has `axis_name` (collectives, axis_index, internal ops).
  std::vector<AttrDef> attrs;  // Attributes beyond op/in/out/name/where/axis_name/algorithm.
  bool elementwise = false;    // Output element i depends on input element i only.
  std::vector<ExactlyOneOf> exactly_one_of = {};  // Groups of mutually exclusive attributes.
  // multi_output: the attribute that gives the number of outputs: a kPositiveInt's value
  // (split's "sections") or a kValueNames list's length (grad's "wrt": one output each).
  const char* output_count = nullptr;
  // Written only in global programs (mode: explicit | auto); partitioning removes it.
  bool global_only = false;
  // How many outputs it makes when no attribute gives the count (top_k: values, indices).
  int outputs = 1;
  // Another op's name a run file may use for this op: an entry `{op: NAME, ...}` with one input
  // that gives some of this op's attributes and none of NAME's means this op (ResolveOp):
  // `{op: max, in: x, axis: 0}` is reduce_max (jnp.max), `{op: max, in: x, scalar: 0}` max.
  const char* written_as = nullptr;
  // Its cost reads its inputs' values, not only their shapes (ragged_dot: the group sizes):
  // with numerics, each device prices each run of it from its own data.
  bool cost_reads_data = false;
};

// Every op, internal ones included, in SPEC order.
const std::vector<OpDef>& OpRegistry();
// Throws the internal error of an OpKind without a registry entry.
[[noreturn]] void ThrowUnregisteredOpKind();
// The entry of `kind` (every OpKind has one). Inline: passes ask it for every op they visit.
inline const OpDef& Op(OpKind kind) {
  static const std::vector<OpDef>& registry = OpRegistry();
  const auto i = static_cast<size_t>(kind);
  if (i >= registry.size()) ThrowUnregisteredOpKind();
  return registry[i];
}
// The op a run file names, or nullptr (internal ops are not found).
const OpDef* FindOp(std::string_view name);
// The op a run-file entry `{op: name, ...}` means, given how many inputs it names and the keys
// it writes: the op written_as `name` when the entry has one input and writes some of that op's
// attributes but none of FindOp(name)'s; else FindOp(name).
const OpDef* ResolveOp(std::string_view name, size_t inputs, const std::vector<std::string>& keys);
// The kind `op` (built in C++) means: as ResolveOp, an attribute counting as written when its
// field differs from a default OpSpec's ({kind: kMax, in: {x}, axes: {0}} is kReduceMax).
OpKind ResolveOpKind(const OpSpec& op);
// The op written_as `name` (reduce_max for "max"), or nullptr.
const OpDef* OpWrittenAs(std::string_view name);
// Names of the ops a run file may write, for "did you mean" and usage text.
std::vector<std::string> UserOpNames();
// The run-file keys op `kind` takes, `op` first.
std::vector<std::string> OpKeys(OpKind kind);
// Every key any op takes (so a known key on the wrong op gets a precise message).
std::vector<std::string> AllOpKeys();
// The attribute `name` of `def`, or nullptr.
const AttrDef* FindAttr(const OpDef& def, std::string_view name);
// Stores `value` into the field of `attr` in `op`; throws std::logic_error if the value's type
// does not fit the field (a registry bug).
void SetAttr(OpSpec& op, const AttrDef& attr, const AttrValue& value);
// The integer held by an integer attribute of `op` (throws std::logic_error for other types).
int64_t IntAttr(const OpSpec& op, const AttrDef& attr);
// What is wrong with an attribute of an op built in C++ (CheckAttrs).
struct AttrError {
  std::string attr;     // The attribute to blame ("sections").
  std::string message;  // "split needs sections >= 1, got 0".
};
// Checks `op`'s attributes against its registry entry as far as OpSpec can tell; nullopt if
// they pass. Required strings and optionals are set, integers are in their type's range,
// kOneOf values are allowed, at most one of each ExactlyOneOf group is set (an empty list
// counts as not set), and each attribute's own check passes. (An integer or list field cannot
// tell "not given" from its default, so those required attributes are enforced by the loader
// only.)
std::optional<AttrError> CheckAttrs(const OpSpec& op);
// The number of outputs `op` makes: what its output_count attribute says, else its entry's
// `outputs` (1 but for top_k).
int64_t OutputCount(const OpSpec& op);
// Checks the output names of `op` against OutputCount; returns "" or what is wrong ("split
// makes 3 outputs (sections: 3), got 2 names").
std::string CheckOutputCount(const OpSpec& op);
// Checks the input count of `op` against its arity; returns "" or what is wrong
// ("matmul takes 2 inputs (in: [a, b]), got 1").
std::string CheckArity(const OpSpec& op);
// Checks that `op` may read its input `name` from host memory (`in_host`) or from device
// memory: host memory holds data only, which move_to_device alone reads; returns "" or what is
// wrong ("add: 'x' is in host memory; ops read device memory (move_to_device it first)").
std::string CheckMemoryKind(const OpSpec& op, const std::string& name, bool in_host);
// `what` (a kernel's complaint about `op`) prefixed with the op's name ("matmul: ..."), unless
// it starts with it already.
std::string NamedOnce(const OpSpec& op, const std::string& what);
// The attribute CheckArity's complaint is about when it is not the inputs ("scalar" for a
// binary op given two inputs and a scalar), or nullptr.
const char* ArityBlamesAttr(const OpSpec& op);
// The ops of one input that run as collectives (stream kCollective), by name, in registry
// order: what `shardsim collective` sweeps and `options.algorithms` may name
// over mesh axes (ragged_all_to_all, which always runs as direct, and device_put, which moves
// an array between meshes, are not among them).
std::vector<std::string> CollectiveOpNames();
// Those of them that run `kind`, by name ("psum", "pmean", ... for all-reduce).
std::vector<std::string> CollectiveOpNames(CollectiveKind kind);

}  // namespace shardsim
