// ByteDfa::compile: a pattern parsed into a tree of code-point sets, built into a Thompson NFA
// over UTF-8 byte ranges, made deterministic by subset construction and trimmed to the states
// that can still reach a match.
#include "text/regex.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"
#include "text/code_points.h"

namespace qwen36::text {

namespace {

constexpr uint32_t kUnbounded = 0xFFFFFFFF;
constexpr uint32_t kMaxRepeat = 1000;        // {n,m} bounds
constexpr size_t kMaxNfaStates = 1u << 20;  // repetitions are copies: this caps their product

using Ranges = CodePointRanges;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space
const Ranges kAnyChar = {{0, kMaxCodePoint}};
const Ranges kDot = {{0, '\n' - 1}, {'\n' + 1, kMaxCodePoint}};


// ---------------------------------------------------------------------------------------------
// Syntax tree

struct Node {
  enum Kind : uint8_t { kSet, kConcat, kAlt, kRepeat } kind;
  Ranges set;                  // kSet
  std::vector<uint32_t> kids;  // kConcat, kAlt; kRepeat: one
  uint32_t min = 0, max = 0;   // kRepeat (max may be kUnbounded)
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}
  std::vector<Node> nodes;

  uint32_t parse(RegexMode mode) {
    std::vector<uint32_t> alts;
    do {
      bool anchored_start = false, anchored_end = false;
      uint32_t c = concat(0, &anchored_start, &anchored_end);
      if (mode == RegexMode::Search) {  // a match somewhere: anything around an unanchored side
        if (!anchored_start) c = add({Node::kConcat, {}, {any_text(), c}});
        if (!anchored_end) c = add({Node::kConcat, {}, {c, any_text()}});
      }
      alts.push_back(c);
    } while (take('|'));
    if (!at_end()) error("unbalanced ')'");
    return alts.size() == 1 ? alts[0] : add({Node::kAlt, {}, std::move(alts)});
  }

 private:
  [[noreturn]] void error(std::string_view what) const { fail("{} at offset {}", what, i_); }
  bool at_end() const { return i_ >= p_.size(); }
  char peek() const { return p_[i_]; }
  bool take(char c) {
    if (at_end() || p_[i_] != c) return false;
    ++i_;
    return true;
  }
  uint32_t add(Node n) {
    nodes.push_back(std::move(n));
    return uint32_t(nodes.size() - 1);
  }
  uint32_t any_text() { return add({Node::kRepeat, {}, {add({Node::kSet, kAnyChar, {}})}, 0, kUnbounded}); }

