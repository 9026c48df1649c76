// Byte-level BPE tokenizer: loading (tokenizer.json or a TokenizerSpec), added-token
// splitting, the PCRE2 pre-tokenizer, encode, decode and the streaming decoder.
// The order of steps and each corner (lstrip, single_word, lossy decode) mirrors Hugging Face
// `tokenizers`, because ids must match it exactly.
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "format/gguf.h"
#include "text/bpe.h"
#include "text/unicode.h"

namespace qwen36::text {

namespace {

// Qwen2/Qwen3 pre-tokenizer regex (tokenizer.ggml.pre = "qwen2").
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5/3.6: combining marks stay with the letters they follow ("qwen35").
constexpr const char* kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex = true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Unicode White_Space, the meaning of \s in the Oniguruma and Rust regexes HF uses. PCRE2's
// \s under UCP also matches U+180E (MONGOLIAN VOWEL SEPARATOR, no longer a space since
// Unicode 6.3), so patterns are rewritten to spell this set out.
constexpr const char* kWhiteSpaceClass =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Replaces \s (and \S outside classes) with the explicit White_Space set.
std::string rewrite_white_space(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : "[" + std::string(kWhiteSpaceClass) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceClass) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Steps back from byte offset `end` over one UTF-8 code point of valid text.
size_t prev_code_point_start(std::string_view text, size_t end) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
  return p;
}

}  // namespace

std::string pattern_for_pre(std::string_view pre) {
  if (pre == "qwen2") return kQwen2Pattern;
  if (pre == "qwen35") return kQwen35Pattern;
  fail("unknown pre-tokenizer '{}' (known: qwen2, qwen35)", pre);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer: the regex split with "Isolated" behaviour (matches and gaps both kept).

class PreTokenizer {
 public:
  explicit PreTokenizer(const std::string& pattern) : pattern_(pattern) {
    const std::string rewritten = rewrite_white_space(pattern);
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code_ == nullptr)
      fail("pre-tokenizer regex does not compile at offset {}: {} (pattern: {})", offset,
           pcre2_message(err), pattern);
    // JIT makes matching several times faster; the interpreter is the fallback.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~PreTokenizer() { pcre2_code_free(code_); }
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls fn(piece) for each pre-token of valid UTF-8 `text`, in order.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const {
    struct MatchData {
      pcre2_match_data* md;
      ~MatchData() { pcre2_match_data_free(md); }
    };
    thread_local MatchData data{pcre2_match_data_create(4, nullptr)};
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0;
    size_t search = 0;
    while (search < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), search, PCRE2_NO_UTF_CHECK,
                                 data.md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) fail("pre-tokenizer regex failed: {}", pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
      const size_t m0 = ov[0], m1 = ov[1];
      if (m1 == m0) {  // an empty match splits nothing; step over one code point
        search = m0 + 1;
        while (search < text.size() && (static_cast<unsigned char>(text[search]) & 0xC0) == 0x80)
          ++search;
        continue;
      }
      if (m0 > start) fn(text.substr(start, m0 - start));
      fn(text.substr(m0, m1 - m0));
      start = search = m1;
    }
    if (start < text.size()) fn(text.substr(start));
  }

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Added-token matcher: leftmost-longest, like the Aho-Corasick automaton HF builds. There are
// only tens of added tokens, so candidates are bucketed by first byte and tried longest first.

struct Tokenizer::Trie {
  std::array<std::vector<size_t>, 256> by_first;  // indices into patterns, longest first
  std::vector<std::pair<std::string, size_t>> patterns;  // (bytes to match, index in added_)
  bool empty() const { return patterns.empty(); }

  void build() {
    for (auto& b : by_first) b.clear();
    for (size_t i = 0; i < patterns.size(); ++i)
      by_first[static_cast<uint8_t>(patterns[i].first[0])].push_back(i);
    for (auto& b : by_first)
      std::stable_sort(b.begin(), b.end(), [&](size_t x, size_t y) {
        return patterns[x].first.size() > patterns[y].first.size();
      });
  }

  // First match at or after `from`: (start, pattern index) or (npos, 0).
  std::pair<size_t, size_t> find(std::string_view text, size_t from) const {
    for (size_t pos = from; pos < text.size(); ++pos) {
      const auto& cands = by_first[static_cast<uint8_t>(text[pos])];
      for (size_t idx : cands) {
        const std::string& p = patterns[idx].first;
        if (text.size() - pos >= p.size() && text.compare(pos, p.size(), p) == 0)
          return {pos, idx};
      }
    }
    return {std::string_view::npos, 0};
  }
};

struct Tokenizer::Piece {
  size_t start, end;
  int32_t id;  // added token id, or -1 for ordinary text
};

namespace {

// Whether code point c counts as a word character for single_word: Rust regex \w, i.e.
// Alphabetic, marks, decimal digits, connector punctuation and the joiners. PCRE2 10.40+ knows
// these Boolean properties; older ones get the nearest general categories.
bool is_word_char(char32_t c) {
  static pcre2_code* code = [] {
    int err = 0;
    PCRE2_SIZE off = 0;
    for (const char* p : {R"(^[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])",
                          R"(^[\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}])"}) {
      pcre2_code* compiled = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p), PCRE2_ZERO_TERMINATED,
                                           PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
      if (compiled != nullptr) return compiled;
    }
    fail("cannot compile the word-character regex: {}", pcre2_message(err));
  }();
  std::string s;
  append_utf8(s, c);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

}  // namespace

void Tokenizer::split_added(std::string_view text, const Trie& trie, bool parse_special,
                            std::vector<Piece>& pieces) const {
  pieces.clear();
  size_t done = 0;  // end of the last piece emitted
  size_t from = 0;  // where the next search starts (skipped matches are consumed too)
  while (!trie.empty()) {
    const auto [found, idx] = trie.find(text, from);
    if (found == std::string_view::npos) break;
    const AddedToken& tok = added_[trie.patterns[idx].second];
    size_t start = found;
    size_t stop = found + trie.patterns[idx].first.size();
    from = stop;
    if (!parse_special && tok.special) continue;
    if (tok.single_word) {
      bool word_before = false, word_after = false;
      if (start > 0) {
        size_t q = prev_code_point_start(text, start);
        word_before = is_word_char(next_code_point(text, q));
      }
      if (stop < text.size()) {
        size_t q = stop;
        word_after = is_word_char(next_code_point(text, q));
      }
      if (word_before || word_after) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t q = prev_code_point_start(text, s);
        size_t r = q;
        if (!is_white_space(next_code_point(text, r))) break;
        s = q;
      }
      start = std::max(s, done);  // spaces an earlier match swallowed stay with it
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t r = stop;
        if (!is_white_space(next_code_point(text, r))) break;
        stop = r;
      }
    }
    if (start < done) start = done;  // a match inside swallowed spaces (degenerate)
    if (done < start) pieces.push_back(Piece{done, start, -1});
    pieces.push_back(Piece{start, stop, tok.id});
    done = stop;
    from = std::max(from, stop);
  }
  if (done < text.size()) pieces.push_back(Piece{done, text.size(), -1});
}

