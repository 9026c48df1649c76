#pragma once
// defines: jinja::Token, jinja::tokenize (template source -> tokens), jinja::template_error
//
// Whitespace control happens here, as in jinja2: transformers renders with trim_blocks and
// lstrip_blocks on and keep_trailing_newline off, and {%- -%} {{- -}} {#- -#} strip too.

#include <string>
#include <string_view>
#include <vector>

namespace qwen36::jinja {

enum class TokenKind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, End };

struct Token {
  TokenKind kind;
  std::string text;  // text, name, operator, decoded string literal or number spelling
  int line;
};

// Every template failure names the line: "template line N: message".
[[noreturn]] void template_error(int line, const std::string& message);

std::vector<Token> tokenize(std::string_view source);

}  // namespace qwen36::jinja
