#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace qwen36 {

void SamplingParams::validate() const {
  QWEN36_CHECK(std::isfinite(temperature) && temperature >= 0 && temperature <= 100,
               "temperature {} is out of range (0..100)", temperature);
  QWEN36_CHECK(top_k >= 0, "top_k {} must be >= 0", top_k);
  QWEN36_CHECK(top_p > 0 && top_p <= 1, "top_p {} is out of range (0, 1]", top_p);
  QWEN36_CHECK(min_p >= 0 && min_p <= 1, "min_p {} is out of range [0, 1]", min_p);
  QWEN36_CHECK(repetition_penalty > 0 && repetition_penalty <= 10, "repetition_penalty {} is out of range (0, 10]",
               repetition_penalty);
  QWEN36_CHECK(std::abs(presence_penalty) <= 2 && std::abs(frequency_penalty) <= 2,
               "presence/frequency penalties must be within [-2, 2]");
  QWEN36_CHECK(penalty_last_n >= -1, "penalty_last_n {} must be >= -1", penalty_last_n);
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // first maximum
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { p_.validate(); }

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) const {
  if (p_.repetition_penalty == 1.0f && p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f) return;
  const size_t n = p_.penalty_last_n < 0 ? history.size() : std::min(history.size(), size_t(p_.penalty_last_n));
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history.last(n))
    if (t >= 0 && size_t(t) < logits.size()) ++counts[t];
  for (const auto& [t, c] : counts) {
    float& l = logits[size_t(t)];
    if (p_.repetition_penalty != 1.0f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    l -= p_.presence_penalty + p_.frequency_penalty * float(c);
  }
}

std::vector<std::pair<int32_t, float>> Sampler::distribution(std::span<float> logits,
                                                             std::span<const int32_t> history) {
  apply_penalties(logits, history);
  std::vector<std::pair<int32_t, float>> cand;
  if (p_.temperature == 0.0f) {
    cand.emplace_back(argmax(logits), 1.0f);
    return cand;
  }
  cand.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand.emplace_back(int32_t(i), logits[i] / p_.temperature);
  auto by_logit = [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); };
  if (p_.top_k > 0 && size_t(p_.top_k) < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + p_.top_k, cand.end(), by_logit);
    cand.resize(size_t(p_.top_k));
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  // Softmax over the survivors (sorted, highest first).
  const float mx = cand.front().second;
  double sum = 0;
  for (auto& c : cand) sum += c.second = std::exp(c.second - mx);
  for (auto& c : cand) c.second = float(c.second / sum);
  if (p_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < cand.size() && acc < p_.top_p) acc += cand[keep++].second;
    cand.resize(std::max<size_t>(keep, 1));
  }
  if (p_.min_p > 0.0f) {
    const float floor = p_.min_p * cand.front().second;
    size_t keep = 1;
    while (keep < cand.size() && cand[keep].second >= floor) ++keep;
    cand.resize(keep);
  }
  double total = 0;
  for (const auto& c : cand) total += c.second;
  for (auto& c : cand) c.second = float(c.second / total);
  return cand;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const auto cand = distribution(logits, history);
  if (cand.size() == 1) return cand.front().first;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double acc = 0;
  for (const auto& c : cand) {
    acc += c.second;
    if (u < acc) return c.first;
  }
  return cand.back().first;
}

}  // namespace qwen36
