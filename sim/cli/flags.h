// Parsing the compact values of command-line flags: shapes, meshes, axis lists, size ranges.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/mesh.h"
#include "sim/units.h"

namespace shardsim {

// Parses "4x4x4" (also a trailing "x" is an error) into positive sizes. Throws InputError
// naming `flag`.
std::vector<int64_t> ParseShapeFlag(const std::string& flag, const std::string& text);
// Parses "dp=4,tp=2" into mesh axes in order. Throws InputError naming `flag`.
std::vector<MeshAxis> ParseMeshFlag(const std::string& flag, const std::string& text);
// Parses "dp" or "dp,tp" into axis names. Throws InputError naming `flag`.
std::vector<std::string> ParseListFlag(const std::string& flag, const std::string& text);
// Parses "1KiB:1GiB" (powers of two from the first to the last, like nccl-tests -b/-e -f 2),
// "1KiB:1GiB:4" (factor 4), or one size "64MiB". Throws InputError naming `flag`.
std::vector<Bytes> ParseSizesFlag(const std::string& flag, const std::string& text);
// Returns `nodes`; throws InputError "--nodes N: ..." unless it is positive.
int PositiveNodesFlag(int nodes);
// Throws InputError if two of the (flag, path) outputs name the same file; empty paths are
// not given.
void CheckDistinctOutputs(const std::vector<std::pair<std::string, std::string>>& outputs);
// Creates the folder `dir` an output flag names (and its parents). Throws InputError
// "FLAG DIR: cannot create the folder..." when it cannot.
void CreateOutputFolder(const std::string& flag, const std::string& dir);
// Parses "0-15,32" (indices and inclusive ranges, each below `limit`) into sorted distinct
// indices. Throws InputError naming `flag`.
std::vector<int64_t> ParseIndexListFlag(const std::string& flag, const std::string& text,
                                        int64_t limit);

}  // namespace shardsim
