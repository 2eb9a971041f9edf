#include "planner/reshard.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim::planner {
namespace {

// Product of the sizes of `list`.
int64_t GroupSize(const std::vector<int>& list, const std::vector<MeshAxis>& axes) {
  int64_t n = 1;
  for (int a : list) n *= axes.at(static_cast<size_t>(a)).size;
  return n;
}

bool Has(const std::vector<int>& list, int a) {
  return std::find(list.begin(), list.end(), a) != list.end();
}

// Length of the common prefix of two axis lists.
size_t CommonPrefix(const std::vector<int>& a, const std::vector<int>& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}

}  // namespace

std::vector<ReshardStep> PlanReshard(const Shape& shape, const ValueSharding& from,
                                     const ValueSharding& to, const std::vector<MeshAxis>& axes) {
  for (int a : to.partial) {
    if (!Has(from.partial, a)) {
      throw std::logic_error("internal error: a reshard cannot make a value partial");
    }
  }
  for (const ValueSharding* s : {&from, &to}) {
    for (const std::vector<int>& dim : s->dims) {
      for (int a : dim) {
        if (Has(s->partial, a)) {
          throw std::logic_error("internal error: a mesh axis both splits and sums a value");
        }
      }
    }
  }
  std::vector<ReshardStep> steps;
  ValueSharding cur = from;
  // Partial axes the target keeps stay as they are (gathers and slices are linear).
  std::vector<int> resolve;
  for (int a : cur.partial) {
    if (!Has(to.partial, a)) resolve.push_back(a);
  }
  auto push = [&](ReshardStep step) {
    step.local_in = LocalShape(shape, cur, axes);
    steps.push_back(std::move(step));
  };
  // Slicing is linear: while partial sums remain, axes `to` adds next to a dimension that no
  // partial sum and no other dimension holds are sliced first (no communication), so the
  // psum_scatter or psum moves only the block the target keeps.
  auto slice_free_axes = [&]() {
    if (resolve.empty()) return;
    auto used = [&](int a) {
      if (Has(cur.partial, a)) return true;
      for (const std::vector<int>& dim : cur.dims) {
        if (Has(dim, a)) return true;
      }
      return false;
    };
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      const std::vector<int>& want = to.dims[d];
      if (CommonPrefix(cur.dims[d], want) != cur.dims[d].size()) continue;
      std::vector<int> run;
      for (size_t i = cur.dims[d].size(); i < want.size() && !used(want[i]); ++i) {
        run.push_back(want[i]);
      }
      if (run.empty()) continue;
      push({ReshardStep::Kind::kDynamicSlice, run, static_cast<int>(d), 0, {}});
      cur.dims[d].insert(cur.dims[d].end(), run.begin(), run.end());
    }
  };
  // 1. Partial sums: a dimension `to` splits next over partial axes takes a psum_scatter over
  // them (the reduce-scatter XLA fuses a psum and a slice into); the rest is one psum, after
  // the slices that need no communication.
  slice_free_axes();
  auto drop_partial = [&](int a) {
    cur.partial.erase(std::find(cur.partial.begin(), cur.partial.end(), a));
    resolve.erase(std::find(resolve.begin(), resolve.end(), a));
  };
  for (size_t d = 0; d < cur.dims.size() && !resolve.empty(); ++d) {
    const std::vector<int>& want = to.dims[d];
    if (CommonPrefix(cur.dims[d], want) != cur.dims[d].size()) continue;
    std::vector<int> run;
    for (size_t i = cur.dims[d].size(); i < want.size() && Has(resolve, want[i]); ++i) {
      run.push_back(want[i]);
    }
    if (run.empty()) continue;
    push({ReshardStep::Kind::kPsumScatter, run, static_cast<int>(d), 0, {}});
    for (int a : run) {
      drop_partial(a);
      cur.dims[d].push_back(a);
    }
  }
  slice_free_axes();
  if (!resolve.empty()) {
    push({ReshardStep::Kind::kPsum, resolve, 0, 0, {}});
    for (int a : std::vector<int>(resolve)) drop_partial(a);
  }
  // 2. One axis moving between dimensions: the minor-most axis of `d` that `to` does not keep
  // there, wanted next on another dimension whose current axes `to` keeps.
  for (size_t d = 0; d < cur.dims.size(); ++d) {
    if (cur.dims[d].empty()) continue;
    const size_t keep = CommonPrefix(cur.dims[d], to.dims[d]);
    if (keep + 1 != cur.dims[d].size()) continue;
    const int a = cur.dims[d].back();
    for (size_t d2 = 0; d2 < cur.dims.size(); ++d2) {
      if (d2 == d) continue;
      const std::vector<int>& want = to.dims[d2];
      const size_t have = cur.dims[d2].size();
      if (CommonPrefix(cur.dims[d2], want) == have && have < want.size() && want[have] == a) {
        push({ReshardStep::Kind::kAllToAll, {a}, static_cast<int>(d), static_cast<int>(d2), {}});
        cur.dims[d].pop_back();
        cur.dims[d2].push_back(a);
        break;
      }
    }
  }
  // 3. Gathers: every dimension drops the axes past its common prefix with `to`.
  for (size_t d = 0; d < cur.dims.size(); ++d) {
    const size_t keep = CommonPrefix(cur.dims[d], to.dims[d]);
    if (keep == cur.dims[d].size()) continue;
    std::vector<int> drop(cur.dims[d].begin() + static_cast<std::ptrdiff_t>(keep),
                          cur.dims[d].end());
    push({ReshardStep::Kind::kAllGather, drop, static_cast<int>(d), 0, {}});
    cur.dims[d].resize(keep);
  }
  // 4. Slices: every dimension takes the axes `to` adds past its current ones.
  for (size_t d = 0; d < cur.dims.size(); ++d) {
    if (cur.dims[d].size() == to.dims[d].size()) continue;
    std::vector<int> add(to.dims[d].begin() + static_cast<std::ptrdiff_t>(cur.dims[d].size()),
                         to.dims[d].end());
    push({ReshardStep::Kind::kDynamicSlice, add, static_cast<int>(d), 0, {}});
    cur.dims[d] = to.dims[d];
  }
  if (!(cur == to)) throw std::logic_error("internal error: reshard plan missed its target");
  return steps;
}

