// ByteDfa: regular expressions over UTF-8 bytes for structured output. Checked against
// std::regex (ECMAScript) on random patterns, exhaustively over code points for classes, and
// for the property masks rely on: every state the automaton can be in still reaches a match.
#include <gtest/gtest.h>

#include <queue>
#include <random>
#include <regex>

#include "core/error.h"
#include "text/regex.h"

namespace qwen36::text {
namespace {

bool matches(const ByteDfa& d, std::string_view text) {
  uint16_t s = ByteDfa::start();
  for (char c : text) {
    s = d.next(s, uint8_t(c));
    if (s == ByteDfa::kDead) return false;
  }
  return d.accepting(s);
}

bool full(std::string_view pattern, std::string_view text) {
  return matches(ByteDfa::compile(pattern, RegexMode::Full), text);
}
bool search(std::string_view pattern, std::string_view text) {
  return matches(ByteDfa::compile(pattern, RegexMode::Search), text);
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | cp >> 6), s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | cp >> 12), s += char(0x80 | (cp >> 6 & 0x3F)), s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | cp >> 18), s += char(0x80 | (cp >> 12 & 0x3F)), s += char(0x80 | (cp >> 6 & 0x3F)),
        s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

TEST(Regex, Basics) {
  EXPECT_TRUE(full("abc", "abc"));
  EXPECT_FALSE(full("abc", "abcd"));
  EXPECT_FALSE(full("abc", "ab"));
  EXPECT_TRUE(full("a|bc|", ""));
  EXPECT_TRUE(full("(ab)*c", "ababc"));
  EXPECT_TRUE(full("a{2,3}", "aaa"));
  EXPECT_FALSE(full("a{2,3}", "aaaa"));
  EXPECT_FALSE(full("a{2,3}", "a"));
  EXPECT_TRUE(full("a{2,}", "aaaaaa"));
  EXPECT_TRUE(full("a{,2}", ""));
  EXPECT_TRUE(full("a{2}", "aa"));
  EXPECT_TRUE(full("x{", "x{"));          // not a quantifier: literal
  EXPECT_TRUE(full("x{1,a}", "x{1,a}"));  // likewise
  EXPECT_TRUE(full("\\d{3}-\\d{4}", "555-1234"));
  EXPECT_FALSE(full("\\d{3}-\\d{4}", "555-123a"));
  EXPECT_TRUE(full("[A-Z][a-z]+", "Hello"));
  EXPECT_TRUE(full("[^a-z]+", "ABC 123"));
  EXPECT_FALSE(full("[^a-z]+", "ABc"));
  EXPECT_TRUE(full("[]a]", "]"));  // ']' first in a class is itself
  EXPECT_TRUE(full("[a-]", "-"));
  EXPECT_TRUE(full("[\\d.]+", "3.14"));
  EXPECT_TRUE(full("[\\b]", "\b"));
  EXPECT_TRUE(full("\\.\\*\\(\\)", ".*()"));
  EXPECT_TRUE(full("\\x41\\u00e9\\n", "A\xC3\xA9\n"));
  EXPECT_TRUE(full(".", "\xE4\xB8\xAD"));   // one code point, three bytes
  EXPECT_FALSE(full(".", "\n"));
  EXPECT_FALSE(full(".", "\xE4\xB8"));      // a truncated sequence is not a character
  EXPECT_TRUE(full("(?:a|b)(?<x>c)(?P<y>d)", "acd"));
  EXPECT_TRUE(full("a+?b??c*?", "aab"));    // lazy quantifiers: same language
  EXPECT_TRUE(full("^ab$", "ab"));
  EXPECT_TRUE(full("^a|b$", "b"));
  EXPECT_TRUE(full("\\^\\$", "^$"));
  EXPECT_TRUE(full("\xC3\xA9+", "\xC3\xA9\xC3\xA9"));  // a literal UTF-8 character repeated whole
  EXPECT_FALSE(full("\xC3\xA9+", "\xC3\xA9\xA9"));
}

TEST(Regex, SearchMode) {
  EXPECT_TRUE(search("abc", "xxabcxx"));
  EXPECT_FALSE(search("abc", "xxabxcx"));
  EXPECT_TRUE(search("^abc", "abcxx"));
  EXPECT_FALSE(search("^abc", "xabc"));
  EXPECT_TRUE(search("abc$", "xxabc"));
  EXPECT_FALSE(search("abc$", "abcx"));
  EXPECT_TRUE(search("^[0-9]{4}-[0-9]{2}$", "2026-12"));
  EXPECT_FALSE(search("^[0-9]{4}-[0-9]{2}$", "2026-123"));
  EXPECT_TRUE(search("^a|b$", "axx"));
  EXPECT_TRUE(search("^a|b$", "xxb"));
  EXPECT_FALSE(search("^a|b$", "xbx"));
  EXPECT_TRUE(search("", "anything\nat all"));
  EXPECT_TRUE(search("x", "line one\nx"));  // around a match: any character, newlines too
}

