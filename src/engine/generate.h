#pragma once
// defines: GenerateOptions, GenerateResult, generate (the single-sequence generation loop)

#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_constraint.h"
#include "model/qwen36.h"

namespace qwen36 {

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // end-of-generation tokens (not emitted)
  int32_t prefill_chunk = 512;    // prompt tokens per forward pass
  // Structured output: every draw is masked by it, and the run ends ("document") once the
  // document is whole. Not owned.
  TokenConstraint* constraint = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated, without the prompt
  int32_t n_prompt = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  std::string stop_reason;  // "eos", "length", "cancelled", "context", "document" (a constraint's whole document)
  double prefill_tok_s() const { return prefill_seconds > 0 ? n_prompt / prefill_seconds : 0; }
  // Decode speed counts the tokens that needed a decode step (all but the first).
  double decode_tok_s() const {
    return decode_seconds > 0 && tokens.size() > 1 ? double(tokens.size() - 1) / decode_seconds : 0;
  }
};

// Prefills `prompt` into `slot` of `state` (which is reset first) and samples up to
// max_tokens. on_token is called with each new token; returning false stops generation.
GenerateResult generate(Model& model, ModelState& state, const std::vector<int32_t>& prompt,
                        const GenerateOptions& opts, const std::function<bool(int32_t)>& on_token = {},
                        int32_t slot = 0);

}  // namespace qwen36
