// Writing a program back as run-file YAML: the `mesh:`, `arrays:`, `program:` and
// `outputs:` sections, one op per line with its attributes as the registry names them.
#pragma once

#include <string>
#include <vector>

#include "collectives/program.h"

namespace shardsim {

// The program's sections as YAML text. `comments`, when given, has one line per op (empty:
// none) written as a comment above it. Init files are written as `file_dir`-resolved paths.
std::string ProgramYaml(const ProgramSpec& program, const std::vector<std::string>& comments = {},
                        const std::string& file_dir = "");

// One op as a YAML flow mapping: {op: psum, in: x, out: y, axis_name: dp}.
std::string OpYaml(const OpSpec& op);

}  // namespace shardsim
