// Every case in tests/data/templates/cases rendered by every template must equal, byte for
// byte, what Python jinja2 configured like transformers produced (tools/golden_templates.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/error.h"
#include "text/chat_template.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;
const fs::path kData = fs::path(QWEN36_TEST_DATA) / "templates";
const fs::path kQwen3Config = fs::path(QWEN36_TEST_DATA) / ".." / ".." / ".models" / "qwen3-tokenizer" / "tokenizer_config.json";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string tpl;   // "qwen36" or "qwen3"
  std::string name;  // case file stem
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.tpl << "/" << c.name; }

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const char* tpl : {"qwen36", "qwen3"}) {
    if (!fs::exists(kData / "cases")) break;
    for (const auto& e : fs::directory_iterator(kData / "cases")) {
      if (e.path().extension() == ".json") out.push_back({tpl, e.path().stem().string()});
    }
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.tpl + a.name < b.tpl + b.name; });
  return out;
}

const ChatTemplate& qwen36_template() {
  static const ChatTemplate t(jinja::Json(read_file(kData / "qwen36_chat_template.jinja")),
                              jinja::Json{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}});
  return t;
}

class TemplateGolden : public ::testing::TestWithParam<Case> {};

TEST_P(TemplateGolden, MatchesJinja2) {
  const Case& c = GetParam();
  std::unique_ptr<ChatTemplate> qwen3;
  const ChatTemplate* tpl = &qwen36_template();
  if (c.tpl == "qwen3") {
    if (!fs::exists(kQwen3Config)) GTEST_SKIP() << "run scripts/fetch-tokenizer.sh to fetch " << kQwen3Config;
    qwen3 = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer_config_file(kQwen3Config.string()));
    tpl = qwen3.get();
  }
  auto input = jinja::Json::parse(read_file(kData / "cases" / (c.name + ".json")));
  jinja::Json tools = input.contains("tools") ? input["tools"] : jinja::Json();
  bool agp = input.value("add_generation_prompt", false);
  jinja::Json kwargs = input.contains("kwargs") ? input["kwargs"] : jinja::Json();
  fs::path expected = kData / "expected" / c.tpl / (c.name + ".txt");
  fs::path error = kData / "expected" / c.tpl / (c.name + ".error");
  if (fs::exists(error)) {
    EXPECT_THROW(tpl->render(input["messages"], tools, agp, kwargs), Error) << "jinja2: " << read_file(error);
    return;
  }
  ASSERT_TRUE(fs::exists(expected)) << expected << " missing: run tools/golden_templates.py";
  EXPECT_EQ(tpl->render(input["messages"], tools, agp, kwargs), read_file(expected));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.tpl + "_" + info.param.name;
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(Cases, TemplateGolden, ::testing::ValuesIn(all_cases()), case_name);

TEST(TemplateGoldenSet, HasAtLeastThirtyCases) {
  size_t n = 0;
  for (const auto& c : all_cases()) n += c.tpl == "qwen36";
  EXPECT_GE(n, 30u);
}

TEST(ChatTemplateConfig, PicksNamedTemplates) {
  jinja::Json list = jinja::Json::array({{{"name", "default"}, {"template", "D{{ messages|length }}"}},
                                         {{"name", "tool_use"}, {"template", "T{{ tools|length }}"}}});
  ChatTemplate t(list, jinja::Json::object());
  jinja::Json msgs = jinja::Json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(t.render(msgs, nullptr, false, nullptr), "D1");
  EXPECT_EQ(t.render(msgs, jinja::Json::array({1, 2}), false, nullptr), "T2");
}

TEST(ChatTemplateConfig, SpecialTokensAndKwargs) {
  jinja::Json config = {{"chat_template", "{{ bos_token }}|{{ eos_token }}|{{ flag }}|{{ add_generation_prompt }}"},
                        {"bos_token", nullptr},
                        {"eos_token", {{"content", "<|im_end|>"}, {"lstrip", false}}}};
  ChatTemplate t = ChatTemplate::from_tokenizer_config(config);
  EXPECT_EQ(t.render(jinja::Json::array(), nullptr, true, {{"flag", 7}}), "|<|im_end|>|7|True");
}