// ---------------------------------------------------------------------------------------------
// Construction.

Tokenizer::Tokenizer(const TokenizerSpec& spec) : nfc_(spec.nfc), ignore_merges_(spec.ignore_merges) {
  QWEN36_CHECK(!spec.tokens.empty(), "tokenizer: empty vocabulary");
  QWEN36_CHECK(!spec.pattern.empty(), "tokenizer: no pre-tokenizer regex");
  texts_ = spec.tokens;
  kind_.assign(texts_.size(), 0);
  vocab_.reserve(texts_.size() * 2);
  for (size_t id = 0; id < texts_.size(); ++id) {
    if (texts_[id].empty()) continue;
    kind_[id] = 1;
    vocab_.emplace(texts_[id], static_cast<int32_t>(id));
  }

  // Byte ids and merges are resolved against the model vocabulary, before added tokens.
  std::vector<int32_t> byte_ids(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_char(static_cast<uint8_t>(b)));
    auto it = vocab_.find(s);
    if (it != vocab_.end()) byte_ids[static_cast<size_t>(b)] = it->second;
  }
  std::vector<BpeMerger::Merge> merges;
  merges.reserve(spec.merges.size());
  auto lookup = [&](const std::string& s, size_t line) {
    auto it = vocab_.find(s);
    if (it == vocab_.end())
      fail("tokenizer: merge {} ('{} {}') needs '{}', which is not in the vocabulary", line,
           spec.merges[line].first, spec.merges[line].second, s);
    return it->second;
  };
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [a, b] = spec.merges[i];
    merges.push_back(BpeMerger::Merge{lookup(a, i), lookup(b, i), lookup(a + b, i)});
  }
  merger_ = std::make_unique<BpeMerger>(byte_ids, merges);

  // Added tokens take their ids' slots and win over vocabulary entries with the same text.
  raw_trie_ = std::make_unique<Trie>();
  normalized_trie_ = std::make_unique<Trie>();
  for (const AddedToken& t : spec.added_tokens) {
    QWEN36_CHECK(t.id >= 0, "tokenizer: added token '{}' has a negative id", t.content);
    QWEN36_CHECK(!t.content.empty(), "tokenizer: added token {} has empty content", t.id);
    QWEN36_CHECK(is_valid_utf8(t.content), "tokenizer: added token {} is not valid UTF-8", t.id);
    const auto id = static_cast<size_t>(t.id);
    if (id >= texts_.size()) {
      texts_.resize(id + 1);
      kind_.resize(id + 1, 0);
    }
    texts_[id] = t.content;
    kind_[id] = t.special ? 3 : 2;
    vocab_[t.content] = t.id;
    added_.push_back(t);
  }
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    if (t.normalized) {
      // Matched against normalised text, so the pattern is normalised too.
      std::string pat = nfc_ ? nfc(t.content) : t.content;
      normalized_trie_->patterns.emplace_back(std::move(pat), i);
    } else {
      raw_trie_->patterns.emplace_back(t.content, i);
    }
  }
  raw_trie_->build();
  normalized_trie_->build();

  bytes_.resize(texts_.size());
  for (size_t id = 0; id < texts_.size(); ++id)
    if (kind_[id] != 0) bytes_[id] = token_text_to_bytes(texts_[id]);

  pre_ = std::make_unique<PreTokenizer>(spec.pattern);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