OpSpec ReshardOp(const ReshardStep& step, const std::string& in, const std::string& out,
                 const std::vector<MeshAxis>& axes) {
  OpSpec op;
  op.in = {in};
  op.out = {out};
  op.axis_name = AxisNames(step.axes, axes);
  switch (step.kind) {
    case ReshardStep::Kind::kPsum:
      op.kind = OpKind::kPsum;
      break;
    case ReshardStep::Kind::kPsumScatter:
      op.kind = OpKind::kPsumScatter;
      op.scatter_dimension = step.dim;
      op.tiled = true;
      break;
    case ReshardStep::Kind::kAllToAll:
      // Splits the whole dimension dim2 into blocks sent to the group's members and joins the
      // blocks received along dim: dim is no longer split over the axis, dim2 is.
      op.kind = OpKind::kAllToAll;
      op.split_axis = step.dim2;
      op.concat_axis = step.dim;
      op.tiled = true;
      break;
    case ReshardStep::Kind::kAllGather:
      op.kind = OpKind::kAllGather;
      op.axis = step.dim;
      op.tiled = true;
      break;
    case ReshardStep::Kind::kDynamicSlice:
      op.kind = OpKind::kDynamicSlice;
      op.axis = step.dim;
      op.sections = GroupSize(step.axes, axes);
      break;
  }
  return op;
}

bool StepCommunicates(const ReshardStep& step) {
  return step.kind != ReshardStep::Kind::kDynamicSlice;
}

std::string DescribeStep(const ReshardStep& step, const std::vector<MeshAxis>& axes) {
  std::string over;
  for (const std::string& name : AxisNames(step.axes, axes))
    over += (over.empty() ? "" : ",") + name;
  const std::string dim = " (dim " + std::to_string(step.dim) + ")";
  switch (step.kind) {
    case ReshardStep::Kind::kPsum:
      return "psum over " + over;
    case ReshardStep::Kind::kPsumScatter:
      return "psum_scatter over " + over + dim;
    case ReshardStep::Kind::kAllToAll:
      return "all_to_all over " + over + " (dim " + std::to_string(step.dim) + " to dim " +
             std::to_string(step.dim2) + ")";
    case ReshardStep::Kind::kAllGather:
      return "all_gather over " + over + dim;
    case ReshardStep::Kind::kDynamicSlice:
      return "slice over " + over + dim;
  }
  return "";
}

}  // namespace shardsim::planner
