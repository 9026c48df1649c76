#pragma once
// defines: SamplingParams, Sampler (logits → next token; or a backend's top candidates →
//          next token, exactly the same one)
//
// Order of operations, as llama.cpp and vLLM apply them: repetition / presence / frequency
// penalties → temperature → top-k → top-p → min-p → draw. Temperature 0 is greedy (argmax,
// ties to the lowest id), which bypasses every other step except the penalties.
//
// Sampling on the device (Backend::sample_candidates, Model::forward_sample): the backend
// applies the penalties and returns each row's top kSampleCandidates logits plus the row's max
// and Σexp; sample_from_candidates draws the very token sample() would draw from the full row,
// or says the candidates do not decide it (then the caller fetches the row and calls
// sample_penalised). Both consume the generator the same way.

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace qwen36 {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;          // 0: off
  float top_p = 0.95f;         // 1: off
  float min_p = 0.05f;         // 0: off; keep tokens with p >= min_p * p_max
  float typical_p = 1.0f;      // 1: off; locally typical sampling: the tokens whose surprise is closest to
                               // the entropy, until they hold typical_p of the probability
  float top_n_sigma = 0.0f;    // 0: off; keep tokens whose logit is within top_n_sigma standard deviations
                               // of the largest (over the whole row)
  float repetition_penalty = 1.0f;  // 1: off; divides positive logits of seen tokens, multiplies negative
  float presence_penalty = 0.0f;    // subtracted once from the logit of every seen token
  float frequency_penalty = 0.0f;   // subtracted per occurrence
  int32_t penalty_last_n = 64;      // how much history the penalties look at (-1: all)
  // false (vLLM, Hugging Face): the filters see the tempered distribution (logit / T). true
  // (llama.cpp's default chain, temperature the last sampler): top-n-sigma, top-k, typical-p,
  // top-p and min-p cut the untempered distribution, then the kept tokens are drawn at T.
  bool temperature_last = false;
  uint64_t seed = 0;

  void validate() const;  // throws Error naming the bad parameter
  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0;
    return p;
  }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits are modified in place. history: tokens so far (prompt + generated), for penalties.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);
  // The same for logits whose penalties are already applied (a row a backend penalised).
  int32_t sample_penalised(std::span<float> logits);

  // The normalised distribution the draw uses (after every filter), for tests and logprobs.
  std::vector<std::pair<int32_t, float>> distribution(std::span<float> logits, std::span<const int32_t> history);

  // ---- sampling from a backend's candidates ----
  // Appends this row's parameters and penalty entries (history as sample() reads it, tokens
  // ≥ vocab ignored) for Backend::sample_candidates. penalties = false: a neutral row (the
  // logits come back as they are, for a caller that needs the raw row).
  void add_candidate_row(std::span<const int32_t> history, int64_t vocab, std::vector<SampleRowParams>& rows,
                         std::vector<PenaltyEntry>& entries, bool penalties = true) const;
  // The token sample() would draw from the full row (penalties applied by the backend), or
  // nullopt, without touching the generator, when the candidates do not decide it.
  std::optional<int32_t> sample_from_candidates(const SampleCandidates& c);
  // Whether any repetition / presence / frequency penalty is set (the history changes the row).
  bool has_penalties() const;

 private:
  using Cand = std::pair<int32_t, float>;
  std::vector<Cand> filtered(std::span<float> logits);  // penalties already applied
  int32_t draw(const std::vector<Cand>& dist);
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history) const;
  SamplingParams p_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace qwen36
