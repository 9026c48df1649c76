#pragma once
// defines: CodePointRanges (a set of Unicode code points), complement, normalised, encode_utf8,
//          utf8_sequences (a code-point range as UTF-8 byte-range sequences)
//
// Regular expressions (regex.h) and grammars (grammar.h) are written over characters but matched
// byte by byte against token bytes: their character sets become sequences of byte ranges here.

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace qwen36::text {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Closed ranges; normalised: sorted, disjoint and not adjacent.
using CodePointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

CodePointRanges normalised(CodePointRanges r);
CodePointRanges complement(const CodePointRanges& r);  // r normalised; within [0, kMaxCodePoint]

// A hex digit's value, or -1.
constexpr int hex_digit(uint32_t c) {
  return c >= '0' && c <= '9' ? int(c - '0') : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? int((c | 0x20) - 'a' + 10) : -1;
}

// cp's UTF-8 bytes into out (room for 4); their count.
int encode_utf8(uint32_t cp, uint8_t* out);
// The UTF-8 character at s[*i] (advancing *i past it), or -1 (and *i unchanged) when the bytes
// there are not one.
int32_t decode_utf8(std::string_view s, size_t* i);

// The UTF-8 encodings of the code points in [lo, hi] (surrogates have none) as sequences of byte
// ranges, each sequence the product of its ranges.
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out);

}  // namespace qwen36::text
