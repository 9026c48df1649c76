// TokenConstraint (structured output's masks): every mask equals the brute-force answer (each
// token's bytes fed to a copy of the matcher) in every state a document passes through, for
// free strings, keys, numbers, enums and closing states; stop ids only once the document is
// whole; the start token; apply_after along a path; the trie over random vocabularies.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/token_constraint.h"

namespace qwen36 {
namespace {

using text::JsonMatcher;
using text::JsonSchema;
using Json = nlohmann::ordered_json;

OutputConstraint document(std::shared_ptr<const JsonSchema> schema, int32_t start_after) {
  OutputConstraint c;
  c.schema = std::move(schema);
  if (start_after >= 0) c.start_after = {start_after};
  return c;
}

// A vocabulary of JSON pieces, single bytes (quotes, backslashes, control bytes among them),
// random byte strings, duplicates and empty (never admitted) entries.
std::vector<std::string> test_vocab(uint32_t seed) {
  std::vector<std::string> v = {"{",    "}",   "[",     "]",      ",",    ":",   "\"",    "\\",   "{\"",  "\":",
                                "\",",  "\"}", ",\"",   "true",   "fal",  "se",  "null",  "\"a\"", "a",   "b",
                                "name", "age", "\"name", "\":\"", "12",   "3.5", "-",     "e+",   "\\n",  "\\u00",
                                "e9",   " ",   "\n  ",  "\"\"",   "x\"",  "",    "tags",  "\":[",  "]}",   "\"a\",\"b"};
  for (int c = 1; c < 128; ++c) v.push_back(std::string(1, char(c)));
  v.push_back("{");  // a duplicate of token 0's bytes
  std::mt19937 rng(seed);
  const std::string alphabet = "{}[],:\"\\ab01.-e \n";
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int len = 1 + int(rng() % 6);
    for (int j = 0; j < len; ++j) s += alphabet[rng() % alphabet.size()];
    v.push_back(s);
  }
  return v;
}

// The mask by definition: token t may come next iff its bytes all feed (or it is a stop id of
// a whole document); empty tokens never.
template <class Matcher>
std::vector<bool> brute_mask(const Matcher& m, const std::vector<std::string>& vocab, int32_t stop) {
  std::vector<bool> ok(vocab.size());
  for (size_t t = 0; t < vocab.size(); ++t) {
    if (int32_t(t) == stop) {
      ok[t] = m.complete();
      continue;
    }
    Matcher c = m;
    ok[t] = !vocab[t].empty() && c.feed(vocab[t]);
  }
  return ok;
}

std::vector<bool> constraint_mask(TokenConstraint& c, size_t n) {
  std::vector<float> logits(n + 3, 0.0f);  // wider than the vocabulary: the extra ids are refused
  const int64_t kept = c.apply(logits);
  std::vector<bool> ok(n);
  int64_t count = 0;
  for (size_t i = 0; i < n; ++i) count += (ok[i] = std::isfinite(logits[i]));
  for (size_t i = n; i < logits.size(); ++i) EXPECT_TRUE(std::isinf(logits[i])) << "id " << i << " past the vocabulary";
  EXPECT_EQ(kept, count);
  return ok;
}

// Feeds `doc` byte by byte through single-byte tokens, comparing the mask with the brute
// force before every byte and at the end.
template <class Matcher>
void check_text(const OutputConstraint& oc, Matcher ref, const std::string& doc, uint32_t seed) {
  std::vector<std::string> vocab = test_vocab(seed);
  const int32_t stop = int32_t(vocab.size());
  vocab.push_back("");  // the stop token: no bytes
  auto trie = std::make_shared<const TokenTrie>(vocab);
  TokenConstraint c(trie, oc, {stop});
  for (size_t i = 0; i <= doc.size(); ++i) {
    ASSERT_EQ(constraint_mask(c, vocab.size()), brute_mask(ref, vocab, stop)) << doc << " before byte " << i;
    if (i == doc.size()) break;
    const int32_t byte_token = 40 + (uint8_t(doc[i]) - 1);  // the single-byte entries start at 40
    ASSERT_EQ(vocab[size_t(byte_token)], doc.substr(i, 1));
    ASSERT_TRUE(c.accept(byte_token)) << doc << " byte " << i;
    ASSERT_TRUE(ref.feed(uint8_t(doc[i])));
  }
  EXPECT_TRUE(c.accept(stop)) << "a whole document takes its stop id";
}

void check_document(const std::shared_ptr<const JsonSchema>& schema, const std::string& doc, uint32_t seed) {
  check_text(document(schema, -1), JsonMatcher(schema), doc, seed);
}

TEST(TokenConstraintTest, MasksEqualBruteForceThroughDocuments) {
  check_document(JsonSchema::any_value(), R"({"a": [1, -2.5e+3, "x\"y\\n\u00e9", true, null], "b": {}})", 1);
  check_document(JsonSchema::any_object(), R"({"name":"ab","tags":["a","b"],"n":12})", 2);
  const auto person = JsonSchema::compile(Json::parse(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "ab"]}}, "ok": {"type": "boolean"}},
    "required": ["name", "age"]})"));
  check_document(person, R"({"name": "x\"\\", "age": 12, "tags": ["ab", "a"], "ok": false})", 3);
  check_document(person, R"({"name":"","age":-0})", 4);
  check_document(JsonSchema::compile(Json::parse(R"({"enum": [1, 10, "a", "ab", null]})")), "10", 5);
  check_document(JsonSchema::compile(Json::parse(R"({"type": "array", "items": {"type": "string", "maxLength": 2}})")),
                 R"(["ab", "", "\n"])", 6);
  const auto patterned = JsonSchema::compile(Json::parse(R"({"type": "object", "properties": {
    "id": {"type": "string", "pattern": "^[ab]+\\d?$"}, "day": {"type": "string", "format": "date"}}})"));
  check_document(patterned, R"({"id": "a\u00621", "day": "2026-12-05"})", 7);
  check_document(JsonSchema::text_matching("(ab|a\"b)+[0-9]{1,3}"), "a\"bab12", 8);
  // A grammar: its own matcher is the reference.
  const auto grammar = text::Grammar::parse(R"(root ::= "{" ws pair ("," ws pair)* ws "}"
pair ::= "\"" [a-z]+ "\":" ws (num | "null" | "[" (num ("," num)*)? "]")
num ::= "-"? [0-9]+
ws ::= " "?)");
  OutputConstraint oc;
  oc.grammar = grammar;
  check_text(oc, text::GrammarMatcher(grammar), R"({ "ab": -12, "b":[1,2],"x": null })", 9);
}

