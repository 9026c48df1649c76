// BPE, pre-tokenizer, added tokens and decoding on small vocabularies built by hand, so every
// expected id can be worked out on paper. Ids 0..255 are the single bytes (id == byte value).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/bpe.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace qwen36::text {
namespace {

using Ids = std::vector<int32_t>;

// Byte-level spelling of raw bytes ("a b" -> "aĠb").
std::string sp(std::string_view raw) { return bytes_to_token_text(raw); }

TokenizerSpec byte_spec(const char* pre = "qwen2") {
  TokenizerSpec s;
  for (int b = 0; b < 256; ++b) s.tokens.push_back(sp(std::string(1, static_cast<char>(b))));
  s.pattern = pattern_for_pre(pre);
  return s;
}

// Adds merge (a, b) of raw byte strings; returns the new token's id.
int32_t merge(TokenizerSpec& s, std::string_view a, std::string_view b) {
  s.merges.emplace_back(sp(a), sp(b));
  s.tokens.push_back(sp(std::string(a) + std::string(b)));
  return static_cast<int32_t>(s.tokens.size() - 1);
}

Ids bytes_of(std::string_view s) {
  Ids ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(TokenizerSmall, ByteAlphabetRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const std::string raw(1, static_cast<char>(b));
    EXPECT_EQ(token_text_to_bytes(sp(raw)), raw) << b;
  }
  EXPECT_EQ(sp(" "), "\xC4\xA0");   // Ġ
  EXPECT_EQ(sp("\n"), "\xC4\x8A");  // Ċ
  EXPECT_EQ(sp("A!~"), "A!~");
  // Text outside the alphabet decodes as itself (added tokens with a newline, say).
  EXPECT_EQ(token_text_to_bytes("<a>\n"), "<a>\n");
}

TEST(TokenizerSmall, MergesApplyByRank) {
  TokenizerSpec s = byte_spec();
  const int32_t he = merge(s, "h", "e");
  const int32_t ll = merge(s, "l", "l");
  const int32_t hell = merge(s, "he", "ll");
  const int32_t hello = merge(s, "hell", "o");
  const Tokenizer t(s);
  EXPECT_EQ(t.encode("hello"), Ids({hello}));
  EXPECT_EQ(t.encode("hellx"), Ids({hell, 'x'}));
  EXPECT_EQ(t.encode("hex"), Ids({he, 'x'}));
  EXPECT_EQ(t.encode("xll"), Ids({'x', ll}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(TokenizerSmall, LowerRankWinsOverPosition) {
  TokenizerSpec s = byte_spec();
  const int32_t bc = merge(s, "b", "c");
  merge(s, "a", "b");
  EXPECT_EQ(Tokenizer(s).encode("abc"), Ids({'a', bc}));
  TokenizerSpec r = byte_spec();
  const int32_t ab = merge(r, "a", "b");
  merge(r, "b", "c");
  EXPECT_EQ(Tokenizer(r).encode("abc"), Ids({ab, 'c'}));
}

TEST(TokenizerSmall, EqualRanksGoLeftmostFirst) {
  TokenizerSpec s = byte_spec();
  const int32_t aa = merge(s, "a", "a");
  const Tokenizer t(s);
  EXPECT_EQ(t.encode("aaa"), Ids({aa, 'a'}));
  EXPECT_EQ(t.encode("aaaa"), Ids({aa, aa}));
  EXPECT_EQ(t.encode("aaaaa"), Ids({aa, aa, 'a'}));
  const int32_t a4 = merge(s, "aa", "aa");
  EXPECT_EQ(Tokenizer(s).encode("aaaaa"), Ids({a4, 'a'}));
}

TEST(TokenizerSmall, LongWordUsesTheSameMerges) {
  TokenizerSpec s = byte_spec();
  const int32_t aa = merge(s, "a", "a");
  const int32_t a4 = merge(s, "aa", "aa");
  const Tokenizer t(s);
  const Ids ids = t.encode(std::string(1001, 'a'));  // longer than the cache keeps
  ASSERT_EQ(ids.size(), 251u);
  for (size_t i = 0; i < 250; ++i) EXPECT_EQ(ids[i], a4);
  EXPECT_EQ(ids[250], 'a');
  EXPECT_EQ(t.encode("aaaaaa"), Ids({a4, aa}));
}

TEST(TokenizerSmall, MergesNeverCrossPreTokens) {
  TokenizerSpec s = byte_spec();
  merge(s, "o", " ");    // would join "hello" and " world" if the split were ignored
  merge(s, "1", "2");    // digits are pre-tokenised one by one
  const int32_t sw = merge(s, " ", "w");
  const Tokenizer t(s);
  EXPECT_EQ(t.encode("o world"), Ids({'o', sw, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(t.encode("123"), Ids({'1', '2', '3'}));
}

TEST(TokenizerSmall, ContractionsAreCaseInsensitive) {
  TokenizerSpec s = byte_spec();
  const int32_t qs = merge(s, "'", "S");
  const int32_t HE = merge(s, "H", "E");
  const Tokenizer t(s);
  EXPECT_EQ(t.encode("HE'S"), Ids({HE, qs}));
  // "'s" splits off the same way in lower case; here no merge joins it.
  EXPECT_EQ(t.encode("he's"), Ids({'h', 'e', '\'', 's'}));
}

TEST(TokenizerSmall, MongolianVowelSeparatorIsNotWhiteSpace) {
  // U+180E stopped being White_Space in Unicode 6.3; HF's regex engines agree, PCRE2's \s
  // does not, hence the pattern rewrite. As punctuation it joins the "!" after it.
  TokenizerSpec s = byte_spec();
  const std::string mvs = "\xE1\xA0\x8E";
  merge(s, "\xE1", "\xA0");
  merge(s, "\xE1\xA0", "\x8E");
  const int32_t joined = merge(s, mvs, "!");
  EXPECT_EQ(Tokenizer(s).encode(mvs + "!"), Ids({joined}));
}

TEST(TokenizerSmall, Qwen35PatternKeepsMarksWithLetters) {
  // x + U+0301 has no precomposed form, so NFC leaves it; the Qwen3 pattern splits the mark
  // off, the Qwen3.5 pattern keeps it with the letter.
  const std::string text = "x\xCC\x81";
  for (const char* pre : {"qwen2", "qwen35"}) {
    TokenizerSpec s = byte_spec(pre);
    merge(s, "\xCC", "\x81");
    const int32_t whole = merge(s, "x", "\xCC\x81");
    const Ids ids = Tokenizer(s).encode(text);
    if (std::string(pre) == "qwen35")
      EXPECT_EQ(ids, Ids({whole}));
    else
      EXPECT_EQ(ids, Ids({'x', whole - 1}));
  }
  EXPECT_THROW(pattern_for_pre("gpt5"), Error);
}

TEST(TokenizerSmall, NfcAppliesBeforeBpe) {
  if (!have_nfc()) GTEST_SKIP() << "built without utf8proc";
  TokenizerSpec s = byte_spec();
  const int32_t e_acute = merge(s, "\xC3", "\xA9");  // é precomposed
  const Tokenizer t(s);
  EXPECT_EQ(t.encode("e\xCC\x81"), Ids({e_acute}));
  s.nfc = false;
  EXPECT_EQ(Tokenizer(s).encode("e\xCC\x81"), Ids({'e', 0xCC, 0x81}));
}

TokenizerSpec with_added(std::vector<AddedToken> added) {
  TokenizerSpec s = byte_spec();
  s.added_tokens = std::move(added);
  return s;
}

TEST(TokenizerSmall, SpecialTokensMatchBeforeBpe) {
  const Tokenizer t(with_added({{.id = 300, .content = "<|x|>", .special = true, .normalized = false},
                                {.id = 301, .content = "<|x|>y", .special = true, .normalized = false}}));
  EXPECT_EQ(t.encode("a<|x|>b"), Ids({'a', 300, 'b'}));
  EXPECT_EQ(t.encode("<|x|>y<|x|>"), Ids({301, 300}));  // longest match wins
  EXPECT_EQ(t.encode(" <|x|> "), Ids({' ', 300, ' '}));
  const Ids plain = t.encode("a<|x|>b", /*parse_special=*/false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 300), 0);
  EXPECT_EQ(t.decode(plain), "a<|x|>b");
  EXPECT_EQ(t.decode(Ids({'a', 300, 'b'})), "a<|x|>b");
  EXPECT_EQ(t.decode(Ids({'a', 300, 'b'}), /*skip_special=*/true), "ab");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_EQ(t.token_id("<|x|>"), 300);
  EXPECT_EQ(t.token_id("\xC4\xA0"), ' ');
  EXPECT_EQ(t.token_id("nope"), -1);
  EXPECT_EQ(t.token_text(' '), "\xC4\xA0");
  EXPECT_EQ(t.vocab_size(), 302);
}

TEST(TokenizerSmall, NonSpecialAddedTokensMatchEvenWithoutParseSpecial) {
  const Tokenizer t(with_added({{.id = 300, .content = "<tag>", .special = false, .normalized = false}}));
  EXPECT_EQ(t.encode("a<tag>", false), Ids({'a', 300}));
  EXPECT_FALSE(t.is_special(300));
  EXPECT_TRUE(t.is_added(300));
}

TEST(TokenizerSmall, LstripAndRstripSwallowWhiteSpace) {
  const Tokenizer t(with_added(
      {{.id = 300, .content = "<l>", .special = true, .lstrip = true, .normalized = false},
       {.id = 301, .content = "<r>", .special = true, .rstrip = true, .normalized = false}}));
  EXPECT_EQ(t.encode("a \t <l> b"), Ids({'a', 300, ' ', 'b'}));
  EXPECT_EQ(t.encode("a <r>  \n b"), Ids({'a', ' ', 301, 'b'}));
  // The whitespace between them goes to the first token that claims it.
  EXPECT_EQ(t.encode("<r>   <l>"), Ids({301, 300}));
  EXPECT_EQ(t.encode("\xE3\x80\x80<l>"), Ids({300}));  // U+3000 is white space too
}

TEST(TokenizerSmall, SingleWordTokensOnlyMatchWholeWords) {
  const Tokenizer t(with_added(
      {{.id = 300, .content = "cat", .special = false, .single_word = true, .normalized = false}}));
  EXPECT_EQ(t.encode("cat"), Ids({300}));
  EXPECT_EQ(t.encode("a cat!"), Ids({'a', ' ', 300, '!'}));
  EXPECT_EQ(t.encode("cats"), Ids({'c', 'a', 't', 's'}));
  EXPECT_EQ(t.encode("\xC3\xA9" "cat"), Ids({0xC3, 0xA9, 'c', 'a', 't'}));  // é is a letter
  // Circled letters are Alphabetic (category So), so \w in Rust's regex counts them.
  EXPECT_EQ(t.encode("\xE2\x92\xB6" "cat"), Ids({0xE2, 0x92, 0xB6, 'c', 'a', 't'}));
  EXPECT_EQ(t.encode("!cat_"), Ids({'!', 'c', 'a', 't', '_'}));
}

TEST(TokenizerSmall, NormalizedAddedTokensMatchNfcText) {
  if (!have_nfc()) GTEST_SKIP() << "built without utf8proc";
  // Content given decomposed; both spellings in the text match after NFC.
  const Tokenizer t(with_added({{.id = 300, .content = "e\xCC\x81", .special = false, .normalized = true}}));
  EXPECT_EQ(t.encode("x\xC3\xA9y"), Ids({'x', 300, 'y'}));
  EXPECT_EQ(t.encode("xe\xCC\x81y"), Ids({'x', 300, 'y'}));
}

TEST(TokenizerSmall, StreamDecoderHoldsIncompleteCharacters) {
  const Tokenizer t(byte_spec());
  const std::string text = "a\xC3\xA9\xF0\x9F\x98\x80z\xE4\xBD\xA0";
  StreamDecoder dec(t);
  std::string joined;
  for (int32_t id : bytes_of(text)) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(is_valid_utf8(piece));
    joined += piece;
  }
  joined += dec.flush();
  EXPECT_EQ(joined, text);
  StreamDecoder d2(t);
  EXPECT_EQ(d2.push(0xF0), "");
  EXPECT_EQ(d2.push(0x9F), "");
  EXPECT_EQ(d2.pending_bytes(), 2u);
  EXPECT_EQ(d2.push('x'), "\xEF\xBF\xBD" "x");  // broken sequence: one U+FFFD, then x
  EXPECT_EQ(d2.push(0xE4), "");
  EXPECT_EQ(d2.flush(), "\xEF\xBF\xBD");
}

TEST(TokenizerSmall, DecodeRejectsUnknownIds) {
  const Tokenizer t(byte_spec());
  EXPECT_THROW(t.decode(Ids({5000})), Error);
  EXPECT_THROW(t.decode(Ids({-1})), Error);
  EXPECT_EQ(t.decode(Ids({0xC3})), "\xEF\xBF\xBD");  // lone lead byte: replaced like HF
}

TEST(TokenizerSmall, EncodeRejectsInvalidUtf8) {
  const Tokenizer t(byte_spec());
  EXPECT_THROW(t.encode("ab\xFF"), Error);
}

// A minimal but complete tokenizer.json; tests break one piece at a time.
std::string good_json() {
  return R"({
    "added_tokens": [{"id": 5, "content": "<s>", "special": true, "normalized": false,
                      "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": " ?\\p{L}+|\\s+|."}, "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4},
              "merges": ["a b", ["Ġ", "ab"]]}
  })";
}

std::string replace(std::string s, std::string_view from, std::string_view to) {
  const size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

TEST(TokenizerSmall, LoadsMinimalJson) {
  const Tokenizer t = Tokenizer::from_json(good_json());
  EXPECT_EQ(t.encode("ab ab<s>"), Ids({2, 4, 5}));  // "ab", " ab", <s>
  EXPECT_EQ(t.decode(Ids({2, 4, 5})), "ab ab<s>");
}

void expect_error(const std::string& json, std::string_view needle) {
  try {
    Tokenizer::from_json(json);
    ADD_FAILURE() << "accepted a broken tokenizer.json; expected an error about '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerSmall, RejectsMalformedJson) {
  expect_error("{not json", "invalid JSON");
  expect_error("[1, 2]", "JSON object");
  expect_error(replace(good_json(), "\"model\"", "\"modle\""), "missing \"model\"");
  expect_error(replace(good_json(), "\"vocab\"", "\"vocabulary\""), "model.vocab");
  expect_error(replace(good_json(), "\"merges\"", "\"merge\""), "model.merges");
  expect_error(replace(good_json(), "\"type\": \"BPE\"", "\"type\": \"WordPiece\""), "WordPiece");
  expect_error(replace(good_json(), "\"byte_fallback\": false", "\"byte_fallback\": true"), "byte_fallback");
  expect_error(replace(good_json(), "\"a b\"", "\"a c\""), "not in the vocabulary");
  expect_error(replace(good_json(), "\"a b\"", "\"ab\""), "two tokens");
  expect_error(replace(good_json(), "\"a\": 0", "\"a\": \"zero\""), "non-integer");
  expect_error(replace(good_json(), "\"b\": 1", "\"b\": 0"), "used by both");
  expect_error(replace(good_json(), "{\"type\": \"NFC\"}", "{\"type\": \"NFKC\"}"), "NFKC");
  expect_error(replace(good_json(), "\\\\p{L}+|", "(\\\\p{L}+|"), "does not compile");
  expect_error(replace(good_json(), "\"Isolated\"", "\"Removed\""), "Removed");
  expect_error(replace(good_json(), "\"id\": 5,", ""), "added token");
  expect_error(replace(good_json(), "\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": {\"type\": \"WordPiece\"}"), "decoder");
}

TEST(TokenizerSmall, FromFileErrorsNameThePath) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "qwen36_tok_test_empty";
  fs::create_directories(dir);
  try {
    Tokenizer::from_file(dir.string());
    ADD_FAILURE() << "no tokenizer.json in the directory, yet it loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
  try {
    Tokenizer::from_file("missing-model.gguf");
    ADD_FAILURE() << "a missing GGUF loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing-model.gguf"), std::string::npos) << e.what();
  }
  const fs::path bad = dir / "tokenizer.json";
  std::ofstream(bad) << "{\"model\": 1}";
  try {
    Tokenizer::from_file(dir.string());
    ADD_FAILURE() << "a broken tokenizer.json loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qwen36::text
