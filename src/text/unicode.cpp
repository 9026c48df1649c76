// UTF-8 helpers and NFC. NFC comes from utf8proc (Debian libutf8proc-dev) when present; a
// quick scan skips it for text that cannot change, which is nearly all text.
#include "text/unicode.h"

#include <cstdlib>
#include <memory>

#include "core/error.h"

#ifdef QWEN36_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace qwen36::text {

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of a complete well-formed sequence starting at bytes[0], 0 if the bytes there are an
// invalid subpart (its length in *bad), or -1 if the sequence is valid so far but cut short.
int sequence_length(std::string_view bytes, size_t* bad) {
  const auto b0 = static_cast<unsigned char>(bytes[0]);
  if (b0 < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  for (int i = 1; i < need; ++i) {
    if (static_cast<size_t>(i) >= bytes.size()) return -1;
    const auto c = static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    const bool ok = i == 1 ? (c >= lo && c <= hi) : is_cont(c);
    if (!ok) {
      *bad = static_cast<size_t>(i);
      return 0;
    }
  }
  return need;
}

}  // namespace

size_t utf8_invalid_offset(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII runs are the common case; skip them eight bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word;
      __builtin_memcpy(&word, text.data() + pos, 8);
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    size_t bad = 0;
    const int n = sequence_length(text.substr(pos), &bad);
    if (n <= 0) return pos;
    pos += static_cast<size_t>(n);
  }
  return text.size();
}

size_t append_utf8_lossy(std::string& out, std::string_view bytes, bool final) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t bad = 0;
    const int n = sequence_length(bytes.substr(pos), &bad);
    if (n > 0) {
      out.append(bytes.data() + pos, static_cast<size_t>(n));
      pos += static_cast<size_t>(n);
    } else if (n == 0) {
      out += kReplacement;
      pos += bad;
    } else {  // valid prefix, cut short by the end of the input
      if (!final) return pos;
      out += kReplacement;
      pos = bytes.size();
    }
  }
  return pos;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  auto cont = [&](size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(text[pos + i]) & 0x3F); };
  char32_t cp;
  if (b0 < 0x80) {
    cp = b0;
    pos += 1;
  } else if (b0 < 0xE0) {
    cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
    pos += 2;
  } else if (b0 < 0xF0) {
    cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    pos += 3;
  } else {
    cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
    pos += 4;
  }
  return cp;
}

#ifdef QWEN36_HAVE_UTF8PROC

namespace {

// A code point that NFC can never touch, wherever it stands: no combining class, no canonical
// decomposition, and it never composes with a character before it. Characters below U+0300
// may compose with what follows, but then what follows is not inert, which sends the whole
// text to the full algorithm.
bool nfc_inert(char32_t cp) {
  if (cp < 0x300) return true;
  if (cp >= 0x1100 && cp <= 0x11FF) return false;  // Hangul jamo compose algorithmically
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  if (p->combining_class != 0) return false;
  if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) return false;  // canonical
  // utf8proc marks characters that can be the second of a composition with bit 15.
  if (p->comb_index != UINT16_MAX && (p->comb_index & 0x8000) != 0) return false;
  return true;
}

}  // namespace

bool nfc_if_needed(std::string_view text, std::string& out) {
  bool needed = false;
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<unsigned char>(text[pos]) < 0xCC) {  // every code point below U+0300
      ++pos;
      continue;
    }
    if (!nfc_inert(next_code_point(text, pos))) {
      needed = true;
      break;
    }
  }
  if (!needed) return false;
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("NFC normalisation failed: {}", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(result, &std::free);
  out.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  return true;
}

bool have_nfc() { return true; }

#else

// Without utf8proc only text whose code points all lie below U+0300 is known to be NFC.
bool nfc_if_needed(std::string_view text, std::string&) {
  for (unsigned char c : text) {
    if (c >= 0xCC)
      fail("this build has no NFC normalisation (utf8proc missing) and the text needs it");
  }
  return false;
}

bool have_nfc() { return false; }

#endif

std::string nfc(std::string_view text) {
  std::string out;
  if (!nfc_if_needed(text, out)) out.assign(text);
  return out;
}

}  // namespace qwen36::text
