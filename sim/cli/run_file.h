// The run file: YAML parsed at the edge into plain validated structs.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/program.h"
#include "sim/cli/model_run_file.h"
#include "sim/cli/plan_search_file.h"
#include "sim/spec_error.h"
#include "sim/time.h"
#include "sim/units.h"
#include "topology/topology_spec.h"

namespace shardsim {

// Bad user input, with a message already located: "FILE:LINE:COL: what is wrong (key K)".
// The CLI prints it as "error: <message>" and exits 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where a key of the run file was written (1-based line and column).
struct KeyLocation {
  int line = 0;           // 1-based line, 0 if unknown.
  int column = 0;         // 1-based column, 0 if unknown.
  bool from_set = false;  // The value came from a --set override.
  std::string set_key;    // The key of that --set override (e.g. "hardware.link").
};

// One raw point-to-point transfer of a `transfers:` run file.
struct TransferSpec {
  std::string name;  // Optional label (default "transfer N").
  int src = 0;       // Source device index.
  int dst = 0;       // Destination device index.
  Bytes bytes;       // Size.
  Time at;           // Start time.
};

// Run options (`options:`).
struct RunOptions {
  std::string numerics = "auto";  // auto | on | off
  // Collective -> default algorithm (one of AlgorithmNames()). Keys are written as given:
  // JAX op names (psum, pmean, pmax, pmin, psum_scatter, all_gather, all_to_all, ppermute)
  // or generic kinds (all_reduce, reduce_scatter, all_gather, all_to_all, permute).
  std::map<std::string, std::string> algorithms;
  // Pipelining unit of the tree algorithm (`options.chunk_size`, SPEC leaves it open).
  Bytes chunk_size = Bytes::MiB(1);
};

// A parsed, validated run file.
struct RunFile {
  std::string path;                     // The file it came from.
  HardwareSpec hardware;                // `hardware:`
  std::vector<TransferSpec> transfers;  // `transfers:` (a raw network study).
  // `mesh:`, `arrays:`, `program:`, `outputs:`; set exactly when `transfers` is not given.
  // Init file paths stay as written: relative ones are relative to the folder of `path`.
  std::optional<ProgramSpec> program;
  // `model:`, `train:`, `plan:` (a model run); set exactly when neither program nor transfers
  // is given.
  std::optional<ModelRunSpec> model;
  // `model:`, `train:`, `plan:` and `search:` read for `shardsim plan` (LoadRunFile's
  // plan_search); then `model` is unset.
  std::optional<PlanSearchSpec> search;
  RunOptions options;                            // `options:`
  std::map<std::string, KeyLocation> locations;  // Dotted key path -> where it was written.

  // Formats a model's SpecError with the location of its key (or of the nearest enclosing
  // key that has one): "FILE:LINE:COL: message (key hardware.shape)".
  std::string Locate(const SpecError& e) const;
};

// Reads and validates a run file. `overrides` are --set "a.b=VALUE" strings applied before
// validation (VALUE is parsed as YAML). Throws InputError for any bad input: missing file,
// YAML syntax, unknown key (with a "did you mean"), wrong type, bad unit, missing field.
// A program is checked as far as the file alone allows: mesh axes, array shapes, literal
// value counts, shardings against the mesh (ValidatePartitionSpec), each op's keys and
// input count, and name flow (every input defined before it is used, every output made).
// Shapes through the ops, and devices against the hardware, are the executor's to check.
// An op's `name` defaults to its first output's name, or "op<i>" when an earlier op already
// has that name. An op may rebind a name (e.g. `out: acc` again); later ops see the new one.
// With `plan_search` (shardsim plan) the file is a plan search file: model:, train:, and plan:
// and search: read by ReadPlanSearch into `search`.
RunFile LoadRunFile(const std::string& path, const std::vector<std::string>& overrides = {},
                    bool plan_search = false);

class YamlValue;

// Mesh axes from a mapping {name: size, ...}, in order: identifiers, sizes >= 1, at least one.
// Throws InputError at the entry at fault.
std::vector<MeshAxis> ReadMeshAxes(const YamlValue& value);

// A collective algorithm: a registry name or `auto`, optionally with an NCCL protocol
// ("ring/LL128"); fails at `value` otherwise, suggesting the closest name.
std::string ReadAlgorithm(const YamlValue& value);

// A device list giving each position of a mesh of `axes` its own device. Throws InputError.
std::vector<int> ReadMeshDevices(const YamlValue& value, const std::vector<MeshAxis>& axes);

// "dp=4 x tp=2": mesh axes for messages and summaries.
std::string DescribeMeshAxes(const std::vector<MeshAxis>& axes);

// "batch: data+fsdp, embed: fsdp" in SPEC's order of logical names ("(none: replicated)").
std::string DescribeRules(const std::map<std::string, std::vector<std::string>>& rules);

// The keys of `algorithms:` maps: JAX's collective names and the generic kinds, from the op
// registry.
std::vector<std::string> AlgorithmKeys();

// Reads a topology description for `shardsim topo FILE.yaml`: a run file's `hardware:`
// section, or a file whose top level is that section. Throws InputError.
RunFile LoadHardwareFile(const std::string& path);

}  // namespace shardsim
