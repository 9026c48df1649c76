#pragma once
// defines: OutputParser (incremental split of model output into content, reasoning and tool
//          calls), parse_output (the same on a whole text), to_openai_message
//
// Qwen output looks like  [<think>]reasoning</think>\n\ncontent<tool_call>...</tool_call>.
// The parser emits deltas as text streams in, holding back only what could still be the
// start of a tag ("<too") or whitespace next to a tag. Whitespace that only frames tags is
// dropped, so content and reasoning come out as the template would re-render them. Tool
// calls are emitted whole once closed. Whatever cannot be parsed is shown as plain content;
// the parser never throws on model output. Concatenating the deltas of any chunking gives
// the result of parse_output on the whole text.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_value.h"

namespace qwen36 {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object as text, as OpenAI's function.arguments
};

struct ParsedOutput {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

struct OutputDelta {
  enum class Kind { Content, Reasoning, ToolCall };
  Kind kind;
  std::string text;    // Content and Reasoning
  ToolCall tool_call;  // ToolCall
  size_t index = 0;    // ToolCall: position in tool_calls
};

struct OutputParserOptions {
  bool thinking_enabled = true;         // false: <think> and </think> are plain text
  bool prompt_opened_thinking = false;  // the prompt left the model reasoning (prompt_opens_thinking)
  jinja::Json tools = nullptr;          // types XML values; when non-empty, unknown functions are text
  std::string id_prefix = "call_";      // tool call ids are id_prefix + index
  size_t max_tool_call_bytes = size_t{16} << 20;  // a longer unclosed call becomes text
};

// Whether a rendered prompt leaves the model inside <think>: after the last turn's opening
// (ChatML's <|im_start|>), a <think> with no </think> after it — the generation prompt of a
// thinking template, or an assistant prefill that is still reasoning.
bool prompt_opens_thinking(std::string_view prompt);

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options = {});

  std::vector<OutputDelta> feed(std::string_view text);
  std::vector<OutputDelta> finish();  // end of stream: flushes what was held back

  const ParsedOutput& result() const { return result_; }  // everything emitted so far

 private:
  enum class State { Content, Reasoning, ToolCall };

  void process(bool at_end);
  void on_text(std::string_view text);  // text of the current state (not a tag)
  void on_tag(std::string_view tag);
  void end_segment();                   // a tag or the end closes a text segment
  void emit(OutputDelta::Kind kind, std::string text);
  void emit_text_as_content(std::string_view text);
  void close_tool_call(bool at_end);
  bool runaway_tool_call(size_t tag_pos, bool at_end);
  std::vector<std::string_view> tags() const;

  OutputParserOptions opt_;
  State state_;
  std::string pending_;   // not yet classified (may start with a partial tag)
  std::string ws_hold_;   // whitespace that is dropped if a tag follows
  bool segment_started_ = false;
  std::string tool_buf_;  // body of the open <tool_call>
  std::vector<OutputDelta> out_;
  ParsedOutput result_;
};

ParsedOutput parse_output(std::string_view text, const OutputParserOptions& options = {});

// {"role":"assistant","content":...,"reasoning_content":...,"tool_calls":[...]}; content is
// null when empty and there are tool calls; absent fields are omitted.
jinja::Json to_openai_message(const ParsedOutput& parsed);

}  // namespace qwen36
