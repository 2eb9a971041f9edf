#include "sim/cli/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include "sim/closest_name.h"

namespace shardsim {
namespace {

bool HasMark(const YAML::Mark& m) { return m.line >= 0 && m.column >= 0; }

std::string Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string> SplitDots(const std::string& key) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    out.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

// Parses a whole string as an integer of type T; false if it is not one.
template <typename T>
bool ParseInteger(std::string_view text, T& out) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, out);
  return ec == std::errc() && ptr == end && begin != end;
}

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

// Sets segments[i..] under `node` (named `path`) to `value`, creating missing mappings and
// list entries; the paths it creates are added to `created`.
void SetPath(YAML::Node node, const std::vector<std::string>& segments, size_t i,
             const YAML::Node& value, const std::string& set_key, const std::string& path,
             std::vector<std::string>& created) {
  const std::string& segment = segments[i];
  const std::string child_path = path.empty() ? segment : path + "." + segment;
  const bool last = i + 1 == segments.size();
  auto fail = [&](const std::string& what) {
    throw InputError(OneLine("--set " + set_key + ": " + what + " (key " + set_key + ")"));
  };
  auto container = [&]() {
    size_t index = 0;
    return ParseInteger(segments[i + 1], index) ? YAML::Node(YAML::NodeType::Sequence)
                                                : YAML::Node(YAML::NodeType::Map);
  };
  auto descend = [&](YAML::Node child) {
    SetPath(child, segments, i + 1, value, set_key, child_path, created);
  };
  if (node.IsSequence()) {
    size_t index = 0;
    if (!ParseInteger(segment, index)) {
      fail((path.empty() ? "the top level" : path) + " is a list; expected an index, got '" +
           segment + "'");
    }
    if (index > node.size()) {
      fail("index " + segment + " is past the end of " + path + " (" + std::to_string(node.size()) +
           " entries)");
    }
    if (index == node.size()) {
      node.push_back(last ? value : container());
      created.push_back(child_path);
      if (!last) descend(node[index]);
      return;
    }
    if (last) {
      node[index] = value;
      return;
    }
    const YAML::Node& const_node = node;
    YAML::Node existing = const_node[index];
    if (existing.IsNull()) {
      node[index] = container();
    } else if (!existing.IsMap() && !existing.IsSequence()) {
      fail(child_path + " is a value, not a mapping or list");
    }
    descend(node[index]);
    return;
  }
  if (!node.IsMap()) fail((path.empty() ? "the top level" : path) + " is not a mapping");
  if (last) {
    node[segment] = value;
    return;
  }
  const YAML::Node& const_node = node;
  YAML::Node existing = const_node[segment];
  if (!existing.IsDefined() || existing.IsNull()) {
    node[segment] = container();
    created.push_back(child_path);
  } else if (!existing.IsMap() && !existing.IsSequence()) {
    fail(child_path + " is a value, not a mapping or list");
  }
  descend(node[segment]);
}

}  // namespace

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return text;
}

std::string FormatLocated(const std::string& file, const KeyLocation& where, const std::string& key,
                          const std::string& what) {
  std::string prefix;
  if (where.from_set) {
    prefix = "--set " + (where.set_key.empty() ? key : where.set_key);
  } else if (where.line > 0) {
    prefix = file + ":" + std::to_string(where.line) + ":" + std::to_string(where.column);
  } else {
    prefix = file;
  }
  return OneLine(prefix + ": " + what + (key.empty() ? "" : " (key " + key + ")"));
}

YamlSource::YamlSource(std::string file) : file_(std::move(file)) {}

YAML::Node YamlSource::Load() const {
  std::error_code ec;
  if (std::filesystem::is_directory(file_, ec)) {
    throw InputError(OneLine(file_ + ": cannot open: " + std::strerror(EISDIR)));
  }
  errno = 0;
  std::ifstream in(file_, std::ios::binary);
  if (!in) {
    int err = errno != 0 ? errno : ENOENT;
    throw InputError(OneLine(file_ + ": cannot open: " + std::strerror(err)));
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    std::vector<YAML::Node> documents = YAML::LoadAll(text.str());
    if (documents.size() > 1) {
      // A second document would be ignored silently: refuse it where it starts.
      KeyLocation where;
      YAML::Mark mark = documents[1].Mark();
      if (HasMark(mark)) {
        where.line = mark.line + 1;
        where.column = mark.column + 1;
      }
      throw InputError(FormatLocated(
          file_, where, "", "a second YAML document (after '---'); a file holds one document"));
    }
    return documents.empty() ? YAML::Node() : documents[0];
  } catch (const YAML::Exception& e) {
    KeyLocation where;
    if (HasMark(e.mark)) {
      where.line = e.mark.line + 1;
      where.column = e.mark.column + 1;
    }
    throw InputError(FormatLocated(file_, where, "", "invalid YAML: " + e.msg));
  }
}

