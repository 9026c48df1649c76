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
  QWEN36_CHECK(typical_p > 0 && typical_p <= 1, "typical_p {} is out of range (0, 1]", typical_p);
  QWEN36_CHECK(std::isfinite(top_n_sigma) && top_n_sigma >= 0, "top_n_sigma {} must be >= 0", top_n_sigma);
  QWEN36_CHECK(repetition_penalty > 0 && repetition_penalty <= 10, "repetition_penalty {} is out of range (0, 10]",
               repetition_penalty);
  QWEN36_CHECK(std::abs(presence_penalty) <= 2 && std::abs(frequency_penalty) <= 2,
               "presence/frequency penalties must be within [-2, 2]");
  QWEN36_CHECK(penalty_last_n >= -1, "penalty_last_n {} must be >= -1", penalty_last_n);
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // first maximum
}

namespace {

using Cand = std::pair<int32_t, float>;

// The order of the draw's candidates: x = logit / T descending, ties to the lower id.
bool by_logit(const Cand& a, const Cand& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); }

// How many of the softmax set's first tokens top-p and min-p keep. e: the set's exp(x − max)
// in by_logit order, sum their Σ (double, in that order).
size_t kept_count(const std::vector<float>& e, double sum, const SamplingParams& p) {
  size_t keep = e.size();
  if (p.top_p < 1.0f) {
    double acc = 0;
    size_t n = 0;
    while (n < e.size() && acc < p.top_p) acc += float(e[n++] / sum);
    keep = std::max<size_t>(n, 1);
  }
  if (p.min_p > 0.0f) {
    const float floor = p.min_p * float(e[0] / sum);
    size_t n = 1;
    while (n < keep && float(e[n] / sum) >= floor) ++n;
    keep = n;
  }
  return keep;
}

// The temperature the filters see: 1 when the temperature comes last (T > 0 here).
float filter_temperature(const SamplingParams& p) { return p.temperature_last ? 1.0f : p.temperature; }

// The kept tokens' distribution, renormalised from their own exponentials: it depends on the
// kept tokens only, not on the rest of the softmax set (which the candidate path may not have).
// With the temperature last the filters saw x = logit, and the kept tokens are drawn at T: their
// exponentials are taken again, of (x − x_max) / T.
std::vector<Cand> normalise(const std::vector<Cand>& cand, const std::vector<float>& e, size_t keep,
                            const SamplingParams& p) {
  std::vector<float> tempered;
  const std::vector<float>* w = &e;
  if (p.temperature_last && p.temperature != 1.0f) {
    tempered.resize(keep);
    for (size_t i = 0; i < keep; ++i) tempered[i] = std::exp((cand[i].second - cand[0].second) / p.temperature);
    w = &tempered;
  }
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += (*w)[i];
  std::vector<Cand> out(keep);
  for (size_t i = 0; i < keep; ++i) out[i] = {cand[i].first, float((*w)[i] / total)};
  return out;
}

// Locally typical sampling (Meister et al.): of the set (sorted by by_logit), the tokens whose
// surprise −log p is closest to the entropy, fewest first, until they hold typical_p of the
// probability; returned in by_logit order (the filters after it see a set as any other).
std::vector<Cand> typical(const std::vector<Cand>& cand, float typical_p) {
  const float mx = cand.front().second;
  std::vector<double> prob(cand.size());
  double sum = 0, entropy = 0;
  for (size_t i = 0; i < cand.size(); ++i) sum += prob[i] = std::exp(double(cand[i].second - mx));
  for (double& q : prob) {
    q /= sum;
    if (q > 0) entropy -= q * std::log(q);
  }
  std::vector<size_t> order(cand.size());
  std::vector<double> distance(cand.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
    distance[i] = prob[i] > 0 ? std::abs(-std::log(prob[i]) - entropy) : INFINITY;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance[a] < distance[b]; });
  double acc = 0;
  size_t keep = 0;
  while (keep < order.size() && (keep == 0 || acc < typical_p)) acc += prob[order[keep++]];
  order.resize(keep);
  std::sort(order.begin(), order.end());  // back to by_logit order
  std::vector<Cand> out;
  out.reserve(keep);
  for (size_t i : order) out.push_back(cand[i]);
  return out;
}

// Top-n-sigma (Tang et al.): the candidates whose x is within n standard deviations of the
// largest, the deviation taken over every finite x of the row.
void top_n_sigma(std::vector<Cand>& cand, float n) {
  double mx = -INFINITY, sum = 0, sq = 0;
  size_t count = 0;
  for (const Cand& c : cand) {
    if (!std::isfinite(c.second)) continue;
    mx = std::max(mx, double(c.second));
    sum += c.second;
    sq += double(c.second) * c.second;
    ++count;
  }
  if (count < 2) return;
  const double mean = sum / double(count);
  const double sigma = std::sqrt(std::max(0.0, sq / double(count) - mean * mean));
  const double floor = mx - double(n) * sigma;
  std::erase_if(cand, [&](const Cand& c) { return !(double(c.second) >= floor); });
}