TEST(TokenConstraintTest, StopOnlyWhenWholeAndFinishedAfterTheLastByte) {
  const std::vector<std::string> vocab = {"{", "}", "{}", "\"", ""};
  auto trie = std::make_shared<const TokenTrie>(vocab);
  TokenConstraint c(trie, document(JsonSchema::any_object(), -1), {4});
  std::vector<float> logits(5, 1.0f);
  EXPECT_EQ(c.apply(logits), 2);  // "{" and "{}"
  EXPECT_TRUE(std::isinf(logits[4])) << "no stop before the document";
  EXPECT_FALSE(c.accept(1)) << "'}' cannot start an object";
  EXPECT_TRUE(c.accept(2));
  EXPECT_TRUE(c.finished());
  logits.assign(5, 1.0f);
  EXPECT_EQ(c.apply(logits), 1);
  EXPECT_TRUE(std::isfinite(logits[4])) << "only the stop after a whole document";
}

TEST(TokenConstraintTest, StartsAfterItsTokenAndAppliesAlongAPath) {
  const std::vector<std::string> vocab = {"<think>", "</think>", "{", "}", "x", "\"", ""};
  std::vector<std::string> bytes = vocab;
  bytes[0] = bytes[1] = "";  // added tokens: never inside the document
  auto trie = std::make_shared<const TokenTrie>(bytes);
  TokenConstraint c(trie, document(JsonSchema::any_object(), 1), {6});
  std::vector<float> logits(7, 1.0f);
  EXPECT_FALSE(c.active());
  EXPECT_EQ(c.apply(logits), 7) << "reasoning is free";
  EXPECT_TRUE(c.accept(4));
  std::vector<float> row(7, 1.0f);
  ASSERT_TRUE(c.apply_after(std::vector<int32_t>{1, 2}, row));  // </think> then "{": a key or "}" next
  EXPECT_EQ(std::vector<bool>({!std::isinf(row[3]), !std::isinf(row[5]), !std::isinf(row[2])}),
            std::vector<bool>({true, true, false}));
  EXPECT_FALSE(c.apply_after(std::vector<int32_t>{1, 3}, row)) << "'}' cannot start the document";
  EXPECT_FALSE(c.active()) << "apply_after changes nothing";
  EXPECT_TRUE(c.accept(1));
  EXPECT_TRUE(c.active());
  logits.assign(7, 1.0f);
  EXPECT_EQ(c.apply(logits), 1);
  EXPECT_TRUE(std::isfinite(logits[2]));

  // Two start tokens in order (</think>, then a call's opening token: here <think> stands in).
  OutputConstraint two = document(JsonSchema::any_object(), -1);
  two.start_after = {1, 0};
  TokenConstraint d(trie, two, {6});
  EXPECT_TRUE(d.accept(0)) << "the second start token before the first: still free";
  EXPECT_FALSE(d.active());
  std::vector<float> free_row(7, 1.0f);
  ASSERT_TRUE(d.apply_after(std::vector<int32_t>{1, 4}, free_row));
  EXPECT_EQ(std::count_if(free_row.begin(), free_row.end(), [](float v) { return std::isfinite(v); }), 7);
  ASSERT_TRUE(d.apply_after(std::vector<int32_t>{1, 4, 0}, free_row));
  EXPECT_TRUE(std::isinf(free_row[3]) && std::isfinite(free_row[2])) << "masked after both";
  EXPECT_TRUE(d.accept(1));
  EXPECT_FALSE(d.active());
  EXPECT_TRUE(d.accept(0));
  EXPECT_TRUE(d.active());
}

