// Output parsing: reasoning split, XML and JSON tool calls, fallbacks on malformed output,
// and streaming: any chunking gives the same result as parsing the whole text.
#include <gtest/gtest.h>

#include <random>

#include "text/output_parser.h"

namespace qwen36 {
namespace {

using jinja::Json;

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "location": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "ratio": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
    "maybe": {"type": ["integer", "null"]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}}}}}
])");

struct Case {
  const char* name;
  std::string text;
  bool opened = false;    // prompt ended with <think>\n
  bool thinking = true;   // thinking enabled
  bool tools = true;      // pass kTools
  std::string content;
  std::string reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments JSON
  size_t max_call_bytes = size_t{16} << 20;
};

OutputParserOptions options_for(const Case& c) {
  OutputParserOptions o;
  o.prompt_opened_thinking = c.opened;
  o.thinking_enabled = c.thinking;
  if (c.tools) o.tools = kTools;
  o.max_tool_call_bytes = c.max_call_bytes;
  return o;
}

const std::string kWeatherCall =
    "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>";

std::vector<Case> cases() {
  std::string huge(200000, 'x');
  huge[1000] = '\n';
  std::string deep_json = "<tool_call>\n{\"name\": \"search\", \"arguments\": " + std::string(5000, '[') + "\n</tool_call>";
  return {
      // Well-formed output.
      {"plain", "Hello world", false, true, true, "Hello world", "", {}},
      {"reasoning_opened", "Let me think.\n</think>\n\nThe answer is 4.", true, true, true, "The answer is 4.", "Let me think.", {}},
      {"reasoning_explicit", "<think>\nhmm\n</think>\n\nok", false, true, true, "ok", "hmm", {}},
      {"thinking_disabled_literal", "<think>x</think>y", false, false, true, "<think>x</think>y", "", {}},
      {"xml_call_typed",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
       "<parameter=metric>\ntrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n"
       "<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n<parameter=maybe>\nnull\n</parameter>\n</function>\n</tool_call>",
       false, true, true, "", "",
       {{"get_weather", R"({"location": "New York", "days": 3, "metric": true, "ratio": 0.5, "opts": {"a": [1, 2]}, "tags": ["x", "y"], "maybe": null})"}}},
      {"json_call", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"cats\"}}\n</tool_call>", false, true, true, "", "",
       {{"search", R"({"query": "cats"})"}}},
      {"content_then_call", "Let me check.\n\n" + kWeatherCall, false, true, true, "Let me check.", "", {{"get_weather", R"({"location": "Paris"})"}}},
      {"two_calls", kWeatherCall + "\n" + kWeatherCall, false, true, true, "", "",
       {{"get_weather", R"({"location": "Paris"})"}, {"get_weather", R"({"location": "Paris"})"}}},
      {"full_turn", "Plan.\n</think>\n\nChecking now.\n\n" + kWeatherCall, true, true, true, "Checking now.", "Plan.",
       {{"get_weather", R"({"location": "Paris"})"}}},
      {"missing_think_close_before_call", "I need the weather.\n\n" + kWeatherCall, true, true, true, "", "I need the weather.",
       {{"get_weather", R"({"location": "Paris"})"}}},
      {"multiline_value_kept",
       "<tool_call>\n<function=search>\n<parameter=query>\nline one\n\nline three\n</parameter>\n</function>\n</tool_call>", false, true,
       true, "", "", {{"search", R"({"query": "line one\n\nline three"})"}}},
      {"no_tools_values_raw", "<tool_call>\n<function=anything>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>", false, true,
       false, "", "", {{"anything", R"({"n": "5"})"}}},
      {"unicode", "<think>思考中 🤔</think>答案是 42 ✅", false, true, true, "答案是 42 ✅", "思考中 🤔", {}},
      // Malformed or adversarial output (never throws; falls back to content).
      {"m_unclosed_call_truncated", "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", false, true, true,
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar", "", {}},
      {"m_unclosed_call_complete_body", "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>",
       false, true, true, "", "", {{"get_weather", R"({"location": "Paris"})"}}},
      {"m_unclosed_think", "<think>never closed", false, true, true, "", "never closed", {}},
      {"m_nested_tool_call", "<tool_call>\n" + kWeatherCall, false, true, true, "<tool_call>", "", {{"get_weather", R"({"location": "Paris"})"}}},
      {"m_tool_call_inside_thinking", "I could call <tool_call> maybe</think>answer", true, true, true,
       "<tool_call> maybe</think>answer", "I could call", {}},
      {"m_bad_json", "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": }\n</tool_call>", false, true, true,
       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": }\n</tool_call>", "", {}},
      {"m_unknown_function", "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>", false, true,
       true, "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>", "", {}},
      {"m_huge_parameter",
       "<tool_call>\n<function=search>\n<parameter=query>\n" + huge + "\n</parameter>\n</function>\n</tool_call>", false, true, true,
       "", "", {{"search", "{\"query\": \"" + huge.substr(0, 1000) + "\\n" + huge.substr(1001) + "\"}"}}},
      {"m_stray_think_close", "Hello</think> world", false, true, true, "Hello world", "", {}},
      {"m_partial_tag_at_end", "Hello <too", false, true, true, "Hello <too", "", {}},
      {"m_partial_close_in_reasoning", "abc</thi", true, true, true, "", "abc</thi", {}},
      {"m_empty", "", false, true, true, "", "", {}},
      {"m_only_whitespace", "\n\n  \t", false, true, true, "", "", {}},
      {"m_empty_call", "<tool_call>\n\n</tool_call>", false, true, true, "<tool_call>\n\n</tool_call>", "", {}},
      {"m_junk_between_params",
       "<tool_call>\n<function=search>\nJUNK\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>", false, true, true,
       "<tool_call>\n<function=search>\nJUNK\n<parameter=query>\nq\n</parameter>\n</function>\n</tool_call>", "", {}},
      {"m_missing_function_close", "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</tool_call>", false, true, true,
       "", "", {{"search", R"({"query": "q"})"}}},
      {"m_missing_parameter_close", "<tool_call>\n<function=search>\n<parameter=query>\nq\n</function>\n</tool_call>", false, true, true,
       "", "", {{"search", R"({"query": "q"})"}}},
      {"m_json_arguments_string", "<tool_call>\n{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"x\\\"}\"}\n</tool_call>",
       false, true, true, "", "", {{"search", R"({"query": "x"})"}}},
      {"m_json_arguments_array", "<tool_call>\n{\"name\": \"search\", \"arguments\": [1]}\n</tool_call>", false, true, true,
       "<tool_call>\n{\"name\": \"search\", \"arguments\": [1]}\n</tool_call>", "", {}},
      {"m_json_no_name", "<tool_call>\n{\"arguments\": {}}\n</tool_call>", false, true, true, "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
       "", {}},
      {"m_empty_function_name", "<tool_call>\n<function=>\n</function>\n</tool_call>", false, true, true,
       "<tool_call>\n<function=>\n</function>\n</tool_call>", "", {}},
      {"m_stray_call_close", "done</tool_call> really", false, true, true, "done</tool_call> really", "", {}},
      {"m_multiple_think_blocks", "<think>a</think>b<think>c</think>d", false, true, true, "bd", "ac", {}},
      {"m_tag_with_attribute", "<tool_call foo>x</tool_call>", false, true, true, "<tool_call foo>x</tool_call>", "", {}},
      {"m_invalid_utf8", "\xff\xfe<tool_call>\xff</tool_call>", false, true, true, "\xff\xfe<tool_call>\xff</tool_call>", "", {}},
      {"m_call_over_size_limit", "<tool_call>\n<function=search>\n<parameter=query>\n" + std::string(100, 'q') +
       "\n</parameter>\n</function>\n</tool_call> after", false, true, true,
       "<tool_call>\n<function=search>\n<parameter=query>\n" + std::string(100, 'q') + "\n</parameter>\n</function>\n</tool_call> after",
       "", {}, 64},
      {"m_value_not_matching_schema", "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=metric>\nTrue\n"
       "</parameter>\n<parameter=opts>\n{broken\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
       false, true, true, "", "", {{"get_weather", R"({"days": "three", "metric": true, "opts": "{broken", "extra": "7"})"}}},
      {"m_nested_think_in_reasoning", "<think>outer <think>inner</think>after", false, true, true, "after", "outer <think>inner", {}},
      {"m_think_close_inside_call_value", "<tool_call>\n<function=search>\n<parameter=query>\na</think>b\n</parameter>\n</function>\n</tool_call>",
       false, true, true, "", "", {{"search", R"({"query": "a</think>b"})"}}},
      {"m_deep_json", deep_json, false, true, true, deep_json, "", {}},
      {"m_text_after_call", kWeatherCall + "\nextra text", false, true, true, "extra text", "", {{"get_weather", R"({"location": "Paris"})"}}},
      {"m_lone_angle_brackets", "a < b > c <<>> </ <t", false, true, true, "a < b > c <<>> </ <t", "", {}},
  };
}

class TemplateOutputParserCase : public ::testing::TestWithParam<Case> {};

void expect_result(const ParsedOutput& got, const Case& c) {
  EXPECT_EQ(got.content, c.content);
  EXPECT_EQ(got.reasoning_content, c.reasoning);
  ASSERT_EQ(got.tool_calls.size(), c.calls.size());
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, c.calls[i].first);
    EXPECT_EQ(got.tool_calls[i].arguments, c.calls[i].second);
    EXPECT_EQ(got.tool_calls[i].id, "call_" + std::to_string(i));
  }
}

