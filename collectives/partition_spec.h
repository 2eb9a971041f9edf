// JAX's PartitionSpec: which mesh axes shard each dimension of an array.
#pragma once

#include <string>
#include <vector>

#include "collectives/array.h"
#include "collectives/mesh.h"

namespace shardsim {

// One entry per array dimension: the mesh axes (first major) that split it; empty = None.
// Dimensions past the spec's length are replicated, as in JAX.
struct PartitionSpec {
  std::vector<std::vector<std::string>> dims;  // Per dimension, the axis names.
  bool operator==(const PartitionSpec&) const = default;
};

// Parses JAX's spelling: "P('dp', None)", "P(('dp', 'tp'), None)", "P()", also
// "PartitionSpec(...)" and double quotes. Throws std::invalid_argument with what is wrong.
PartitionSpec ParsePartitionSpec(const std::string& text);
// JAX's spelling of a spec: "P('dp', None)", "P(('dp', 'tp'),)".
std::string FormatPartitionSpec(const PartitionSpec& spec);

// Checks `spec` for an array of `shape` on `mesh`: every axis exists, no axis is used twice,
// rank(spec) <= rank(shape), and every sharded dimension divides by the product of its axes.
// Throws std::invalid_argument naming the problem (the caller adds the array's name).
void ValidatePartitionSpec(const PartitionSpec& spec, const Shape& shape, const Mesh& mesh);

}  // namespace shardsim