void YamlSource::ApplyOverride(YAML::Node root, const std::string& text) {
  size_t eq = text.find('=');
  std::string key = eq == std::string::npos ? "" : Trim(std::string_view(text).substr(0, eq));
  std::vector<std::string> segments = SplitDots(key);
  bool bad = key.empty() || std::any_of(segments.begin(), segments.end(), [](const std::string& s) {
               return s.empty() || s.find_first_of(" \t") != std::string::npos;
             });
  if (bad) throw InputError(OneLine("--set " + text + ": expected KEY=VALUE"));
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw InputError(
        OneLine("--set " + key + ": invalid YAML value: " + e.msg + " (key " + key + ")"));
  }
  std::vector<std::string> created;
  SetPath(root, segments, 0, value, key, "", created);
  for (const std::string& path : created) set_paths_[path] = key;
  set_paths_[key] = key;
}

std::string YamlSource::OverrideFor(const std::string& path) const {
  std::string candidate = path;
  while (true) {
    auto it = set_paths_.find(candidate);
    if (it != set_paths_.end()) return it->second;
    size_t dot = candidate.rfind('.');
    if (dot == std::string::npos) return "";
    candidate.resize(dot);
  }
}

void YamlSource::Fail(const std::string& path, const YAML::Mark& mark,
                      const std::string& what) const {
  KeyLocation where;
  where.set_key = OverrideFor(path);
  where.from_set = !where.set_key.empty();
  if (HasMark(mark)) {
    where.line = mark.line + 1;
    where.column = mark.column + 1;
  }
  throw InputError(FormatLocated(file_, where, path, what));
}

void YamlSource::Record(const std::string& path, const YAML::Mark& mark) {
  KeyLocation where;
  where.set_key = OverrideFor(path);
  where.from_set = !where.set_key.empty();
  if (!where.from_set && HasMark(mark)) {
    where.line = mark.line + 1;
    where.column = mark.column + 1;
  }
  locations_[path] = where;
}

YamlValue::YamlValue(YamlSource* source, YAML::Node node, std::string path, YAML::Mark key_mark)
    : source_(source), node_(std::move(node)), path_(std::move(path)), key_mark_(key_mark) {}

YAML::Mark YamlValue::mark() const {
  if (!node_.IsDefined() || node_.IsNull()) return key_mark_;
  YAML::Mark m = node_.Mark();
  return HasMark(m) ? m : key_mark_;
}

std::string YamlValue::SetKey() const { return source_->OverrideFor(path_); }

std::string YamlValue::Describe() const {
  if (!node_.IsDefined() || node_.IsNull()) return "nothing (an empty value)";
  if (node_.IsMap()) return "a mapping";
  if (node_.IsSequence()) return "a list";
  return Quote(node_.Scalar());
}

void YamlValue::Fail(const std::string& what) const { source_->Fail(path_, mark(), what); }

void YamlValue::FailAtKey(const std::string& what) const {
  source_->Fail(path_, HasMark(key_mark_) ? key_mark_ : mark(), what);
}

void YamlValue::FailChild(std::string_view child, const std::string& what) const {
  std::string child_path = path_.empty() ? std::string(child) : path_ + "." + std::string(child);
  source_->Fail(child_path, mark(), what);
}

void YamlValue::Expected(const std::string& what) const {
  Fail("expected " + what + ", got " + Describe());
}

std::string YamlValue::String() const {
  if (!node_.IsScalar()) Expected("a string");
  return node_.Scalar();
}

std::string YamlValue::OneOf(const std::vector<std::string>& allowed) const {
  if (!node_.IsScalar()) Expected("one of " + JoinNames(allowed));
  std::string value = node_.Scalar();
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return value;
  std::string suggestion = SuggestKey(value, allowed);
  if (!suggestion.empty()) {
    Fail("unknown value " + Quote(value) + "; did you mean '" + suggestion + "'?");
  }
  Fail("expected one of " + JoinNames(allowed) + ", got " + Quote(value));
}

int YamlValue::Int(int min) const {
  int64_t value = Int64(min);
  if (value > std::numeric_limits<int>::max()) {
    Fail("must be at most " + std::to_string(std::numeric_limits<int>::max()) + ", got " +
         std::to_string(value));
  }
  return static_cast<int>(value);
}

int64_t YamlValue::Int64(int64_t min) const {
  if (!node_.IsScalar()) Expected("an integer");
  int64_t value = 0;
  if (!ParseInteger(Trim(node_.Scalar()), value)) Expected("an integer");
  if (value < min) {
    if (min == 1) Fail("must be positive, got " + std::to_string(value));
    if (min == 0) Fail("must not be negative, got " + std::to_string(value));
    Fail("must be at least " + std::to_string(min) + ", got " + std::to_string(value));
  }
  return value;
}

double YamlValue::Number() const {
  double value = 0;
  if (!node_.IsScalar() || !YAML::convert<double>::decode(node_, value)) Expected("a number");
  return value;
}

bool YamlValue::Bool() const {
  bool value = false;
  if (!node_.IsScalar() || !YAML::convert<bool>::decode(node_, value)) {
    Expected("true or false");
  }
  return value;
}

