#pragma once
// defines: UTF-8 helpers (validation, lossy repair, streaming completion) and NFC normalisation
//
// The tokenizer works on UTF-8 bytes throughout. These helpers hold the few places where code
// points matter: checking input, NFC (the Qwen normalizer) and turning decoded token bytes back
// into valid UTF-8 the way Hugging Face does (String::from_utf8_lossy: one U+FFFD per maximal
// invalid subpart, Unicode 15 §3.9).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qwen36::text {

// Byte offset of the first invalid UTF-8 byte, or text.size() when all of it is valid.
size_t utf8_invalid_offset(std::string_view text);
inline bool is_valid_utf8(std::string_view text) { return utf8_invalid_offset(text) == text.size(); }

// Appends `bytes` to `out` as valid UTF-8, replacing each maximal invalid subpart with U+FFFD.
// With final=false an incomplete but so-far-valid sequence at the end is held back: the return
// value is the number of bytes consumed, and the caller keeps the rest for later.
size_t append_utf8_lossy(std::string& out, std::string_view bytes, bool final);

// Appends the UTF-8 encoding of code point `cp` (must be a valid scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes one code point of valid UTF-8 at text[pos], advancing pos.
char32_t next_code_point(std::string_view text, size_t& pos);

// Unicode NFC of valid UTF-8 text. Returns false and leaves `out` untouched when text is
// already in NFC as far as a quick scan can tell (the common case); otherwise writes the
// normalised text to `out` and returns true. Throws Error if built without utf8proc and the
// text needs normalising.
bool nfc_if_needed(std::string_view text, std::string& out);

// NFC as a plain function (tests, round trips).
std::string nfc(std::string_view text);

// Whether this build can normalise arbitrary text (utf8proc present).
bool have_nfc();

}  // namespace qwen36::text
