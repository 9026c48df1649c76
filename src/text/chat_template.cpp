#include "text/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qwen36 {

using jinja::Json;

ChatTemplate::ChatTemplate(const Json& chat_template, Json special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  auto compile = [](const std::string& name, const std::string& source) {
    return with_context("chat template '" + name + "'",
                        [&] { return std::make_shared<jinja::Template>(source); });
  };
  if (chat_template.is_string()) {
    source_ = chat_template.get<std::string>();
    templates_.emplace_back("default", compile("default", source_));
  } else if (chat_template.is_array()) {
    for (const auto& entry : chat_template) {
      QWEN36_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                       entry.contains("template") && entry["template"].is_string(),
                   "chat_template list entries must be objects with string 'name' and 'template'");
      std::string name = entry["name"].get<std::string>();
      if (source_.empty() || name == "default") source_ = entry["template"].get<std::string>();
      templates_.emplace_back(name, compile(name, entry["template"].get<std::string>()));
    }
    QWEN36_CHECK(!templates_.empty(), "chat_template list is empty");
  } else {
    fail("chat_template must be a string or a list of named templates");
  }
}

ChatTemplate ChatTemplate::from_tokenizer_config(const Json& config) {
  QWEN36_CHECK(config.is_object(), "tokenizer config must be a JSON object");
  QWEN36_CHECK(config.contains("chat_template") && !config["chat_template"].is_null(),
               "tokenizer config has no chat_template");
  // transformers' special_tokens_map: the set special tokens, as strings.
  Json special = Json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                          "mask_token", "additional_special_tokens"}) {
    if (!config.contains(key) || config[key].is_null()) continue;
    const Json& v = config[key];
    auto content = [](const Json& t) -> Json {
      if (t.is_object() && t.contains("content")) return t["content"];
      return t;
    };
    if (v.is_array()) {
      Json list = Json::array();
      for (const auto& t : v) list.push_back(content(t));
      special[key] = std::move(list);
    } else {
      special[key] = content(v);
    }
  }
  return ChatTemplate(config["chat_template"], std::move(special));
}

ChatTemplate ChatTemplate::from_tokenizer_config_file(const std::string& path) {
  return with_context(path, [&] {
    std::ifstream in(path, std::ios::binary);
    QWEN36_CHECK(in.good(), "cannot open file");
    Json config;
    try {
      config = Json::parse(in);
    } catch (const Json::exception& e) {
      fail("invalid JSON: {}", e.what());
    }
    return from_tokenizer_config(config);
  });
}

namespace {

constexpr std::string_view kProbeName = "qwen36_probe_function", kProbeKey = "qwen36_probe_key",
                           kProbeValue = "qwen36_probe_value";

// The probe function's call with `arguments`, as the template renders it: from after "<tool_call>"
// through "</tool_call>"; nullopt when it renders none.
std::optional<std::string> probe_call(const ChatTemplate& t, const Json& arguments) {
  const Json tools = Json::array(
      {{{"type", "function"},
        {"function", {{"name", kProbeName}, {"description", ""}, {"parameters", {{"type", "object"}}}}}}});
  const Json call = {{"type", "function"}, {"function", {{"name", kProbeName}, {"arguments", arguments}}}};
  const Json messages = Json::array({{{"role", "user"}, {"content", "x"}},
                                     {{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}}});
  std::string text;
  try {
    text = t.render(messages, tools, false, nullptr);
  } catch (const Error&) {
    return std::nullopt;
  }
  const size_t open = text.rfind("<tool_call>");
  const size_t close = open == std::string::npos ? open : text.find("</tool_call>", open);
  if (close == std::string::npos) return std::nullopt;
  const size_t from = open + std::string_view("<tool_call>").size();
  return text.substr(from, close + std::string_view("</tool_call>").size() - from);
}

}  // namespace

std::optional<std::string> ChatTemplate::tool_call_name_prefix() const {
  const auto call = probe_call(*this, Json::object());
  const size_t at = call ? call->find(kProbeName) : std::string::npos;
  if (at == std::string::npos) return std::nullopt;
  return call->substr(0, at);
}

std::optional<ChatTemplate::ToolCallForm> ChatTemplate::tool_call_form() const {
  const auto empty = probe_call(*this, Json::object());
  const auto one = probe_call(*this, Json{{kProbeKey, kProbeValue}});
  const size_t at = empty ? empty->find(kProbeName) : std::string::npos;
  if (at == std::string::npos || !one || one->substr(0, at + kProbeName.size()) != empty->substr(0, at + kProbeName.size()))
    return std::nullopt;
  ToolCallForm f;
  f.before_name = empty->substr(0, at);
  const std::string rest0 = empty->substr(at + kProbeName.size()), rest1 = one->substr(at + kProbeName.size());
  if (const size_t args = rest0.find("{}"); args != std::string::npos) {  // the arguments as a JSON object
    f.json = true;
    f.after_name = rest0.substr(0, args);
    f.after_args = rest0.substr(args + 2);
    return f;
  }
  // XML: what one parameter adds is the text between the common head and tail of the two calls.
  size_t tail = 0;
  while (tail < rest0.size() && tail < rest1.size() && rest0[rest0.size() - 1 - tail] == rest1[rest1.size() - 1 - tail])
    ++tail;
  f.after_name = rest0.substr(0, rest0.size() - tail);
  f.after_args = rest0.substr(rest0.size() - tail);
  if (!rest1.starts_with(f.after_name)) return std::nullopt;
  const std::string param = rest1.substr(f.after_name.size(), rest1.size() - tail - f.after_name.size());
  const size_t key = param.find(kProbeKey), value = param.find(kProbeValue);
  if (key == std::string::npos || value == std::string::npos || value < key + kProbeKey.size()) return std::nullopt;
  f.before_key = param.substr(0, key);
  f.after_key = param.substr(key + kProbeKey.size(), value - key - kProbeKey.size());
  f.after_value = param.substr(value + kProbeValue.size());
  if (f.before_key.empty() || f.after_value.empty()) return std::nullopt;
  return f;
}

std::string ChatTemplate::render(const Json& messages, const Json& tools, bool add_generation_prompt,
                                 const Json& kwargs) const {
  QWEN36_CHECK(messages.is_array(), "messages must be a JSON array");
  QWEN36_CHECK(tools.is_null() || tools.is_array(), "tools must be a JSON array");
  QWEN36_CHECK(kwargs.is_null() || kwargs.is_object(), "template kwargs must be a JSON object");

  const jinja::Template* chosen = nullptr;
  if (templates_.size() == 1 && templates_[0].first == "default") {
    chosen = templates_[0].second.get();
  } else {
    auto find = [&](const char* name) -> const jinja::Template* {
      for (const auto& [n, t] : templates_) {
        if (n == name) return t.get();
      }
      return nullptr;
    };
    if (!tools.is_null()) chosen = find("tool_use");
    if (!chosen) chosen = find("default");
    QWEN36_CHECK(chosen, "the chat template list has no 'default' template");
  }

  jinja::Object vars;
  vars.set("messages", jinja::Value::from_json(messages));
  vars.set("tools", jinja::Value::from_json(tools));
  vars.set("documents", jinja::Value(jinja::None{}));
  vars.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    vars.set(it.key(), jinja::Value::from_json(it.value()));
  }
  if (kwargs.is_object()) {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) vars.set(it.key(), jinja::Value::from_json(it.value()));
  }
  return chosen->render(vars);
}

}  // namespace qwen36
