// Who binds each name of a program: the facts the scheduling passes (prefetch, remat, offload,
// deferred readers) need to move or repeat ops without changing which binding a reader sees.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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
  // Every bound name: views of the program's own names, valid while its arrays and ops stay
  // as they are (no copy of each name).
  std::unordered_map<std::string_view, Binding> names;

  // Whether `name` is bound exactly once.
  bool Once(const std::string& name) const;
  // The bindings of `name`, or null when nothing binds it.
  const Binding* Find(const std::string& name) const;
  // The (last) op binding `name`, or kNoMaker (an array, or unbound).
  size_t Maker(const std::string& name) const;
};

// The bindings of `program`'s arrays and ops (viewing its names: `program` must outlive them
// unchanged).
NameBindings BindingsOf(const ProgramSpec& program);

// The data flow between a program's ops, by name: what the scheduling passes read of each op
// (made once per program and shared, so each name is hashed once).
struct OpGraph {
  // Per input of each op, in order: the op binding it (NameBindings::kNoMaker for an input
  // array or an unbound name), and whether its name is bound once; op i's inputs are the
  // entries [input_start[i], input_start[i + 1]).
  std::vector<size_t> input_maker, input_start;
  std::vector<char> input_once;
  std::vector<char> output_once;  // Per op: every name it binds is bound once.
  // Per op: every name it reads or binds is bound once, and what it reads is bound before it
  // (an input array or an earlier op's result): an op that may move without changing which
  // binding any reader sees.
  std::vector<char> bound_once;
  // Per op: the ops after it reading its results, ascending (once per input that reads one).
  std::vector<std::vector<size_t>> readers;

  bool operator==(const OpGraph&) const = default;
};

// A program's names as ids, each distinct name hashed once, listed per op in the order the ops
// had when it was made: GraphOf makes the graph of the same ops in any later order from them
// without hashing a name again (the scheduling passes reorder a step's ops three times).
struct OpNameIds {
  int names = 0;                  // Distinct names (ids 0 .. names - 1).
  std::vector<int> arrays;        // Per input array, its name's id.
  std::vector<size_t> in_start;   // Per op (+ 1 at the end): its first entry of `in`.
  std::vector<size_t> out_start;  // Per op (+ 1 at the end): its first entry of `out`.
  std::vector<int> in, out;       // The ops' input and result names' ids.
};

// The name ids of `program`'s arrays and ops, in its present order.
OpNameIds NameIdsOf(const ProgramSpec& program);

// The data flow of `program`.
OpGraph GraphOf(const ProgramSpec& program);
// The data flow of a program whose op k was op `made_at[k]` when `ids` were made (its ops are
// those ops reordered, with their names): equal to GraphOf of the program as it is now.
OpGraph GraphOf(const OpNameIds& ids, const std::vector<size_t>& made_at);
// The data flow of `program`: from `ids` through `made_at` when given, else from its names.
OpGraph GraphOf(const ProgramSpec& program, const OpNameIds* ids,
                const std::vector<size_t>& made_at);

}  // namespace shardsim::planner
