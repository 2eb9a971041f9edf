// Minimal streaming JSON output: escaping and number formatting shared by all writers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardsim {

// Appends `s` to `out` as a JSON string literal (quoted, escaped).
void AppendJsonString(std::string& out, std::string_view s);
// Appends `list` to `out` as a JSON array of strings (["a", "b"]).
void AppendJsonStrings(std::string& out, const std::vector<std::string>& list);
// Appends a double as JSON: shortest round-trip form; non-finite values become null.
void AppendJsonNumber(std::string& out, double v);

}  // namespace shardsim
