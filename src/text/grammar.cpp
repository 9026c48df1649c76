// Grammar::parse: GBNF text into rules of byte ranges and rule references, with the checks that
// keep the matcher out of dead ends and infinite expansion (grammar.h).
#include <algorithm>
#include <map>

#include "core/error.h"
#include "text/code_points.h"
#include "text/grammar.h"

namespace qwen36::text {

namespace {

constexpr uint32_t kMaxRepeat = 1000;       // {m,n} bounds
constexpr size_t kMaxSymbols = 1u << 22;   // repetitions are copies: this caps their product

struct Symbol {
  enum Kind : uint8_t { kByte, kRule, kClass, kJson, kText } kind;
  uint8_t lo, hi;  // kByte: a byte in [lo, hi]
  uint32_t index;  // kRule: the rule; kClass: the character class; kJson / kText: the embedded value
  bool is_rule() const { return kind == kRule; }
};
using Alternative = std::vector<Symbol>;

Symbol byte_range(uint8_t lo, uint8_t hi) { return {Symbol::kByte, lo, hi, 0}; }
Symbol ref(uint32_t rule) { return {Symbol::kRule, 0, 0, rule}; }

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

struct GrammarCompiler {
  GrammarCompiler(std::string_view text, std::vector<Grammar::Embedded> embedded)
      : src(text), values(std::move(embedded)) {}
  std::string_view src;
  std::vector<Grammar::Embedded> values;
  size_t i = 0;
  std::vector<std::vector<Alternative>> rules;
  std::vector<std::string> names;
  std::vector<bool> defined;
  std::map<std::string, uint32_t, std::less<>> by_name;
  std::vector<CodePointRanges> classes;          // character classes, each once
  std::map<CodePointRanges, uint32_t> class_ids;
  size_t symbols = 0;

  [[noreturn]] void error(std::string_view what) const {
    const size_t at = std::min(i, src.size());
    const size_t line = size_t(std::count(src.begin(), src.begin() + long(at), '\n')) + 1;
    const size_t line_start = src.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t column = at - (line_start == std::string_view::npos || at == 0 ? 0 : line_start + 1) + 1;
    fail("grammar, line {} column {}: {}", line, column, what);
  }
  bool at_end() const { return i >= src.size(); }
  bool take(char c) {
    if (at_end() || src[i] != c) return false;
    ++i;
    return true;
  }

  uint32_t rule_id(std::string_view name) {
    if (auto it = by_name.find(name); it != by_name.end()) return it->second;
    rules.emplace_back();
    names.emplace_back(name);
    defined.push_back(false);
    return by_name[std::string(name)] = uint32_t(rules.size() - 1);
  }

  // A rule made by the compiler (groups, classes, repetitions), named after where it came from.
  uint32_t new_rule(std::string_view kind, std::vector<Alternative> alts) {
    for (const Alternative& a : alts) symbols += a.size() + 1;
    if (symbols > kMaxSymbols) error("the grammar is too large (its repetitions expand past 4M symbols)");
    rules.push_back(std::move(alts));
    names.push_back(fmt::format("{} #{}", kind, rules.size() - 1));
    defined.push_back(true);
    return uint32_t(rules.size() - 1);
  }

  // Spaces and comments; newlines too when `newlines`.
  void space(bool newlines) {
    while (!at_end()) {
      const char c = src[i];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++i;
      } else if (c == '#') {
        while (!at_end() && src[i] != '\n') ++i;
      } else {
        break;
      }
    }
  }

  void parse() {
    space(true);
    while (!at_end()) {
      const size_t start = i;
      while (!at_end() && is_name_char(src[i])) ++i;
      if (i == start) error("expected a rule name");
      const std::string_view name = src.substr(start, i - start);
      space(false);
      if (!take(':') || !take(':') || !take('=')) error(fmt::format("expected '::=' after rule name '{}'", name));
      space(true);
      std::vector<Alternative> alts = alternates(false);
      const uint32_t id = rule_id(name);
      if (defined[id]) error(fmt::format("rule '{}' is defined twice", name));
      for (const Alternative& a : alts) symbols += a.size() + 1;
      rules[id] = std::move(alts);
      defined[id] = true;
      space(false);
      if (!at_end() && src[i] != '\n' && src[i] != '\r') error(fmt::format("unexpected '{}'", src[i]));
      space(true);
    }
  }

