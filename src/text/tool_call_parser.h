#pragma once
// defines: parse_tool_call (the body of one <tool_call>...</tool_call> block -> name + arguments)
//
// Two forms are accepted:
//   Qwen3.6 XML:  <function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>
//                 values are typed by the tool's JSON schema (integer, number, boolean, null,
//                 object, array parsed; string and unknown parameters kept raw);
//   Qwen3 JSON:   {"name": NAME, "arguments": {...}}
// Anything else, or a function missing from a non-empty tool list, yields nullopt so the
// caller can show the text as plain content. Never throws.

#include <optional>
#include <string>
#include <string_view>

#include "text/jinja_value.h"

namespace qwen36 {

struct ParsedToolCall {
  std::string name;
  jinja::Json arguments;  // always an object
};

// tools: OpenAI tool list ([{"type":"function","function":{...}}] or bare function objects),
// or null.
std::optional<ParsedToolCall> parse_tool_call(std::string_view body, const jinja::Json& tools);

}  // namespace qwen36
