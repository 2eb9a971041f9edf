// Who binds each name of a program: the facts the scheduling passes (prefetch, remat, offload,
// deferred readers) need to move or repeat ops without changing which binding a reader sees.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <unordered_map>

#include "collectives/program.h"

namespace shardsim::planner {

// The bindings of a program's names: input arrays and op results.
struct NameBindings {
  // maker of a name no op binds (an input array).
  static constexpr size_t kNoMaker = std::numeric_limits<size_t>::max();
  // One name's bindings.
  struct Binding {
    int count = 0;            // Times it is bound (an array once).
    size_t maker = kNoMaker;  // The (last) op binding it; kNoMaker for an array.
  };
  std::unordered_map<std::string, Binding> names;  // Every bound name.

  // Whether `name` is bound exactly once.
  bool Once(const std::string& name) const;
  // The bindings of `name`, or null when nothing binds it.
  const Binding* Find(const std::string& name) const;
  // The (last) op binding `name`, or kNoMaker (an array, or unbound).
  size_t Maker(const std::string& name) const;
};

// The bindings of `program`'s arrays and ops.
NameBindings BindingsOf(const ProgramSpec& program);

}  // namespace shardsim::planner
