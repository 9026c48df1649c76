#pragma once
// defines: the byte-level alphabet (bytes <-> printable code points) and BpeMerger, which
// turns one pre-token's bytes into token ids by applying merges in rank order.
//
// Byte-level BPE vocabularies spell every byte as a printable character (GPT-2's
// bytes_to_unicode): printable Latin-1 bytes stand for themselves, the other 68 bytes are
// shifted to U+0100 and up (so a space is "Ġ", a newline "Ċ"). The merger works on ids, so
// this spelling only matters when loading the vocabulary and when decoding.

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qwen36::text {

// The printable code point that spells byte b.
char32_t byte_to_char(uint8_t b);
// The byte spelled by code point c, or -1 if c is not part of the byte-level alphabet.
int char_to_byte(char32_t c);

// Spells raw bytes in the byte-level alphabet ("hello world" -> "helloĠworld").
std::string bytes_to_token_text(std::string_view bytes);
// Back from a vocabulary entry to raw bytes, as the ByteLevel decoder does: if any character
// lies outside the alphabet, the entry's own UTF-8 bytes are used unchanged (this is how added
// tokens such as "<|im_start|>" or ones containing a newline come out).
std::string token_text_to_bytes(std::string_view text);

class BpeMerger {
 public:
  struct Merge {
    int32_t left, right, result;  // ids; rank = position in the list
  };
  // byte_ids[b] is the id of the single-byte token for b, or -1 if the vocabulary lacks it
  // (such bytes are dropped, as Hugging Face does without an unk token or byte fallback).
  BpeMerger(const std::vector<int32_t>& byte_ids, const std::vector<Merge>& merges);

  // Appends the ids of one pre-token (raw bytes) to out. Thread-safe; results of short
  // pre-tokens are cached.
  void encode(std::string_view bytes, std::vector<int32_t>& out) const;

  size_t merge_count() const { return merge_count_; }

 private:
  struct Slot {
    uint64_t key;  // left << 32 | right; kEmpty when unused
    uint32_t rank;
    int32_t result;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  const Slot* find(int32_t left, int32_t right) const;
  void merge_uncached(std::string_view bytes, std::vector<int32_t>& out) const;

  int32_t byte_ids_[256];
  std::vector<Slot> table_;  // open addressing, power-of-two size
  uint64_t mask_ = 0;
  size_t merge_count_ = 0;

  // Cache of pre-token bytes -> ids. Real text repeats words constantly, so most pre-tokens
  // skip the merge loop. Bounded: cleared when full.
  static constexpr size_t kCacheMaxEntries = 1 << 17;
  static constexpr size_t kCacheMaxWordBytes = 64;
  // Transparent hashing lets a hit look up a string_view without building a std::string.
  struct ViewHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, ViewHash, std::equal_to<>> cache_;
};

}  // namespace qwen36::text
