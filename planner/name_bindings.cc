#include "planner/name_bindings.h"

namespace shardsim::planner {

bool NameBindings::Once(const std::string& name) const {
  const Binding* b = Find(name);
  return b && b->count == 1;
}

const NameBindings::Binding* NameBindings::Find(const std::string& name) const {
  const auto it = names.find(name);
  return it == names.end() ? nullptr : &it->second;
}

size_t NameBindings::Maker(const std::string& name) const {
  const Binding* b = Find(name);
  return b ? b->maker : kNoMaker;
}

NameBindings BindingsOf(const ProgramSpec& program) {
  NameBindings b;
  b.names.reserve(program.arrays.size() + program.ops.size() * 2);
  for (const ArraySpec& a : program.arrays) ++b.names[a.name].count;
  for (size_t i = 0; i < program.ops.size(); ++i) {
    for (const std::string& out : program.ops[i].out) {
      NameBindings::Binding& binding = b.names[out];
      ++binding.count;
      binding.maker = i;
    }
  }
  return b;
}

}  // namespace shardsim::planner