const std::string& Tokenizer::pattern() const { return pre_->pattern(); }

namespace {

using nlohmann::json;

bool get_bool(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  QWEN36_CHECK(it->is_boolean(), "'{}' must be true or false", key);
  return it->get<bool>();
}

std::string type_of(const json& obj, const char* what) {
  QWEN36_CHECK(obj.is_object(), "{} must be an object", what);
  auto it = obj.find("type");
  QWEN36_CHECK(it != obj.end() && it->is_string(), "{} has no \"type\"", what);
  return it->get<std::string>();
}

// normalizer: null, NFC, or a Sequence of those.
bool parse_normalizer(const json& n) {
  if (n.is_null()) return false;
  const std::string type = type_of(n, "normalizer");
  if (type == "NFC") return true;
  if (type == "Sequence") {
    bool nfc = false;
    const json& list = n.value("normalizers", json::array());
    QWEN36_CHECK(list.is_array(), "normalizer Sequence needs a \"normalizers\" array");
    QWEN36_CHECK(list.size() <= 1, "normalizer Sequence with {} steps is not supported", list.size());
    for (const json& step : list) nfc = parse_normalizer(step) || nfc;
    return nfc;
  }
  fail("normalizer '{}' is not supported (only NFC)", type);
}

// Collects the regex of a Split (Isolated) or a ByteLevel with use_regex; rejects the rest.
void parse_pre_tokenizer(const json& p, std::string& pattern) {
  const std::string type = type_of(p, "pre_tokenizer");
  if (type == "Sequence") {
    const json& list = p.value("pretokenizers", json::array());
    QWEN36_CHECK(list.is_array(), "pre_tokenizer Sequence needs a \"pretokenizers\" array");
    for (const json& step : list) parse_pre_tokenizer(step, pattern);
    return;
  }
  if (type == "Split") {
    QWEN36_CHECK(pattern.empty(), "more than one regex pre-tokenizer is not supported");
    const std::string behavior = p.value("behavior", "");
    QWEN36_CHECK(behavior == "Isolated", "Split behavior '{}' is not supported (only Isolated)", behavior);
    QWEN36_CHECK(!get_bool(p, "invert", false), "Split with invert=true is not supported");
    const json& pat = p.value("pattern", json::object());
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      pattern = pat["Regex"].get<std::string>();
    } else if (pat.contains("String") && pat["String"].is_string()) {
      pattern = "\\Q" + pat["String"].get<std::string>() + "\\E";
    } else {
      fail("Split pre-tokenizer has no Regex or String pattern");
    }
    QWEN36_CHECK(!pattern.empty(), "Split pre-tokenizer has an empty pattern");
    return;
  }
  if (type == "ByteLevel") {
    QWEN36_CHECK(!get_bool(p, "add_prefix_space", false),
                 "ByteLevel add_prefix_space=true is not supported");
    if (get_bool(p, "use_regex", true)) {
      QWEN36_CHECK(pattern.empty(), "more than one regex pre-tokenizer is not supported");
      pattern = kGpt2Pattern;
    }
    return;
  }
  fail("pre_tokenizer '{}' is not supported (only Split, ByteLevel, Sequence)", type);
}

}  // namespace

