#include "collectives/numerics_check.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "collectives/init.h"
#include "collectives/local_op.h"
#include "collectives/local_ops.h"
#include "collectives/outputs.h"
#include "collectives/semantics.h"
#include "collectives/sharding.h"

namespace shardsim {

std::map<std::string, Array> ReferenceOutputs(const Mesh& mesh, const ProgramSpec& program,
                                              const std::string& base_dir,
                                              const std::map<std::string, Array>* inputs) {
  int n = mesh.size();
  std::vector<std::map<std::string, Array>> env(n);
  for (const ArraySpec& spec : program.arrays) {
    Array made;
    const Array* global = nullptr;
    if (inputs && inputs->count(spec.name) && inputs->at(spec.name).has_data()) {
      global = &inputs->at(spec.name);
    } else {
      made = MakeInitialArray(spec, /*with_data=*/true, base_dir);
      global = &made;
    }
    Sharding sharding(mesh, spec.sharding, spec.shape);
    for (int p = 0; p < n; ++p) env[p][spec.name] = sharding.Shard(*global, p);
  }
  for (const OpSpec& op : program.ops) {
    if (op.kind == OpKind::kAllgatherMatmul || op.kind == OpKind::kMatmulReduceScatter) {
      // By definition: x @ all_gather(w) (or all_gather(x) @ w), psum_scatter(x @ w).
      bool gather = op.kind == OpKind::kAllgatherMatmul;
      OpSpec coll = op;
      coll.kind = gather ? OpKind::kAllGather : OpKind::kPsumScatter;
      coll.tiled = true;
      coll.axis = 0;
      std::vector<Array> gathered;
      if (gather) {
        bool rhs = op.gather == "rhs";
        std::vector<Array> inputs;
        for (int p = 0; p < n; ++p) inputs.push_back(env[p].at(op.in[rhs ? 1 : 0]));
        gathered = ReferenceCollective(coll, mesh, inputs);
        for (int p = 0; p < n; ++p) {
          env[p][op.out.at(0)] = rhs ? Matmul(env[p].at(op.in[0]), gathered[p])
                                     : Matmul(gathered[p], env[p].at(op.in[1]));
        }
      } else {
        std::vector<Array> products;
        for (int p = 0; p < n; ++p) {
          products.push_back(Matmul(env[p].at(op.in[0]), env[p].at(op.in[1])));
        }
        std::vector<Array> outs = ReferenceCollective(coll, mesh, products);
        for (int p = 0; p < n; ++p) env[p][op.out.at(0)] = std::move(outs[p]);
      }
      continue;
    }
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
                              const std::map<std::string, Array>& reference, int mesh_size,
                              int64_t reduction_length) {
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
    double f32_roundings = mesh_size + 1 + 4 * std::sqrt(static_cast<double>(reduction_length));
    double tol = (2 * Epsilon(ref.dtype()) + f32_roundings * std::ldexp(1.0, -24)) * scale;
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

int64_t LongestReduction(const ProgramSpec& program) {
  int64_t longest = 1;
  for (const ArraySpec& a : program.arrays) {
    for (int64_t d : a.shape) longest = std::max(longest, d);
  }
  return longest;
}


}  // namespace shardsim
