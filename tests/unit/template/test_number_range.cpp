// Bounded numbers (JSON Schema minimum / maximum / exclusive*): the automaton of number_range
// against exact decimal comparison on random bounds and random numbers, and in schemas.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

#include "json_matcher_util.h"
#include "text/number_range.h"

namespace qwen36::text {
namespace {

using namespace json_test;

bool matches(const ByteDfa& d, std::string_view text) {
  uint16_t s = ByteDfa::start();
  for (char c : text)
    if ((s = d.next(s, uint8_t(c))) == ByteDfa::kDead) return false;
  return d.accepting(s);
}

// A number with up to 3 fraction digits, as text and as thousandths.
struct Num {
  std::string text;
  int64_t milli;
};

Num random_num(std::mt19937& rng, bool allow_frac) {
  const int64_t whole = int64_t(rng() % 2401) - 1200;
  const int frac_digits = allow_frac ? int(rng() % 4) : 0;
  std::string frac;
  for (int k = 0; k < frac_digits; ++k) frac += char('0' + rng() % 10);
  const bool negative = whole < 0 || (whole == 0 && rng() % 3 == 0);
  int64_t milli = std::abs(whole) * 1000;
  for (int k = 0; k < 3; ++k) milli += (k < frac_digits ? frac[size_t(k)] - '0' : 0) * (k == 0 ? 100 : k == 1 ? 10 : 1);
  Num n{(negative ? "-" : "") + std::to_string(std::abs(whole)) + (frac.empty() ? "" : "." + frac), negative ? -milli : milli};
  return n;
}

TEST(NumberRange, AgreesWithExactComparison) {
  std::mt19937 rng(42);
  int checked = 0, inside = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool integer = trial % 3 == 0;
    std::optional<NumberBound> lo, hi;
    Num lo_n{}, hi_n{};
    if (rng() % 4) lo_n = random_num(rng, true), lo = NumberBound{lo_n.text, rng() % 2 == 0};
    if (rng() % 4) hi_n = random_num(rng, true), hi = NumberBound{hi_n.text, rng() % 2 == 0};
    auto in_range = [&](int64_t v) {
      return (!lo || (lo->exclusive ? v > lo_n.milli : v >= lo_n.milli)) &&
             (!hi || (hi->exclusive ? v < hi_n.milli : v <= hi_n.milli));
    };
    ByteDfa d;
    try {
      d = number_range(lo, hi, integer);
    } catch (const Error& e) {
      // Only when nothing fits: check a dense sample of the interval finds nothing.
      for (int64_t v = -1300000; v <= 1300000; v += integer ? 1000 : 1) ASSERT_FALSE(in_range(v)) << e.what() << " " << v;
      continue;
    }
    for (int k = 0; k < 200; ++k) {
      const Num n = random_num(rng, !integer || rng() % 4 == 0);
      const bool negative_zero = n.text[0] == '-' && n.milli == 0;
      const bool fraction = n.text.find('.') != std::string::npos;
      const bool want = in_range(n.milli) && !negative_zero && !(integer && fraction);
      ASSERT_EQ(matches(d, n.text), want) << n.text << " in " << (lo ? lo->value : "-inf") << (lo && lo->exclusive ? "(x)" : "")
                                          << " .. " << (hi ? hi->value : "inf") << (hi && hi->exclusive ? "(x)" : "")
                                          << (integer ? " integer" : "");
      ++checked;
      inside += want;
    }
  }
  EXPECT_GT(inside, checked / 5);
}

TEST(NumberRange, BoundsAsWritten) {
  const ByteDfa tenth = number_range(NumberBound{"0.1", true}, std::nullopt, false);  // exactly one tenth
  EXPECT_FALSE(matches(tenth, "0.1"));
  EXPECT_TRUE(matches(tenth, "0.1000000000000001"));
  EXPECT_TRUE(matches(tenth, "0.11"));
  const ByteDfa exp = number_range(NumberBound{"2.5e-3", false}, NumberBound{"1E+2", false}, false);
  EXPECT_TRUE(matches(exp, "0.0025"));
  EXPECT_FALSE(matches(exp, "0.0024"));
  EXPECT_TRUE(matches(exp, "100"));
  EXPECT_FALSE(matches(exp, "100.01"));
  EXPECT_FALSE(matches(exp, "1e2")) << "no exponent under bounds";
  const ByteDfa big = number_range(NumberBound{"1e25", false}, std::nullopt, true);  // longer than 20 digits
  EXPECT_TRUE(matches(big, "10000000000000000000000000"));
  EXPECT_FALSE(matches(big, "9999999999999999999999999"));
  EXPECT_THROW(number_range(NumberBound{"2", false}, NumberBound{"1", false}, false), Error);
  EXPECT_THROW(number_range(NumberBound{"1.2", false}, NumberBound{"1.8", false}, true), Error);
  EXPECT_THROW(number_range(NumberBound{"0", true}, NumberBound{"0", false}, false), Error);
}

TEST(NumberRange, InSchemas) {
  const Schema s = compile(R"({"type": "object", "properties": {
      "month": {"type": "integer", "minimum": 1, "maximum": 12},
      "price": {"type": "number", "exclusiveMinimum": 0},
      "t": {"type": "number", "minimum": -5, "exclusiveMaximum": true, "maximum": 5}}})");
  EXPECT_TRUE(accepts(s, R"({"month": 12, "price": 0.5, "t": -5})"));
  EXPECT_TRUE(accepts(s, R"({"month": 1, "price": 19.99, "t": 4.999})"));
  EXPECT_EQ(refused_at(s, R"({"month": 13)"), 11u);
  EXPECT_EQ(refused_at(s, R"({"month": 0)"), 10u);
  EXPECT_EQ(refused_at(s, R"({"price": 0})"), 11u) << "0 is not above 0: the number cannot end there";
  EXPECT_EQ(refused_at(s, R"({"price": -)"), 10u);
  EXPECT_EQ(refused_at(s, R"({"t": 5)"), 6u) << "draft 4: maximum made exclusive";
  // A bounded number ends where it cannot go on: top level complete and finished.
  JsonMatcher m(compile(R"({"type": "integer", "minimum": 1, "maximum": 12})"));
  ASSERT_TRUE(m.feed(std::string_view("12")));
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.finished());
  JsonMatcher one(compile(R"({"type": "integer", "minimum": 1, "maximum": 12})"));
  ASSERT_TRUE(one.feed(std::string_view("1")));
  EXPECT_TRUE(one.complete());
  EXPECT_FALSE(one.finished()) << "10, 11, 12 may follow";
  EXPECT_NE(error_of(R"({"type": "integer", "minimum": 3, "maximum": 2})").find("no integer lies within"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "number", "minimum": "3"})").find("'minimum' must be a number"), std::string::npos);
  // Both forms on one side: the tighter applies.
  const Schema both = compile(R"({"type": "number", "minimum": 1, "exclusiveMinimum": 2})");
  EXPECT_EQ(refused_at(both, "2 "), 1u);
  EXPECT_TRUE(accepts(both, "2.5"));
}

}  // namespace
}  // namespace qwen36::text
