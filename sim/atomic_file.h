// Writing output files all at once: a reader never sees a partial file.
#pragma once

#include <string>
#include <string_view>

namespace shardsim {

// Writes `contents` to a temporary file beside `path`, then renames it over `path`.
// Throws std::runtime_error naming the path if it cannot be written.
void WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace shardsim
