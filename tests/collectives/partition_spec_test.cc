#include "collectives/partition_spec.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace shardsim {
namespace {

// The message of the std::invalid_argument `f` throws ("" if none).
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string ParseError(const std::string& text) {
  return ErrorOf([&] { ParsePartitionSpec(text); });
}

std::string ValidateError(const PartitionSpec& spec, const Shape& shape) {
  const Mesh mesh({{"dp", 4}, {"tp", 2}}, {0, 1, 2, 3, 4, 5, 6, 7});
  return ErrorOf([&] { ValidatePartitionSpec(spec, shape, mesh); });
}

TEST(PartitionSpecTest, ParsesJaxSpellings) {
  EXPECT_EQ(ParsePartitionSpec("P('dp', None)").dims,
            (std::vector<std::vector<std::string>>{{"dp"}, {}}));
  EXPECT_EQ(ParsePartitionSpec("P(('dp', 'tp'), None)").dims,
            (std::vector<std::vector<std::string>>{{"dp", "tp"}, {}}));
  EXPECT_TRUE(ParsePartitionSpec("P()").dims.empty());
  EXPECT_EQ(ParsePartitionSpec("PartitionSpec(\"dp\")").dims,
            (std::vector<std::vector<std::string>>{{"dp"}}));
  EXPECT_EQ(ParsePartitionSpec("  P ( ( 'tp' , ) ,( ),None , 'dp' , )  ").dims,
            (std::vector<std::vector<std::string>>{{"tp"}, {}, {}, {"dp"}}));
  EXPECT_EQ(ParsePartitionSpec("jax.sharding.PartitionSpec(None, 'x')").dims,
            (std::vector<std::vector<std::string>>{{}, {"x"}}));
}

TEST(PartitionSpecTest, FormatsLikeJax) {
  EXPECT_EQ(FormatPartitionSpec({{{"dp"}, {}}}), "P('dp', None)");
  EXPECT_EQ(FormatPartitionSpec({{{"dp", "tp"}}}), "P(('dp', 'tp'),)");
  EXPECT_EQ(FormatPartitionSpec({{{"dp"}}}), "P('dp',)");
  EXPECT_EQ(FormatPartitionSpec({}), "P()");
  EXPECT_EQ(FormatPartitionSpec({{{}, {"tp", "dp"}, {"x"}}}), "P(None, ('tp', 'dp'), 'x')");
}

TEST(PartitionSpecTest, RoundTrips) {
  const std::vector<PartitionSpec> specs = {
      {}, {{{"dp"}}}, {{{"dp"}, {}}}, {{{}, {}}}, {{{"dp", "tp"}, {}}}, {{{"a"}, {"b", "c"}, {}}}};
  for (const PartitionSpec& spec : specs) {
    EXPECT_EQ(ParsePartitionSpec(FormatPartitionSpec(spec)), spec) << FormatPartitionSpec(spec);
  }
  for (const std::string text : {"P('dp', None)", "P(('dp', 'tp'), None)", "P()", "P('x',)"}) {
    EXPECT_EQ(FormatPartitionSpec(ParsePartitionSpec(text)), text);
  }
}

TEST(PartitionSpecTest, ParseErrorsSayWhatAndWhere) {
  EXPECT_EQ(ParseError("Q('dp')"),
            "bad PartitionSpec \"Q('dp')\": expected P( or PartitionSpec(, got 'Q' at "
            "character 0");
  EXPECT_EQ(ParseError(""), "bad PartitionSpec \"\": expected P( or PartitionSpec( at character 0");
  EXPECT_EQ(ParseError("P('dp'"),
            "bad PartitionSpec \"P('dp'\": expected ')' but the text ended at character 6");
  EXPECT_EQ(ParseError("P(dp)"),
            "bad PartitionSpec \"P(dp)\": expected a quoted axis name, None or a tuple, got dp "
            "(quote axis names: 'dp') at character 2");
  EXPECT_NE(ParseError("P('dp',, None)").find("got ',' at character 7"), std::string::npos);
  EXPECT_NE(ParseError("P('dp' 'tp')").find("expected ',' or ')' after an entry at character 7"),
            std::string::npos);
  EXPECT_NE(ParseError("P('dp') x").find("unexpected text after the closing ')' at character 8"),
            std::string::npos);
  EXPECT_NE(ParseError("P('')").find("empty axis name at character 2"), std::string::npos);
  EXPECT_NE(ParseError("P('dp)").find("unterminated string at character 2"), std::string::npos);
  EXPECT_NE(ParseError("P(('dp', None))").find("quoted axis name in the tuple, got 'N'"),
            std::string::npos);
  EXPECT_NE(ParseError("P['dp']").find("expected '(', got '['"), std::string::npos);
}

TEST(PartitionSpecTest, ValidatesAgainstMeshAndShape) {
  EXPECT_EQ(ValidateError({{{"dp"}, {}}}, {1024, 4096}), "");
  EXPECT_EQ(ValidateError({{{"dp", "tp"}}}, {16, 3}), "");
  EXPECT_EQ(ValidateError({}, {}), "");
  EXPECT_EQ(ValidateError({{{"pp"}, {}}}, {8, 8}),
            "sharding P('pp', None) names mesh axis 'pp', which the mesh lacks (mesh axes: dp, "
            "tp)");
  EXPECT_EQ(ValidateError({{{"dp"}, {"dp"}}}, {8, 8}),
            "sharding P('dp', 'dp') uses mesh axis 'dp' twice (dimensions 0 and 1)");
  EXPECT_EQ(ValidateError({{{"dp", "dp"}}}, {8, 8}),
            "sharding P(('dp', 'dp'),) uses mesh axis 'dp' twice (dimensions 0 and 0)");
  EXPECT_EQ(ValidateError({{{}, {"tp"}}}, {8, 5}),
            "sharding P(None, 'tp'): dimension 1 of size 5 is not divisible by 2 (the size of "
            "mesh axis tp)");
  EXPECT_EQ(ValidateError({{{"dp", "tp"}}}, {12}),
            "sharding P(('dp', 'tp'),): dimension 0 of size 12 is not divisible by 8 (the "
            "product of mesh axes dp, tp)");
  EXPECT_EQ(ValidateError({{{"dp"}, {}, {}}}, {8, 8}),
            "sharding P('dp', None, None) has 3 entries but the array has rank 2");
}

}  // namespace
}  // namespace shardsim
