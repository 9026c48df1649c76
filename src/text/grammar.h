#pragma once
// defines: Grammar (a context-free grammar in llama.cpp's GBNF, compiled to byte-level rules),
//          GrammarMatcher (byte-level recogniser of the grammar's sentences)
//
// Structured output's third form after JSON schemas and regular expressions: llama-server's
// `grammar` field and `qwen36 run --grammar-file`. GBNF, as llama.cpp documents it:
//   name ::= alternatives      (a rule; `root` is where a sentence starts; # comments)
//   "literal" with \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH escapes, [character classes]
//   with ranges and ^, `.` (any character), rule names, ( groups ), | alternatives, and the
//   repetitions * + ? {m} {m,} {m,n}. At the top level a newline ends a rule's body (inside
//   parentheses newlines are spaces). Token references (<[id]>) are not supported.
// Characters are Unicode code points; literals compile to UTF-8 bytes and a character class to
// an automaton over one character's bytes, so the matcher reads token bytes directly. Compilation refuses, naming the rule: undefined rules, a
// missing root, left recursion (the matcher expands rules depth-first), rules that match no
// finite text; alternatives that can never end are dropped, so every state the matcher reaches
// can still complete a sentence and a mask never leads into a dead end.
//
// The matcher follows every parse at once (a set of stacks, as llama.cpp's sampler does); stacks
// are shared nodes interned in an arena that a matcher and its copies share, so a copy is a few
// words and a byte's effect on a stack is computed once and cached.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/json_schema.h"
#include "text/regex.h"

namespace qwen36::text {

class Grammar {
 public:
  // A value the engine's own grammars embed (a tool call's arguments), written %0, %1, ... in the
  // text: a JSON document of `json`, or raw text that `text` matches in full. A user's grammar
  // has none.
  struct Embedded {
    std::shared_ptr<const JsonSchema> json;
    std::shared_ptr<const ByteDfa> text;
  };
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, std::vector<Embedded> values = {});

  // A compiled rule's alternatives are element runs in elems, each ending with kEnd.
  struct Elem {
    enum Kind : uint8_t { kBytes, kClass, kJson, kText, kRule, kEnd } kind;
    uint8_t lo = 0, hi = 0;  // kBytes: one byte in [lo, hi]
    uint32_t ref = 0;        // kRule: the rule; kClass: the class's automaton (one character's
                             // bytes); kJson / kText: the embedded value
  };
  const std::vector<Elem>& elems() const { return elems_; }
  const ByteDfa& character_class(uint32_t i) const { return classes_[i]; }
  const std::shared_ptr<const JsonSchema>& json(uint32_t i) const { return embedded_[i].json; }
  const ByteDfa& text(uint32_t i) const { return *embedded_[i].text; }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return alts_[rule]; }
  uint32_t root() const { return root_; }

 private:
  friend struct GrammarCompiler;
  std::vector<Elem> elems_;
  std::vector<std::vector<uint32_t>> alts_;  // rule -> the first element of each alternative
  std::vector<ByteDfa> classes_;
  std::vector<Embedded> embedded_;
  uint32_t root_ = 0;
};

// `text` as a GBNF string literal (quoted, escaped).
std::string gbnf_literal(std::string_view text);

class GrammarMatcher {
 public:
  static constexpr int kMaxParses = 64;  // stacks alive at once; more is an Error (too ambiguous)

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  GrammarMatcher(const GrammarMatcher& other) = default;
  GrammarMatcher& operator=(const GrammarMatcher& other);

  // Consumes the byte if the text stays a prefix of a sentence; false (state unchanged) otherwise.
  bool feed(uint8_t byte);
  bool feed(std::string_view bytes);  // all or nothing
  bool complete() const { return accept_; }               // the text is a whole sentence
  bool finished() const { return accept_ && count_ == 0; }  // ... and nothing may follow
  size_t hash() const;
  bool operator==(const GrammarMatcher& other) const;

 private:
  struct Arena;
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<Arena> arena_;
  uint8_t count_ = 0;  // live stacks: heads_[0, count_), sorted
  bool accept_ = false;
  std::array<uint32_t, kMaxParses> heads_{};  // the arena's stack nodes, each at a byte element
};

}  // namespace qwen36::text
