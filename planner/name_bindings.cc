#include "planner/name_bindings.h"

#include <numeric>

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

OpGraph GraphOf(const ProgramSpec& program) {
  std::vector<size_t> made_at(program.ops.size());
  std::iota(made_at.begin(), made_at.end(), size_t{0});
  return GraphOf(NameIdsOf(program), made_at);
}

OpGraph GraphOf(const ProgramSpec& program, const OpNameIds* ids,
                const std::vector<size_t>& made_at) {
  return ids ? GraphOf(*ids, made_at) : GraphOf(program);
}

OpNameIds NameIdsOf(const ProgramSpec& program) {
  OpNameIds ids;
  std::unordered_map<std::string_view, int> id_of;
  id_of.reserve(program.arrays.size() + program.ops.size() * 2);
  auto id = [&](const std::string& name) {
    return id_of.try_emplace(name, static_cast<int>(id_of.size())).first->second;
  };
  for (const ArraySpec& a : program.arrays) ids.arrays.push_back(id(a.name));
  ids.in_start.reserve(program.ops.size() + 1);
  ids.out_start.reserve(program.ops.size() + 1);
  for (const OpSpec& op : program.ops) {
    ids.in_start.push_back(ids.in.size());
    ids.out_start.push_back(ids.out.size());
    for (const std::string& name : op.in) ids.in.push_back(id(name));
    for (const std::string& name : op.out) ids.out.push_back(id(name));
  }
  ids.in_start.push_back(ids.in.size());
  ids.out_start.push_back(ids.out.size());
  ids.names = static_cast<int>(id_of.size());
  return ids;
}

OpGraph GraphOf(const OpNameIds& ids, const std::vector<size_t>& made_at) {
  // GraphOf's bindings by id: how many times each name is bound, and its (last) maker.
  const size_t n = made_at.size();
  std::vector<int> count(static_cast<size_t>(ids.names), 0);
  std::vector<size_t> maker(static_cast<size_t>(ids.names), NameBindings::kNoMaker);
  for (int a : ids.arrays) ++count[static_cast<size_t>(a)];
  for (size_t i = 0; i < n; ++i) {
    const size_t o = made_at[i];
    for (size_t k = ids.out_start[o]; k < ids.out_start[o + 1]; ++k) {
      const auto name = static_cast<size_t>(ids.out[k]);
      ++count[name];
      maker[name] = i;
    }
  }
  OpGraph g;
  g.input_maker.reserve(ids.in.size());
  g.input_once.reserve(ids.in.size());
  g.input_start.assign(n + 1, 0);
  g.output_once.assign(n, 1);
  g.bound_once.assign(n, 1);
  g.readers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t o = made_at[i];
    g.input_start[i] = g.input_maker.size();
    for (size_t k = ids.in_start[o]; k < ids.in_start[o + 1]; ++k) {
      const auto name = static_cast<size_t>(ids.in[k]);
      const size_t m = maker[name];
      const bool once = count[name] == 1;
      g.input_maker.push_back(m);
      g.input_once.push_back(once);
      g.bound_once[i] = g.bound_once[i] && once && (m == NameBindings::kNoMaker || m < i);
      if (m != NameBindings::kNoMaker && m < i) g.readers[m].push_back(i);
    }
    for (size_t k = ids.out_start[o]; k < ids.out_start[o + 1]; ++k) {
      g.output_once[i] = g.output_once[i] && count[static_cast<size_t>(ids.out[k])] == 1;
    }
    g.bound_once[i] = g.bound_once[i] && g.output_once[i];
  }
  g.input_start[n] = g.input_maker.size();
  return g;
}

}  // namespace shardsim::planner
