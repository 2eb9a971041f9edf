// The op registry: one entry per op of the program IR, the single source of truth for its
// name, arity, run-file keys, whether it communicates (and as which collective), and how it
// is costed. The YAML loader, lowering, the executors and the timing engine read it; none of
// them keeps its own list of op names.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/collective.h"
#include "collectives/program.h"

namespace shardsim {

// How many inputs an op takes.
enum class OpArity {
  kNone,        // No array input (axis_index).
  kOne,         // One input.
  kTwo,         // Exactly two inputs (matmul, einsum, collective matmuls).
  kBinary,      // Two inputs, or one input with `scalar:` (add, sub, mul, div, max).
  kAtLeastTwo,  // Two or more (concatenate).
};

// How an op is scheduled on a device.
enum class OpStream {
  kCompute,     // Runs on the compute stream, priced by the compute model.
  kFree,        // Runs on the compute stream but costs nothing (relabelling, fused views).
  kCollective,  // Runs on the communication engines as a collective over a group.
  kComposite,   // Expands at lowering into primitives (collective matmuls).
};

// One op of the registry.
struct OpDef {
  OpKind kind;                    // The op.
  const char* name;               // SPEC name ("psum").
  bool user_visible;              // Written in run files (false: internal lowering ops).
  OpArity arity;                  // Inputs it takes.
  bool multi_output;              // Makes one output per `sections` (split); else one.
  OpStream stream;                // How it is scheduled.
  CollectiveKind collective;      // kCollective: what the algorithms run.
  ReduceOp reduce;                // kCollective reductions: how partial values combine.
  bool takes_axis_name;           // Has `axis_name` (collectives, axis_index, internal ops).
  std::vector<const char*> keys;  // Run-file keys beyond op/in/out/name/axis_name/algorithm.
  bool elementwise = false;       // Output element i depends on input element i only.
};

// Every op, internal ones included, in SPEC order.
const std::vector<OpDef>& OpRegistry();
// The entry of `kind` (every OpKind has one).
const OpDef& Op(OpKind kind);
// The op a run file names, or nullptr (internal ops are not found).
const OpDef* FindOp(std::string_view name);
// Names of the ops a run file may write, for "did you mean" and usage text.
std::vector<std::string> UserOpNames();
// The run-file keys op `kind` takes, `op` first.
std::vector<std::string> OpKeys(OpKind kind);
// Every key any op takes (so a known key on the wrong op gets a precise message).
std::vector<std::string> AllOpKeys();
// Checks the input count of `op` against its arity; returns "" or what is wrong
// ("matmul takes 2 inputs (in: [a, b]), got 1").
std::string CheckArity(const OpSpec& op);

}  // namespace shardsim