TEST(Regex, ErrorsNameTheProblem) {
  auto error_of = [](std::string_view p) {
    try {
      ByteDfa::compile(p, RegexMode::Full);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(error_of("a(?=b)").find("lookahead"), std::string::npos);
  EXPECT_NE(error_of("a(?<=b)").find("lookbehind"), std::string::npos);
  EXPECT_NE(error_of("(?i)a").find("inline flags"), std::string::npos);
  EXPECT_NE(error_of("\\bword").find("word boundaries"), std::string::npos);
  EXPECT_NE(error_of("a(b").find("missing ')'"), std::string::npos);
  EXPECT_NE(error_of("a)b").find("unbalanced"), std::string::npos);
  EXPECT_NE(error_of("*a").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error_of("a**").find("quantifier"), std::string::npos);
  EXPECT_NE(error_of("a{3,2}").find("n > m"), std::string::npos);
  EXPECT_NE(error_of("a{5000}").find("above 1000"), std::string::npos);
  EXPECT_NE(error_of("[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("[abc").find("missing ']'"), std::string::npos);
  EXPECT_NE(error_of("a^b").find("'^'"), std::string::npos);
  EXPECT_NE(error_of("(a$)").find("'$'"), std::string::npos);
  EXPECT_NE(error_of("\\q").find("unknown escape"), std::string::npos);
  EXPECT_NE(error_of("\\p{L}").find("property"), std::string::npos);
  EXPECT_NE(error_of("a\\").find("trailing backslash"), std::string::npos);
  EXPECT_NE(error_of("[^\\s\\S]").find("matches nothing"), std::string::npos);
  EXPECT_NE(error_of("\xFF").find("UTF-8"), std::string::npos);
  // The classic exponential automaton: the 21st symbol from the end.
  EXPECT_NE(error_of("[ab]*a[ab]{20}").find("too complex"), std::string::npos);
  EXPECT_EQ(error_of("[ab]*a[ab]{8}"), "no error");
  EXPECT_NE(error_of("(a").find("regex '(a'"), std::string::npos);  // the pattern is named
}

// A class over code points: every code point (surrogates excluded) is tested against the set.
TEST(Regex, ClassesCoverExactlyTheirCodePoints) {
  struct Case {
    const char* pattern;
    bool (*in)(uint32_t);
  };
  const Case cases[] = {
      {"[\\u00e9-\\u4e2d]", [](uint32_t c) { return c >= 0xE9 && c <= 0x4E2D; }},
      {"[^a-z\\u0800-\\uffff]", [](uint32_t c) { return !(c >= 'a' && c <= 'z') && !(c >= 0x800 && c <= 0xFFFF); }},
      {"[\\u07ff\\u0800\\uffff]", [](uint32_t c) { return c == 0x7FF || c == 0x800 || c == 0xFFFF; }},
      {".", [](uint32_t c) { return c != '\n'; }},
  };
  for (const Case& k : cases) {
    const ByteDfa d = ByteDfa::compile(k.pattern, RegexMode::Full);
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      ASSERT_EQ(matches(d, utf8(cp)), k.in(cp)) << k.pattern << " at U+" << std::hex << cp;
    }
    EXPECT_FALSE(matches(d, "\xED\xA0\x80")) << k.pattern << ": a surrogate's bytes";
    EXPECT_FALSE(matches(d, "\xC0\x80")) << k.pattern << ": an overlong encoding";
  }
}

// From every state reachable from the start, a match is reachable: masks never strand a request.
void expect_trimmed(const ByteDfa& d, std::string_view pattern) {
  for (uint16_t s = 0; s < d.states(); ++s) {
    std::vector<bool> seen(d.states());
    std::queue<uint16_t> q;
    q.push(s);
    seen[s] = true;
    bool found = false;
    while (!q.empty() && !found) {
      const uint16_t t = q.front();
      q.pop();
      found = d.accepting(t);
      for (int b = 0; b < 256; ++b)
        if (const uint16_t u = d.next(t, uint8_t(b)); u != ByteDfa::kDead && !seen[u]) seen[u] = true, q.push(u);
    }
    EXPECT_TRUE(found) << pattern << ": state " << s << " reaches no match";
    bool any = false;
    for (int b = 0; b < 256; ++b) any |= d.next(s, uint8_t(b)) != ByteDfa::kDead;
    EXPECT_EQ(any, d.extendable(s));
  }
}

// A random pattern over {a, b, c} from the syntax std::regex and ByteDfa share.
std::string random_pattern(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return int(rng() % unsigned(n)); };
  if (depth <= 0 || pick(4) == 0) {
    static const char* kAtoms[] = {"a", "b", "c", ".", "[ab]", "[^a]", "[a-c]", "\\w", "[^\\d]"};
    return kAtoms[pick(9)];
  }
  switch (pick(4)) {
    case 0: return random_pattern(rng, depth - 1) + random_pattern(rng, depth - 1);
    case 1: return "(" + random_pattern(rng, depth - 1) + "|" + random_pattern(rng, depth - 1) + ")";
    case 2: {
      static const char* kQuant[] = {"*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"};
      return "(?:" + random_pattern(rng, depth - 1) + ")" + kQuant[pick(7)];
    }
    default: return random_pattern(rng, depth - 1) + random_pattern(rng, depth - 1) + random_pattern(rng, depth - 1);
  }
}

TEST(Regex, AgreesWithStdRegexOnRandomPatterns) {
  std::mt19937 rng(2026);
  int checked = 0, matched = 0, too_complex = 0;
  for (int p = 0; p < 300; ++p) {
    const std::string pattern = random_pattern(rng, 4);
    const std::regex ref(pattern, std::regex::ECMAScript);
    ByteDfa full_dfa, search_dfa;
    try {
      full_dfa = ByteDfa::compile(pattern, RegexMode::Full);
      search_dfa = ByteDfa::compile(pattern, RegexMode::Search);
    } catch (const Error& e) {  // long patterns of '.' and negated classes: see the bound below
      ASSERT_NE(std::string(e.what()).find("too complex"), std::string::npos) << e.what();
      ++too_complex;
      continue;
    }
    expect_trimmed(full_dfa, pattern);
    for (int t = 0; t < 60; ++t) {
      std::string text;
      for (int n = int(rng() % 9); n > 0; --n) text += "abc"[rng() % 3];
      const bool want = std::regex_match(text, ref);
      ASSERT_EQ(matches(full_dfa, text), want) << "/" << pattern << "/ on '" << text << "'";
      ASSERT_EQ(matches(search_dfa, text), std::regex_search(text, ref)) << "search /" << pattern << "/ on '" << text << "'";
      ++checked;
      matched += want;
    }
  }
  EXPECT_GT(matched, checked / 10) << "the random patterns should match a fair share of texts";
  EXPECT_LE(too_complex, 15) << "of 300 random patterns";
}

TEST(Regex, ContinuesWith) {
  const ByteDfa d = ByteDfa::compile("a\xC3\xA9|\xE4\xB8\xAD", RegexMode::Full);
  EXPECT_TRUE(d.continues_with(ByteDfa::start(), 'a', 'a'));
  EXPECT_FALSE(d.continues_with(ByteDfa::start(), 'b', 0xFF));  // '中' is above U+00FF
  const uint16_t after_a = d.next(ByteDfa::start(), 'a');
  EXPECT_TRUE(d.continues_with(after_a, 0xE0, 0xEF));
  EXPECT_FALSE(d.continues_with(after_a, 0, 0xDF));
}

// avoiding(s): any bytes without s, checked against std::string::find on random texts.
TEST(Regex, Avoiding) {
  for (std::string_view s : {"</parameter>", "aab", "aaa", "abab", "x"}) {
    const ByteDfa d = ByteDfa::avoiding(s);
    std::mt19937 rng(uint32_t(s.size()));
    for (int t = 0; t < 3000; ++t) {
      std::string text;
      for (int n = int(rng() % 16); n > 0; --n) text += std::string_view("abx</parmet>")[rng() % 12];
      if (rng() % 5 == 0) text.insert(rng() % (text.size() + 1), s);
      ASSERT_EQ(matches(d, text), text.find(s) == std::string::npos) << s << " in " << text;
    }
    expect_trimmed(d, s);
  }
}

TEST(Regex, EscapedLiteralsMatchThemselves) {
  for (const char* lit : {"a.b*c", "(x|y)", "[1-2]{3}", "\\d+$^", "price: $5?", "a/b-c", "caf\xC3\xA9"}) {
    const std::string p = regex_escape(lit);
    EXPECT_TRUE(full(p, lit)) << p;
    EXPECT_FALSE(full(p, std::string(lit) + "x")) << p;
  }
}

}  // namespace
}  // namespace qwen36::text
