#pragma once
// defines: Tokenizer (byte-level BPE, exact to Hugging Face `tokenizers`), TokenizerSpec,
//          AddedToken, StreamDecoder
//
// Encoding follows the Hugging Face pipeline for Qwen checkpoints:
//   1. added tokens (e.g. <|im_start|>) are cut out of the raw text first, honouring each
//      token's special / lstrip / rstrip / single_word / normalized flags;
//   2. every remaining piece is NFC-normalised on its own;
//   3. the pre-tokenizer regex (taken from the checkpoint, run by PCRE2 with UTF + UCP) splits
//      it into pre-tokens, matches and the gaps between them alike ("Isolated");
//   4. each pre-token's bytes are merged by BPE rank.
// Decoding maps ids back to bytes and repairs invalid UTF-8 with U+FFFD, as HF does.
//
// Needs PCRE2 (QWEN36_HAVE_PCRE2); NFC needs utf8proc (QWEN36_HAVE_UTF8PROC).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qwen36 {
class GgufFile;
}

namespace qwen36::text {

class BpeMerger;
class PreTokenizer;

// A token matched in the raw text before BPE (HF's AddedToken, same defaults as its JSON).
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by encode(..., parse_special=false)
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool single_word = false;  // only matches when not inside a word
  bool normalized = true;    // matched against NFC text instead of the raw text
};

// Everything a tokenizer is built from; tokenizer.json and GGUF metadata both map onto it.
struct TokenizerSpec {
  // Vocabulary in byte-level spelling ("Ġhello"); index = id. Empty strings are holes.
  // May contain the added tokens' contents at their ids too (GGUF does).
  std::vector<std::string> tokens;
  // Merges in rank order as (left, right) in byte-level spelling.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<AddedToken> added_tokens;
  // Pre-tokenizer regex (PCRE2 syntax compatible with the Oniguruma patterns HF uses).
  std::string pattern;
  bool nfc = true;             // normalizer NFC
  bool ignore_merges = false;  // HF BPE option: a pre-token already in the vocab is one token
};

// The pre-tokenizer regex that a GGUF `tokenizer.ggml.pre` value names ("qwen2", "qwen35").
// Throws Error for names it does not know.
std::string pattern_for_pre(std::string_view pre);

class Tokenizer {
 public:
  explicit Tokenizer(const TokenizerSpec& spec);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // `path` is a tokenizer.json or a directory that contains one. Throws Error naming the file.
  static Tokenizer from_file(const std::string& path);
  // The contents of a tokenizer.json.
  static Tokenizer from_json(std::string_view json_text);
  // The spec a tokenizer.json describes (exposed for tests and for tools).
  static TokenizerSpec spec_from_json(std::string_view json_text);
  // The gpt2-type BPE tokenizer stored in a GGUF file's tokenizer.ggml.* metadata.
  static Tokenizer from_gguf(const GgufFile& file);

  // Text (valid UTF-8, else Error) to ids. With parse_special=false, special added tokens
  // in the text are ordinary text (HF's encode_special_tokens); non-special ones still match.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Ids to text; invalid UTF-8 becomes U+FFFD. Throws Error on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The raw bytes of one token (may be a fragment of a UTF-8 sequence).
  const std::string& token_bytes(int32_t id) const;
  // An id's bytes as streamed text and logprobs show them: empty for an id past the vocabulary
  // (a padded embedding row) or without a token, where token_bytes throws.
  std::string piece(int32_t id) const;
  // Every id's bytes as text constrained to a document may hold them (structured output):
  // n entries; added tokens that are not special (<tool_call>, </tool_call>, <think> ...) as
  // their text, so a constrained call is written with the token a model writes it with; empty
  // for special tokens (<|im_end|> ...) and ids without a token.
  std::vector<std::string> document_bytes(int64_t n) const;

  // Id of a token in its vocabulary spelling or an added token's content; -1 if none.
  int32_t token_id(std::string_view token) const;
  // Vocabulary spelling of an id ("Ġhello"), or the added token's content.
  const std::string& token_text(int32_t id) const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;
  // One past the largest id.
  int32_t vocab_size() const { return static_cast<int32_t>(texts_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const std::string& pattern() const;

 private:
  struct Piece;
  struct Trie;
  void encode_text(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, bool parse_special,
                         std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void split_added(std::string_view text, const Trie& trie, bool parse_special,
                   std::vector<Piece>& pieces) const;

  std::vector<std::string> texts_;  // id -> vocabulary spelling / added content
  std::vector<std::string> bytes_;  // id -> decoded bytes
  std::vector<uint8_t> kind_;       // id -> 0 hole, 1 vocab, 2 added, 3 added+special
  std::unordered_map<std::string, int32_t> vocab_;  // spelling -> id (added tokens included)
  std::vector<AddedToken> added_;
  std::unique_ptr<Trie> raw_trie_;         // added tokens with normalized=false
  std::unique_ptr<Trie> normalized_trie_;  // added tokens with normalized=true (NFC content)
  std::unique_ptr<BpeMerger> merger_;
  std::unique_ptr<PreTokenizer> pre_;
  bool nfc_ = true;
  bool ignore_merges_ = false;
};

// Turns ids arriving one at a time into text, never emitting a broken UTF-8 sequence: bytes
// of an unfinished character are held until the rest arrives. The concatenated output equals
// Tokenizer::decode of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false)
      : tok_(&tok), skip_special_(skip_special) {}
  // Text completed by this id (often empty, or several characters).
  std::string push(int32_t id);
  // Whatever is still held, with an unfinished sequence replaced by U+FFFD; resets.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace qwen36::text
