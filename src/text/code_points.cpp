// Code-point sets and their UTF-8 byte ranges (code_points.h).
#include "text/code_points.h"

#include <algorithm>

namespace qwen36::text {

CodePointRanges normalised(CodePointRanges r) {
  std::sort(r.begin(), r.end());
  CodePointRanges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

CodePointRanges complement(const CodePointRanges& r) {  // r normalised
  CodePointRanges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

int encode_utf8(uint32_t cp, uint8_t* out) {
  if (cp < 0x80) {
    out[0] = uint8_t(cp);
    return 1;
  }
  const int n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  for (int k = n - 1; k > 0; --k, cp >>= 6) out[k] = uint8_t(0x80 | (cp & 0x3F));
  out[0] = uint8_t((0xF00 >> n) | cp);  // 2: 0xC0, 3: 0xE0, 4: 0xF0
  return n;
}

int32_t decode_utf8(std::string_view s, size_t* i) {
  if (*i >= s.size()) return -1;
  const auto b = uint8_t(s[*i]);
  const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || *i + size_t(n) > s.size()) return -1;
  uint32_t cp = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = uint8_t(s[*i + size_t(k)]);
    if ((c & 0xC0) != 0x80) return -1;
    cp = cp << 6 | (c & 0x3F);
  }
  *i += size_t(n);
  return int32_t(cp);
}

// Splits [lo, hi] until, in each piece, lo and hi have one encoding length and every byte
// position varies independently: the piece is then the product of its bytes' ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates have no encoding
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  for (uint32_t last : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= last && hi > last) {
      utf8_sequences(lo, last, out);
      utf8_sequences(last + 1, hi, out);
      return;
    }
  }
  const int n = hi < 0x80 ? 1 : hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  for (int k = 1; k < n; ++k) {
    const uint32_t m = (1u << (6 * k)) - 1;  // the low k continuation bytes
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_sequences(lo, lo | m, out);
      utf8_sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_sequences(lo, (hi & ~m) - 1, out);
      utf8_sequences(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  encode_utf8(lo, a);
  encode_utf8(hi, b);
  ByteRangeSeq seq;
  for (int k = 0; k < n; ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

}  // namespace qwen36::text
