// Mixture of experts on the CPU: softmax → top-k → renormalise routing, and the routed
// SwiGLU experts. Tokens are grouped by expert so each expert's weights are read once per
// batch rather than once per token.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qwen36::cpu {

void moe_route(const Tensor& logits, int64_t k, bool renorm, Tensor& weights, Tensor& ids) {
  const int64_t E = logits.cols(), T = logits.rows();
  QWEN36_CHECK(k > 0 && k <= E && weights.numel() == T * k && ids.numel() == T * k && ids.dtype == DType::I32,
               "moe_route: logits {} top-{} into {} / {}", logits.shape_str(), k, weights.shape_str(), ids.shape_str());
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.as<const float>() + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
    for (auto& x : p) x /= sum;
    // Highest probability first; ties go to the lower expert id.
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    float top = 0;
    for (int64_t j = 0; j < k; ++j) top += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      ids.as<int32_t>()[t * k + j] = order[size_t(j)];
      weights.as<float>()[t * k + j] = renorm ? p[size_t(order[size_t(j)])] / top : p[size_t(order[size_t(j)])];
    }
  }
}

void moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, std::span<const MlpWeights> experts,
                 Tensor& out) {
  const int64_t D = x.cols(), T = x.rows(), k = ids.cols();
  QWEN36_CHECK(out.numel() == T * D && ids.rows() == T, "moe_experts: x {} ids {} out {}", x.shape_str(),
               ids.shape_str(), out.shape_str());
  const int64_t E = int64_t(experts.size());
  // Tokens routed to each expert, with their routing weight.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.as<const int32_t>()[t * k + j];
      QWEN36_CHECK(e >= 0 && e < E, "moe_experts: expert id {} out of range", e);
      routed[size_t(e)].emplace_back(t, weights.as<const float>()[t * k + j]);
    }
  std::fill(out.as<float>(), out.as<float>() + T * D, 0.0f);
  std::vector<float> xs, gate, up, act, y;
  // Ascending expert order, matching the reference's accumulation order.
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = routed[size_t(e)];
    if (toks.empty()) continue;
    const MlpWeights& m = experts[size_t(e)];
    const int64_t n = int64_t(toks.size()), I = m.gate_proj.rows();
    xs.resize(size_t(n * D));
    gate.resize(size_t(n * I));
    up.resize(size_t(n * I));
    act.resize(size_t(n * I));
    y.resize(size_t(n * D));
    for (int64_t i = 0; i < n; ++i)
      std::copy(x.as<const float>() + toks[size_t(i)].first * D, x.as<const float>() + (toks[size_t(i)].first + 1) * D,
                xs.data() + i * D);
    Tensor tx(xs.data(), DType::F32, {n, D}), tg(gate.data(), DType::F32, {n, I}), tu(up.data(), DType::F32, {n, I}),
        ta(act.data(), DType::F32, {n, I}), ty(y.data(), DType::F32, {n, D});
    matmul(tx, m.gate_proj, tg);
    matmul(tx, m.up_proj, tu);
    swiglu(tg, tu, ta);
    matmul(ta, m.down_proj, ty);
    for (int64_t i = 0; i < n; ++i) {
      const float w = toks[size_t(i)].second;
      float* o = out.as<float>() + toks[size_t(i)].first * D;
      for (int64_t d = 0; d < D; ++d) o[d] += w * y[size_t(i * D + d)];
    }
  }
}

}  // namespace qwen36::cpu
