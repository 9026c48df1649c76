#pragma once
// defines: OutputMatcher (a JSON-schema matcher or a grammar matcher behind the one interface
//          token_constraint.h walks the vocabulary with)

#include <cstdint>
#include <string_view>
#include <variant>

#include "text/grammar.h"
#include "text/json_schema.h"

namespace qwen36 {

class OutputMatcher {
 public:
  explicit OutputMatcher(text::JsonMatcher m) : m_(std::move(m)) {}
  explicit OutputMatcher(text::GrammarMatcher m) : m_(std::move(m)) {}

  bool feed(uint8_t byte) {
    return std::visit([&](auto& m) { return m.feed(byte); }, m_);
  }
  bool feed(std::string_view bytes) {
    return std::visit([&](auto& m) { return m.feed(bytes); }, m_);
  }
  bool complete() const {
    return std::visit([](const auto& m) { return m.complete(); }, m_);
  }
  bool finished() const {
    return std::visit([](const auto& m) { return m.finished(); }, m_);
  }
  size_t hash() const {
    return std::visit([](const auto& m) { return m.hash(); }, m_);
  }
  bool operator==(const OutputMatcher& other) const { return m_ == other.m_; }

  // The JSON matcher's shortcuts for the vocabulary walk (a grammar has none).
  bool in_free_string() const {
    const auto* j = std::get_if<text::JsonMatcher>(&m_);
    return j && j->in_free_string();
  }
  text::JsonMatcher::Automaton automaton() const {
    const auto* j = std::get_if<text::JsonMatcher>(&m_);
    return j ? j->automaton() : text::JsonMatcher::Automaton{};
  }
  void set_automaton_state(uint16_t state) { std::get<text::JsonMatcher>(m_).set_automaton_state(state); }

 private:
  std::variant<text::JsonMatcher, text::GrammarMatcher> m_;
};

}  // namespace qwen36
