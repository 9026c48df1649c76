#pragma once
// defines: NumberBound, number_range (the JSON numbers within JSON Schema's minimum / maximum /
//          exclusiveMinimum / exclusiveMaximum, as a ByteDfa)
//
// A bounded number is matched like a pattern: its bytes step an automaton built from regular
// expressions of the decimal comparisons (a longer integer part is larger; at equal length the
// first differing digit decides; then the fraction), intersected with the number's shape.
// Bounds are exact decimals as written in the schema (0.1 is one tenth, not the nearest double).
// The language is a subset of JSON's number syntax: no exponent, no "-0", at most
// kMaxWholeDigits integer digits (or the bound's count, when longer) and kMaxFracDigits
// fraction digits — every in-range value is still writable at that precision.

#include <optional>
#include <string>

#include "text/regex.h"

namespace qwen36::text {

struct NumberBound {
  std::string value;  // a JSON number's text: "3", "-1.5", "2.5e-3"
  bool exclusive = false;
};

constexpr int kMaxWholeDigits = 20;
constexpr int kMaxFracDigits = 16;

// Throws Error when no number (no integer, when `integer`) lies within the bounds.
ByteDfa number_range(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi, bool integer);

}  // namespace qwen36::text
