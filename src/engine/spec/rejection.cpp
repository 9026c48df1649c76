#include "engine/spec/rejection.h"

#include <algorithm>
#include <unordered_map>

namespace qwen36 {

namespace {

float prob_of(const Dist& d, int32_t tok) {
  for (const auto& [t, p] : d)
    if (t == tok) return p;
  return 0.0f;
}

}  // namespace

int32_t draw(const Dist& p, std::mt19937_64& rng) {
  if (p.size() == 1) return p.front().first;
  double total = 0;
  for (const auto& e : p) total += e.second;
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  double acc = 0;
  for (const auto& [t, w] : p) {
    acc += w;
    if (u < acc) return t;
  }
  return p.back().first;
}

bool accept_or_recover(const Dist& p, const Dist& q, int32_t draft, std::mt19937_64& rng, int32_t* replacement) {
  const double pd = prob_of(p, draft);
  const double qd = q.empty() ? 1.0 : prob_of(q, draft);
  // u < p/q with u in [0, 1): always accepted when p >= q, never when p = 0.
  if (pd > 0 && (pd >= qd || std::uniform_real_distribution<double>(0.0, 1.0)(rng) * qd < pd)) return true;
  // Residual norm(max(0, p − q)). It has mass whenever a rejection is possible (p ≠ q).
  std::unordered_map<int32_t, float> qmap;
  if (q.empty())
    qmap[draft] = 1.0f;
  else
    for (const auto& [t, w] : q) qmap[t] = w;
  Dist residual;
  residual.reserve(p.size());
  for (const auto& [t, w] : p) {
    const auto it = qmap.find(t);
    const float r = it == qmap.end() ? w : std::max(0.0f, w - it->second);
    if (r > 0) residual.emplace_back(t, r);
  }
  // Rounding can leave no mass (p ≈ q); p itself is then the right fallback.
  *replacement = draw(residual.empty() ? p : residual, rng);
  return false;
}

}  // namespace qwen36
