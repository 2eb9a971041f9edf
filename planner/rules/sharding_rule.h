// Sharding rules, one file per op family (XLA's spmd handlers): given the shardings an op's
// operands have, the layouts the op can run in: what each operand must be resharded to and
// what sharding each result has (possibly partial sums).
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/dtype.h"
#include "collectives/mesh.h"
#include "collectives/program.h"
#include "planner/value_sharding.h"

namespace shardsim::planner {

// What a rule sees of one op.
struct RuleContext {
  const OpSpec& op;                   // The global op.
  std::vector<Shape> in_shapes;       // Operands' global shapes.
  std::vector<DType> in_dtypes;       // Operands' dtypes.
  std::vector<ValueSharding> in;      // Operands' current shardings.
  std::vector<Shape> out_shapes;      // Results' global shapes.
  const std::vector<MeshAxis>& axes;  // The mesh.
  // Auto mode: the sharding propagation would like the first result to have (a hint).
  std::optional<ValueSharding> preferred;
};

// One way to run an op.
struct Strategy {
  std::vector<ValueSharding> operands;  // The sharding each operand must have (no partials
                                        // unless the op is linear in it).
  std::vector<ValueSharding> results;   // Each result's sharding.
  std::string why;                      // A few words: "contracting d split over tp".
  // Each result is multiplied by this after the local op: a mean over split dimensions is, on
  // each device, its block's mean, n times its share of the global mean (1: none).
  double result_scale = 1;
  // Mesh axes each result is a maximum over after the local op (a max over split
  // dimensions): the partitioner takes pmax over them at once (empty: none).
  std::vector<int> result_max_over;
  // The local op to emit instead of the global op's kind (its kind and attributes; inputs,
  // outputs and names come from the op): take_shard for a split table's look-up.
  std::optional<OpSpec> local_op;
};

// An op explicit mode refuses (JAX would raise): the message names what is wrong and the fix.
class RuleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The candidate strategies for an op. The first candidate is explicit mode's: it must need no
// operand resharding (else the rule throws RuleError in explicit mode); auto mode weighs all.
using ShardingRule = std::vector<Strategy> (*)(const RuleContext& ctx, bool explicit_mode);

// The rule of `kind`, or nullptr when the op has none yet.
ShardingRule FindShardingRule(OpKind kind);

// Rules by family (rules/*.cc).
std::vector<Strategy> ElementwiseRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> ContractionRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> TransposeRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> ReshapeRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> AlongAxisRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> BroadcastRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> FullLikeRule(const RuleContext& ctx, bool explicit_mode);
// move_to_host, move_to_device: the operand as it is, the result laid out the same.
std::vector<Strategy> HostCopyRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> ReductionRule(const RuleContext& ctx, bool explicit_mode);
std::vector<Strategy> MappedRule(const RuleContext& ctx, bool explicit_mode);
// take: MappedRule's layouts (the table's indexed axis whole) and, in auto mode, the look-up in
// place on a table split along that axis (XLA's partitioned gather): each device takes the
// rows its block holds (take_shard), leaving partial sums over the axis's mesh axes.
std::vector<Strategy> TakeRule(const RuleContext& ctx, bool explicit_mode);

// Per operand of `op` (operands of global shapes `in_shapes`), the dimensions its sharding
// rule reads whole (a row op's rows, attention's sequences); empty lists for ops whose rule
// may split every dimension.
std::vector<std::vector<int>> WholeOperandDims(const OpSpec& op,
                                               const std::vector<Shape>& in_shapes);

// Helpers the rules share.
// The type of operand `i` in JAX notation ("f32[8@dp,4]").
std::string OperandType(const RuleContext& ctx, size_t i);
// Whether `s` uses mesh axis `a` on any dimension.
bool UsesAxis(const ValueSharding& s, int a);
// `s` with every split of dimension `dim` removed.
ValueSharding Unsplit(ValueSharding s, int dim);
// `s` without partial axes.
ValueSharding Reduced(ValueSharding s);
// `axis` counted from the front for a value of `rank` dimensions.
int NormalAxis(int64_t axis, size_t rank);
// The number of positions `mesh_axes` span (the product of their sizes).
int64_t AxesSize(const std::vector<int>& mesh_axes, const std::vector<MeshAxis>& axes);
// Whether no mesh axis splits two dimensions of `dims`.
bool AxesDistinct(const std::vector<std::vector<int>>& dims);
// Refuses (RuleError) in explicit mode, naming operand `i`, what is wrong and the fix.
[[noreturn]] void Refuse(const RuleContext& ctx, size_t i, const std::string& what);

}  // namespace shardsim::planner