// Softmax over the set (sorted by by_logit), top-p, min-p, renormalisation.
std::vector<Cand> filter_sorted(const std::vector<Cand>& cand, const SamplingParams& p) {
  const float mx = cand.front().second;
  std::vector<float> e(cand.size());
  double sum = 0;
  for (size_t i = 0; i < cand.size(); ++i) sum += e[i] = std::exp(cand[i].second - mx);
  return normalise(cand, e, kept_count(e, sum, p), p);
}

SampleRowParams row_params(const SamplingParams& p) {
  SampleRowParams r;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  return r;
}

// The seen tokens (< vocab) of the last penalty_last_n of history, with their counts.
std::unordered_map<int32_t, int> seen_counts(const SamplingParams& p, std::span<const int32_t> history, size_t vocab) {
  const size_t n = p.penalty_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.penalty_last_n));
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history.last(n))
    if (t >= 0 && size_t(t) < vocab) ++counts[t];
  return counts;
}

}  // namespace

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { p_.validate(); }

bool Sampler::has_penalties() const {
  return p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
}

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) const {
  if (!has_penalties()) return;
  const SampleRowParams rp = row_params(p_);
  for (const auto& [t, c] : seen_counts(p_, history, logits.size()))
    logits[size_t(t)] = penalised_logit(logits[size_t(t)], rp, c);
}

std::vector<Cand> Sampler::filtered(std::span<float> logits) {
  std::vector<Cand> cand;
  if (p_.temperature == 0.0f) {
    cand.emplace_back(argmax(logits), 1.0f);
    return cand;
  }
  cand.reserve(logits.size());
  const float T = filter_temperature(p_);
  for (size_t i = 0; i < logits.size(); ++i) cand.emplace_back(int32_t(i), logits[i] / T);
  if (p_.top_n_sigma > 0.0f) top_n_sigma(cand, p_.top_n_sigma);
  if (p_.top_k > 0 && size_t(p_.top_k) < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + p_.top_k, cand.end(), by_logit);
    cand.resize(size_t(p_.top_k));
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }
  if (p_.typical_p < 1.0f) return filter_sorted(typical(cand, p_.typical_p), p_);
  return filter_sorted(cand, p_);
}

std::vector<Cand> Sampler::distribution(std::span<float> logits, std::span<const int32_t> history) {
  apply_penalties(logits, history);
  return filtered(logits);
}

int32_t Sampler::draw(const std::vector<Cand>& dist) {
  if (dist.size() == 1) return dist.front().first;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double acc = 0;
  for (const auto& c : dist) {
    acc += c.second;
    if (u < acc) return c.first;
  }
  return dist.back().first;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  apply_penalties(logits, history);
  return draw(filtered(logits));
}

int32_t Sampler::sample_penalised(std::span<float> logits) { return draw(filtered(logits)); }

void Sampler::add_candidate_row(std::span<const int32_t> history, int64_t vocab, std::vector<SampleRowParams>& rows,
                                std::vector<PenaltyEntry>& entries, bool penalties) const {
  SampleRowParams r;
  if (penalties && has_penalties()) {
    r = row_params(p_);
    r.penalty_begin = int32_t(entries.size());
    for (const auto& [t, c] : seen_counts(p_, history, size_t(vocab))) entries.push_back({t, c});
    r.penalty_count = int32_t(entries.size()) - r.penalty_begin;
  }
  r.temperature = p_.temperature > 0 ? filter_temperature(p_) : 0.0f;  // the candidates' stats: what the filters see
  rows.push_back(r);
}

