// A program op for tests that build ProgramSpecs by hand: kind, inputs, one output, mesh axes,
// with a name and key numbered in creation order ("psum3", "program.3").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/program.h"

namespace shardsim::test {

// The op `kind` on `in` writing `out`, over mesh axes `axes` (collectives).
inline OpSpec MakeOp(OpKind kind, std::vector<std::string> in, std::string out,
                     std::vector<std::string> axes = {}) {
  static int counter = 0;
  OpSpec op;
  op.kind = kind;
  op.in = std::move(in);
  op.out = {std::move(out)};
  op.axis_name = std::move(axes);
  op.name = std::string(OpKindName(kind)) + std::to_string(counter);
  op.key = "program." + std::to_string(counter++);
  return op;
}

}  // namespace shardsim::test
