#pragma once
// defines: helpers shared by the speculative-decoding tests: a small random model with an MTP
//          head, and a chi-square statistic.

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/presets.h"
#include "model/qwen36.h"
#include "model/random_weights.h"

namespace qwen36::test {

// A 4-layer tiny-dense model (3 DeltaNet + 1 attention) with random weights and an MTP head.
inline std::unique_ptr<Model> random_model(Backend& backend, int64_t vocab, uint64_t seed, bool moe = false) {
  ModelConfig c = model_preset(moe ? "tiny-moe" : "tiny-dense", 4);
  c.vocab_size = vocab;
  c.validate();
  return std::make_unique<Model>(make_random_weights(c, DType::F32, seed, /*with_mtp=*/true), backend);
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

}  // namespace qwen36::test
