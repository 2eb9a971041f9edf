#include "sim/cli/flags.h"

#include <filesystem>
#include <set>
#include <sstream>

#include "sim/cli/run_file.h"

namespace shardsim {
namespace {

std::vector<std::string> SplitOn(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::stringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.push_back("");
  return parts;
}

bool ParsePositive(const std::string& text, int64_t* out) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  try {
    *out = std::stoll(text);
  } catch (const std::exception&) {
    return false;
  }
  return *out > 0;
}

}  // namespace

std::vector<int64_t> ParseShapeFlag(const std::string& flag, const std::string& text) {
  std::vector<int64_t> shape;
  for (const std::string& part : SplitOn(text, 'x')) {
    int64_t v = 0;
    if (!ParsePositive(part, &v)) {
      throw InputError(flag + " " + text + ": expected positive sizes like 4x4x4");
    }
    shape.push_back(v);
  }
  if (shape.empty()) throw InputError(flag + ": expected sizes like 4x4x4");
  return shape;
}

std::vector<MeshAxis> ParseMeshFlag(const std::string& flag, const std::string& text) {
  std::vector<MeshAxis> axes;
  std::set<std::string> seen;
  for (const std::string& part : SplitOn(text, ',')) {
    size_t eq = part.find('=');
    int64_t size = 0;
    if (eq == std::string::npos || eq == 0 || !ParsePositive(part.substr(eq + 1), &size)) {
      throw InputError(flag + " " + text + ": expected axes like dp=4,tp=2");
    }
    std::string name = part.substr(0, eq);
    if (!seen.insert(name).second) {
      throw InputError(flag + " " + text + ": axis '" + name + "' is named twice");
    }
    axes.push_back(MeshAxis{name, static_cast<int>(size)});
  }
  return axes;
}

std::vector<std::string> ParseListFlag(const std::string& flag, const std::string& text) {
  std::vector<std::string> names = SplitOn(text, ',');
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (n.empty()) throw InputError(flag + " " + text + ": expected names like dp,tp");
    if (!seen.insert(n).second) {
      throw InputError(flag + " " + text + ": '" + n + "' is named twice");
    }
  }
  return names;
}

std::vector<Bytes> ParseSizesFlag(const std::string& flag, const std::string& text) {
  std::vector<std::string> parts = SplitOn(text, ':');
  try {
    if (parts.size() == 1) return {ParseBytes(parts[0])};
    if (parts.size() == 2 || parts.size() == 3) {
      Bytes lo = ParseBytes(parts[0]), hi = ParseBytes(parts[1]);
      int64_t factor = 2;
      if (parts.size() == 3 && (!ParsePositive(parts[2], &factor) || factor < 2)) {
        throw InputError(flag + " " + text + ": the step factor must be an integer >= 2");
      }
      if (lo.count() <= 0 || hi < lo) {
        throw InputError(flag + " " + text + ": expected MIN:MAX with 0 < MIN <= MAX");
      }
      std::vector<Bytes> sizes;
      for (int64_t s = lo.count(); s <= hi.count(); s *= factor) {
        sizes.push_back(Bytes(s));
        if (s > hi.count() / factor) break;  // The next step is past MAX (or past int64).
      }
      return sizes;
    }
  } catch (const UnitError& e) {
    throw InputError(flag + " " + text + ": " + e.what());
  }
  throw InputError(flag + " " + text + ": expected a size or MIN:MAX like 1KiB:1GiB");
}

int PositiveNodesFlag(int nodes) {
  if (nodes < 1) {
    throw InputError("--nodes " + std::to_string(nodes) + ": expected a positive number of nodes");
  }
  return nodes;
}

void CheckDistinctOutputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  // Paths compared as absolute, normalized names ("out.json" is "./out.json").
  std::vector<std::filesystem::path> seen(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].second.empty()) continue;
    std::error_code ec;
    seen[i] = std::filesystem::weakly_canonical(std::filesystem::absolute(outputs[i].second), ec);
    if (ec) seen[i] = std::filesystem::absolute(outputs[i].second).lexically_normal();
    for (size_t j = 0; j < i; ++j) {
      if (!outputs[j].second.empty() && seen[j] == seen[i]) {
        throw InputError(outputs[j].first + " and " + outputs[i].first + " name the same file " +
                         outputs[i].second + ": give each output its own path");
      }
    }
  }
}

std::vector<int64_t> ParseIndexListFlag(const std::string& flag, const std::string& text,
                                        int64_t limit) {
  auto parse = [&](const std::string& digits) {
    if (digits.empty() || digits.size() > 15 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      throw InputError(flag + " " + text + ": expected device indices and ranges like 0-15,32");
    }
    return std::stoll(digits);
  };
  std::set<int64_t> indices;
  for (const std::string& part : SplitOn(text, ',')) {
    size_t dash = part.find('-');
    int64_t lo = parse(part.substr(0, dash));
    int64_t hi = dash == std::string::npos ? lo : parse(part.substr(dash + 1));
    if (hi < lo) throw InputError(flag + " " + text + ": range " + part + " runs backwards");
    if (hi >= limit) {
      throw InputError(flag + " " + text + ": " + std::to_string(hi) + " is out of range (0.." +
                       std::to_string(limit - 1) + ")");
    }
    for (int64_t i = lo; i <= hi; ++i) indices.insert(i);
  }
  return {indices.begin(), indices.end()};
}

void CreateOutputFolder(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw InputError(flag + " " + dir + ": cannot create the folder" +
                     (ec ? ": " + ec.message() : ""));
  }
}

}  // namespace shardsim
