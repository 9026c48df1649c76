// number_range: bounded JSON numbers as an automaton (number_range.h).
#include "text/number_range.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace qwen36::text {

namespace {

// A decimal as sign, integer digits (no leading zeros; "0" for none) and fraction digits (no
// trailing zeros).
struct Decimal {
  bool negative = false;
  std::string whole = "0", frac;
  bool zero() const { return whole == "0" && frac.empty(); }
};

Decimal parse_decimal(std::string_view text) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) d.negative = text[i++] == '-';
  std::string digits;
  long point = -1;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') {
      QWEN36_CHECK(point < 0, "'{}' is not a number", text);
      point = long(digits.size());
    } else {
      QWEN36_CHECK(text[i] >= '0' && text[i] <= '9', "'{}' is not a number", text);
      digits += text[i];
    }
  }
  QWEN36_CHECK(!digits.empty(), "'{}' is not a number", text);
  if (point < 0) point = long(digits.size());
  if (i < text.size()) {
    const std::string exp(text.substr(i + 1));
    QWEN36_CHECK(!exp.empty() && exp.size() < 6, "'{}' has an exponent out of range", text);
    point += std::stol(exp);  // "+21", "-07"
  }
  QWEN36_CHECK(point > -1000 && point < 1000, "'{}' is out of range", text);
  if (point <= 0) {
    d.frac = std::string(size_t(-point), '0') + digits;
  } else if (size_t(point) >= digits.size()) {
    d.whole = digits + std::string(size_t(point) - digits.size(), '0');
  } else {
    d.whole = digits.substr(0, size_t(point));
    d.frac = digits.substr(size_t(point));
  }
  d.whole.erase(0, std::min(d.whole.find_first_not_of('0'), d.whole.size() - 1));
  while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
  if (d.zero()) d.negative = false;
  return d;
}

std::string digit_range(char lo, char hi) {
  if (lo == hi) return std::string(1, lo);
  return std::string("[") + lo + "-" + hi + "]";
}

std::string join(const std::vector<std::string>& alts) {
  std::string out = "(?:";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
  return out + ")";
}

// Integer parts (no leading zeros) greater than w, as alternatives.
void int_greater(const std::string& w, std::vector<std::string>& alts) {
  const size_t n = w.size();
  alts.push_back("[1-9]\\d{" + std::to_string(n) + ",}");  // more digits
  for (size_t k = 0; k < n; ++k) {                         // same length: first larger digit at k
    const char lo = char(std::max(w[k] + 1, k == 0 ? int('1') : int('0')));
    if (lo > '9') continue;
    alts.push_back(w.substr(0, k) + digit_range(lo, '9') + "\\d{" + std::to_string(n - k - 1) + "}");
  }
}

// Integer parts less than w.
void int_less(const std::string& w, std::vector<std::string>& alts) {
  const size_t n = w.size();
  if (n >= 2) alts.push_back("\\d");                                          // one digit, 0 included
  if (n >= 3) alts.push_back("[1-9]\\d{1," + std::to_string(n - 2) + "}");  // 2 .. n-1 digits
  for (size_t k = 0; k < n; ++k) {
    const char lo = k == 0 && n > 1 ? '1' : '0';
    if (w[k] - 1 < lo) continue;
    alts.push_back(w.substr(0, k) + digit_range(lo, char(w[k] - 1)) + "\\d{" + std::to_string(n - k - 1) + "}");
  }
}

// The optional fraction ("\.digits") of numbers whose fraction is >= (> when strict) 0.f;
// nullopt when none is.
std::optional<std::string> frac_at_least(const std::string& f, bool strict) {
  if (f.empty()) return strict ? "\\.\\d*[1-9]\\d*" : "(?:\\.\\d+)?";
  std::vector<std::string> alts;
  for (size_t k = 0; k < f.size(); ++k)
    if (f[k] < '9') alts.push_back(f.substr(0, k) + digit_range(char(f[k] + 1), '9') + "\\d*");
  alts.push_back(f + (strict ? "\\d*[1-9]\\d*" : "\\d*"));
  return "\\." + join(alts);
}

