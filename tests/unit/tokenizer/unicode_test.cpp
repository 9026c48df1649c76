// UTF-8 validation, lossy repair (one U+FFFD per maximal invalid subpart) and NFC.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "text/unicode.h"

#if __has_include(<utf8proc.h>)
#include <utf8proc.h>
#define QWEN36_TEST_UTF8PROC 1
#endif

namespace qwen36::text {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

std::string lossy(std::string_view s) {
  std::string out;
  append_utf8_lossy(out, s, true);
  return out;
}

TEST(TokenizerUnicode, ValidatesUtf8) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain ascii text that is longer than eight bytes"));
  EXPECT_TRUE(is_valid_utf8("caf\xC3\xA9 \xE4\xBD\xA0 \xF0\x9F\x98\x80"));
  EXPECT_EQ(utf8_invalid_offset("abc\xC0\x80"), 3u);             // overlong
  EXPECT_EQ(utf8_invalid_offset("ab\xED\xA0\x80"), 2u);          // surrogate
  EXPECT_EQ(utf8_invalid_offset("\xF4\x90\x80\x80"), 0u);        // above U+10FFFF
  EXPECT_EQ(utf8_invalid_offset("0123456789\xE4\xBD"), 10u);     // cut short
  EXPECT_EQ(utf8_invalid_offset("x\x80"), 1u);                   // stray continuation
  EXPECT_EQ(utf8_invalid_offset("\xFF"), 0u);
}

TEST(TokenizerUnicode, LossyReplacesMaximalSubparts) {
  // Expected strings follow Unicode §3.9 "substitution of maximal subparts", which is what
  // Rust's String::from_utf8_lossy (used by HF decode) and Python's 'replace' do.
  EXPECT_EQ(lossy("ok"), "ok");
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFFFD);                        // one truncated sequence
  EXPECT_EQ(lossy("\xE0\x80"), kFFFD + kFFFD);                    // E0 needs A0..BF next
  EXPECT_EQ(lossy("a\xF1\x80\x80" "b"), "a" + kFFFD + "b");
  EXPECT_EQ(lossy("\xC0\xAF"), kFFFD + kFFFD);
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFFFD + kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(lossy("\xE2\x82\xAC\xE2\x82"), "\xE2\x82\xAC" + kFFFD);
}

TEST(TokenizerUnicode, LossyHoldsBackIncompleteTail) {
  std::string out;
  EXPECT_EQ(append_utf8_lossy(out, "ab\xF0\x9F", false), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(append_utf8_lossy(out, "\xF0\x9F\x98\x80", false), 4u);
  EXPECT_EQ(out, "\xF0\x9F\x98\x80");
  out.clear();
  // A tail that can never complete is replaced at once, not held.
  EXPECT_EQ(append_utf8_lossy(out, "a\xC0", false), 2u);
  EXPECT_EQ(out, "a" + kFFFD);
}

TEST(TokenizerUnicode, NfcKnownCases) {
  if (!have_nfc()) GTEST_SKIP() << "built without utf8proc";
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                         // e + acute -> é
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                      // Angstrom sign -> Å
  EXPECT_EQ(nfc("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");     // reordered: ạ + acute
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");      // U+0958 is excluded
  EXPECT_EQ(nfc("\xE3\x81\x8B\xE3\x82\x99"), "\xE3\x81\x8C");      // か + dakuten -> が
  EXPECT_EQ(nfc("plain"), "plain");
  EXPECT_EQ(nfc("\xEF\xAC\x81"), "\xEF\xAC\x81");                  // ﬁ: compatibility only
}

#ifdef QWEN36_TEST_UTF8PROC
std::string full_nfc(const std::string& s) {
  utf8proc_uint8_t* r = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &r,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string out = n >= 0 ? std::string(reinterpret_cast<char*>(r), static_cast<size_t>(n)) : "";
  std::free(r);
  return out;
}

// The quick scan that skips NFC must never skip text that NFC would change: check every
// code point next to the characters most likely to compose or reorder with it.
TEST(TokenizerUnicode, NfcQuickScanNeverSkipsAChange) {
  if (!have_nfc()) GTEST_SKIP() << "built without utf8proc";
  const char* neighbours[] = {"a", "e\xCC\x81", "\xE1\x84\x80", "\xEA\xB0\x80", "\xE0\xA4\x95",
                              "\xCC\x81", "\xE3\x82\x99"};
  size_t checked = 0;
  for (char32_t cp = 0x20; cp < 0x30000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string c;
    append_utf8(c, cp);
    for (const char* n : neighbours) {
      for (const std::string& s : {std::string(n) + c, c + n}) {
        ASSERT_EQ(nfc(s), full_nfc(s)) << "code point U+" << std::hex << static_cast<uint32_t>(cp);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000000u);
}
#endif

}  // namespace
}  // namespace qwen36::text
