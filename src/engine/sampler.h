#pragma once
// defines: SamplingParams, Sampler (logits → next token)
//
// Order of operations, as llama.cpp and vLLM apply them: repetition / presence / frequency
// penalties → temperature → top-k → top-p → min-p → draw. Temperature 0 is greedy (argmax,
// ties to the lowest id), which bypasses every other step except the penalties.

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace qwen36 {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;          // 0: off
  float top_p = 0.95f;         // 1: off
  float min_p = 0.05f;         // 0: off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1: off; divides positive logits of seen tokens, multiplies negative
  float presence_penalty = 0.0f;    // subtracted once from the logit of every seen token
  float frequency_penalty = 0.0f;   // subtracted per occurrence
  int32_t penalty_last_n = 64;      // how much history the penalties look at (-1: all)
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

  // The normalised distribution the draw uses (after every filter), for tests and logprobs.
  std::vector<std::pair<int32_t, float>> distribution(std::span<float> logits, std::span<const int32_t> history);

 private:
  void apply_penalties(std::span<float> logits, std::span<const int32_t> history) const;
  SamplingParams p_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace qwen36
