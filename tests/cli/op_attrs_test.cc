// The run-file loader reads op attributes from the op registry alone: for every op it accepts
// exactly the registry's keys, stores each attribute where the registry says, refuses a
// missing required attribute and every other op's keys.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/ir/op_registry.h"
#include "sim/cli/run_file.h"

namespace shardsim {
namespace {

// A valid value of `attr` as YAML text, and the same value as the loader should store it.
struct Sample {
  std::string yaml;
  AttrValue value;
};

Sample SampleOf(const AttrDef& attr) {
  switch (attr.type) {
    case AttrType::kInt:
      return {"-1", int64_t{-1}};
    case AttrType::kNonNegativeInt:
      return {"2", int64_t{2}};
    case AttrType::kPositiveInt:  // One: a multi-output op then makes one output.
      return {"1", int64_t{1}};
    case AttrType::kBool:
      return {"true", true};
    case AttrType::kIntList:
      return {"[1, 0]", std::vector<int64_t>{1, 0}};
    case AttrType::kShape:
      return {"[2, -1]", std::vector<int64_t>{2, -1}};
    case AttrType::kString:  // Strings are einsum specs, or element types.
      if (attr.name == std::string("preferred_element_type")) return {"bf16", std::string("bf16")};
      return {"\"ab,bc->ac\"", std::string("ab,bc->ac")};
    case AttrType::kOneOf:
      return {attr.values.back(), std::string(attr.values.back())};
    case AttrType::kNumber:
      return {"2.5", 2.5};
    case AttrType::kBytes:
      return {"2 KiB", 2048.0};
    case AttrType::kPerm:
      return {"[[0, 1], [1, 0]]", std::vector<std::pair<int, int>>{{0, 1}, {1, 0}}};
    case AttrType::kSharding:
      return {"\"P('d', None)\"", PartitionSpec{{{"d"}, {}}}};
    case AttrType::kValueName:  // The test program's array.
      return {"x", std::string("x")};
    case AttrType::kValueNames:  // One name: a multi-output op then makes one output.
      return {"[x]", std::vector<std::string>{"x"}};
    case AttrType::kAxisList:
      return {"[1, 0]", std::vector<int64_t>{1, 0}};
  }
  return {};
}

// The value of `attr`'s field in `op`, as text, to compare what was loaded.
std::string FieldText(const OpSpec& op, const AttrDef& attr) {
  return std::visit(
      [&](auto member) {
        std::ostringstream text;
        const auto& v = op.*member;
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::optional<int>> ||
                      std::is_same_v<V, std::optional<double>>) {
          if (v)
            text << *v;
          else
            text << "unset";
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          for (int64_t x : v) text << x << ' ';
        } else if constexpr (std::is_same_v<V, std::vector<std::pair<int, int>>>) {
          for (const auto& [a, b] : v) text << a << ':' << b << ' ';
        } else if constexpr (std::is_same_v<V, PartitionSpec>) {
          text << FormatPartitionSpec(v);
        } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
          for (const std::string& x : v) text << x << ' ';
        } else {
          text << v;
        }
        return text.str();
      },
      attr.field);
}

// Which attributes a test entry writes: all but the later ones of each exactly-one-of group.
std::vector<const AttrDef*> WrittenAttrs(const OpDef& def) {
  std::vector<const AttrDef*> written;
  for (const AttrDef& attr : def.attrs) {
    bool later_in_group = false;
    for (const ExactlyOneOf& group : def.exactly_one_of) {
      for (size_t i = 1; i < group.names.size(); ++i) {
        if (std::string(group.names[i]) == attr.name) later_in_group = true;
      }
    }
    // device_put's in_sharding names the source mesh's axes, not the sample's (tested apart).
    const bool other_mesh =
        def.kind == OpKind::kDevicePut && attr.name == std::string("in_sharding");
    if (!later_in_group && !other_mesh) written.push_back(&attr);
  }
  return written;
}

// One program entry for `def` with the attributes `attrs`, and `extra` appended ("k: v").
std::string OpEntry(const OpDef& def, const std::vector<const AttrDef*>& attrs,
                    const std::string& extra = "") {
  std::string entry = "{op: " + std::string(def.name);
  switch (def.arity) {
    case OpArity::kNone:
      break;
    case OpArity::kOne:
    case OpArity::kOneOrMore:
      entry += ", in: x";
      break;
    case OpArity::kBinary:  // The sample attributes include scalar: one input.
      entry += ", in: x";
      break;
    case OpArity::kTwo:
    case OpArity::kAtLeastTwo:
      entry += ", in: [x, x]";
      break;
    case OpArity::kThree:
      entry += ", in: [x, x, x]";
      break;
    case OpArity::kFour:
      entry += ", in: [x, x, x, x]";
      break;
    case OpArity::kSix:
      entry += ", in: [x, x, x, x, x, x]";
      break;
  }
  // One name per output (top_k: two); the run file's outputs name the first, y.
  std::string names = "y";
  for (int i = 1; i < def.outputs; ++i) names += ", y" + std::to_string(i);
  entry += def.outputs > 1 ? ", out: [" + names + "]" : ", out: y";
  if (def.takes_axis_name) entry += ", axis_name: d";
  if (def.kind == OpKind::kDevicePut) {
    entry += ", mesh: b, in_sharding: \"P()\"";  // From mesh a (OpFile), replicated there.
  }
  for (const AttrDef* attr : attrs)
    entry += ", " + std::string(attr->name) + ": " + SampleOf(*attr).yaml;
  if (!extra.empty()) entry += ", " + extra;
  return entry + "}";
}

