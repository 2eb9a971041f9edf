#include "collectives/partition_spec.h"

#include <cctype>
#include <cstddef>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardsim {
namespace {

// A recursive-descent reader of JAX's PartitionSpec spelling.
class SpecParser {
 public:
  explicit SpecParser(const std::string& text) : text_(text) {}

  PartitionSpec Parse() {
    SkipSpace();
    const std::string head = ReadIdentifier();
    // Accept dotted module paths too: "jax.sharding.PartitionSpec(...)".
    const size_t dot = head.rfind('.');
    const std::string last = dot == std::string::npos ? head : head.substr(dot + 1);
    if (last != "P" && last != "PartitionSpec") {
      Fail(head.empty() ? "expected P( or PartitionSpec("
                        : "expected P( or PartitionSpec(, got '" + head + "'",
           head.empty() ? pos_ : pos_ - head.size());
    }
    SkipSpace();
    Expect('(');
    PartitionSpec spec;
    SkipSpace();
    while (!AtEnd() && Peek() != ')') {
      spec.dims.push_back(ReadEntry());
      SkipSpace();
      if (AtEnd() || Peek() == ')') break;
      if (Peek() != ',') Fail("expected ',' or ')' after an entry", pos_);
      ++pos_;
      SkipSpace();
    }
    Expect(')');
    SkipSpace();
    if (!AtEnd()) Fail("unexpected text after the closing ')'", pos_);
    return spec;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipSpace() {
    while (!AtEnd() && std::isspace(static_cast<unsigned char>(Peek()))) ++pos_;
  }

  [[noreturn]] void Fail(const std::string& what, size_t at) const {
    throw std::invalid_argument("bad PartitionSpec \"" + text_ + "\": " + what + " at character " +
                                std::to_string(at));
  }

  void Expect(char c) {
    if (AtEnd()) Fail(std::string("expected '") + c + "' but the text ended", pos_);
    if (Peek() != c) {
      Fail(std::string("expected '") + c + "', got '" + Peek() + "'", pos_);
    }
    ++pos_;
  }

  std::string ReadIdentifier() {
    const size_t start = pos_;
    while (!AtEnd() &&
           (std::isalnum(static_cast<unsigned char>(Peek())) || Peek() == '_' || Peek() == '.')) {
      ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  // A quoted axis name: 'dp' or "dp".
  std::string ReadString() {
    const char quote = Peek();
    const size_t start = pos_;
    ++pos_;
    const size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) Fail("unterminated string", start);
    std::string name = text_.substr(pos_, end - pos_);
    if (name.empty()) Fail("empty axis name", start);
    pos_ = end + 1;
    return name;
  }

  // One dimension: 'a', None, ('a', 'b'), ('a',), ().
  std::vector<std::string> ReadEntry() {
    if (AtEnd()) Fail("expected an axis name, None or a tuple but the text ended", pos_);
    const char c = Peek();
    if (c == '\'' || c == '"') return {ReadString()};
    if (c == '(') return ReadTuple();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      const std::string word = ReadIdentifier();
      if (word == "None") return {};
      Fail("expected a quoted axis name, None or a tuple, got " + word + " (quote axis names: '" +
               word + "')",
           start);
    }
    Fail(std::string("expected a quoted axis name, None or a tuple, got '") + c + "'", pos_);
  }

  std::vector<std::string> ReadTuple() {
    ++pos_;  // '('
    std::vector<std::string> names;
    SkipSpace();
    while (!AtEnd() && Peek() != ')') {
      const char c = Peek();
      if (c != '\'' && c != '"') {
        Fail(std::string("expected a quoted axis name in the tuple, got '") + c + "'", pos_);
      }
      names.push_back(ReadString());
      SkipSpace();
      if (AtEnd() || Peek() == ')') break;
      if (Peek() != ',') Fail("expected ',' or ')' in the tuple", pos_);
      ++pos_;
      SkipSpace();
    }
    Expect(')');
    return names;
  }

  const std::string& text_;
  size_t pos_ = 0;
};

// "P('dp', None)" style text of one dimension.
std::string FormatEntry(const std::vector<std::string>& names) {
  if (names.empty()) return "None";
  if (names.size() == 1) return "'" + names[0] + "'";
  std::string text = "(";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += ", ";
    text += "'" + names[i] + "'";
  }
  return text + ")";
}

}  // namespace

PartitionSpec ParsePartitionSpec(const std::string& text) { return SpecParser(text).Parse(); }

std::string FormatPartitionSpec(const PartitionSpec& spec) {
  std::string text = "P(";
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    if (i > 0) text += ", ";
    text += FormatEntry(spec.dims[i]);
  }
  // Like Python's repr of a one-element tuple (and JAX's repr): "P('dp',)".
  if (spec.dims.size() == 1) text += ",";
  return text + ")";
}

void ValidatePartitionSpec(const PartitionSpec& spec, const Shape& shape, const Mesh& mesh) {
  // The messages are made only when one is thrown (every lowered array is checked).
  auto spec_text = [&] { return FormatPartitionSpec(spec); };
  if (spec.dims.size() > shape.size()) {
    throw std::invalid_argument("sharding " + spec_text() + " has " +
                                std::to_string(spec.dims.size()) +
                                " entries but the array has rank " + std::to_string(shape.size()));
  }
  std::vector<std::pair<int, size_t>> used;  // Axis index -> the dimension that uses it.
  for (size_t d = 0; d < spec.dims.size(); ++d) {
    int64_t product = 1;
    for (const std::string& name : spec.dims[d]) {
      const int a = mesh.AxisIndex(name);
      if (a < 0) {
        std::string mesh_names;
        for (const MeshAxis& axis : mesh.axes()) {
          mesh_names += (mesh_names.empty() ? "" : ", ") + axis.name;
        }
        throw std::invalid_argument(
            "sharding " + spec_text() + " names mesh axis '" + name + "', which the mesh lacks" +
            (mesh_names.empty() ? " (the mesh has no axes)" : " (mesh axes: " + mesh_names + ")"));
      }
      for (const auto& [axis, dim] : used) {
        if (axis != a) continue;
        throw std::invalid_argument("sharding " + spec_text() + " uses mesh axis '" + name +
                                    "' twice (dimensions " + std::to_string(dim) + " and " +
                                    std::to_string(d) + ")");
      }
      used.emplace_back(a, d);
      product *= mesh.axes()[a].size;
    }
    if (shape[d] % product != 0) {
      std::string names;
      for (const std::string& name : spec.dims[d]) names += (names.empty() ? "" : ", ") + name;
      throw std::invalid_argument(
          "sharding " + spec_text() + ": dimension " + std::to_string(d) + " of size " +
          std::to_string(shape[d]) + " is not divisible by " + std::to_string(product) +
          (spec.dims[d].size() == 1 ? " (the size of mesh axis " : " (the product of mesh axes ") +
          names + ")");
    }
  }
}

}  // namespace shardsim
