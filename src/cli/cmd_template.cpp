// qwen36 template: renders a checkpoint's chat template for a message list, exactly as
// transformers' apply_chat_template(tokenize=False) would; prints only the prompt.
#include <cstdio>
#include <fstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace qwen36::cli {

namespace {

jinja::Json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  QWEN36_CHECK(in.good(), "cannot open {} file {}", what, path);
  try {
    return jinja::Json::parse(in);
  } catch (const jinja::Json::exception& e) {
    fail("{} file {} is not valid JSON: {}", what, path, e.what());
  }
}

struct TemplateArgs {
  std::string tokenizer_config;
  std::string messages;
  std::string tools;
  std::string kwargs;
  bool add_generation_prompt = false;
};

void run_template(const TemplateArgs& a) {
  ChatTemplate tpl = ChatTemplate::from_tokenizer_config_file(a.tokenizer_config);
  jinja::Json messages = read_json_file(a.messages, "messages");
  // A messages file may also be a whole request ({"messages": [...], "tools": [...]}).
  jinja::Json tools = nullptr;
  if (messages.is_object() && messages.contains("messages")) {
    if (messages.contains("tools")) tools = messages["tools"];
    messages = jinja::Json(messages["messages"]);
  }
  QWEN36_CHECK(messages.is_array(), "messages file {} must hold a JSON array of messages", a.messages);
  if (!a.tools.empty()) tools = read_json_file(a.tools, "tools");
  QWEN36_CHECK(tools.is_null() || tools.is_array(), "tools must be a JSON array");
  jinja::Json kwargs = nullptr;
  if (!a.kwargs.empty()) {
    try {
      kwargs = jinja::Json::parse(a.kwargs);
    } catch (const jinja::Json::exception& e) {
      fail("--kwargs is not valid JSON: {}", e.what());
    }
    QWEN36_CHECK(kwargs.is_object(), "--kwargs must be a JSON object");
  }
  std::string prompt = tpl.render(messages, tools, a.add_generation_prompt, kwargs);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void register_template(CLI::App& app) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* cmd = app.add_subcommand("template", "Render a chat template (prints the prompt only)");
  cmd->add_option("--tokenizer-config", args->tokenizer_config, "tokenizer_config.json with chat_template")
      ->required();
  cmd->add_option("--messages", args->messages, "JSON file: array of chat messages")->required();
  cmd->add_option("--tools", args->tools, "JSON file: array of tool definitions");
  cmd->add_flag("--add-generation-prompt", args->add_generation_prompt, "End with the assistant turn opener");
  cmd->add_option("--kwargs", args->kwargs, "JSON object of extra template variables, e.g. {\"enable_thinking\":false}");
  cmd->callback([args] { run_template(*args); });
}

}  // namespace qwen36::cli