template <typename Parse>
auto YamlValue::Quantity(const char* example, Parse parse) const -> decltype(parse(std::string())) {
  if (!node_.IsScalar()) Expected(example);
  try {
    return parse(node_.Scalar());
  } catch (const UnitError& e) {
    Fail(e.what());
  }
}

Bytes YamlValue::ToBytes() const {
  return Quantity("a size like \"64 MiB\"", [](const std::string& s) { return ParseBytes(s); });
}

Bandwidth YamlValue::ToBandwidth() const {
  Bandwidth value = Quantity("a bandwidth like \"45 GB/s\"",
                             [](const std::string& s) { return ParseBandwidth(s); });
  if (value.bytes_per_second() <= 0) Fail("a bandwidth must be positive, got " + Describe());
  return value;
}

Time YamlValue::ToTime() const {
  return Quantity("a time like \"1 us\"", [](const std::string& s) { return ParseTime(s); });
}

FlopRate YamlValue::ToFlopRate() const {
  FlopRate value = Quantity("a compute rate like \"197 TFLOP/s\"",
                            [](const std::string& s) { return ParseFlopRate(s); });
  if (value.per_second() <= 0) Fail("a compute rate must be positive, got " + Describe());
  return value;
}

std::vector<int> YamlValue::Shape() const {
  const std::string kWhat = "a list of positive integers like [4, 4] or \"4x4\"";
  std::vector<int> shape;
  if (node_.IsSequence()) {
    for (const YamlValue& entry : List()) shape.push_back(entry.Int(1));
    if (shape.empty()) Fail("expected at least one dimension, got an empty list");
    return shape;
  }
  if (!node_.IsScalar()) Expected(kWhat);
  std::string text = Trim(node_.Scalar());
  size_t start = 0;
  while (true) {
    size_t x = text.find_first_of("xX", start);
    std::string part = Trim(std::string_view(text).substr(
        start, x == std::string::npos ? std::string::npos : x - start));
    int size = 0;
    if (!ParseInteger(part, size)) Expected(kWhat);
    if (size < 1) Fail("every dimension must be positive, got " + Quote(text));
    shape.push_back(size);
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return shape;
}

std::vector<YamlValue> YamlValue::List() const {
  if (!node_.IsSequence()) Expected("a list");
  std::vector<YamlValue> out;
  for (size_t i = 0; i < node_.size(); ++i) {
    const YAML::Node& const_node = node_;
    YAML::Node entry = const_node[i];
    std::string child_path = path_.empty() ? std::to_string(i) : path_ + "." + std::to_string(i);
    YAML::Mark entry_mark = entry.Mark();
    if (!HasMark(entry_mark)) entry_mark = mark();
    source_->Record(child_path, entry_mark);
    out.emplace_back(source_, entry, child_path, entry_mark);
  }
  return out;
}

YamlMap YamlValue::Map(const std::vector<std::string>& allowed) const {
  if (!node_.IsMap()) Expected("a mapping");
  std::vector<std::pair<std::string, YamlValue>> entries;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    YAML::Mark key_mark = key.Mark();
    if (!HasMark(key_mark)) key_mark = mark();
    if (!key.IsScalar()) {
      source_->Fail(
          path_, key_mark,
          "a key must be a plain name, got a " + std::string(key.IsMap() ? "mapping" : "list"));
    }
    const std::string name = key.Scalar();
    const std::string child_path = path_.empty() ? name : path_ + "." + name;
    for (const auto& [seen, seen_value] : entries) {
      if (seen == name) {
        YAML::Mark first = seen_value.key_mark();
        source_->Fail(child_path, key_mark,
                      "duplicate key '" + name + "' (first given at line " +
                          std::to_string(first.line + 1) + ")");
      }
    }
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string where = path_.empty() ? "top-level key" : "key";
      std::string suggestion = SuggestKey(name, allowed);
      source_->Fail(child_path, key_mark,
                    "unknown " + where + " '" + name + "'" +
                        (suggestion.empty() ? "; expected one of " + JoinNames(allowed)
                                            : "; did you mean '" + suggestion + "'?"));
    }
    source_->Record(child_path, key_mark);
    entries.emplace_back(name, YamlValue(source_, value, child_path, key_mark));
  }
  return YamlMap(*this, std::move(entries));
}

YamlMap::YamlMap(YamlValue self, std::vector<std::pair<std::string, YamlValue>> entries)
    : self_(std::move(self)), entries_(std::move(entries)) {}

std::optional<YamlValue> YamlMap::Find(std::string_view key) const {
  for (const auto& [name, value] : entries_) {
    if (name == key) return value;
  }
  return std::nullopt;
}

YamlValue YamlMap::Get(std::string_view key) const {
  std::optional<YamlValue> value = Find(key);
  if (!value) self_.FailChild(key, "missing required key '" + std::string(key) + "'");
  return *value;
}

}  // namespace shardsim