TEST_P(TemplateOutputParserCase, WholeText) {
  const Case& c = GetParam();
  expect_result(parse_output(c.text, options_for(c)), c);
}

// Random chunkings: concatenated deltas equal the whole-text result.
TEST_P(TemplateOutputParserCase, RandomChunksGiveSameResult) {
  const Case& c = GetParam();
  for (unsigned seed = 0; seed < 12; ++seed) {
    std::mt19937 rng(seed);
    size_t max_chunk = seed < 4 ? 1 + seed : seed < 8 ? 16 : 4096;
    OutputParser p(options_for(c));
    ParsedOutput joined;
    auto take = [&](const std::vector<OutputDelta>& deltas) {
      for (const auto& d : deltas) {
        if (d.kind == OutputDelta::Kind::Content) joined.content += d.text;
        else if (d.kind == OutputDelta::Kind::Reasoning) joined.reasoning_content += d.text;
        else {
          EXPECT_EQ(d.index, joined.tool_calls.size());
          joined.tool_calls.push_back(d.tool_call);
        }
      }
    };
    for (size_t pos = 0; pos < c.text.size();) {
      size_t n = std::min(c.text.size() - pos, 1 + rng() % max_chunk);
      take(p.feed(std::string_view(c.text).substr(pos, n)));
      pos += n;
    }
    take(p.finish());
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_result(joined, c);
    expect_result(p.result(), c);
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Cases, TemplateOutputParserCase, ::testing::ValuesIn(cases()), case_name);

TEST(TemplateOutputParser, HasAtLeast25MalformedCases) {
  size_t n = 0;
  for (const auto& c : cases()) n += std::string(c.name).rfind("m_", 0) == 0;
  EXPECT_GE(n, 25u);
}

TEST(TemplateOutputParser, HoldsBackPartialTagsOnly) {
  OutputParser p;
  auto d = p.feed("Hello <too");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "Hello");  // " <too" may still become a tag
  d = p.feed("l_call>\n<function=f>\n</function>\n</tool_call>");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, OutputDelta::Kind::ToolCall);
  EXPECT_EQ(d[0].tool_call.name, "f");
  EXPECT_EQ(d[0].tool_call.arguments, "{}");
  EXPECT_TRUE(p.finish().empty());
}

TEST(TemplateOutputParser, StreamsReasoningBeforeItCloses) {
  OutputParserOptions o;
  o.prompt_opened_thinking = true;
  OutputParser p(o);
  auto d = p.feed("step one, ");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].kind, OutputDelta::Kind::Reasoning);
  EXPECT_EQ(d[0].text, "step one,");
}

TEST(TemplateOutputParser, OpenAIMessage) {
  ParsedOutput out = parse_output("<think>r</think>" + kWeatherCall, {});
  Json m = to_openai_message(out);
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["reasoning_content"], "r");
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["id"], "call_0");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>())["location"], "Paris");
}

}  // namespace
}  // namespace qwen36
