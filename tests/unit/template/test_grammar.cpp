// GBNF grammars (structured output's grammar field): the matcher against ByteDfa on random
// regular grammars written both ways, against a counter on a non-regular language (balanced
// parentheses), the GBNF syntax as llama.cpp writes it, and the compile-time checks.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "text/grammar.h"
#include "text/regex.h"

namespace qwen36::text {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> gbnf(std::string_view text) { return Grammar::parse(text); }

// Index of the first refused byte (text.size() if none); a refusal must leave the state as it was.
size_t first_refused(GrammarMatcher& m, std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const GrammarMatcher before = m;
    if (m.feed(uint8_t(text[i]))) continue;
    EXPECT_TRUE(m == before) << "state changed by a refused byte at " << i << " of " << text;
    return i;
  }
  return text.size();
}

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return first_refused(m, text) == text.size() && m.complete();
}

std::string error_of_with(std::string_view text, std::vector<Grammar::Embedded> values) {
  try {
    Grammar::parse(text, std::move(values));
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}
std::string error_of(std::string_view text) { return error_of_with(text, {}); }

TEST(Grammar, LlamaCppStyleJson) {
  const auto g = gbnf(R"(# JSON, as llama.cpp's grammars/json.gbnf writes it
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
)");
  EXPECT_TRUE(accepts(g, R"({"a": [1, -2.5e+3, "x\"y\u00e9", true, null], "b": {}})"));
  EXPECT_TRUE(accepts(g, "{\"caf\xC3\xA9\": \"\xE4\xB8\xAD\"}"));
  EXPECT_TRUE(accepts(g, "{\n  \"k\": 1\n}"));
  GrammarMatcher m(g);
  EXPECT_EQ(first_refused(m, R"({"a": tru})"), 9u);
  EXPECT_EQ(first_refused(m = GrammarMatcher(g), R"([1])"), 0u) << "root is an object";
  EXPECT_EQ(first_refused(m = GrammarMatcher(g), "{\"a\x01"), 3u) << "control bytes are escaped";
  GrammarMatcher done(g);
  ASSERT_EQ(first_refused(done, "{}"), 2u);
  EXPECT_TRUE(done.complete());
  EXPECT_FALSE(done.finished()) << "whitespace may follow";
}

TEST(Grammar, BalancedParenthesesAgainstACounter) {
  const auto g = gbnf(R"g(root ::= "(" root ")" root | "")g");
  std::mt19937 rng(3);
  for (int t = 0; t < 2000; ++t) {
    std::string s;
    for (int n = int(rng() % 12); n > 0; --n) s += "()"[rng() % 2];
    size_t refused = s.size();
    int depth = 0;
    for (size_t i = 0; i < s.size(); ++i)
      if ((depth += s[i] == '(' ? 1 : -1) < 0) {
        refused = i;
        break;
      }
    GrammarMatcher m(g);
    ASSERT_EQ(first_refused(m, s), refused) << s;
    if (refused == s.size()) {
      EXPECT_EQ(m.complete(), depth == 0) << s;
    }
  }
}

// A random regular expression over {a, b, c}, written as a regex and as GBNF.
struct Both {
  std::string regex, gbnf;
};

Both random_expr(std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return int(rng() % unsigned(n)); };
  if (depth <= 0 || pick(4) == 0) {
    static const Both kAtoms[] = {{"a", "\"a\""}, {"b", "\"b\""}, {"[ab]", "[ab]"}, {"[^a]", "[^a]"},
                                  {"c", "\"c\""}, {"(?:ab)", "\"ab\""}, {".", "."}};
    return kAtoms[pick(7)];
  }
  const Both x = random_expr(rng, depth - 1), y = random_expr(rng, depth - 1);
  switch (pick(3)) {
    case 0: return {x.regex + y.regex, x.gbnf + " " + y.gbnf};
    case 1: return {"(?:" + x.regex + "|" + y.regex + ")", "(" + x.gbnf + " | " + y.gbnf + ")"};
    default: {
      static const char* kQuant[] = {"*", "+", "?", "{2}", "{1,3}", "{0,2}", "{2,}"};
      const char* q = kQuant[pick(7)];
      return {"(?:" + x.regex + ")" + q, "(" + x.gbnf + ")" + q};
    }
  }
}

TEST(Grammar, AgreesWithRegexAutomata) {
  std::mt19937 rng(9);
  int accepted = 0, checked = 0, ambiguous = 0;
  for (int p = 0; p < 200; ++p) {
    const Both e = random_expr(rng, 4);
    ByteDfa d;
    try {
      d = ByteDfa::compile(e.regex, RegexMode::Full);
    } catch (const Error&) {
      continue;  // too complex for the automaton: nothing to compare with
    }
    const auto g = gbnf("root ::= " + e.gbnf);
    for (int t = 0; t < 50; ++t) {
      std::string s;
      for (int n = int(rng() % 8); n > 0; --n) s += "abc"[rng() % 3];
      // The regex automaton is trimmed: its first dead byte is where no completion exists.
      size_t want = s.size();
      uint16_t st = ByteDfa::start();
      for (size_t i = 0; i < s.size(); ++i)
        if ((st = d.next(st, uint8_t(s[i]))) == ByteDfa::kDead) {
          want = i;
          break;
        }
      GrammarMatcher m(g);
      size_t refused;
      try {
        refused = first_refused(m, s);
      } catch (const Error& err) {  // nested repetitions of nullable parts multiply the parses
        ASSERT_NE(std::string(err.what()).find("too ambiguous"), std::string::npos) << err.what();
        ++ambiguous;
        continue;
      }
      ASSERT_EQ(refused, want) << e.regex << " | " << e.gbnf << " on " << s;
      if (want == s.size()) {
        ASSERT_EQ(m.complete(), d.accepting(st)) << e.regex << " on " << s;
        accepted += m.complete();
      }
      ++checked;
    }
  }
  EXPECT_GT(accepted, checked / 20);
  EXPECT_LT(ambiguous, checked / 20) << "texts whose parses outnumber GrammarMatcher::kMaxParses";
}

