// JSON-schema strings under `pattern` and `format`, and the raw-text documents of
// JsonSchema::text_matching: escapes decoded before the automaton, no dead ends after a
// backslash, lengths next to patterns, state equality for mask caching, and random strings
// checked against std::regex on their decoded characters.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "json_matcher_util.h"
#include "text/json_schema.h"

namespace qwen36::text {
namespace {

using namespace json_test;

TEST(JsonPattern, CharactersMatchThePattern) {
  const Schema s = compile(R"({"type": "string", "pattern": "^\\d{3}-\\d{4}$"})");
  EXPECT_TRUE(accepts(s, R"("555-1234")"));
  EXPECT_EQ(refused_at(s, R"("555-12345")"), 9u);
  EXPECT_EQ(refused_at(s, R"("55a")"), 3u);
  EXPECT_EQ(refused_at(s, R"("555")"), 4u) << "the closing quote needs a match";
  JsonMatcher m(s);
  ASSERT_TRUE(m.feed(std::string_view("\"5")));
  EXPECT_FALSE(m.in_free_string());

  const Schema search = compile(R"({"type": "string", "pattern": "ab"})");  // unanchored: somewhere
  EXPECT_TRUE(accepts(search, R"("xxabyy")"));
  EXPECT_TRUE(accepts(search, R"("ab")"));
  EXPECT_EQ(refused_at(search, R"("xxa")"), 4u);
}

TEST(JsonPattern, EscapesAreDecodedFirst) {
  const Schema s = compile(R"({"type": "string", "pattern": "^a\"b\\n$"})");
  EXPECT_TRUE(accepts(s, R"("a\"b\n")"));
  EXPECT_TRUE(accepts(s, R"("a\u0022b\u000a")"));
  EXPECT_TRUE(accepts(s, R"("a\u0022b\u000A")"));
  EXPECT_EQ(refused_at(s, R"("a\"b\t")"), 6u);
  EXPECT_EQ(refused_at(s, R"("a"b")"), 2u) << "a raw quote closes the string, which needs a match";

  const Schema e = compile(R"({"type": "string", "pattern": "^\u00e9$"})");  // é, U+00E9
  EXPECT_TRUE(accepts(e, "\"\xC3\xA9\""));
  EXPECT_TRUE(accepts(e, R"("\u00e9")"));
  EXPECT_EQ(refused_at(e, R"("\u00f)"), 5u) << "no character of U+00F0-U+00FF matches";
  EXPECT_EQ(refused_at(e, R"("\u0100")"), 4u) << "only \\u00XX escapes";

  // Where no character up to U+00FF can come next, the backslash itself is refused: it could
  // only lead into a dead end.
  const Schema cjk = compile(R"({"type": "string", "pattern": "^\u4e2d+$"})");
  EXPECT_TRUE(accepts(cjk, "\"\xE4\xB8\xAD\xE4\xB8\xAD\""));
  EXPECT_EQ(refused_at(cjk, R"("\)"), 1u);
  EXPECT_EQ(refused_at(cjk, "\"\xE4\xB8\""), 3u) << "half a character";
  EXPECT_EQ(refused_at(cjk, "\"\xE4\xB8\xAD\xE4\\"), 5u) << "no escape inside a character";
}

TEST(JsonPattern, LengthNextToPattern) {
  const Schema s = compile(R"({"type": "string", "pattern": "^[a-z]*$", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(accepts(s, R"("ab")"));
  EXPECT_TRUE(accepts(s, R"("a\u0062c")"));
  EXPECT_EQ(refused_at(s, R"("a")"), 2u);
  EXPECT_EQ(refused_at(s, R"("abcd")"), 4u);
  EXPECT_EQ(refused_at(s, R"("aB")"), 2u);
}

TEST(JsonPattern, Formats) {
  const Schema s = compile(R"({"type": "object", "properties": {
      "day": {"type": "string", "format": "date"},
      "at": {"type": "string", "format": "date-time"},
      "id": {"type": "string", "format": "uuid"},
      "ip": {"type": "string", "format": "ipv4"},
      "mail": {"type": "string", "format": "email"},
      "site": {"type": "string", "format": "uri"}}})");
  EXPECT_TRUE(accepts(s, R"({"day": "2026-12-05", "at": "2026-12-05T01:08:32.5+01:00",
      "id": "123e4567-e89b-12d3-a456-426614174000", "ip": "192.168.0.1", "mail": "a.b@example.com",
      "site": "not checked"})"));
  EXPECT_EQ(refused_at(s, R"({"day": "2026-13)"), 15u);
  EXPECT_EQ(refused_at(s, R"({"at": "2026-12-05 01)"), 18u);
  EXPECT_EQ(refused_at(s, R"({"at": "2026-12-05T01:08:32")"), 27u) << "RFC 3339: the offset is required";
  EXPECT_EQ(refused_at(s, R"({"ip": "256.1.1.1"})"), 10u);
  EXPECT_EQ(refused_at(s, R"({"mail": "a@b..c"})"), 14u);
  // A pattern and a format: both apply.
  const Schema both = compile(R"({"type": "string", "format": "date", "pattern": "^2026-"})");
  EXPECT_TRUE(accepts(both, R"("2026-12-05")"));
  EXPECT_EQ(refused_at(both, R"("2025)"), 4u);
  EXPECT_EQ(refused_at(both, R"("2026-13)"), 7u);
  EXPECT_NE(error_of(R"({"type": "string", "format": "date", "pattern": "^x"})").find("both 'pattern' and 'format'"),
            std::string::npos);
}

TEST(JsonPattern, EqualStatesShareMasks) {
  const Schema s = compile(R"({"type": "string", "pattern": "ab"})");
  JsonMatcher a(s), b(s);
  ASSERT_TRUE(a.feed(std::string_view("\"xx")));
  ASSERT_TRUE(b.feed(std::string_view("\"y\\u0079yy")));
  EXPECT_TRUE(a == b) << "uncounted: the automaton state is the whole state";
  EXPECT_EQ(a.hash(), b.hash());
  ASSERT_TRUE(b.feed(uint8_t('a')));
  EXPECT_FALSE(a == b);
}

TEST(JsonPattern, TextMatching) {
  const Schema s = JsonSchema::text_matching("(yes|no|maybe( not)?)");
  JsonMatcher m(s);
  EXPECT_FALSE(m.complete());
  EXPECT_EQ(first_refused(m, "yes"), 3u);
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.finished());
  EXPECT_EQ(refused_at(s, " yes"), 0u) << "raw text: no whitespace around it";
  EXPECT_EQ(refused_at(s, "nope"), 2u);
  JsonMatcher maybe(s);
  ASSERT_TRUE(maybe.feed(std::string_view("maybe")));
  EXPECT_TRUE(maybe.complete());
  EXPECT_FALSE(maybe.finished()) << "' not' may follow";
  EXPECT_THROW(JsonSchema::text_matching("(a"), Error);
}

// Random JSON strings over a small alphabet, some escaped: accepted exactly when the decoded
// characters match the pattern (std::regex_search) — and a refusal comes at the first byte that
// no completion could follow.
TEST(JsonPattern, RandomStringsAgreeWithStdRegex) {
  const char* kPattern = "^[a-c]*(ab|c\"a)[a-c\\\\]?$";
  const Schema s = JsonSchema::compile(Json{{"type", "string"}, {"pattern", kPattern}}, Whitespace::Any);
  const std::regex ref(kPattern);
  std::mt19937 rng(5);
  const char* kPieces[] = {"a", "b", "c", "\\\"", "\\\\", "\\u0061", "\\u0062", "\""};
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string doc = "\"", decoded;
    for (int n = int(rng() % 7); n > 0; --n) {
      const int k = int(rng() % 7);  // pieces 0-6: content
      doc += kPieces[k];
      decoded += "abc\"\\ab"[k];
    }
    doc += '"';
    const bool want = std::regex_search(decoded, ref);
    ASSERT_EQ(accepts(s, doc), want) << doc;
    accepted += want;
  }
  EXPECT_GT(accepted, 100);
}

}  // namespace
}  // namespace qwen36::text