  // Top-level alternatives (depth 0) may open with ^ and close with $; the flags say which did.
  uint32_t concat(int depth, bool* anchored_start, bool* anchored_end) {
    Node n{Node::kConcat, {}, {}};
    if (depth == 0 && take('^')) *anchored_start = true;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && depth == 0 && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) {
        ++i_;
        *anchored_end = true;
        break;
      }
      n.kids.push_back(repeated(atom(depth)));
    }
    return add(std::move(n));
  }

  uint32_t alternation(int depth) {
    std::vector<uint32_t> alts;
    do alts.push_back(concat(depth, nullptr, nullptr));
    while (take('|'));
    return alts.size() == 1 ? alts[0] : add({Node::kAlt, {}, std::move(alts)});
  }

  // The atom with the quantifier after it, if any.
  uint32_t repeated(uint32_t atom) {
    uint32_t lo, hi;
    if (take('*')) lo = 0, hi = kUnbounded;
    else if (take('+')) lo = 1, hi = kUnbounded;
    else if (take('?')) lo = 0, hi = 1;
    else if (!braces(&lo, &hi)) return atom;
    take('?');  // lazy: the same language
    if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?')) error("possessive or repeated quantifier");
    uint32_t b0, b1;
    const size_t at = i_;
    if (braces(&b0, &b1)) {
      i_ = at;
      error("repeated quantifier");
    }
    return add({Node::kRepeat, {}, {atom}, lo, hi});
  }

  // {n}, {n,}, {n,m}; anything else leaves '{' to be read as a literal.
  bool braces(uint32_t* lo, uint32_t* hi) {
    const size_t start = i_;
    auto number = [&](uint32_t* v) {
      const size_t from = i_;
      uint64_t x = 0;
      while (!at_end() && peek() >= '0' && peek() <= '9') x = std::min<uint64_t>(x * 10 + uint64_t(p_[i_++] - '0'), 1u << 30);
      *v = uint32_t(x);
      return i_ > from;
    };
    if (!take('{')) return false;
    bool ok;
    if (take(',')) {  // {,m}: Python's {0,m}
      *lo = 0;
      ok = number(hi);
    } else {
      ok = number(lo);
      *hi = *lo;
      if (ok && take(',') && !number(hi)) *hi = kUnbounded;
    }
    if (!ok || !take('}')) {
      i_ = start;
      return false;
    }
    if (*lo > kMaxRepeat || (*hi != kUnbounded && *hi > kMaxRepeat))
      error(fmt::format("repetition count above {}", kMaxRepeat));
    if (*lo > *hi) error("repetition {n,m} with n > m");
    return true;
  }

  uint32_t atom(int depth) {
    const char c = peek();
    switch (c) {
      case '(': return group(depth);
      case '[': ++i_; return add({Node::kSet, class_body(), {}});
      case '.': ++i_; return add({Node::kSet, kDot, {}});
      case '\\': ++i_; return add({Node::kSet, escape(false), {}});
      case '^':
      case '$': error(fmt::format("'{}' is supported only at the start / end of the pattern or of a top-level alternative", c));
      case '*':
      case '+':
      case '?': error("nothing to repeat");
      default: {
        const uint32_t cp = code_point();
        return add({Node::kSet, {{cp, cp}}, {}});
      }
    }
  }

  uint32_t group(int depth) {
    ++i_;  // '('
    if (take('?')) {
      if (take('P')) {
        if (!take('<')) error("(?P= backreferences are not supported");
        name();
      } else if (take('<')) {
        if (!at_end() && (peek() == '=' || peek() == '!')) error("lookbehind is not supported");
        name();
      } else if (!take(':')) {
        if (!at_end() && (peek() == '=' || peek() == '!')) error("lookahead is not supported");
        error("inline flags and other (? groups are not supported");
      }
    }
    const uint32_t inner = alternation(depth + 1);
    if (!take(')')) error("missing ')'");
    return inner;
  }

  void name() {  // a group's name and its '>'
    while (!at_end() && peek() != '>') ++i_;
    if (!take('>')) error("unterminated group name");
  }

  // After '\\'. In a class \b is a backspace.
  Ranges escape(bool in_class) {
    if (at_end()) error("trailing backslash");
    const char c = p_[i_++];
    auto one = [](uint32_t cp) { return Ranges{{cp, cp}}; };
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0': return one(0);
      case 'x': return one(hex_digits(2));
      case 'u': {
        const uint32_t cp = hex_digits(4);
        if (cp >= 0xD800 && cp <= 0xDFFF) error("a surrogate code point");
        return one(cp);
      }
      case 'b':
        if (in_class) return one('\b');
        [[fallthrough]];
      case 'B': error("word boundaries (\\b, \\B) are not supported");
      case 'A':
      case 'Z':
      case 'z':
      case 'G': error("anchors other than ^ and $ are not supported");
      case 'p':
      case 'P': error("Unicode property classes are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') error("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
      error(fmt::format("unknown escape \\{}", c));
    --i_;  // escaped punctuation or another character: itself
    const uint32_t cp = code_point();
    return one(cp);
  }

  uint32_t hex_digits(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      const int d = at_end() ? -1 : hex_digit(uint8_t(peek()));
      if (d < 0) error(fmt::format("expected {} hex digits", n));
      ++i_;
      v = v * 16 + uint32_t(d);
    }
    return v;
  }

  // After '['.
  Ranges class_body() {
    const bool negated = take('^');
    Ranges set;
    bool first = true;
    for (;;) {
      if (at_end()) error("missing ']'");
      if (peek() == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      Ranges item = class_item();
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() && peek() == '-' &&
          p_[i_ + 1] != ']') {
        ++i_;
        const Ranges hi = class_item();
        if (hi.size() != 1 || hi[0].first != hi[0].second) error("a class escape cannot end a range");
        if (hi[0].first < item[0].first) error("range out of order in a character class");
        item[0].second = hi[0].first;
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    set = normalised(std::move(set));
    return negated ? complement(set) : set;
  }

  Ranges class_item() {
    if (take('\\')) return escape(true);
    const uint32_t cp = code_point();
    return {{cp, cp}};
  }

  // The pattern's next UTF-8 character.
  uint32_t code_point() {
    const int32_t cp = decode_utf8(p_, &i_);
    if (cp < 0) error("the pattern is not valid UTF-8");
    return uint32_t(cp);
  }

  std::string_view p_;
  size_t i_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Thompson NFA over byte ranges

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    uint32_t to;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<uint32_t> eps;
  };
  std::vector<State> states;

  uint32_t add() {
    QWEN36_CHECK(states.size() < kMaxNfaStates, "too complex (its repetitions expand past {} automaton states)",
                 kMaxNfaStates);
    states.emplace_back();
    return uint32_t(states.size() - 1);
  }
  void eps(uint32_t from, uint32_t to) { states[from].eps.push_back(to); }

  // The fragment of node n: entry and exit states (the exit has no edges yet).
  std::pair<uint32_t, uint32_t> build(const std::vector<Node>& nodes, uint32_t n) {
    const Node& node = nodes[n];
    const uint32_t in = add();
    switch (node.kind) {
      case Node::kSet: {
        const uint32_t out = add();
        std::vector<ByteRangeSeq> seqs;
        for (const auto& [lo, hi] : node.set) utf8_sequences(lo, hi, seqs);
        for (const ByteRangeSeq& seq : seqs) {
          uint32_t cur = in;
          for (size_t k = 0; k < seq.size(); ++k) {
            const uint32_t to = k + 1 == seq.size() ? out : add();
            states[cur].edges.push_back({seq[k].first, seq[k].second, to});
            cur = to;
          }
        }
        return {in, out};
      }
      case Node::kConcat: {
        uint32_t cur = in;
        for (uint32_t kid : node.kids) {
          const auto [a, b] = build(nodes, kid);
          eps(cur, a);
          cur = b;
        }
        return {in, cur};
      }
      case Node::kAlt: {
        const uint32_t out = add();
        for (uint32_t kid : node.kids) {
          const auto [a, b] = build(nodes, kid);
          eps(in, a);
          eps(b, out);
        }
        return {in, out};
      }
      case Node::kRepeat: {
        uint32_t cur = in;
        for (uint32_t k = 0; k < node.min; ++k) {
          const auto [a, b] = build(nodes, node.kids[0]);
          eps(cur, a);
          cur = b;
        }
        const uint32_t out = add();
        if (node.max == kUnbounded) {
          const auto [a, b] = build(nodes, node.kids[0]);
          eps(cur, a);
          eps(b, a);
          eps(b, out);
        } else {
          for (uint32_t k = node.min; k < node.max; ++k) {  // each further copy optional
            eps(cur, out);
            const auto [a, b] = build(nodes, node.kids[0]);
            eps(cur, a);
            cur = b;
          }
        }
        eps(cur, out);
        return {in, out};
      }
    }
    return {in, in};
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Subset construction and trimming

struct DfaBuilder {
  const Nfa& nfa;
  uint32_t accept;
  std::vector<uint32_t> mark;  // closure's visited stamps
  uint32_t stamp = 0;

  std::vector<uint32_t> closure(std::vector<uint32_t> set) {
    ++stamp;
    std::vector<uint32_t> stack = set;
    set.clear();
    while (!stack.empty()) {
      const uint32_t s = stack.back();
      stack.pop_back();
      if (mark[s] == stamp) continue;
      mark[s] = stamp;
      set.push_back(s);
      for (uint32_t t : nfa.states[s].eps) stack.push_back(t);
    }
    std::sort(set.begin(), set.end());
    return set;
  }

  ByteDfa build(uint32_t start) {
    ByteDfa d;
    // Byte classes: a class starts at every edge's lo and after every edge's hi.
    std::array<bool, 257> cut{};
    for (const Nfa::State& s : nfa.states)
      for (const Nfa::Edge& e : s.edges) cut[e.lo] = cut[e.hi + 1] = true;
    uint16_t cls = 0;
    for (int b = 0; b < 256; ++b) {
      if (b > 0 && cut[size_t(b)]) ++cls;
      d.class_of_[size_t(b)] = uint8_t(cls);
    }
    d.classes_ = uint16_t(cls + 1);

    mark.assign(nfa.states.size(), 0);
    std::map<std::vector<uint32_t>, uint32_t> ids;
    std::vector<const std::vector<uint32_t>*> sets;
    std::vector<uint32_t> next;  // [state * classes + class], kDead-free until trimmed: UINT32_MAX
    auto id_of = [&](std::vector<uint32_t> set) {
      auto [it, fresh] = ids.emplace(std::move(set), uint32_t(sets.size()));
      if (fresh) {
        QWEN36_CHECK(sets.size() < ByteDfa::kMaxStates, "too complex (more than {} automaton states)",
                     ByteDfa::kMaxStates);
        sets.push_back(&it->first);
      }
      return it->second;
    };
    id_of(closure({start}));
    std::vector<std::vector<uint32_t>> buckets(d.classes_);
    for (size_t s = 0; s < sets.size(); ++s) {
      for (auto& b : buckets) b.clear();
      for (uint32_t q : *sets[s])
        for (const Nfa::Edge& e : nfa.states[q].edges)
          for (int c = d.class_of_[e.lo]; c <= d.class_of_[e.hi]; ++c) buckets[size_t(c)].push_back(e.to);
      for (const auto& b : buckets) next.push_back(b.empty() ? UINT32_MAX : id_of(closure(b)));
    }

    std::vector<bool> accepting(sets.size());
    for (size_t q = 0; q < sets.size(); ++q) accepting[q] = std::binary_search(sets[q]->begin(), sets[q]->end(), accept);
    return trimmed(std::move(d), next, accepting);
  }

  // d's transitions from `next` ([state * classes + class], UINT32_MAX: none), keeping only the
  // states from which an accepting state is reachable (none at all when the start is not).
  static ByteDfa trimmed(ByteDfa d, const std::vector<uint32_t>& next, const std::vector<bool>& accepting) {
    const size_t n = accepting.size();
    std::vector<std::vector<uint32_t>> preds(n);
    std::vector<bool> live(n, false);
    std::vector<uint32_t> work;
    for (size_t s = 0; s < n; ++s) {
      for (size_t c = 0; c < d.classes_; ++c)
        if (const uint32_t t = next[s * d.classes_ + c]; t != UINT32_MAX) preds[t].push_back(uint32_t(s));
      if (accepting[s]) {
        live[s] = true;
        work.push_back(uint32_t(s));
      }
    }
    while (!work.empty()) {
      const uint32_t t = work.back();
      work.pop_back();
      for (uint32_t p : preds[t])
        if (!live[p]) live[p] = true, work.push_back(p);
    }
    d.next_.clear();
    d.flags_.clear();
    if (n == 0 || !live[0]) return d;
    std::vector<uint16_t> renum(n, ByteDfa::kDead);
    uint16_t kept = 0;
    for (size_t s = 0; s < n; ++s)
      if (live[s]) renum[s] = kept++;
    for (size_t s = 0; s < n; ++s) {
      if (!live[s]) continue;
      uint8_t flags = accepting[s] ? ByteDfa::kAccepting : 0;
      for (size_t c = 0; c < d.classes_; ++c) {
        const uint32_t t = next[s * d.classes_ + c];
        const uint16_t to = t == UINT32_MAX ? ByteDfa::kDead : renum[t];
        if (to != ByteDfa::kDead) flags |= ByteDfa::kExtendable;
        d.next_.push_back(to);
      }
      d.flags_.push_back(flags);
    }
    return d;
  }

  // The product automaton: both (intersection) or either (union) accepting.
  static ByteDfa product(const ByteDfa& a, const ByteDfa& b, bool both) {
    ByteDfa d;
    std::map<std::pair<uint8_t, uint8_t>, uint8_t> classes;  // (a's class, b's class) -> class
    std::vector<uint8_t> rep;                                  // a byte of each class
    for (int byte = 0; byte < 256; ++byte) {
      auto [it, fresh] = classes.emplace(std::pair(a.class_of_[size_t(byte)], b.class_of_[size_t(byte)]),
                                         uint8_t(classes.size()));
      if (fresh) rep.push_back(uint8_t(byte));
      d.class_of_[size_t(byte)] = it->second;
    }
    d.classes_ = uint16_t(classes.size());
    // A side that is empty or has died is kDead; a pair with both dead is no state.
    std::map<std::pair<uint16_t, uint16_t>, uint32_t> ids;
    std::vector<std::pair<uint16_t, uint16_t>> pairs;
    std::vector<uint32_t> next;
    auto id_of = [&](uint16_t x, uint16_t y) -> uint32_t {
      if (both ? x == ByteDfa::kDead || y == ByteDfa::kDead : x == ByteDfa::kDead && y == ByteDfa::kDead)
        return UINT32_MAX;
      auto [it, fresh] = ids.emplace(std::pair(x, y), uint32_t(pairs.size()));
      if (fresh) {
        QWEN36_CHECK(pairs.size() < ByteDfa::kMaxStates, "too complex (more than {} automaton states)",
                     ByteDfa::kMaxStates);
        pairs.emplace_back(x, y);
      }
      return it->second;
    };
    id_of(a.empty() ? ByteDfa::kDead : ByteDfa::start(), b.empty() ? ByteDfa::kDead : ByteDfa::start());
    for (size_t s = 0; s < pairs.size(); ++s) {
      const auto [x, y] = pairs[s];
      for (uint8_t r : rep)
        next.push_back(id_of(x == ByteDfa::kDead ? x : a.next(x, r), y == ByteDfa::kDead ? y : b.next(y, r)));
    }
    std::vector<bool> accepting(pairs.size());
    for (size_t s = 0; s < pairs.size(); ++s) {
      const bool ax = pairs[s].first != ByteDfa::kDead && a.accepting(pairs[s].first);
      const bool by = pairs[s].second != ByteDfa::kDead && b.accepting(pairs[s].second);
      accepting[s] = both ? ax && by : ax || by;
    }
    return trimmed(std::move(d), next, accepting);
  }
};

ByteDfa ByteDfa::intersect(const ByteDfa& a, const ByteDfa& b) { return DfaBuilder::product(a, b, true); }
ByteDfa ByteDfa::unite(const ByteDfa& a, const ByteDfa& b) { return DfaBuilder::product(a, b, false); }

ByteDfa ByteDfa::compile(std::string_view pattern, RegexMode mode) {
  return with_context(fmt::format("regex '{}'", pattern.substr(0, 80)), [&] {
    Parser parser(pattern);
    const uint32_t root = parser.parse(mode);
    Nfa nfa;
    const auto [start, accept] = nfa.build(parser.nodes, root);
    ByteDfa d = DfaBuilder{nfa, accept, {}, 0}.build(start);
    QWEN36_CHECK(!d.empty(), "it matches nothing");
    return d;
  });
}

ByteDfa ByteDfa::character(const CodePointRanges& set) {
  const std::vector<Node> nodes = {{Node::kSet, set, {}}};
  Nfa nfa;
  const auto [start, accept] = nfa.build(nodes, 0);
  ByteDfa d = DfaBuilder{nfa, accept, {}, 0}.build(start);
  QWEN36_CHECK(!d.empty(), "a character class matches nothing");
  return d;
}

ByteDfa ByteDfa::avoiding(std::string_view s) {
  QWEN36_CHECK(!s.empty() && s.size() < kMaxStates, "avoiding: the text must have 1 to {} bytes", kMaxStates - 1);
  // State k: the longest suffix of the bytes so far that is a prefix of s has k bytes (k < |s|).
  // The next state after byte c is computed as a string search would (the prefix function).
  ByteDfa d;
  std::array<bool, 257> cut{};
  for (char c : s) cut[uint8_t(c)] = cut[uint8_t(c) + 1] = true;
  uint16_t cls = 0;
  std::vector<uint8_t> rep = {0};
  for (int b = 0; b < 256; ++b) {
    if (b > 0 && cut[size_t(b)]) ++cls, rep.push_back(uint8_t(b));
    d.class_of_[size_t(b)] = uint8_t(cls);
  }
  d.classes_ = uint16_t(cls + 1);
  const size_t n = s.size();
  std::vector<size_t> fail(n, 0);  // prefix function of s
  for (size_t i = 1, k = 0; i < n; ++i) {
    while (k > 0 && s[i] != s[k]) k = fail[k - 1];
    if (s[i] == s[k]) ++k;
    fail[i] = k;
  }
  std::vector<uint32_t> next;
  for (size_t k = 0; k < n; ++k) {
    for (uint8_t c : rep) {
      size_t j = k;
      while (j > 0 && uint8_t(s[j]) != c) j = fail[j - 1];
      if (uint8_t(s[j]) == c) ++j;
      next.push_back(j == n ? UINT32_MAX : uint32_t(j));  // the whole of s: refused
    }
  }
  return DfaBuilder::trimmed(std::move(d), next, std::vector<bool>(n, true));
}

bool ByteDfa::continues_with(uint16_t state, uint32_t lo, uint32_t hi) const {
  for (uint32_t cp = lo; cp <= hi; ++cp) {
    uint8_t b[4];
    uint16_t s = state;
    for (int k = 0, n = encode_utf8(cp, b); k < n && s != kDead; ++k) s = next(s, b[k]);
    if (s != kDead) return true;
  }
  return false;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}/-").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace qwen36::text