TEST(Grammar, Syntax) {
  // '|' may open the next line; comments anywhere; escapes; UTF-8 classes; '.' is any character.
  const auto g = gbnf("root ::= \"x\" item{1,2}  # items\n"
                      "       | \"\\u00e9\" [\xC3\xA0-\xC3\xBF]+ .\n"
                      "item ::= [0-9] \"\\n\"\n");
  EXPECT_TRUE(accepts(g, "x1\n"));
  EXPECT_TRUE(accepts(g, "x1\n2\n"));
  EXPECT_FALSE(accepts(g, "x1\n2\n3\n"));
  EXPECT_TRUE(accepts(g, "\xC3\xA9\xC3\xA0\xC3\xBF\xE4\xB8\xAD"));
  EXPECT_FALSE(accepts(g, "\xC3\xA9\xC3\xA0"));
  // Right recursion runs in constant stack: a long repetition stays one parse.
  const auto star = gbnf("root ::= [a-z]* \".\"");
  GrammarMatcher m(star);
  EXPECT_EQ(first_refused(m, std::string(5000, 'q') + "."), 5001u);
  EXPECT_TRUE(m.complete() && m.finished());
}

TEST(Grammar, ErrorsNameTheProblem) {
  EXPECT_EQ(error_of("start ::= \"a\""), "grammar: no 'root' rule (where a sentence starts)");
  EXPECT_EQ(error_of("root ::= item"), "grammar: rule 'item' is used but not defined");
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("left recursion through rule 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= x\nx ::= y? x \"a\" | \"b\"\ny ::= \"c\"").find("left recursion"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\" root").find("matches no finite text"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "grammar, line 2 column 13: rule 'root' is defined twice");
  EXPECT_EQ(error_of("root ::= \"a\\q\""), "grammar, line 1 column 12: unknown escape '\\q'");
  EXPECT_NE(error_of("root ::= \"abc").find("unterminated string literal"), std::string::npos);
  EXPECT_NE(error_of("root ::= <[1000]>").find("token references"), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error_of("root := \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,2}").find("m > n"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"").find("expected ')'"), std::string::npos);
  // Alternatives that never end are dropped, and the rest still works.
  const auto g = gbnf("root ::= \"a\" | \"b\" loop\nloop ::= \"c\" loop");
  EXPECT_TRUE(accepts(g, "a"));
  GrammarMatcher m(g);
  EXPECT_EQ(first_refused(m, "b"), 0u) << "'b' leads only into a rule that never ends";
}

// Values the engine embeds (%N): a JSON document of a schema, or raw text an automaton matches.
TEST(Grammar, EmbeddedValues) {
  const auto word = std::make_shared<const ByteDfa>(ByteDfa::compile("[a-z]*", RegexMode::Full));
  const auto g = Grammar::parse(R"(root ::= "<" %0 ">" %1)",
                                {{nullptr, word}, {JsonSchema::compile(Json::parse(R"({"type": "integer"})")), nullptr}});
  EXPECT_TRUE(accepts(g, "<abc>12"));
  EXPECT_TRUE(accepts(g, "<>-3"));
  GrammarMatcher m(g);
  EXPECT_EQ(first_refused(m, "<a1"), 2u);
  GrammarMatcher n(g);
  ASSERT_EQ(first_refused(n, "<>12"), 4u);
  EXPECT_TRUE(n.complete());
  EXPECT_FALSE(n.finished()) << "more digits may follow";
  // A text that may be empty counts as such for left recursion.
  EXPECT_NE(error_of_with("root ::= %0 root \"x\" | \"y\"", {{nullptr, word}}).find("left recursion"), std::string::npos);
  EXPECT_EQ(error_of_with("root ::= %0 \"x\" root | \"y\"", {{nullptr, word}}), "no error");
  EXPECT_NE(error_of_with("root ::= %1", {{nullptr, word}}).find("embedded value"), std::string::npos);
}

TEST(Grammar, TooAmbiguousIsAnError) {
  std::string text = "root ::= \"z\" (x0";
  for (int k = 1; k < 80; ++k) text += " | x" + std::to_string(k);
  text += ")";
  for (int k = 0; k < 80; ++k) text += "\nx" + std::to_string(k) + " ::= \"a\" \"" + std::string(size_t(k + 1), 'b') + "\"";
  const auto g = gbnf(text);  // 80 rules starting with "a": after "z", 80 parses alive
  GrammarMatcher m(g);
  EXPECT_THROW(m.feed(uint8_t('z')), Error);
}

}  // namespace
}  // namespace qwen36::text