  std::vector<Alternative> alternates(bool nested) {
    std::vector<Alternative> alts;
    alts.push_back(sequence(nested));
    for (;;) {
      const size_t here = i;
      space(true);  // a top-level rule may go on with '|' at the start of the next line
      if (!take('|')) {
        i = here;
        return alts;
      }
      space(true);
      alts.push_back(sequence(nested));
    }
  }

  Alternative sequence(bool nested) {
    Alternative seq;
    while (!at_end()) {
      const char c = src[i];
      if (c == '|' || c == ')' || (!nested && (c == '\n' || c == '\r'))) break;
      item(seq);
      space(nested);
    }
    return seq;
  }

  // An atom and the repetitions after it.
  void item(Alternative& seq) {
    const size_t start = seq.size();
    atom(seq);
    while (!at_end() && (src[i] == '*' || src[i] == '+' || src[i] == '?' || src[i] == '{')) {
      const Alternative x(seq.begin() + long(start), seq.end());
      seq.resize(start);
      const char op = src[i++];
      uint32_t lo = 0, hi = 0;  // hi == UINT32_MAX: unbounded
      if (op == '*') lo = 0, hi = UINT32_MAX;
      if (op == '+') lo = 1, hi = UINT32_MAX;
      if (op == '?') lo = 0, hi = 1;
      if (op == '{') braces(&lo, &hi);
      for (uint32_t k = 0; k < lo; ++k) seq.insert(seq.end(), x.begin(), x.end());
      if (hi == UINT32_MAX) {
        seq.push_back(ref(star(x)));
      } else if (hi > lo) {
        uint32_t inner = UINT32_MAX;  // x (x (x)?)? ...: each further copy optional
        for (uint32_t k = lo; k < hi; ++k) {
          Alternative more = x;
          if (inner != UINT32_MAX) more.push_back(ref(inner));
          inner = new_rule("repetition", {std::move(more), {}});
        }
        seq.push_back(ref(inner));
      }
      if (symbols + seq.size() > kMaxSymbols) error("the grammar is too large (its repetitions expand past 4M symbols)");
    }
  }

  uint32_t star(const Alternative& x) {  // R ::= x R | (empty)
    const uint32_t r = new_rule("repetition", {});
    Alternative loop = x;
    loop.push_back(ref(r));
    rules[r] = {std::move(loop), {}};
    symbols += x.size() + 3;
    return r;
  }

  // After '{': m}, m,}, m,n}.
  void braces(uint32_t* lo, uint32_t* hi) {
    auto number = [&] {
      const size_t from = i;
      uint64_t v = 0;
      while (!at_end() && src[i] >= '0' && src[i] <= '9') v = std::min<uint64_t>(v * 10 + uint64_t(src[i++] - '0'), 1u << 30);
      if (i == from) error("expected a number in {m,n}");
      return uint32_t(v);
    };
    space(false);
    *lo = number();
    space(false);
    *hi = *lo;
    if (take(',')) {
      space(false);
      *hi = !at_end() && src[i] == '}' ? UINT32_MAX : number();
      space(false);
    }
    if (!take('}')) error("expected '}'");
    if (*lo > kMaxRepeat || (*hi != UINT32_MAX && *hi > kMaxRepeat))
      error(fmt::format("repetition count above {}", kMaxRepeat));
    if (*lo > *hi) error("repetition {m,n} with m > n");
  }

