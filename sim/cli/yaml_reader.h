// A small typed reader over yaml-cpp nodes: every read knows its dotted key path and the
// node's Mark, so every error is one located line "FILE:LINE:COL: what is wrong (key K)".
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/cli/run_file.h"
#include "sim/time.h"
#include "sim/units.h"

namespace shardsim {

// Makes `text` one line (newlines and tabs become spaces).
std::string OneLine(std::string text);

// "FILE:LINE:COL: what (key KEY)", "--set SETKEY: what (key KEY)" or "FILE: what (key KEY)"
// (the key part left out when `key` is empty), as one line.
std::string FormatLocated(const std::string& file, const KeyLocation& where, const std::string& key,
                          const std::string& what);

// One YAML document being read: its file name, the --set overrides applied to it, and the
// locations of the keys read so far. Owns the error wording.
class YamlSource {
 public:
  // `file`: the path named in error messages.
  explicit YamlSource(std::string file);

  // The path named in error messages.
  const std::string& file() const { return file_; }

  // Reads and parses the file, which must hold one YAML document. Throws InputError
  // ("FILE: cannot open: ...", "FILE:LINE:COL: invalid YAML: ...", or at a second document).
  YAML::Node Load() const;

  // Applies one --set "a.b.c=VALUE" override to `root` (VALUE parsed as YAML; intermediate
  // mappings and list entries are created). Throws InputError for a malformed override.
  void ApplyOverride(YAML::Node root, const std::string& text);

  // The --set key whose value covers `path` (the path or an enclosing one), or "".
  std::string OverrideFor(const std::string& path) const;

  // Throws InputError "PREFIX: what (key PATH)", PREFIX being "--set K", "FILE:LINE:COL"
  // or "FILE" (when the mark is unknown).
  [[noreturn]] void Fail(const std::string& path, const YAML::Mark& mark,
                         const std::string& what) const;

  // Remembers where the key `path` was written.
  void Record(const std::string& path, const YAML::Mark& mark);

  // The locations recorded so far, by dotted path.
  const std::map<std::string, KeyLocation>& locations() const { return locations_; }

 private:
  std::string file_;
  std::map<std::string, std::string> set_paths_;  // Path given or created by --set -> its key.
  std::map<std::string, KeyLocation> locations_;  // Recorded key locations.
};

class YamlMap;

// A YAML node with its dotted key path, read through typed accessors that throw located
// InputErrors.
class YamlValue {
 public:
  // `key_mark`: where the key (or list entry) holding this value was written.
  YamlValue(YamlSource* source, YAML::Node node, std::string path, YAML::Mark key_mark);

  // The dotted key path, e.g. "hardware.link.bandwidth".
  const std::string& path() const { return path_; }
  // The underlying node.
  const YAML::Node& node() const { return node_; }
  // Where the value was written (the key's place for an empty value).
  YAML::Mark mark() const;
  // Where its key was written.
  const YAML::Mark& key_mark() const { return key_mark_; }
  // The --set key that gave this value (or an enclosing one), or "" if it came from the file.
  std::string SetKey() const;

  // True for a YAML mapping.
  bool IsMap() const { return node_.IsMap(); }
  // True for a YAML list (sequence).
  bool IsList() const { return node_.IsSequence(); }
  // True for a YAML scalar.
  bool IsScalar() const { return node_.IsScalar(); }

  // Words for the node's kind, for "expected X, got Y": "a mapping", "a list", "\"abc\"", ...
  std::string Describe() const;

  // A scalar as a string.
  std::string String() const;
  // A string that must be one of `allowed` (with a did-you-mean otherwise).
  std::string OneOf(const std::vector<std::string>& allowed) const;
  // An integer >= `min`.
  int Int(int min) const;
  // A 64-bit integer >= `min` (the default accepts any, negative ones included).
  int64_t Int64(int64_t min = INT64_MIN) const;
  // A number (integer or floating point, also .inf and .nan).
  double Number() const;
  // true/false (also yes/no, on/off).
  bool Bool() const;
  // A size ("64 MiB" or a bare count).
  Bytes ToBytes() const;
  // A bandwidth with a unit; must be positive.
  Bandwidth ToBandwidth() const;
  // A time with a unit (non-negative).
  Time ToTime() const;
  // A compute rate with a unit; must be positive.
  FlopRate ToFlopRate() const;
  // A list of positive integers: [4, 4] or the string "4x4".
  std::vector<int> Shape() const;
  // A list; each entry's path is "PATH.INDEX".
  std::vector<YamlValue> List() const;
  // A mapping whose keys must be in `allowed` (a "did you mean" otherwise); `allowed` empty
  // accepts any key.
  YamlMap Map(const std::vector<std::string>& allowed) const;

  // Throws the InputError "LOCATION: what (key PATH)" at this value.
  [[noreturn]] void Fail(const std::string& what) const;
  // Throws the InputError "LOCATION: what (key PATH)" at this value's key.
  [[noreturn]] void FailAtKey(const std::string& what) const;
  // Throws the InputError "LOCATION: what (key PATH.child)" at this value.
  [[noreturn]] void FailChild(std::string_view child, const std::string& what) const;
  // Throws "expected `what`, got <kind>" at this value.
  [[noreturn]] void Expected(const std::string& what) const;

 private:
  // Parses this scalar with `parse` (a sim/units.h parser); `example` names the expected form.
  template <typename Parse>
  auto Quantity(const char* example, Parse parse) const -> decltype(parse(std::string()));

  YamlSource* source_;
  YAML::Node node_;
  std::string path_;
  YAML::Mark key_mark_;
};

// A mapping read through YamlValue::Map: its entries in file order, keys already checked.
class YamlMap {
 public:
  // Built by YamlValue::Map.
  YamlMap(YamlValue self, std::vector<std::pair<std::string, YamlValue>> entries);

  // The mapping itself.
  const YamlValue& self() const { return self_; }
  // The entries, in file order.
  const std::vector<std::pair<std::string, YamlValue>>& entries() const { return entries_; }
  // Whether `key` is present.
  bool Has(std::string_view key) const { return Find(key).has_value(); }
  // The value of `key`, if present.
  std::optional<YamlValue> Find(std::string_view key) const;
  // The value of a required `key`; a "missing required key" error at the mapping otherwise.
  YamlValue Get(std::string_view key) const;

 private:
  YamlValue self_;
  std::vector<std::pair<std::string, YamlValue>> entries_;
};

}  // namespace shardsim
