// The references of Backend::sample_candidates and Backend::argmax_rows (cpu::) and the Backend
// defaults, which run them on a host copy of the logits. Sampler::sample_from_candidates
// (engine/sampler.cpp) relies on the exact definitions in backend/backend.h: penalties by
// penalised_logit, candidates ordered (logit desc, id asc), x = logit / T with IEEE division.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36 {
namespace cpu {

void sample_candidates(Tensor& logits, std::span<const SampleRowParams> rows, std::span<const PenaltyEntry> penalties,
                       int32_t k, int32_t* ids, float* vals, float* stats) {
  const int64_t R = logits.rows(), V = logits.cols();
  QWEN36_CHECK(logits.dtype == DType::F32 && int64_t(rows.size()) == R, "sample_candidates: logits {} for {} rows",
               logits.shape_str(), rows.size());
  QWEN36_CHECK(k >= 1 && k <= std::min<int64_t>(V, kMaxSampleCandidates), "sample_candidates: k {} for vocab {}", k, V);
  const int64_t q = std::min<int64_t>(int64_t(k) + 1, V);  // the candidates and the next logit
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t r = 0; r < R; ++r) {
    const SampleRowParams& p = rows[size_t(r)];
    float* l = logits.as<float>() + r * V;
    QWEN36_CHECK(p.penalty_begin >= 0 && p.penalty_count >= 0 &&
                     size_t(p.penalty_begin) + size_t(p.penalty_count) <= penalties.size(),
                 "sample_candidates: row {} names penalty entries past the list", r);
    for (const PenaltyEntry& e : penalties.subspan(size_t(p.penalty_begin), size_t(p.penalty_count)))
      if (e.token >= 0 && e.token < V) l[e.token] = penalised_logit(l[e.token], p, e.count);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + q, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      ids[r * k + j] = order[size_t(j)];
      vals[r * k + j] = l[order[size_t(j)]];
    }
    const float T = p.temperature > 0 ? p.temperature : 1.0f;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, l[i] / T);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(l[i] / T - mx);
    stats[r * 3 + 0] = mx;
    stats[r * 3 + 1] = float(sum);
    stats[r * 3 + 2] = k < V ? l[order[size_t(k)]] : -std::numeric_limits<float>::infinity();
  }
}

void argmax_rows(const Tensor& logits, Tensor& ids) {
  const int64_t R = logits.rows(), V = logits.cols();
  QWEN36_CHECK(logits.dtype == DType::F32 && ids.dtype == DType::I32 && ids.numel() == R,
               "argmax_rows: logits {} → ids {}", logits.shape_str(), ids.shape_str());
  for (int64_t r = 0; r < R; ++r) {
    const float* l = logits.as<float>() + r * V;
    int32_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (l[i] > l[best] || (std::isnan(l[best]) && !std::isnan(l[i]))) best = int32_t(i);  // ties keep the lower id
    ids.as<int32_t>()[r] = best;
  }
}

}  // namespace cpu

void Backend::argmax_rows(const Tensor& logits, Tensor& ids) {
  std::vector<float> host(size_t(logits.numel()));
  std::vector<int32_t> best(size_t(ids.numel()));
  copy_to_host(logits, host.data());
  const Tensor h(host.data(), DType::F32, {logits.rows(), logits.cols()});
  Tensor b(best.data(), DType::I32, {int64_t(best.size())});
  cpu::argmax_rows(h, b);
  copy_from_host(best.data(), ids);
}

void Backend::sample_candidates(Tensor& logits, std::span<const SampleRowParams> rows,
                                std::span<const PenaltyEntry> penalties, int32_t k, int32_t* ids, float* vals,
                                float* stats) {
  std::vector<float> host(size_t(logits.numel()));
  copy_to_host(logits, host.data());
  Tensor h(host.data(), DType::F32, {logits.rows(), logits.cols()});
  cpu::sample_candidates(h, rows, penalties, k, ids, vals, stats);
  if (!penalties.empty()) copy_from_host(host.data(), logits);
}

}  // namespace qwen36