TokenizerSpec Tokenizer::spec_from_json(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("invalid JSON: {}", e.what());
  }
  QWEN36_CHECK(root.is_object(), "top level must be a JSON object");
  TokenizerSpec spec;
  try {
    auto mit = root.find("model");
    QWEN36_CHECK(mit != root.end() && mit->is_object(), "missing \"model\"");
    const json& model = *mit;
    const std::string type = model.value("type", "BPE");
    QWEN36_CHECK(type == "BPE", "model type '{}' is not supported (only BPE)", type);
    QWEN36_CHECK(!get_bool(model, "byte_fallback", false), "BPE byte_fallback is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = model.find(key);
      QWEN36_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
                   "BPE {} is not supported", key);
    }
    auto dit = model.find("dropout");
    QWEN36_CHECK(dit == model.end() || dit->is_null() || (dit->is_number() && dit->get<double>() == 0.0),
                 "BPE dropout is not supported");
    spec.ignore_merges = get_bool(model, "ignore_merges", false);

    auto vit = model.find("vocab");
    QWEN36_CHECK(vit != model.end() && vit->is_object(), "missing \"model.vocab\"");
    int64_t max_id = -1;
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      QWEN36_CHECK(it.value().is_number_integer(), "vocab entry '{}' has a non-integer id", it.key());
      const int64_t id = it.value().get<int64_t>();
      QWEN36_CHECK(id >= 0 && id < (int64_t{1} << 30), "vocab entry '{}' has id {} out of range", it.key(), id);
      max_id = std::max(max_id, id);
    }
    spec.tokens.resize(static_cast<size_t>(max_id + 1));
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      std::string& slot = spec.tokens[it.value().get<size_t>()];
      QWEN36_CHECK(slot.empty(), "vocab id {} is used by both '{}' and '{}'", it.value().get<int64_t>(), slot, it.key());
      QWEN36_CHECK(!it.key().empty(), "vocab has an empty token");
      slot = it.key();
    }

    auto merit = model.find("merges");
    QWEN36_CHECK(merit != model.end() && merit->is_array(), "missing \"model.merges\"");
    spec.merges.reserve(merit->size());
    for (const json& m : *merit) {
      if (m.is_string()) {  // older files: "left right"
        const auto& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        QWEN36_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                         s.find(' ', sp + 1) == std::string::npos,
                     "merge '{}' is not two tokens separated by a space", s);
        spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        fail("merge {} is neither \"a b\" nor [\"a\", \"b\"]", m.dump());
      }
    }

    auto ait = root.find("added_tokens");
    if (ait != root.end() && !ait->is_null()) {
      QWEN36_CHECK(ait->is_array(), "\"added_tokens\" must be an array");
      for (const json& t : *ait) {
        QWEN36_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() &&
                         t.contains("content") && t["content"].is_string(),
                     "added token {} needs an integer \"id\" and a string \"content\"", t.dump());
        AddedToken a;
        const int64_t id = t["id"].get<int64_t>();
        QWEN36_CHECK(id >= 0 && id < (int64_t{1} << 30), "added token id {} out of range", id);
        a.id = static_cast<int32_t>(id);
        a.content = t["content"].get<std::string>();
        a.special = get_bool(t, "special", false);
        a.lstrip = get_bool(t, "lstrip", false);
        a.rstrip = get_bool(t, "rstrip", false);
        a.single_word = get_bool(t, "single_word", false);
        a.normalized = get_bool(t, "normalized", !a.special);
        spec.added_tokens.push_back(std::move(a));
      }
    }

    spec.nfc = parse_normalizer(root.value("normalizer", json()));
    const json& pre = root.value("pre_tokenizer", json());
    QWEN36_CHECK(!pre.is_null(), "missing \"pre_tokenizer\" (byte-level BPE needs one)");
    parse_pre_tokenizer(pre, spec.pattern);
    QWEN36_CHECK(!spec.pattern.empty(), "pre_tokenizer has no regex split");
    const json& dec = root.value("decoder", json());
    if (!dec.is_null()) {
      const std::string dtype = type_of(dec, "decoder");
      QWEN36_CHECK(dtype == "ByteLevel", "decoder '{}' is not supported (only ByteLevel)", dtype);
    }
  } catch (const json::exception& e) {
    fail("unexpected structure: {}", e.what());
  }
  return spec;
}