// Why the candidates give sample()'s very token.
//
// sample() sorts the row's (id, x = logit / T) by by_logit ("host order"); its softmax set is
// the first kk of that order (kk = top_k when 0 < top_k < V, else V). The backend ordered the
// candidates by the raw logit, and every other token's logit is ≤ c.next, so its x ≤ next / T
// (division by T > 0 is monotonic under rounding, though it may merge neighbours). The
// candidates whose x is strictly above next / T are therefore exactly the first M tokens of
// the row's host order, with the very same x values (the logits are copies, the division the
// same IEEE operation). All of the row's candidates are when they are the whole row.
//
// (1) kk ≤ M: the softmax set is known; filter_sorted computes what sample() computes from it,
//     float for float (same values, same order, same code).
// (2) kk > M (top_k 0 or beyond the known prefix): sample()'s probabilities are p_i = e_i / S
//     with S the Σ e over a set we do not hold. S is bounded: S ≥ the prefix's own Σ (the full
//     path's running sum passes through it in the same order, and adding positive terms never
//     lowers a rounded sum); S ≤ the row's Σ (the backend's sum_exp, within its error). Top-p
//     stops at i when Σ_{j<i} p_j ≥ top_p and min-p at i when p_i < min_p · p_0 (e_0 = 1);
//     each is decided with margins for S and for the rounding of p_i, and where one stop is
//     certain inside the prefix (with no earlier one uncertain) the kept set is the prefix's
//     first `keep` tokens. normalise() renormalises them from their own e_i, which do not
//     depend on S: the same floats as sample(). Anything undecided: nullopt.
// The draw is the same call on the same distribution, so the generator advances identically;
// nullopt returns before touching it.
std::optional<int32_t> Sampler::sample_from_candidates(const SampleCandidates& c) {
  const size_t n = c.ids.size();
  QWEN36_CHECK(n > 0 && c.logits.size() == n && int64_t(n) <= c.vocab, "sample_from_candidates: {} candidates of {}",
               n, c.vocab);
  if (p_.temperature == 0.0f) return c.ids[0];  // argmax, ties to the lower id: candidate 0
  // Typical-p and top-n-sigma read the whole row (its entropy, its deviation): the row comes to
  // the host.
  if (p_.typical_p < 1.0f || p_.top_n_sigma > 0.0f) return std::nullopt;
  const float T = filter_temperature(p_);
  std::vector<Cand> cand(n);
  for (size_t i = 0; i < n; ++i) cand[i] = {c.ids[i], c.logits[i] / T};
  std::sort(cand.begin(), cand.end(), by_logit);
  size_t M = n;
  if (int64_t(n) < c.vocab) {
    const float bound = c.next / T;
    M = 0;
    while (M < n && cand[M].second > bound) ++M;
  }
  const int64_t kk = p_.top_k > 0 && p_.top_k < c.vocab ? p_.top_k : c.vocab;
  if (kk <= int64_t(M)) {  // (1)
    cand.resize(size_t(kk));
    return draw(filter_sorted(cand, p_));
  }
  // (2)
  if (M == 0 || (p_.top_p >= 1.0f && p_.min_p <= 0.0f)) return std::nullopt;
  const float mx = cand[0].second;
  std::vector<float> e(M);
  double pre = 0;
  for (size_t i = 0; i < M; ++i) pre += e[i] = std::exp(cand[i].second - mx);
  constexpr double kSumTol = 1e-4;    // the backend's Σ (f32, ≤ 1e-5 relative), with room
  constexpr double kRoundTol = 1e-6;  // p_i = float(e_i / S) and their double sums (a few 2^-24)
  const double row = double(c.sum_exp) * std::exp(double(c.max) - double(mx));
  const double s_hi = row * (1 + kSumTol), s_lo = kk == c.vocab ? std::max(pre, row * (1 - kSumTol)) : pre;
  if (!(s_lo > 0 && s_lo <= s_hi)) return std::nullopt;  // stats that contradict the candidates
  // min-p's floor must stay a normal float for the relative margins to hold
  if (p_.min_p > 0.0f && double(p_.min_p) / s_hi < 1e-30) return std::nullopt;
  enum class Stop { No, Yes, Unknown };
  double E = 0;  // Σ e over the first i tokens
  size_t keep = 0;
  for (size_t i = 1; i <= M && keep == 0; ++i) {
    E += e[i - 1];
    Stop by_p = Stop::No, by_m = Stop::No;
    if (p_.top_p < 1.0f)
      by_p = E / s_hi * (1 - kRoundTol) >= p_.top_p ? Stop::Yes
             : E / s_lo * (1 + kRoundTol) < p_.top_p ? Stop::No
                                                      : Stop::Unknown;
    if (p_.min_p > 0.0f)
      by_m = i == M                                      ? Stop::Unknown  // token M is not known
             : double(e[i]) < p_.min_p * (1 - kRoundTol)  ? Stop::Yes
             : double(e[i]) >= p_.min_p * (1 + kRoundTol) ? Stop::No
                                                          : Stop::Unknown;
    if (by_p == Stop::Yes || by_m == Stop::Yes)
      keep = i;
    else if (by_p == Stop::Unknown || by_m == Stop::Unknown)
      return std::nullopt;
  }
  if (keep == 0) return std::nullopt;  // the kept set runs past the known prefix
  return draw(normalise(cand, e, keep, p_));
}

}  // namespace qwen36
