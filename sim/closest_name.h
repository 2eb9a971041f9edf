// Suggesting the nearest known name for a misspelled one ("did you mean ...?").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardsim {

// Optimal-string-alignment (Damerau-Levenshtein) edit distance, case-insensitive: insertions,
// deletions, substitutions and transpositions of adjacent characters each cost 1.
int EditDistance(std::string_view a, std::string_view b);

// The name in `known` closest to `name` by edit distance (longer shared prefix, then first
// listed, on ties), or "" when `known` is empty or the best needs more than half the name
// rewritten. For values such as preset names.
std::string ClosestName(std::string_view name, const std::vector<std::string>& known);

// The allowed key closest to `typed`: edit distance <= 2 (and shorter than `typed`), or a
// prefix either way; "" when none qualifies. For misspelled YAML keys and enum values.
std::string SuggestKey(std::string_view typed, const std::vector<std::string>& allowed);

// Joins names as "a, b, c" for error messages.
std::string JoinNames(const std::vector<std::string>& names);

// Joins names as "a, b or c" for choices in usage text and messages.
std::string JoinNamesOr(const std::vector<std::string>& names);

}  // namespace shardsim