Tokenizer Tokenizer::from_json(std::string_view json_text) {
  return Tokenizer(spec_from_json(json_text));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  if (file.size() >= 5 && file.compare(file.size() - 5, 5, ".gguf") == 0) return from_gguf(GgufFile(file));
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot open tokenizer file", file);
  std::ostringstream ss;
  ss << in.rdbuf();
  return with_context(file, [&] { return from_json(ss.str()); });
}

// ---------------------------------------------------------------------------------------------
// Encode.

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const size_t bad = utf8_invalid_offset(text);
  if (bad != text.size()) fail("tokenizer input is not valid UTF-8 (byte offset {})", bad);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  encode_text(text, parse_special, out);
  return out;
}

void Tokenizer::encode_text(std::string_view text, bool parse_special,
                            std::vector<int32_t>& out) const {
  if (raw_trie_->empty()) {
    encode_normalized(text, parse_special, out);
    return;
  }
  std::vector<Piece> pieces;
  split_added(text, *raw_trie_, parse_special, pieces);
  for (const Piece& p : pieces) {
    if (p.id >= 0)
      out.push_back(p.id);
    else
      encode_normalized(text.substr(p.start, p.end - p.start), parse_special, out);
  }
}

void Tokenizer::encode_normalized(std::string_view text, bool parse_special,
                                  std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc_ && nfc_if_needed(text, normalized)) text = normalized;
  if (normalized_trie_->empty()) {
    encode_plain(text, out);
    return;
  }
  std::vector<Piece> pieces;
  split_added(text, *normalized_trie_, parse_special, pieces);
  for (const Piece& p : pieces) {
    if (p.id >= 0)
      out.push_back(p.id);
    else
      encode_plain(text.substr(p.start, p.end - p.start), out);
  }
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  pre_->split(text, [&](std::string_view word) {
    if (ignore_merges_) {
      auto it = vocab_.find(bytes_to_token_text(word));
      if (it != vocab_.end() && kind_[static_cast<size_t>(it->second)] == 1) {
        out.push_back(it->second);
        return;
      }
    }
    merger_->encode(word, out);
  });
}

// ---------------------------------------------------------------------------------------------
// Decode and lookups.

std::string Tokenizer::piece(int32_t id) const {
  return id >= 0 && id < vocab_size() && !token_text(id).empty() ? token_bytes(id) : std::string{};
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || kind_[static_cast<size_t>(id)] == 0)
    fail("token id {} is not in the vocabulary (size {})", id, vocab_size());
  return bytes_[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  token_bytes(id);  // range check
  return texts_[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && kind_[static_cast<size_t>(id)] == 3;
}

std::vector<std::string> Tokenizer::document_bytes(int64_t n) const {
  std::vector<std::string> bytes(static_cast<size_t>(n));
  for (int32_t id = 0; id < int32_t(std::min<int64_t>(n, vocab_size())); ++id)
    if (kind_[size_t(id)] == 1 || kind_[size_t(id)] == 2) bytes[size_t(id)] = bytes_[size_t(id)];
  return bytes;
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() && kind_[static_cast<size_t>(id)] >= 2;
}

int32_t Tokenizer::token_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string& b = token_bytes(id);
    if (skip_special && is_special(id)) continue;
    bytes += b;
  }
  std::string out;
  out.reserve(bytes.size());
  append_utf8_lossy(out, bytes, /*final=*/true);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  const std::string& b = tok_->token_bytes(id);
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += b;
  std::string out;
  const size_t used = append_utf8_lossy(out, pending_, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  append_utf8_lossy(out, pending_, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace qwen36::text
