// Forced tool calls as grammars: the calls a template renders (Qwen3.6's XML form, Qwen3's JSON
// form) are sentences of the grammar when their arguments fit the functions' schemas, and are
// refused where they do not; what the grammar accepts parses back into those arguments.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/grammar.h"
#include "text/tool_call_grammar.h"
#include "text/tool_call_parser.h"

namespace qwen36::text {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kData = fs::path(QWEN36_TEST_DATA) / "templates";
const fs::path kQwen3Config = fs::path(QWEN36_TEST_DATA) / ".." / ".." / ".models" / "qwen3-tokenizer" / "tokenizer_config.json";

ChatTemplate qwen36_template() {
  std::ifstream in(kData / "qwen36_chat_template.jinja", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ChatTemplate(Json(ss.str()), Json{{"eos_token", "<|im_end|>"}});
}

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
     "unit": {"enum": ["c", "f"]}, "detailed": {"type": "boolean"}, "hours": {"type": "array", "items": {"type": "integer"}}},
     "required": ["city"]}}},
  {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}])");

std::vector<Json> functions() { return {kTools[0]["function"], kTools[1]["function"]}; }

// The template's rendering of an assistant's calls, from its "<tool_call>" through the last "</tool_call>".
std::string rendered(const ChatTemplate& t, const std::vector<std::pair<std::string, Json>>& calls) {
  Json tool_calls = Json::array();
  for (const auto& [name, args] : calls)
    tool_calls.push_back({{"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}});
  const std::string text = t.render(Json::array({{{"role", "user"}, {"content", "x"}},
                                                 {{"role", "assistant"}, {"content", ""}, {"tool_calls", tool_calls}}}),
                                    kTools, false, nullptr);
  const size_t from = text.find("<tool_call>", text.rfind("<|im_start|>assistant")), to = text.rfind("</tool_call>");
  return text.substr(from, to + std::string_view("</tool_call>").size() - from);
}

bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.feed(std::string_view(text)) && m.complete();
}

void check_form(const ChatTemplate& t) {
  const auto form = t.tool_call_form();
  ASSERT_TRUE(form);
  const auto one = tool_call_grammar(*form, functions(), false);
  const Json good = {{"city", "New\nYork <3"}, {"days", 3}, {"unit", "f"}, {"detailed", true}, {"hours", {9, 17}}};
  const std::string call = rendered(t, {{"get_weather", good}});
  EXPECT_TRUE(accepts(one, call)) << call;
  // What the grammar accepts parses back into the arguments.
  const size_t open = call.find("<tool_call>") + std::string_view("<tool_call>").size();
  const auto parsed = parse_tool_call(call.substr(open, call.rfind("</tool_call>") - open), kTools);
  ASSERT_TRUE(parsed) << call;
  EXPECT_EQ(parsed->name, "get_weather");
  EXPECT_EQ(parsed->arguments, good) << parsed->arguments.dump();
  EXPECT_TRUE(accepts(one, rendered(t, {{"get_weather", {{"city", "Oslo"}}}})));
  EXPECT_TRUE(accepts(one, "\n\n" + rendered(t, {{"get_weather", {{"city", "Oslo"}}}}))) << "after </think>";
  EXPECT_FALSE(accepts(one, "\n\n\n" + rendered(t, {{"get_weather", {{"city", "Oslo"}}}})));
  EXPECT_TRUE(accepts(one, rendered(t, {{"list_files", {{"path", "/tmp"}, {"depth", 2}}}})));
  for (const Json& bad : {Json{{"city", "Oslo"}, {"days", 9}}, Json{{"city", "Oslo"}, {"days", "three"}},
                          Json{{"days", 3}}, Json{{"city", "Oslo"}, {"unit", "k"}}, Json{{"city", "Oslo"}, {"hours", {"x"}}}})
    EXPECT_FALSE(accepts(one, rendered(t, {{"get_weather", bad}}))) << bad.dump();
  // A raw XML value cannot hold its closing tag (the parser would end it there); a JSON string can.
  EXPECT_TRUE(accepts(one, rendered(t, {{"get_weather", {{"city", "<b>a</b></param"}}}})));
  EXPECT_EQ(accepts(one, rendered(t, {{"get_weather", {{"city", "a</parameter>b"}}}})), form->json);
  EXPECT_FALSE(accepts(one, rendered(t, {{"get_time", Json::object()}}))) << "not one of the functions";
  const std::string two = rendered(t, {{"get_weather", {{"city", "Oslo"}}}, {"list_files", Json::object()}});
  EXPECT_FALSE(accepts(one, two));
  EXPECT_TRUE(accepts(tool_call_grammar(*form, functions(), true), two)) << two;
  // Opened: the text starts after the first call's "<tool_call>" (tool_choice "auto").
  const std::string after_open = call.substr(std::string_view("<tool_call>").size());
  EXPECT_TRUE(accepts(tool_call_grammar(*form, functions(), false, true), after_open));
  EXPECT_FALSE(accepts(tool_call_grammar(*form, functions(), false, true), call));
  EXPECT_TRUE(accepts(tool_call_grammar(*form, functions(), true, true), two.substr(std::string_view("<tool_call>").size())));
}

TEST(ToolCallGrammar, Qwen36XmlForm) { check_form(qwen36_template()); }

// XML-form strings are raw text, held to their pattern, format and length.
TEST(ToolCallGrammar, XmlStringsFollowTheirSchema) {
  const ChatTemplate t = qwen36_template();
  const auto form = t.tool_call_form();
  ASSERT_TRUE(form);
  const Json fn = Json::parse(R"({"name": "book", "parameters": {"type": "object", "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "when": {"type": "string", "format": "date"},
    "note": {"type": "string", "maxLength": 5}}}})");
  const auto g = tool_call_grammar(*form, {fn}, false);
  auto call = [&](const Json& args) {
    const std::string text = t.render(
        Json::array({{{"role", "user"}, {"content", "x"}},
                     {{"role", "assistant"}, {"content", ""},
                      {"tool_calls", {{{"type", "function"}, {"function", {{"name", "book"}, {"arguments", args}}}}}}}}),
        Json::array({{{"type", "function"}, {"function", fn}}}), false, nullptr);
    const size_t from = text.find("<tool_call>", text.rfind("<|im_start|>assistant"));
    return text.substr(from, text.rfind("</tool_call>") + std::string_view("</tool_call>").size() - from);
  };
  EXPECT_TRUE(accepts(g, call({{"code", "OSL"}, {"when", "2026-12-05"}, {"note", "a<b"}})));
  EXPECT_TRUE(accepts(g, call({{"note", ""}})));
  EXPECT_FALSE(accepts(g, call({{"code", "OSLO"}})));
  EXPECT_FALSE(accepts(g, call({{"when", "2026-13-05"}})));
  EXPECT_FALSE(accepts(g, call({{"note", "toolong"}})));
}

TEST(ToolCallGrammar, Qwen3JsonForm) {
  if (!fs::exists(kQwen3Config)) GTEST_SKIP() << "run scripts/fetch-tokenizer.sh to fetch " << kQwen3Config;
  check_form(ChatTemplate::from_tokenizer_config_file(kQwen3Config.string()));
}

TEST(ToolCallGrammar, UnsupportedSchemaIsAnError) {
  const auto form = qwen36_template().tool_call_form();
  ASSERT_TRUE(form);
  const Json fn = Json::parse(R"({"name": "f", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer", "multipleOf": 2}}}})");
  try {
    tool_call_grammar(*form, {fn}, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multipleOf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qwen36::text
