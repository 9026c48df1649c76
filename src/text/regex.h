#pragma once
// defines: ByteDfa (a regular expression compiled to a deterministic automaton over UTF-8
//          bytes), RegexMode, regex_escape
//
// Structured output walks the vocabulary byte by byte (token_constraint.h), so a regular
// expression — JSON Schema's `pattern`, a `format`, vLLM's `regex` and `choice` outputs —
// becomes a DFA over bytes whose state is one integer. Every state of the DFA can still reach a
// match (the others are cut at compile time), so a mask built from it never leads into a dead end.
//
// Syntax: the common ground of ECMAScript (JSON Schema's regex dialect) and Python's `re` (what
// vLLM users write):
//   literals (UTF-8), `.` (any character but \n), classes [...] / [^...] with ranges and escapes,
//   \d \D \w \W \s \S (ASCII meanings), \n \r \t \f \v \0 \xHH \uHHHH and escaped punctuation,
//   groups (...) (?:...) (?<name>...) (?P<name>...), alternation |, quantifiers * + ? {n} {n,}
//   {n,m} (a lazy `?` after one is accepted: it does not change what matches), and ^ / $ at the
//   start / end of the pattern or of one of its top-level alternatives.
// Not supported, an Error naming it: backreferences, lookaround, \b \B \A \Z, inline flags,
// possessive quantifiers, anchors anywhere else.
// Characters are Unicode code points: `.` or a class matches one code point's UTF-8 sequence;
// surrogates (U+D800–U+DFFF) are never matched.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/code_points.h"

namespace qwen36::text {

// Full: the whole text must match (vLLM's regex output). Search: a match somewhere in the text
// (JSON Schema's `pattern`; ^ and $ anchor it).
enum class RegexMode : uint8_t { Full, Search };

class ByteDfa {
 public:
  static constexpr uint16_t kDead = 0xFFFF;
  static constexpr size_t kMaxStates = 16384;  // more is an Error ("too complex")

  static ByteDfa compile(std::string_view pattern, RegexMode mode);  // throws Error
  // One character (its UTF-8 bytes) of a non-empty code-point set.
  static ByteDfa character(const CodePointRanges& set);
  // Any bytes that do not contain `s` (non-empty) — the text of an XML value before its closing
  // tag, say.
  static ByteDfa avoiding(std::string_view s);
  // The texts both match / either matches (may be empty(); throws Error past kMaxStates).
  static ByteDfa intersect(const ByteDfa& a, const ByteDfa& b);
  static ByteDfa unite(const ByteDfa& a, const ByteDfa& b);

  // No text matches (only intersect / unite of empty automata give one); the state functions
  // below are then not to be called.
  bool empty() const { return flags_.empty(); }

  static constexpr uint16_t start() { return 0; }
  uint16_t next(uint16_t state, uint8_t byte) const { return next_[size_t(state) * classes_ + class_of_[byte]]; }
  // The bytes so far are a match.
  bool accepting(uint16_t state) const { return flags_[state] & kAccepting; }
  // Some byte continues from here.
  bool extendable(uint16_t state) const { return flags_[state] & kExtendable; }
  // Some code point in [lo, hi] (hi <= 0xFF: one or two UTF-8 bytes) continues from here.
  bool continues_with(uint16_t state, uint32_t lo, uint32_t hi) const;
  size_t states() const { return flags_.size(); }

 private:
  enum : uint8_t { kAccepting = 1, kExtendable = 2 };
  friend struct DfaBuilder;
  std::array<uint8_t, 256> class_of_{};  // bytes that every transition treats alike share a class
  uint16_t classes_ = 1;
  std::vector<uint16_t> next_;  // [state * classes_ + class]
  std::vector<uint8_t> flags_;
};

// The pattern matching exactly `literal` (its metacharacters escaped).
std::string regex_escape(std::string_view literal);

}  // namespace qwen36::text
