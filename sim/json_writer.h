// Minimal streaming JSON output: escaping and number formatting shared by all writers.
#pragma once

#include <string>
#include <string_view>

namespace shardsim {

// Appends `s` to `out` as a JSON string literal (quoted, escaped).
void AppendJsonString(std::string& out, std::string_view s);
// Appends a double as JSON: shortest round-trip form; non-finite values become null.
void AppendJsonNumber(std::string& out, double v);

}  // namespace shardsim
