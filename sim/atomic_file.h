// Writing output files all at once: a reader never sees a partial file.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardsim {

// Writes `contents` to a temporary file beside `path`, then renames it over `path`.
// Throws std::runtime_error naming the path if it cannot be written.
void WriteFileAtomically(const std::string& path, std::string_view contents);

// Writes several (path, contents) outputs of one command all or nothing: every file goes to a
// temporary name first, and they are renamed into place only when all were written, so a
// failure leaves neither a partial file nor an earlier output of the same command behind.
// Throws std::runtime_error "cannot write PATH: reason".
void WriteOutputFiles(const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace shardsim
