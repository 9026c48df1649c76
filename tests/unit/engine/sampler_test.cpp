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
}

}  // namespace
}  // namespace qwen36