// ... <= (< when strict) 0.g.
std::optional<std::string> frac_at_most(const std::string& g, bool strict) {
  if (g.empty()) return strict ? std::nullopt : std::optional<std::string>("(?:\\.0+)?");
  std::vector<std::string> alts;
  for (size_t k = 0; k < g.size(); ++k)
    if (g[k] > '0') alts.push_back(g.substr(0, k) + digit_range('0', char(g[k] - 1)) + "\\d*");
  for (size_t j = 1; j < g.size(); ++j) alts.push_back(g.substr(0, j));  // g ends in a non-zero digit
  if (!strict) alts.push_back(g + "0*");
  return "(?:\\." + join(alts) + ")?";
}

// Unsigned numbers (magnitudes) >= a (> when strict); nullopt: none.
std::optional<std::string> at_least(const Decimal& a, bool strict, bool integer) {
  std::vector<std::string> alts, larger;
  int_greater(a.whole, larger);
  const std::string any_frac = integer ? "" : "(?:\\.\\d+)?";
  alts.push_back(join(larger) + any_frac);
  if (integer) {
    if (a.frac.empty() && !strict) alts.push_back(a.whole);
  } else if (auto f = frac_at_least(a.frac, strict)) {
    alts.push_back(a.whole + *f);
  }
  return join(alts);
}

std::optional<std::string> at_most(const Decimal& b, bool strict, bool integer) {
  std::vector<std::string> alts, smaller;
  int_less(b.whole, smaller);
  const std::string any_frac = integer ? "" : "(?:\\.\\d+)?";
  if (!smaller.empty()) alts.push_back(join(smaller) + any_frac);
  if (integer) {
    if (!b.frac.empty() || !strict) alts.push_back(b.whole);
  } else if (auto f = frac_at_most(b.frac, strict)) {
    alts.push_back(b.whole + *f);
  }
  if (alts.empty()) return std::nullopt;
  return join(alts);
}

// The numbers of one sign: `sign` ("" or "-") then a magnitude within [lo, hi] (each optional),
// of the shape allowed; empty when none.
ByteDfa signed_part(const std::string& sign, const std::optional<std::string>& lo, const std::optional<std::string>& hi,
                    const std::string& shape) {
  ByteDfa d = ByteDfa::compile(sign + shape, RegexMode::Full);
  for (const auto& side : {lo, hi})
    if (side) d = ByteDfa::intersect(d, ByteDfa::compile(sign + *side, RegexMode::Full));
  return d;
}

}  // namespace

ByteDfa number_range(const std::optional<NumberBound>& lo_bound, const std::optional<NumberBound>& hi_bound,
                     bool integer) {
  std::optional<Decimal> lo, hi;
  if (lo_bound) lo = parse_decimal(lo_bound->value);
  if (hi_bound) hi = parse_decimal(hi_bound->value);
  const bool lo_excl = lo_bound && lo_bound->exclusive, hi_excl = hi_bound && hi_bound->exclusive;
  size_t whole_digits = kMaxWholeDigits;
  for (const auto& d : {lo, hi})
    if (d) whole_digits = std::max(whole_digits, d->whole.size());
  const std::string shape = "(?:0|[1-9]\\d{0," + std::to_string(whole_digits - 1) + "})" +
                            (integer ? "" : "(?:\\.\\d{1," + std::to_string(kMaxFracDigits) + "})?");
  const Decimal zero;
  ByteDfa out;
  // Values >= 0, written without a sign.
  if (!hi || !hi->negative) {
    const bool positive_lo = lo && !lo->negative && !(lo->zero() && !lo_excl);
    std::optional<std::string> above = positive_lo ? at_least(*lo, lo_excl, integer) : std::nullopt;
    std::optional<std::string> below = hi ? at_most(*hi, hi_excl, integer) : std::nullopt;
    if (!(hi && !below)) out = signed_part("", above, below, shape);
  }
  // Values < 0: "-" and a magnitude > 0 within [-hi, -lo].
  if (!lo || lo->negative) {
    const bool negative_hi = hi && hi->negative;
    std::optional<std::string> above = negative_hi ? at_least(*hi, hi_excl, integer) : at_least(zero, true, integer);
    std::optional<std::string> below = lo ? at_most(*lo, lo_excl, integer) : std::nullopt;
    if (!(lo && !below)) {
      const ByteDfa neg = signed_part("-", above, below, shape);
      out = out.empty() ? neg : neg.empty() ? out : ByteDfa::unite(out, neg);
    }
  }
  QWEN36_CHECK(!out.empty(), "no {} lies within the bounds", integer ? "integer" : "number");
  return out;
}

}  // namespace qwen36::text
