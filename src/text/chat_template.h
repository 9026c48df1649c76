#pragma once
// defines: ChatTemplate (a checkpoint's Jinja chat template, rendered the way Hugging Face
//          transformers' apply_chat_template(tokenize=False) renders it)
//
// Variables given to the template: messages, tools (none when absent), documents (none),
// add_generation_prompt, the special tokens of tokenizer_config.json (bos_token, eos_token,
// ...), then the caller's extra kwargs (enable_thinking, preserve_thinking, ...).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_eval.h"
#include "text/jinja_value.h"

namespace qwen36 {

class ChatTemplate {
 public:
  // `chat_template` as stored in tokenizer_config.json: a string, or a list of
  // {"name", "template"} entries (transformers picks "tool_use" when tools are given, else
  // "default"). `special_tokens` holds the variables bos_token etc.
  ChatTemplate(const jinja::Json& chat_template, jinja::Json special_tokens);

  static ChatTemplate from_tokenizer_config(const jinja::Json& config);
  static ChatTemplate from_tokenizer_config_file(const std::string& path);
  // The template a checkpoint carries (chat_template_source.cpp), looked for in this order: a
  // GGUF's tokenizer.chat_template (bos / eos token texts from its vocabulary), the chat_template
  // of tokenizer_config.json beside the path, chat_template.jinja there (transformers' newer
  // layout; the special tokens still from tokenizer_config.json). `path`: a checkpoint or
  // tokenizer directory, a file in one, or a .gguf file. nullopt when none is found; throws
  // Error on a bad one.
  static std::optional<ChatTemplate> find(const std::string& path);
  // A template from a Jinja file (llama-server's --chat-template-file), with the special tokens
  // `path` (as for find) gives, if any.
  static ChatTemplate from_file(const std::string& jinja_file, const std::string& path);

  // messages: array of message objects; tools: null or array; kwargs: null or object.
  std::string render(const jinja::Json& messages, const jinja::Json& tools, bool add_generation_prompt,
                     const jinja::Json& kwargs) const;
  // What this template writes between "<tool_call>" and the function's name in an assistant's
  // tool call ("\n<function=" in Qwen3.6's XML form, "\n{\"name\": \"" in Qwen3's JSON form),
  // found by rendering one; nullopt when it renders no such call.
  std::optional<std::string> tool_call_name_prefix() const;

  // The whole shape of a tool call as this template writes it, found by rendering probe calls:
  //   JSON form (Qwen3): "<tool_call>" before_name NAME after_name ARGUMENTS-OBJECT after_args
  //   XML form (Qwen3.6): "<tool_call>" before_name NAME after_name
  //                       (before_key KEY after_key VALUE after_value)* after_args
  // nullopt when the rendering fits neither.
  struct ToolCallForm {
    bool json = false;
    std::string before_name, after_name, after_args;
    std::string before_key, after_key, after_value;  // XML form
    bool operator==(const ToolCallForm&) const = default;
  };
  std::optional<ToolCallForm> tool_call_form() const;

  // The Jinja text of the template used without tools ("default", else the first of a list), as
  // the checkpoint stores it (llama-server's /props reports it).
  const std::string& source() const { return source_; }
  // The special tokens' texts it was given (bos_token, eos_token, ...).
  const jinja::Json& special_tokens() const { return special_tokens_; }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<jinja::Template>>> templates_;
  jinja::Json special_tokens_;
  std::string source_;
};

}  // namespace qwen36
