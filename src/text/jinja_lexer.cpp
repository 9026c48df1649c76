// Splits a template into text and tag tokens, applying jinja2's whitespace rules.
#include "text/jinja_lexer.h"

#include <fmt/format.h>

#include "core/error.h"

namespace qwen36::jinja {

void template_error(int line, const std::string& message) {
  fail("template line {}: {}", line, message);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) {
    // jinja2 normalises newlines and (keep_trailing_newline=False) drops one final newline.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r' && i + 1 < src.size() && src[i + 1] == '\n') continue;
      src_ += src[i];
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next = false;    // previous tag ended with '-'
    bool trim_newline = false;  // previous block/comment tag ended plainly (trim_blocks)
    while (pos <= src_.size()) {
      size_t open = find_tag(pos);
      std::string text = src_.substr(pos, (open == std::string::npos ? src_.size() : open) - pos);
      bool line_start = pos == 0 || src_[pos - 1] == '\n';
      if (trim_newline && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
        line_start = true;
      }
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      int text_line = line_at(pos);
      if (open == std::string::npos) {
        emit_text(std::move(text), text_line);
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: drop spaces/tabs between the line start and a block or comment tag.
        size_t nl = text.rfind('\n');
        size_t from = nl == std::string::npos ? 0 : nl + 1;
        if (nl != std::string::npos || line_start) {
          if (text.find_first_not_of(" \t", from) == std::string::npos) text.erase(from);
        }
      }
      emit_text(std::move(text), text_line);
      size_t body = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      char close_mod = '\0';
      if (kind == '#') {
        size_t end = src_.find("#}", body);
        if (end == std::string::npos) template_error(line_at(open), "unclosed comment");
        close_mod = (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) ? src_[end - 1] : '\0';
        pos = end + 2;
      } else {
        pos = lex_tag(kind, body, close_mod);
      }
      strip_next = close_mod == '-';
      trim_newline = kind != '{' && close_mod != '-' && close_mod != '+';
      if (kind == '%' && is_raw_tag()) pos = lex_raw(pos, strip_next, trim_newline);
    }
    tokens_.push_back({TokenKind::End, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  int line_at(size_t pos) {
    // Positions only move forward, so count incrementally.
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({TokenKind::Text, std::move(text), line});
  }

  // Lexes the expression tokens of a {{ }} or {% %} tag; returns the position after it.
  size_t lex_tag(char kind, size_t pos, char& close_mod) {
    int open_line = line_at(pos);
    tokens_.push_back({kind == '{' ? TokenKind::VarBegin : TokenKind::BlockBegin, "", open_line});
    const char* closer = kind == '{' ? "}}" : "%}";
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) template_error(open_line, "unclosed tag");
      int line = line_at(pos);
      if ((src_[pos] == '-' || src_[pos] == '+') && src_.compare(pos + 1, 2, closer) == 0) {
        close_mod = src_[pos];
        if (kind == '{' && close_mod == '+') template_error(line, "unexpected '+'");
        pos += 3;
        break;
      }
      if (src_.compare(pos, 2, closer) == 0) {
        pos += 2;
        break;
      }
      char c = src_[pos];
      if (is_name_start(c)) {
        size_t s = pos;
        while (pos < src_.size() && (is_name_start(src_[pos]) || is_digit(src_[pos]))) ++pos;
        tokens_.push_back({TokenKind::Name, src_.substr(s, pos - s), line});
      } else if (is_digit(c)) {
        pos = lex_number(pos, line);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos, line);
      } else {
        static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
        std::string op(1, c);
        for (const char* t : two) {
          if (src_.compare(pos, 2, t) == 0) op = t;
        }
        if (op.size() == 1 && std::string_view("+-*/%~<>=()[]{}.,:|").find(c) == std::string_view::npos) {
          template_error(line, fmt::format("unexpected character '{}'", c));
        }
        pos += op.size();
        tokens_.push_back({TokenKind::Operator, op, line});
      }
    }
    tokens_.push_back({kind == '{' ? TokenKind::VarEnd : TokenKind::BlockEnd, "", line_at(pos)});
    return pos;
  }

  size_t lex_number(size_t pos, int line) {
    size_t s = pos;
    bool is_float = false;
    while (pos < src_.size() && (is_digit(src_[pos]) || src_[pos] == '_')) ++pos;
    if (pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
      is_float = true;
      ++pos;
      while (pos < src_.size() && (is_digit(src_[pos]) || src_[pos] == '_')) ++pos;
    }
    if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t e = pos + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        is_float = true;
        pos = e;
        while (pos < src_.size() && is_digit(src_[pos])) ++pos;
      }
    }
    std::string spelling;
    for (size_t i = s; i < pos; ++i) {
      if (src_[i] != '_') spelling += src_[i];
    }
    tokens_.push_back({is_float ? TokenKind::Float : TokenKind::Integer, spelling, line});
    return pos;
  }

  size_t lex_string(size_t pos, int line) {
    char quote = src_[pos++];
    std::string out;
    while (true) {
      if (pos >= src_.size()) template_error(line, "unterminated string literal");
      char c = src_[pos++];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= src_.size()) template_error(line, "unterminated string literal");
      char e = src_[pos++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos + n > src_.size()) template_error(line, "truncated escape in string literal");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            char h = src_[pos + k];
            int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) template_error(line, "bad escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          pos += n;
          append_utf8(out, cp);
          break;
        }
        default:  // Python keeps unknown escapes verbatim
          out += '\\';
          out += e;
      }
    }
    tokens_.push_back({TokenKind::String, std::move(out), line});
    return pos;
  }

  bool is_raw_tag() const {
    size_t n = tokens_.size();
    return n >= 3 && tokens_[n - 1].kind == TokenKind::BlockEnd && tokens_[n - 2].kind == TokenKind::Name &&
           tokens_[n - 2].text == "raw" && tokens_[n - 3].kind == TokenKind::BlockBegin;
  }

  // {% raw %}...{% endraw %}: the body is text, verbatim; replaces the raw tag's tokens.
  size_t lex_raw(size_t pos, bool& strip_next, bool& trim_newline) {
    int line = tokens_.back().line;
    tokens_.resize(tokens_.size() - 3);
    size_t search = pos;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) template_error(line, "missing endraw");
      size_t p = open + 2;
      char mod = p < src_.size() ? src_[p] : '\0';
      if (mod == '-' || mod == '+') ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char close_mod = '\0';
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) close_mod = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) template_error(line, "malformed endraw");
      std::string text = src_.substr(pos, open - pos);
      if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && is_space(text[k])) ++k;
        text.erase(0, k);
      }
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      }
      emit_text(std::move(text), line);
      strip_next = close_mod == '-';
      trim_newline = close_mod != '-' && close_mod != '+';
      return p + 2;
    }
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace qwen36::jinja