  void atom(Alternative& seq) {
    const char c = src[i];
    if (c == '"') {
      ++i;
      while (!take('"')) {
        if (at_end() || src[i] == '\n') error("unterminated string literal");
        uint8_t b[4];
        const int n = encode_utf8(character(), b);
        for (int k = 0; k < n; ++k) seq.push_back(byte_range(b[k], b[k]));
      }
    } else if (c == '[') {
      ++i;
      seq.push_back(character_class());
    } else if (c == '.') {
      ++i;
      seq.push_back(class_symbol({{0, kMaxCodePoint}}));
    } else if (c == '(') {
      ++i;
      space(true);
      std::vector<Alternative> alts = alternates(true);
      if (!take(')')) error("expected ')'");
      seq.push_back(ref(new_rule("group", std::move(alts))));
    } else if (c == '<' || c == '!') {
      error("token references (<[id]>, <token>) are not supported");
    } else if (c == '%' && !values.empty()) {
      ++i;
      size_t k = 0;
      const size_t from = i;
      while (!at_end() && src[i] >= '0' && src[i] <= '9') k = k * 10 + size_t(src[i++] - '0');
      if (i == from || k >= values.size()) error("expected the number of an embedded value after '%'");
      if (!values[k].json && (!values[k].text || values[k].text->empty())) error("an embedded value matches nothing");
      seq.push_back({values[k].json ? Symbol::kJson : Symbol::kText, 0, 0, uint32_t(k)});
    } else if (is_name_char(c)) {
      const size_t start = i;
      while (!at_end() && is_name_char(src[i])) ++i;
      seq.push_back(ref(rule_id(src.substr(start, i - start))));
    } else {
      error(fmt::format("unexpected '{}'", c));
    }
  }

  // After '['.
  Symbol character_class() {
    const bool negated = take('^');
    CodePointRanges set;
    while (!take(']')) {
      if (at_end() || src[i] == '\n') error("unterminated character class");
      const uint32_t lo = character();
      uint32_t hi = lo;
      if (i + 1 < src.size() && src[i] == '-' && src[i + 1] != ']') {
        ++i;
        hi = character();
        if (hi < lo) error("range out of order in a character class");
      }
      set.emplace_back(lo, hi);
    }
    set = normalised(std::move(set));
    return class_symbol(negated ? complement(set) : set);
  }

  // One character of the set: a single byte range when all of it is ASCII.
  Symbol class_symbol(const CodePointRanges& set) {
    if (set.size() == 1 && set[0].second < 0x80) return byte_range(uint8_t(set[0].first), uint8_t(set[0].second));
    std::vector<ByteRangeSeq> seqs;
    for (const auto& [lo, hi] : set) utf8_sequences(lo, hi, seqs);
    if (seqs.empty()) error("the character class matches nothing");
    auto [it, fresh] = class_ids.emplace(set, uint32_t(classes.size()));
    if (fresh) classes.push_back(set);
    return {Symbol::kClass, 0, 0, it->second};
  }

  // One character of a literal or class: UTF-8, or an escape.
  uint32_t character() {
    if (take('\\')) {
      if (at_end()) error("unterminated escape");
      const char e = src[i++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-': return uint32_t(e);
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        default: i -= 2; error(fmt::format("unknown escape '\\{}'", e));
      }
    }
    const int32_t cp = decode_utf8(src, &i);
    if (cp < 0) error("the grammar is not valid UTF-8");
    return uint32_t(cp);
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const int d = at_end() ? -1 : hex_digit(uint8_t(src[i]));
      if (d < 0) error(fmt::format("expected {} hex digits", digits));
      ++i;
      v = v * 16 + uint32_t(d);
    }
    if (v > kMaxCodePoint) error("code point above U+10FFFF");
    return v;
  }

  // ------------------------------------------------------------------------------------------
  // Checks and flattening

  std::shared_ptr<const Grammar> finish() {
    const auto root = by_name.find("root");
    QWEN36_CHECK(root != by_name.end() && defined[root->second], "grammar: no 'root' rule (where a sentence starts)");
    for (size_t r = 0; r < rules.size(); ++r)
      QWEN36_CHECK(defined[r], "grammar: rule '{}' is used but not defined", names[r]);
    const size_t n = rules.size();

    // Rules that can end (derive a finite text); alternatives through the others are dropped.
    std::vector<bool> productive(n, false);
    auto all = [&](const Alternative& a, const std::vector<bool>& ok) {
      return std::all_of(a.begin(), a.end(), [&](const Symbol& s) { return !s.is_rule() || ok[s.index]; });
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r)
        if (!productive[r] && std::any_of(rules[r].begin(), rules[r].end(), [&](const Alternative& a) { return all(a, productive); }))
          productive[r] = changed = true;
    }
    for (auto& alts : rules) std::erase_if(alts, [&](const Alternative& a) { return !all(a, productive); });
    std::vector<bool> reachable(n, false);
    std::vector<uint32_t> work = {root->second};
    reachable[root->second] = true;
    while (!work.empty()) {
      const uint32_t r = work.back();
      work.pop_back();
      QWEN36_CHECK(!rules[r].empty(), "grammar: rule '{}' matches no finite text (every alternative recurses forever)",
                   names[r]);
      for (const Alternative& a : rules[r])
        for (const Symbol& s : a)
          if (s.is_rule() && !reachable[s.index]) reachable[s.index] = true, work.push_back(s.index);
    }