// A forced beginning (tool_choice): one of the alternatives token by token, then free; none
// needs a trie.
TEST(TokenConstraintTest, ForcedBeginningThenFree) {
  OutputConstraint oc;
  oc.forced = {{7, 1, 2}, {7, 1, 2, 3}, {7, 4}};
  TokenConstraint c(nullptr, oc, {});
  auto allowed = [&](TokenConstraint& k) {
    std::vector<float> logits(10, 0.5f);
    k.apply(logits);
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 10; ++i)
      if (std::isfinite(logits[size_t(i)])) ids.push_back(i);
    return ids;
  };
  EXPECT_EQ(allowed(c), std::vector<int32_t>{7});
  std::vector<float> row(10, 0.5f);
  ASSERT_TRUE(c.apply_after(std::vector<int32_t>{7}, row));
  EXPECT_TRUE(std::isfinite(row[1]) && std::isfinite(row[4]) && std::isinf(row[7]));
  EXPECT_FALSE(c.apply_after(std::vector<int32_t>{7, 2}, row)) << "2 follows no 7 in the alternatives";
  EXPECT_FALSE(c.accept(1));
  TokenConstraint d(nullptr, oc, {});
  ASSERT_TRUE(d.accept(7) && d.accept(1));
  EXPECT_EQ(allowed(d), std::vector<int32_t>{2});
  ASSERT_TRUE(d.accept(2));
  EXPECT_FALSE(d.masks()) << "{7, 1, 2} is whole: the rest is free";
  EXPECT_EQ(allowed(d).size(), 10u);
  EXPECT_TRUE(d.accept(9));
  EXPECT_FALSE(d.finished()) << "a forced beginning never ends the request";
}

TEST(TokenConstraintTest, FreeStringAdmitsEveryPlainTokenOnce) {
  // Inside a free string every non-empty token of plain bytes stays (duplicates and tokens that
  // are prefixes of each other included), and the quote that closes it.
  const std::vector<std::string> vocab = {"ab", "a", "abc", "", "b", "ab", "abd", "c", "\""};
  auto trie = std::make_shared<const TokenTrie>(vocab);
  EXPECT_EQ(trie->max_token_bytes(), 3u);
  EXPECT_EQ(trie->all().token_ids.size(), 8u);
  EXPECT_EQ(trie->string_breakers().token_ids, std::vector<int32_t>{8});
  TokenConstraint c(trie, document(JsonSchema::any_value(), -1), {});
  std::vector<float> logits(9, 0.0f);
  EXPECT_EQ(c.apply(logits), 1) << "only the quote starts a string value";
  ASSERT_TRUE(c.accept(8));
  logits.assign(9, 0.0f);
  EXPECT_EQ(c.apply(logits), 8);
  EXPECT_TRUE(std::isinf(logits[3]));
}

}  // namespace
}  // namespace qwen36