// The mode a program holding `entry` ("{op: NAME, ...}") needs: global-only ops need a global
// program.
std::string ModeFor(const std::string& entry) {
  const size_t start = entry.find("op: ") + 4;
  const OpDef* def = FindOp(entry.substr(start, entry.find_first_of(",}", start) - start));
  return def && def->global_only ? "explicit" : "manual";
}

// A temporary run file holding one program entry; removed when the test ends.
class OpFile {
 public:
  explicit OpFile(const std::string& entry)
      : path_(std::filesystem::temp_directory_path() /
              ("shardsim_op_attrs_" + std::to_string(getpid()) + ".yaml")) {
    // device_put moves x from a mesh of its own to one with the sample axis d.
    const bool put = entry.find("op: device_put") != std::string::npos;
    std::ofstream(path_) << "hardware: {preset: tpu-v5e, shape: [" << (put ? 4 : 2) << ", 1]}\n"
                         << "mode: " << ModeFor(entry) << "\n"
                         << (put ? "meshes: {a: {axes: {c: 2}}, b: {axes: {d: 2}}}\n"
                                   "arrays: {x: {shape: [4, 4], mesh: a}}\n"
                                 : "mesh: {axes: {d: 2}}\n"
                                   "arrays: {x: {shape: [4, 4]}}\n")
                         << "program:\n  - " << entry << "\noutputs: {y: \"P()\"}\n";
  }
  ~OpFile() { std::filesystem::remove(path_); }
  // The file's path.
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// The loader's message for `entry`, or "" when it loads.
std::string LoadMessage(const std::string& entry) {
  OpFile file(entry);
  try {
    LoadRunFile(file.path());
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(OpAttrsLoaderTest, EveryOpLoadsItsRegistryAttributesIntoTheirFields) {
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    SCOPED_TRACE(def.name);
    const std::vector<const AttrDef*> attrs = WrittenAttrs(def);
    OpFile file(OpEntry(def, attrs));
    RunFile loaded;
    ASSERT_NO_THROW(loaded = LoadRunFile(file.path())) << OpEntry(def, attrs);
    const OpSpec& op = loaded.program->ops.at(0);
    EXPECT_EQ(op.kind, def.kind);
    for (const AttrDef* attr : attrs) {
      OpSpec expected;
      expected.kind = def.kind;
      SetAttr(expected, *attr, SampleOf(*attr).value);
      EXPECT_EQ(FieldText(op, *attr), FieldText(expected, *attr)) << attr->name;
    }
  }
}

TEST(OpAttrsLoaderTest, EveryOpRefusesEveryOtherOpsKeys) {
  const std::vector<std::string> all = AllOpKeys();
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    const std::vector<std::string> keys = OpKeys(def.kind);
    for (const std::string& key : all) {
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
      SCOPED_TRACE(std::string(def.name) + " " + key);
      const std::string message = LoadMessage(OpEntry(def, WrittenAttrs(def), key + ": 1"));
      EXPECT_TRUE(Contains(message, "key '" + key + "' does not apply to op " + def.name))
          << message;
    }
  }
}

TEST(OpAttrsLoaderTest, RequiredAttributesMustBeGiven) {
  int required = 0;
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    const std::vector<const AttrDef*> attrs = WrittenAttrs(def);
    for (const AttrDef* attr : attrs) {
      if (!attr->required) continue;
      ++required;
      SCOPED_TRACE(std::string(def.name) + " " + attr->name);
      std::vector<const AttrDef*> without;
      for (const AttrDef* a : attrs) {
        if (a != attr) without.push_back(a);
      }
      const std::string message = LoadMessage(OpEntry(def, without));
      EXPECT_TRUE(Contains(message, "missing required key '" + std::string(attr->name) + "'"))
          << message;
    }
  }
  EXPECT_GE(required, 6);  // all_to_all (2), einsum, reshape, split, slice (2).
}

TEST(OpAttrsLoaderTest, ExactlyOneOfEachGroup) {
  for (const OpDef& def : OpRegistry()) {
    if (!def.user_visible) continue;
    for (const ExactlyOneOf& group : def.exactly_one_of) {
      SCOPED_TRACE(def.name);
      std::vector<const AttrDef*> none;
      for (const AttrDef* a : WrittenAttrs(def)) {
        if (std::find_if(group.names.begin(), group.names.end(), [&](const char* n) {
              return std::string(n) == a->name;
            }) == group.names.end()) {
          none.push_back(a);
        }
      }
      EXPECT_TRUE(Contains(LoadMessage(OpEntry(def, none)), group.missing));
      // Each member alone loads; two together are refused.
      for (const char* name : group.names) {
        std::vector<const AttrDef*> one = none;
        one.push_back(FindAttr(def, name));
        EXPECT_EQ(LoadMessage(OpEntry(def, one)), "") << name;
      }
      std::vector<const AttrDef*> both = none;
      both.push_back(FindAttr(def, group.names[0]));
      both.push_back(FindAttr(def, group.names[1]));
      EXPECT_TRUE(Contains(
          LoadMessage(OpEntry(def, both)),
          "give either " + std::string(group.names[0]) + " or " + group.names[1] + ", not both"));
    }
  }
}

// A list attribute may be empty where its type allows it: reshape to a scalar is shape: [].
TEST(OpAttrsLoaderTest, EmptyListIsAValue) {
  EXPECT_EQ(LoadMessage("{op: reshape, in: x, out: y, shape: []}"), "");
  EXPECT_TRUE(Contains(LoadMessage("{op: reshape, in: x, out: y, shape: 3}"),
                       "a list of sizes like [64, -1]"));
}

}  // namespace
}  // namespace shardsim