// What a forced tool call (tool_choice) writes before the function's name, found by rendering.
TEST(ChatTemplateConfig, ToolCallNamePrefix) {
  EXPECT_EQ(qwen36_template().tool_call_name_prefix(), std::optional<std::string>("\n<function="));
  const ChatTemplate plain(jinja::Json("{% for m in messages %}{{ m.content }}{% endfor %}"), jinja::Json::object());
  EXPECT_EQ(plain.tool_call_name_prefix(), std::nullopt);
  if (!fs::exists(kQwen3Config)) GTEST_SKIP() << "run scripts/fetch-tokenizer.sh to fetch " << kQwen3Config;
  EXPECT_EQ(ChatTemplate::from_tokenizer_config_file(kQwen3Config.string()).tool_call_name_prefix(),
            std::optional<std::string>("\n{\"name\": \""));
}

// The whole shape of a tool call, found by rendering probe calls.
TEST(ChatTemplateConfig, ToolCallForm) {
  const auto xml = qwen36_template().tool_call_form();
  ASSERT_TRUE(xml);
  EXPECT_FALSE(xml->json);
  EXPECT_EQ(xml->before_name, "\n<function=");
  EXPECT_EQ(xml->after_name + xml->before_key + "K" + xml->after_key + "V" + xml->after_value + xml->after_args,
            ">\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>");
  EXPECT_EQ(xml->after_name + xml->after_args, ">\n</function>\n</tool_call>");
  const ChatTemplate plain(jinja::Json("{% for m in messages %}{{ m.content }}{% endfor %}"), jinja::Json::object());
  EXPECT_EQ(plain.tool_call_form(), std::nullopt);
  if (!fs::exists(kQwen3Config)) GTEST_SKIP() << "run scripts/fetch-tokenizer.sh to fetch " << kQwen3Config;
  const auto json = ChatTemplate::from_tokenizer_config_file(kQwen3Config.string()).tool_call_form();
  ASSERT_TRUE(json);
  EXPECT_TRUE(json->json);
  EXPECT_EQ(json->before_name, "\n{\"name\": \"");
  EXPECT_EQ(json->after_name, "\", \"arguments\": ");
  EXPECT_EQ(json->after_args, "}\n</tool_call>");
}

TEST(ChatTemplateConfig, BadInputIsAnError) {
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(jinja::Json{{"x", 1}}), Error);
  EXPECT_THROW(ChatTemplate(jinja::Json(42), jinja::Json::object()), Error);
  EXPECT_THROW(ChatTemplate(jinja::Json("{% if %}"), jinja::Json::object()), Error);
  ChatTemplate t(jinja::Json("x"), jinja::Json::object());
  EXPECT_THROW(t.render(jinja::Json::object(), nullptr, false, nullptr), Error);
  EXPECT_THROW(ChatTemplate::from_tokenizer_config_file("/nonexistent/tokenizer_config.json"), Error);
}

// The CLI prints exactly the rendered prompt: nothing added, nothing lost.
TEST(TemplateCli, PrintsExactlyThePrompt) {
  fs::path dir = fs::temp_directory_path() / ("qwen36_tpl_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  jinja::Json config = {{"chat_template", read_file(kData / "qwen36_chat_template.jinja")},
                        {"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  auto input = jinja::Json::parse(read_file(kData / "cases" / "19_multi_step_tools.json"));
  std::ofstream(dir / "messages.json") << input["messages"].dump();
  std::ofstream(dir / "tools.json") << input["tools"].dump();
  std::string cmd = std::string(QWEN36_BIN) + " template --tokenizer-config " + (dir / "tokenizer_config.json").string() +
                    " --messages " + (dir / "messages.json").string() + " --tools " + (dir / "tools.json").string() +
                    " --kwargs '{\"enable_thinking\": true}'";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  EXPECT_EQ(pclose(pipe), 0);
  EXPECT_EQ(out, read_file(kData / "expected" / "qwen36" / "19_multi_step_tools.txt"));

  FILE* bad = popen((std::string(QWEN36_BIN) + " template --tokenizer-config /nonexistent.json --messages x 2>&1").c_str(), "r");
  ASSERT_NE(bad, nullptr);
  std::string err;
  for (size_t n; (n = fread(buf, 1, sizeof(buf), bad)) > 0;) err.append(buf, n);
  EXPECT_NE(pclose(bad), 0);
  EXPECT_NE(err.find("error: /nonexistent.json: cannot open file"), std::string::npos) << err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qwen36
