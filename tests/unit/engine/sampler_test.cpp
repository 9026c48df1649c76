// Sampler: each filter against its definition, penalties, seeding, and the empirical
// distribution of draws against the filtered softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/sampler.h"

namespace qwen36 {
namespace {

std::vector<float> logits_of(std::initializer_list<float> l) { return std::vector<float>(l); }

std::map<int32_t, float> dist(SamplingParams p, std::vector<float> logits, std::vector<int32_t> history = {}) {
  Sampler s(p);
  std::map<int32_t, float> m;
  for (auto [id, prob] : s.distribution(logits, history)) m[id] = prob;
  return m;
}

SamplingParams plain(float temp) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  return p;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler s(SamplingParams::greedy());
  auto l = logits_of({0.1f, 3.0f, -1.0f, 3.0f});
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, TemperatureSoftmax) {
  const auto d = dist(plain(2.0f), logits_of({0.0f, 1.0f, 2.0f}));
  const double z = 1 + std::exp(0.5) + std::exp(1.0);
  EXPECT_NEAR(d.at(0), 1 / z, 1e-6);
  EXPECT_NEAR(d.at(1), std::exp(0.5) / z, 1e-6);
  EXPECT_NEAR(d.at(2), std::exp(1.0) / z, 1e-6);
}

TEST(Sampler, TopKKeepsTheKLargest) {
  auto p = plain(1.0f);
  p.top_k = 2;
  const auto d = dist(p, logits_of({1.0f, 4.0f, 3.0f, 2.0f}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(d.count(1) && d.count(2));
  EXPECT_NEAR(d.at(1), 1 / (1 + std::exp(-1.0)), 1e-6);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  auto p = plain(1.0f);
  p.top_p = 0.7f;
  // probabilities ~ 0.64, 0.24, 0.09, 0.03: 0.64 < 0.7, so two tokens are needed
  const auto d = dist(p, logits_of({3.0f, 2.0f, 1.0f, 0.0f}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.at(0) + d.at(1), 1.0, 1e-6);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  auto p = plain(1.0f);
  p.min_p = 0.3f;  // keeps p >= 0.3 * p_max: exp(-1) = 0.37 stays, exp(-2) = 0.14 goes
  const auto d = dist(p, logits_of({5.0f, 4.0f, 3.0f}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_FALSE(d.count(2));
}

// The temperature last (llama.cpp's chain): min-p cuts the untempered distribution, then the
// kept tokens are drawn at T. Logits 5, 4, 3 with min_p 0.3: untempered, exp(-1) = 0.37 stays and
// exp(-2) = 0.14 goes; at T = 4 first all three would stay (exp(-0.5) = 0.61 > 0.3).
TEST(Sampler, TemperatureLastFiltersBeforeTempering) {
  auto p = plain(4.0f);
  p.min_p = 0.3f;
  EXPECT_EQ(dist(p, logits_of({5.0f, 4.0f, 3.0f})).size(), 3u);
  p.temperature_last = true;
  const auto d = dist(p, logits_of({5.0f, 4.0f, 3.0f}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.at(0), 1 / (1 + std::exp(-0.25)), 1e-6);  // the kept two at T = 4
  EXPECT_NEAR(d.at(1), std::exp(-0.25) / (1 + std::exp(-0.25)), 1e-6);
  // Without a filter the order does not matter.
  auto q = plain(4.0f);
  const auto first = dist(q, logits_of({5.0f, 4.0f, 3.0f}));
  q.temperature_last = true;
  const auto last = dist(q, logits_of({5.0f, 4.0f, 3.0f}));
  for (int32_t t : {0, 1, 2}) EXPECT_NEAR(first.at(t), last.at(t), 1e-6);
}

// Typical-p: surprise −log p against the entropy H. Probabilities 0.5, 0.25, 0.125, 0.125:
// H = 1.75 bits; surprises 1, 2, 3, 3 bits, distances 0.75, 0.25, 1.25, 1.25. Token 1 first
// (0.25 < 0.3), then token 0 (0.75): the kept set is {0, 1}, renormalised 2/3, 1/3.
TEST(Sampler, TypicalPKeepsTheTokensNearestTheEntropy) {
  auto p = plain(1.0f);
  p.typical_p = 0.3f;
  const float l2 = std::log(2.0f);
  const auto d = dist(p, logits_of({3 * l2, 2 * l2, l2, l2}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.at(0), 2.0 / 3, 1e-6);
  EXPECT_NEAR(d.at(1), 1.0 / 3, 1e-6);
  p.typical_p = 0.2f;  // token 1 alone holds 0.25
  EXPECT_EQ(dist(p, logits_of({3 * l2, 2 * l2, l2, l2})).size(), 1u);
  EXPECT_EQ(dist(p, logits_of({3 * l2, 2 * l2, l2, l2})).count(1), 1u) << "the most typical, not the most likely";
}

// Top-n-sigma: logits 10, 9, 0, 0, 0, 0 have mean 19/6 and σ ≈ 4.34: n = 0.5 keeps x ≥ 7.83.
TEST(Sampler, TopNSigmaKeepsTokensNearTheLargestLogit) {
  auto p = plain(1.0f);
  p.top_n_sigma = 0.5f;
  const auto d = dist(p, logits_of({10, 9, 0, 0, 0, 0}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d.at(0), 1 / (1 + std::exp(-1.0)), 1e-6);
  p.top_n_sigma = 3.0f;  // 10 − 13.0 < 0: everything stays
  EXPECT_EQ(dist(p, logits_of({10, 9, 0, 0, 0, 0})).size(), 6u);
  p.temperature = 0.5f;  // the same set at any temperature (x and σ scale alike)
  p.top_n_sigma = 0.5f;
  EXPECT_EQ(dist(p, logits_of({10, 9, 0, 0, 0, 0})).size(), 2u);
}

TEST(Sampler, RepetitionAndPresencePenalties) {
  auto p = SamplingParams::greedy();
  p.repetition_penalty = 2.0f;
  // token 0 (logit 3, seen) becomes 1.5 < token 1 (2.0)
  Sampler s(p);
  auto l = logits_of({3.0f, 2.0f, -1.0f});
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0}), 1);
  EXPECT_FLOAT_EQ(l[0], 1.5f);

  auto q = SamplingParams::greedy();
  q.presence_penalty = 1.5f;
  q.frequency_penalty = 0.25f;
  Sampler s2(q);
  auto l2 = logits_of({3.0f, 2.0f, -1.0f});
  s2.sample(l2, std::vector<int32_t>{0, 0, 2});
  EXPECT_FLOAT_EQ(l2[0], 3.0f - 1.5f - 0.5f);
  EXPECT_FLOAT_EQ(l2[2], -1.0f - 1.5f - 0.25f);
  EXPECT_FLOAT_EQ(l2[1], 2.0f);
}

TEST(Sampler, SameSeedSameDraws) {
  auto p = plain(1.0f);
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int32_t> da, db;
  for (int i = 0; i < 50; ++i) {
    auto la = logits_of({0.0f, 0.5f, 1.0f, 1.5f}), lb = la;
    da.push_back(a.sample(la, {}));
    db.push_back(b.sample(lb, {}));
  }
  EXPECT_EQ(da, db);
}

// Chi-square goodness of fit of 20,000 draws against the filtered distribution
// (3 degrees of freedom; 16.27 is the 0.1% critical value).
TEST(Sampler, DrawsFollowTheDistribution) {
  auto p = plain(0.8f);
  p.seed = 7;
  const auto want = dist(p, logits_of({0.0f, 0.5f, 1.0f, 1.5f}));
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    auto l = logits_of({0.0f, 0.5f, 1.0f, 1.5f});
    ++counts[s.sample(l, {})];
  }
  double chi2 = 0;
  for (auto [id, prob] : want) {
    const double e = prob * n;
    chi2 += (counts[id] - e) * (counts[id] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);
}

TEST(Sampler, RejectsBadParameters) {
  auto p = plain(1.0f);
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = plain(-1.0f);
  EXPECT_THROW(Sampler{p}, Error);
  p = plain(std::nanf(""));
  EXPECT_THROW(Sampler{p}, Error);
  p = plain(1.0f);
  p.min_p = 2;
  EXPECT_THROW(Sampler{p}, Error);
  p = plain(1.0f);
  p.typical_p = 0;
  EXPECT_THROW(Sampler{p}, Error);
  p = plain(1.0f);
  p.top_n_sigma = -1;
  EXPECT_THROW(Sampler{p}, Error);
}

}  // namespace
}  // namespace qwen36
