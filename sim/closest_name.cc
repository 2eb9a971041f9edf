#include "sim/closest_name.h"

#include <algorithm>
#include <cctype>

namespace shardsim {
namespace {

bool SameLetter(char a, char b) {
  return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
}

// Length of the common prefix of two strings, case-insensitive.
size_t CommonPrefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && SameLetter(a[n], b[n])) {
    ++n;
  }
  return n;
}

}  // namespace

int EditDistance(std::string_view a, std::string_view b) {
  // d[i][j] = distance(a[0..i), b[0..j)), with the transposition step of the OSA variant.
  const size_t n = a.size();
  const size_t m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      int cost = SameLetter(a[i - 1], b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && SameLetter(a[i - 1], b[j - 2]) && SameLetter(a[i - 2], b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string ClosestName(std::string_view name, const std::vector<std::string>& known) {
  std::string best;
  int best_distance = 0;
  size_t best_prefix = 0;
  for (const std::string& candidate : known) {
    // Smallest edit distance wins; on a tie the longer shared prefix ("tpu-v5" is closer to
    // "tpu-v5e" than to "tpu-v4"), then the first listed.
    int d = EditDistance(name, candidate);
    size_t prefix = CommonPrefix(name, candidate);
    if (best.empty() || d < best_distance || (d == best_distance && prefix > best_prefix)) {
      best = candidate;
      best_distance = d;
      best_prefix = prefix;
    }
  }
  // A suggestion that rewrites more than half of the name is noise, not help.
  int limit = std::max<int>(2, static_cast<int>(std::max(name.size(), best.size()) / 2));
  if (best.empty() || best_distance > limit) return "";
  return best;
}

std::string SuggestKey(std::string_view typed, const std::vector<std::string>& allowed) {
  // Scores: twice the edit distance when it is at most 2 (and less than the word's length),
  // 6 for a prefix match only; a prefix match wins a tie.
  constexpr int kNone = 1 << 30;
  std::string best;
  int best_score = kNone;
  for (const std::string& word : allowed) {
    int distance = EditDistance(typed, word);
    bool prefix = (typed.size() >= 2 && word.starts_with(typed)) ||
                  (word.size() >= 2 && typed.starts_with(word));
    int score = distance <= 2 && distance < static_cast<int>(typed.size()) ? 2 * distance
                : prefix                                                   ? 6
                                                                           : kNone;
    if (score != kNone && prefix) score -= 1;
    if (score < best_score) {
      best_score = score;
      best = word;
    }
  }
  return best;
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  return out;
}

std::string JoinNamesOr(const std::vector<std::string>& names) {
  if (names.size() < 2) return JoinNames(names);
  std::vector<std::string> head(names.begin(), names.end() - 1);
  return JoinNames(head) + " or " + names.back();
}

}  // namespace shardsim
