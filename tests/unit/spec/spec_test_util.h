#pragma once
// defines: helpers shared by the speculative-decoding tests (tests/unit/spec and
//          tests/server/engine_spec_test.cpp): a small random model with an MTP head, the exact
//          joint distribution of its first three sampled tokens, and a chi-square statistic.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/presets.h"
#include "model/qwen36.h"
#include "model/random_weights.h"

namespace qwen36::test {

// A 4-layer tiny-dense model (3 DeltaNet + 1 attention) with random weights and an MTP head.
// intermediate > 0 replaces the preset's MLP width (statistical tests that run thousands of
// generations take a narrow one: the MLP was most of their time).
inline std::unique_ptr<Model> random_model(Backend& backend, int64_t vocab, uint64_t seed, bool moe = false,
                                           int64_t intermediate = 0) {
  ModelConfig c = model_preset(moe ? "tiny-moe" : "tiny-dense", 4);
  c.vocab_size = vocab;
  if (intermediate > 0) c.intermediate_size = intermediate;
  c.validate();
  return std::make_unique<Model>(make_random_weights(c, DType::F32, seed, /*with_mtp=*/true), backend);
}

// Token bytes for a model of n ids under structured output: JSON pieces, then single printable
// bytes; no whitespace (a random model under a mask could spend its tokens on it); the last id
// is a stop token (no bytes).
inline std::vector<std::string> json_piece_vocab(int32_t n) {
  std::vector<std::string> v = {"{",     "}",  "[",  "]",   ",",     ":",     "\"",  "{\"", "\":", "\",",
                                "\"}",   ",\"", "true", "false", "null", "ok",  "n",   "tag", "\"a\"", "\"b\"",
                                "12",    "-",  ".",  "e",   "\\",    "\\n",   "x",   "0",   "7",   "\"ok\":"};
  for (int c = 0x21; int32_t(v.size()) < n - 1; c = c == 0x7e ? 0x21 : c + 1) v.push_back(std::string(1, char(c)));
  v.push_back("");
  return v;
}

// Pearson's statistic of observed counts against expected probabilities; cells expected
// below 5 counts are pooled into one cell. dof is set to (cells − 1).
inline double chi_square(const std::vector<double>& probs, const std::vector<uint64_t>& counts, uint64_t n,
                         int* dof) {
  double stat = 0, pooled_e = 0, pooled_o = 0;
  int cells = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = probs[i] * double(n);
    if (e < 5) {
      pooled_e += e;
      pooled_o += double(counts[i]);
      continue;
    }
    stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  if (pooled_e >= 5) {
    stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  *dof = cells - 1;
  return stat;
}

// Upper 0.1 % point of chi-square with `dof` degrees of freedom (Wilson–Hilferty).
inline double chi_square_critical_001(int dof) {
  const double k = dof, z = 3.0902;  // standard normal 0.999 quantile
  const double a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Exact P(t1, t2, t3) of the target sampling softmax(logits / temp), from full forwards.
inline std::vector<double> exact_joint(Model& m, Backend& be, const std::vector<int32_t>& prompt, double temp) {
  const int64_t V = m.config().vocab_size;
  auto next_dist = [&](const std::vector<int32_t>& ctx) {
    ModelState st(be, m.config(), 1, 32, false);
    std::vector<float> logits(static_cast<size_t>(V));
    m.forward(ForwardBatch::single(ctx, 0, 0), st, logits.data());
    double mx = logits[0], sum = 0;
    for (float l : logits) mx = std::max(mx, double(l));
    std::vector<double> p(static_cast<size_t>(V));
    for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((double(logits[i]) - mx) / temp);
    for (double& x : p) x /= sum;
    return p;
  };
  std::vector<double> joint(size_t(V * V * V));
  const auto p1 = next_dist(prompt);
  for (int32_t a = 0; a < V; ++a) {
    auto ctx = prompt;
    ctx.push_back(a);
    const auto p2 = next_dist(ctx);
    for (int32_t b = 0; b < V; ++b) {
      auto ctx2 = ctx;
      ctx2.push_back(b);
      const auto p3 = next_dist(ctx2);
      for (int32_t c = 0; c < V; ++c)
        joint[size_t((a * V + b) * V + c)] = p1[size_t(a)] * p2[size_t(b)] * p3[size_t(c)];
    }
  }
  return joint;
}

}  // namespace qwen36::test