    // Left recursion: a rule reaching itself before any byte.
    std::vector<bool> nullable(n, false);
    // An embedded text that may be empty matches nothing as well.
    auto empty_ok = [&](const Symbol& s) {
      return s.is_rule() ? bool(nullable[s.index])
                         : s.kind == Symbol::kText && values[s.index].text->accepting(ByteDfa::start());
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r)
        if (!nullable[r] && std::any_of(rules[r].begin(), rules[r].end(), [&](const Alternative& a) {
              return std::all_of(a.begin(), a.end(), empty_ok);
            }))
          nullable[r] = changed = true;
    }
    // The references a rule's expansion makes before any character: r -> s. One that is not the
    // last of its alternative leaves a continuation on the stack ("grows"); a loop through such a
    // reference would expand forever. Loops of last references (x** and the like) come back to a
    // position already expanded and stop there.
    std::vector<std::vector<uint32_t>> edges(n);
    std::vector<std::pair<uint32_t, uint32_t>> growing;
    for (size_t r = 0; r < n; ++r) {
      if (!reachable[r]) continue;
      for (const Alternative& a : rules[r]) {
        for (size_t k = 0; k < a.size(); ++k) {
          if (a[k].is_rule()) {
            edges[r].push_back(a[k].index);
            if (k + 1 < a.size()) growing.emplace_back(uint32_t(r), a[k].index);
          }
          if (!empty_ok(a[k])) break;  // past what may match nothing, the expansion goes on
        }
      }
    }
    std::vector<uint32_t> seen(n, 0);
    uint32_t stamp = 0;
    for (const auto& [from, to] : growing) {
      ++stamp;  // does `to` lead back to `from`?
      std::vector<uint32_t> stack = {to};
      while (!stack.empty()) {
        const uint32_t r = stack.back();
        stack.pop_back();
        QWEN36_CHECK(r != from, "grammar: left recursion through rule '{}' (a rule that can reach itself before "
                     "matching a character)", names[from]);
        if (seen[r] == stamp) continue;
        seen[r] = stamp;
        for (uint32_t s : edges[r]) stack.push_back(s);
      }
    }

    std::shared_ptr<Grammar> g(new Grammar());
    g->alts_.resize(n);
    g->root_ = root->second;
    for (const CodePointRanges& set : classes) g->classes_.push_back(ByteDfa::character(set));
    g->embedded_ = values;
    for (size_t r = 0; r < n; ++r) {
      if (!reachable[r]) continue;
      for (const Alternative& a : rules[r]) {
        g->alts_[r].push_back(uint32_t(g->elems_.size()));
        for (const Symbol& s : a) {
          constexpr Grammar::Elem::Kind kKinds[] = {Grammar::Elem::kBytes, Grammar::Elem::kRule, Grammar::Elem::kClass,
                                                    Grammar::Elem::kJson, Grammar::Elem::kText};
          g->elems_.push_back({kKinds[s.kind], s.lo, s.hi, s.index});
        }
        g->elems_.push_back({Grammar::Elem::kEnd, 0, 0, 0});
      }
    }
    return g;
  }
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, std::vector<Embedded> values) {
  GrammarCompiler c(gbnf, std::move(values));
  c.parse();
  return c.finish();
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (uint8_t(c) < 0x20) out += fmt::format("\\x{:02X}", uint8_t(c));
        else out += c;
    }
  }
  return out + "\"";
}

}  // namespace qwen36::text
