// Where a checkpoint keeps its chat template: ChatTemplate::find / from_file (chat_template.h).
#include <filesystem>
#include "core/error.h"
#include "core/file_text.h"
#include "format/gguf.h"
#include "text/chat_template.h"

namespace qwen36 {

namespace fs = std::filesystem;
using jinja::Json;

namespace {

Json read_json(const fs::path& p) {
  return with_context(p.string(), [&] {
    Json j = Json::parse(read_file(p.string()), nullptr, false);
    QWEN36_CHECK(j.is_object(), "not a JSON object");
    return j;
  });
}

bool is_gguf(const fs::path& p) { return p.extension() == ".gguf"; }

// The directory of a checkpoint path (itself, or the folder of a file in it).
fs::path folder_of(const fs::path& p) { return fs::is_directory(p) ? p : p.parent_path(); }

// The special-token keys of tokenizer_config.json, from a GGUF: bos / eos as token texts.
Json gguf_tokenizer_config(const GgufFile& g) {
  Json config = Json::object();
  if (!g.has("tokenizer.ggml.tokens")) return config;
  const auto& tokens = g.get_arr_str("tokenizer.ggml.tokens");
  for (const auto& [key, name] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token"},
                                  std::pair{"tokenizer.ggml.eos_token_id", "eos_token"}}) {
    if (!g.has(key)) continue;
    const int64_t id = g.get_int(key);
    if (id >= 0 && size_t(id) < tokens.size()) config[name] = std::string(tokens[size_t(id)]);
  }
  return config;
}

// The tokenizer config `path` gives (chat_template left in, if any): a GGUF's own (its
// template, bos / eos), else tokenizer_config.json beside it; empty when there is none.
Json tokenizer_config(const fs::path& path) {
  if (is_gguf(path)) {
    const GgufFile g(path.string());
    Json config = gguf_tokenizer_config(g);
    if (g.has("tokenizer.chat_template")) {
      config["chat_template"] = std::string(g.get_str("tokenizer.chat_template"));
      return config;
    }
  }
  const fs::path file = folder_of(path) / "tokenizer_config.json";
  return fs::exists(file) ? read_json(file) : Json::object();
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::find(const std::string& path) {
  Json config = tokenizer_config(path);
  if (config.contains("chat_template") && !config["chat_template"].is_null()) return from_tokenizer_config(config);
  const fs::path jinja = folder_of(path) / "chat_template.jinja";
  if (!fs::exists(jinja)) return std::nullopt;
  config["chat_template"] = with_context(jinja.string(), [&] { return read_file(jinja.string()); });
  return from_tokenizer_config(config);
}

ChatTemplate ChatTemplate::from_file(const std::string& jinja_file, const std::string& path) {
  Json config = path.empty() ? Json::object() : tokenizer_config(path);
  config["chat_template"] = read_file(jinja_file);
  return from_tokenizer_config(config);
}

}  // namespace qwen36
