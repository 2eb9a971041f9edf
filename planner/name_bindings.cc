#include "planner/name_bindings.h"

namespace shardsim::planner {

bool NameBindings::Once(const std::string& name) const {
  const auto it = count.find(name);
  return it != count.end() && it->second == 1;
}

NameBindings BindingsOf(const ProgramSpec& program) {
  NameBindings b;
  for (const ArraySpec& a : program.arrays) ++b.count[a.name];
  for (size_t i = 0; i < program.ops.size(); ++i) {
    for (const std::string& out : program.ops[i].out) {
      ++b.count[out];
      b.maker[out] = i;
    }
  }
  return b;
}

}  // namespace shardsim::planner
