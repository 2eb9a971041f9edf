// Building shard_map programs in C++: the API model builders, the partitioner, benchmarks and
// tests use directly. The YAML loader is one client: it reads, validates with file locations,
// and hands the values to a builder.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "collectives/program.h"

namespace shardsim {

// With several meshes, the mesh each output of `op` lives on, given each defined value's mesh
// (`mesh_of`): the op's own, except that a grad's gradients live on their parameters' meshes
// (reverse mode returns cotangents through device_put to their primals' meshes). Every
// parameter's mesh is read before any output, which may reuse a parameter's name, is bound.
std::vector<std::string> OutputMeshes(const OpSpec& op,
                                      const std::map<std::string, std::string>& mesh_of);

// Appends arrays, ops and outputs to a program, checking each against the op registry (arity,
// attributes as CheckAttrs does, output count) and the names defined so far. Errors are SpecErrors
// keyed like run files
// ("program.3", "arrays.x", "outputs.y"). Ops without output names get fresh ones ("v0", ...).
class ProgramBuilder {
 public:
  // A program on a mesh of `axes` (first major); `devices` as `mesh.devices` (empty: default);
  // `mode`: a shard_map body (manual) or a global program (explicit, auto).
  explicit ProgramBuilder(std::vector<MeshAxis> axes, std::vector<int> devices = {},
                          ProgramMode mode = ProgramMode::kManual);

  // Makes the program run on several disjoint meshes (call before any array or op): arrays
  // name theirs (ArraySpec::mesh), ops run on their first input's unless OpSpec::mesh says
  // (device_put's is its destination). Without axes given to the constructor, the program's
  // axes become every mesh's in turn.
  void Meshes(std::vector<MeshSpec> meshes);
  // Declares input array `name`; returns the name.
  std::string Input(std::string name, Shape shape, DType dtype, PartitionSpec sharding,
                    InitSpec init = {});
  // Declares an input from a full ArraySpec; returns its name.
  std::string Input(ArraySpec array);
  // Appends `op`; fills its key, default name and missing output names. A max of one input
  // with axes or keepdims becomes reduce_max (ResolveOpKind). Returns its first output's name.
  std::string Add(OpSpec op);
  // Marks `name` as an output with out spec `spec`; `unreduced`: OutputSpec::unreduced.
  void Output(const std::string& name, PartitionSpec spec, bool unreduced = false);

  // `a @ b`.
  std::string Matmul(const std::string& a, const std::string& b, std::string out = "");
  // jnp.einsum(spec, a, b).
  std::string Einsum(const std::string& spec, const std::string& a, const std::string& b,
                     std::string out = "");
  // An elementwise op of two inputs (add, sub, mul, div, max).
  std::string Binary(OpKind kind, const std::string& a, const std::string& b, std::string out = "");
  // An elementwise op of one input (relu, gelu, exp, tanh, neg).
  std::string Unary(OpKind kind, const std::string& x, std::string out = "");
  // jax.grad (global programs): the gradients of scalar `of` with respect to each of `wrt`,
  // named `out` (fresh names when empty). Returns the output names.
  std::vector<std::string> Grad(const std::string& of, std::vector<std::string> wrt,
                                std::vector<std::string> out = {});
  // jax.shard_map (global programs): `body`, a mode: manual program on this program's mesh
  // axes, runs on every device with the blocks of `in` (in[i] stands for body.arrays[i], of its
  // shape and dtype, laid out by its sharding: the in_specs); its outputs, assembled by their
  // out specs, are the results, named `out` (fresh names when empty). The body's keys are
  // prefixed with the op's ("program.4.body.program.1"). Returns the output names.
  std::vector<std::string> ShardMap(std::vector<std::string> in, ProgramSpec body,
                                    std::vector<std::string> out = {});
  // psum / pmean / pmax / pmin over `axes`.
  std::string Reduce(OpKind kind, const std::string& x, std::vector<std::string> axes,
                     std::string out = "");
  // all_gather over `axes` along `axis`.
  std::string AllGather(const std::string& x, std::vector<std::string> axes, int64_t axis,
                        bool tiled, std::string out = "");
  // psum_scatter over `axes` along `scatter_dimension`.
  std::string PsumScatter(const std::string& x, std::vector<std::string> axes,
                          int64_t scatter_dimension, bool tiled, std::string out = "");
  // all_to_all over `axes`.
  std::string AllToAll(const std::string& x, std::vector<std::string> axes, int64_t split_axis,
                       int64_t concat_axis, bool tiled, std::string out = "");
  // ppermute: a ring shift by `shift` along `axes`.
  std::string Ppermute(const std::string& x, std::vector<std::string> axes, int shift,
                       std::string out = "");

  // The program so far.
  const ProgramSpec& program() const { return program_; }
  // Takes the program.
  ProgramSpec Build() && { return std::move(program_); }

 private:
  std::string Fresh();
  std::string Collective(OpKind kind, const std::string& x, std::vector<std::string> axes,
                         std::string out, OpSpec op);

  ProgramSpec program_;
  std::set<std::string> defined_;
  std::set<std::string> op_names_;
  std::map<std::string, std::string> mesh_of_;  // With several meshes: each value's mesh.
  int next_value_ = 0;
};

}  // namespace shardsim
