// Who binds each name of a program: the facts the scheduling passes (prefetch, remat) need to
// move or repeat ops without changing which binding a reader sees.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>

#include "collectives/program.h"

namespace shardsim::planner {

// The bindings of a program's names: input arrays and op results.
struct NameBindings {
  std::unordered_map<std::string, int> count;  // Times each name is bound (an array once).
  std::unordered_map<std::string, size_t>
      maker;  // The (last) op binding each name; arrays have none.

  // Whether `name` is bound exactly once.
  bool Once(const std::string& name) const;
};

// The bindings of `program`'s arrays and ops.
NameBindings BindingsOf(const ProgramSpec& program);

}  // namespace shardsim::planner
