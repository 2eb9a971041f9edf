#include "sim/cli/collective_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "collectives/algorithm.h"
#include "collectives/ir/op_registry.h"
#include "collectives/numerics_check.h"
#include "collectives/placement.h"
#include "collectives/runtime/machine.h"
#include "collectives/runtime/run_program.h"
#include "sim/atomic_file.h"
#include "sim/cli/flags.h"
#include "sim/cli/run_file.h"
#include "sim/closest_name.h"
#include "topology/build.h"

namespace shardsim {
namespace {

// Host memory above which `--numerics on` is refused: every device's buffer, the reference
// and the results are held at once.
constexpr Bytes kNumericsBudget = Bytes::GiB(4);

struct Row {
  Bytes size;
  int64_t count = 0;
  Time time;
  std::string algorithm;
  double max_abs_error = 0;
};

// The one-op program measuring `op` on S bytes, in nccl-tests' convention: S is the size of
// the whole operation (all-reduce: each rank's buffer; all-gather: the gathered output;
// reduce-scatter: each rank's input; all-to-all: each rank's buffer; permute: each buffer).
ProgramSpec SweepProgram(const CollectiveCommandOptions& o, const std::vector<MeshAxis>& axes,
                         const std::vector<std::string>& group_axes, OpKind kind,
                         int64_t elements) {
  ProgramSpec p;
  p.mesh_axes = axes;
  ArraySpec x;
  x.name = "x";
  x.shape = {elements};
  x.dtype = DType::kF32;
  x.init.kind = InitSpec::Kind::kArange;
  const CollectiveKind collective = Op(kind).collective;
  // Each holds S / n.
  if (collective == CollectiveKind::kAllGather) x.sharding.dims = {group_axes};
  p.arrays.push_back(x);
  OpSpec op;
  op.kind = kind;
  op.name = OpKindName(kind);
  op.key = "--op";
  op.in = {"x"};
  op.out = {"y"};
  op.axis_name = group_axes;
  op.tiled = true;
  if (kind == OpKind::kPpermute) op.shift = 1;
  op.algorithm = o.algorithm == "auto" ? "" : o.algorithm;
  p.ops.push_back(op);
  OutputSpec out;
  out.name = "y";
  out.key = "--op";
  // Outputs that differ per device are sharded over the group's axes.
  if (collective != CollectiveKind::kAllGather && collective != CollectiveKind::kAllReduce) {
    out.spec.dims = {group_axes};
  }
  // Axes outside the group hold different data too when the input is arange on each device:
  // they do not here (the input is replicated or sharded over the group only).
  p.outputs.push_back(out);
  return p;
}

}  // namespace

Time SimulateCollectiveSize(const Machine& machine, const Mesh& mesh,
                            const std::vector<std::string>& group_axes, OpKind kind,
                            int64_t elements, const std::string& algorithm, std::string* resolved) {
  CollectiveCommandOptions o;
  o.algorithm = algorithm;
  ProgramSpec program = SweepProgram(o, mesh.axes(), group_axes, kind, elements);
  CheckProgram(mesh, program);
  RunConfig config;
  config.numerics = false;
  RunResult result = RunProgram(machine, mesh, program, config);
  if (resolved) *resolved = result.ops[0].algorithm;
  return result.end;
}

std::string CollectiveOpChoices() { return JoinNamesOr(CollectiveOpNames()); }

std::string AlgorithmChoices() { return JoinNames(AlgorithmNames()); }

double BusBandwidthFactor(const std::string& op, int n) {
  if (n <= 1) return 0;
  double f = static_cast<double>(n - 1) / n;
  const OpDef* def = FindOp(op);
  if (def && def->collective == CollectiveKind::kAllReduce) return 2 * f;
  if (def && def->collective == CollectiveKind::kPermute) return 1;
  return f;
}

int RunCollectiveCommand(const CollectiveCommandOptions& o) {
  HardwareSpec hw;
  hw.preset = o.hardware;
  if (!o.shape.empty()) {
    for (int64_t v : ParseShapeFlag("--shape", o.shape)) hw.shape.push_back(static_cast<int>(v));
  }
  if (o.nodes) hw.nodes = PositiveNodesFlag(*o.nodes);
  Topology topo;
  try {
    topo = BuildHardware(hw);
  } catch (const SpecError& e) {
    std::string flag = e.key() == "hardware.shape"   ? "--shape"
                       : e.key() == "hardware.nodes" ? "--nodes"
                                                     : "--hardware";
    throw InputError(flag + ": " + e.what());
  }
  Machine machine(std::move(topo));
  const Topology& topology = machine.topology();
  std::vector<MeshAxis> axes = ParseMeshFlag("--mesh", o.mesh);
  std::vector<std::string> group_axes = ParseListFlag("--axis", o.axis);
  const OpDef* def = FindOp(o.op);
  if (!def || def->stream != OpStream::kCollective) {
    throw InputError("--op " + o.op + ": expected " + CollectiveOpChoices());
  }
  const OpKind kind = def->kind;
  std::vector<Bytes> sizes = ParseSizesFlag("--sizes", o.sizes);
  std::vector<int> devices;
  try {
    devices = DefaultPlacement(axes, topology);
  } catch (const std::invalid_argument& e) {
    throw InputError("--mesh " + o.mesh + ": " + e.what());
  }
  Mesh mesh(axes, devices);
  int n = 1;
  for (const std::string& a : group_axes) {
    int i = mesh.AxisIndex(a);
    if (i < 0) throw InputError("--axis " + o.axis + ": '" + a + "' is not an axis of --mesh");
    n *= axes[i].size;
  }
  double factor = BusBandwidthFactor(o.op, n);
  std::vector<Row> rows;
  bool numerics_failed = false;
  for (Bytes size : sizes) {
    // Whole f32 elements, a multiple of the group size (nccl-tests rounds counts down).
    int64_t elements = size.count() / 4 / n * n;
    if (elements == 0) continue;
    // Each device's buffer, about three times over (the run, the reference, the results).
    double host_bytes = static_cast<double>(elements) * 4 * mesh.size() * 3;
    if (o.numerics == "on" && host_bytes > static_cast<double>(kNumericsBudget.count())) {
      throw InputError("--sizes " + o.sizes + ": checking numerics at " +
                       FormatBytes(Bytes(elements * 4)) + " needs about " +
                       FormatBytes(Bytes(static_cast<int64_t>(std::min(host_bytes, 9e18)))) +
                       " of host memory, over the " + FormatBytes(kNumericsBudget) +
                       " budget of --numerics on; use smaller sizes or --numerics off");
    }
    ProgramSpec program = SweepProgram(o, axes, group_axes, kind, elements);
    try {
      CheckProgram(mesh, program);
    } catch (const SpecError& e) {
      // The sweep's op is keyed "--op"; its algorithm "--op.algorithm" (refused at lowering).
      std::string flag = e.key() == "--op"             ? "--op " + o.op
                         : e.key() == "--op.algorithm" ? "--algorithm " + o.algorithm
                                                       : e.key();
      throw InputError(flag + ": " + e.what());
    }
    RunConfig config;
    config.numerics = o.numerics == "on";
    RunResult result;
    try {
      result = RunProgram(machine, mesh, program, config);
    } catch (const SpecError& e) {
      // Refused while running (an algorithm `auto` cannot fit): name the op's flag.
      throw InputError("--op " + o.op + ": " + e.what());
    } catch (const TimeRangeError& e) {
      throw InputError("--sizes " + o.sizes + ": " + e.what());
    }
    Row row{Bytes(elements * 4), elements, result.end, result.ops[0].algorithm, 0};
    if (config.numerics) {
      NumericsReport r = CompareOutputs(
          result.outputs, ReferenceOutputs(mesh, program, "", &result.inputs), mesh.size());
      row.max_abs_error = r.max_abs_error;
      if (!r.passed) {
        numerics_failed = true;
        std::fprintf(stderr, "numerics check FAILED at %s: max_abs_error %g (tolerance %g)\n",
                     FormatBytes(row.size).c_str(), r.max_abs_error, r.tolerance);
      }
    }
    rows.push_back(row);
  }
  if (rows.empty()) {
    throw InputError("--sizes " + o.sizes + ": no size holds one float32 element per device of " +
                     "the " + std::to_string(n) + "-device group");
  }
  std::ostringstream out, csv;
  out << "# " << o.op << " over " << o.axis << " (" << n << " devices) on " << topology.name()
      << ", float32, nccl-tests busbw factor " << factor << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%14s %12s %20s %13s %12s %12s\n", "size(B)", "count",
                "algorithm", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  out << line;
  csv << "size_bytes,count,algorithm,time_us,algbw_gbps,busbw_gbps\n";
  for (const Row& r : rows) {
    double algbw = static_cast<double>(r.size.count()) / r.time.seconds() / 1e9;
    std::snprintf(line, sizeof(line), "%14lld %12lld %20s %13.3f %12.3f %12.3f\n",
                  static_cast<long long>(r.size.count()), static_cast<long long>(r.count),
                  r.algorithm.c_str(), r.time.microseconds(), algbw, algbw * factor);
    out << line;
    std::snprintf(line, sizeof(line), "%lld,%lld,%s,%.6f,%.6f,%.6f\n",
                  static_cast<long long>(r.size.count()), static_cast<long long>(r.count),
                  r.algorithm.c_str(), r.time.microseconds(), algbw, algbw * factor);
    csv << line;
  }
  if (!o.csv_path.empty()) WriteFileAtomically(o.csv_path, csv.str());
  std::cout << out.str();
  return numerics_failed ? 1 : 0;
}

}  // namespace shardsim
