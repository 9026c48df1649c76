// The Jinja interpreter: feature templates compared with jinja2's output, Python value
// formatting, and errors that name the template line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/jinja_eval.h"
#include "text/jinja_value.h"

namespace qwen36::jinja {
namespace {

namespace fs = std::filesystem;
const fs::path kFeatures = fs::path(QWEN36_TEST_DATA) / "templates" / "features";
const fs::path kExpected = fs::path(QWEN36_TEST_DATA) / "templates" / "expected" / "features";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Object context() {
  Value v = Value::from_json(Json::parse(read_file(kFeatures / "context.json")));
  return v.object();
}

std::string render(const std::string& src, const Json& vars = Json::object()) {
  return Template(src).render(Value::from_json(vars).object());
}

std::string error_of(const std::string& src, const Json& vars = Json::object()) {
  try {
    render(src, vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class TemplateJinjaFeature : public ::testing::TestWithParam<std::string> {};

TEST_P(TemplateJinjaFeature, MatchesJinja2) {
  const std::string name = GetParam();
  Template t(read_file(kFeatures / (name + ".jinja")));
  EXPECT_EQ(t.render(context()), read_file(kExpected / (name + ".txt")));
}

INSTANTIATE_TEST_SUITE_P(Features, TemplateJinjaFeature,
                         ::testing::Values("loops", "scoping", "macros", "filters", "strings", "tests_ops",
                                           "whitespace"));

TEST(TemplateJinjaValue, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1e-5), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123456789012345.0), "123456789012345.0");
  EXPECT_EQ(python_float_repr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(python_float_repr(1.0 / 3.0), "0.3333333333333333");
}

TEST(TemplateJinjaValue, JsonDumpsKeepsKeyOrderAndUnicode) {
  Value v = Value::from_json(Json::parse(R"({"z": 1, "a": [true, null, 2.5], "é": "日本\n"})"));
  EXPECT_EQ(python_json_dumps(v, {}), R"({"z": 1, "a": [true, null, 2.5], "é": "日本\n"})");
  JsonDumpOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(python_json_dumps(Value("é😀"), ascii), R"("\u00e9\ud83d\ude00")");
}

TEST(TemplateJinjaErrors, NameTheLine) {
  EXPECT_EQ(error_of("line1\n{{ raise_exception('boom') }}"), "template line 2: raise_exception: boom");
  EXPECT_EQ(error_of("a\nb\n{% if x %}\n{{ x.y.z }}\n{% endif %}", {{"x", {{"k", 1}}}}),
            "template line 4: 'dict object' has no attribute 'y' is undefined");
  EXPECT_NE(error_of("{% for %}").find("template line 1:"), std::string::npos);
  EXPECT_NE(error_of("\n\n{% if true %}unclosed").find("template line 3:"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("non-namespace"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 | nosuchfilter }}").find("no filter named 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("{{ x is nosuchtest }}").find("no test named"), std::string::npos);
  EXPECT_NE(error_of("{% unknowntag %}").find("unknown tag 'unknowntag'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{{ none in none }}").find("not iterable"), std::string::npos);
  EXPECT_NE(error_of("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}").find("too deep"), std::string::npos);
}

TEST(TemplateJinja, TrailingNewlineDroppedLikeJinja2) {
  EXPECT_EQ(render("a\n"), "a");
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\n"), "x\n");
}

TEST(TemplateJinja, UndefinedBehavesLikeJinja2Default) {
  EXPECT_EQ(render("[{{ nope }}][{% for x in nope %}x{% endfor %}][{{ nope | length }}]"), "[][][0]");
  EXPECT_EQ(render("{{ nope == nope2 }} {{ nope is defined }}"), "True False");
  EXPECT_NE(error_of("{{ nope.attr }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nope() }}").find("'nope' is undefined"), std::string::npos);
}

TEST(TemplateJinja, RendersAreIndependent) {
  Template t("{% set ns = namespace(n=0) %}{% for m in ms %}{% set ns.n = ns.n + m %}{% endfor %}{{ ns.n }}");
  EXPECT_EQ(t.render(Value::from_json(Json{{"ms", {1, 2, 3}}}).object()), "6");
  EXPECT_EQ(t.render(Value::from_json(Json{{"ms", {10}}}).object()), "10");
}

}  // namespace
}  // namespace qwen36::jinja
