#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"

namespace qwen36 {

GenerateResult generate(Model& model, ModelState& state, const std::vector<int32_t>& prompt,
                        const GenerateOptions& opts, const std::function<bool(int32_t)>& on_token, int32_t slot) {
  using clock = std::chrono::steady_clock;
  const ModelConfig& c = model.config();
  QWEN36_CHECK(!prompt.empty(), "the prompt is empty");
  QWEN36_CHECK(opts.max_tokens >= 0, "max_tokens {} must be >= 0", opts.max_tokens);
  QWEN36_CHECK(opts.prefill_chunk > 0, "prefill chunk must be positive");
  for (int32_t t : prompt)
    QWEN36_CHECK(t >= 0 && t < c.vocab_size, "prompt token {} is outside the vocabulary (0..{})", t, c.vocab_size - 1);
  QWEN36_CHECK(int64_t(prompt.size()) < state.capacity(), "the prompt ({} tokens) does not fit the context ({})",
               prompt.size(), state.capacity());

  GenerateResult res;
  res.n_prompt = int32_t(prompt.size());
  state.reset_slot(slot);
  Sampler sampler(opts.sampling);
  std::vector<float> logits(size_t(c.vocab_size));  // the row, when its candidates do not decide
  std::vector<int32_t> history = prompt;
  // A forward pass whose one output row is sampled on the backend (Model::forward_sample):
  // the same token as sampling the full row, which comes to the host only when needed.
  auto forward_sample = [&](const ForwardBatch& batch) {
    SampleRequest req;
    sampler.add_candidate_row(history, c.vocab_size, req.rows, req.penalties);
    std::optional<int32_t> tok;
    req.take = [&](int32_t, const SampleCandidates& cand) {
      tok = sampler.sample_from_candidates(cand);
      return tok.has_value();
    };
    req.full_logits = logits.data();
    model.forward_sample(batch, state, req);
    return tok ? *tok : sampler.sample_penalised(logits);
  };

  auto t0 = clock::now();
  int32_t tok = -1;
  for (size_t b = 0; b < prompt.size(); b += size_t(opts.prefill_chunk)) {
    const size_t n = std::min(prompt.size() - b, size_t(opts.prefill_chunk));
    const bool last = b + n == prompt.size();
    ForwardBatch batch =
        ForwardBatch::single(std::span(prompt).subspan(b, n), int32_t(b), slot, /*all_logits=*/false);
    if (!last) {
      batch.output_rows.clear();
      model.forward(batch, state, nullptr);
    } else {
      tok = forward_sample(batch);
    }
  }
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  int32_t pos = int32_t(prompt.size());
  res.stop_reason = "length";
  while (int32_t(res.tokens.size()) < opts.max_tokens) {
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), tok) != opts.stop_ids.end()) {
      res.stop_reason = "eos";
      break;
    }
    res.tokens.push_back(tok);
    history.push_back(tok);
    if (on_token && !on_token(tok)) {
      res.stop_reason = "cancelled";
      break;
    }
    if (int32_t(res.tokens.size()) == opts.max_tokens) break;
    if (pos + 1 >= state.capacity()) {
      res.stop_reason = "context";
      break;
    }
    const int32_t one[1] = {tok};
    tok = forward_sample(ForwardBatch::single(one, pos++, slot));
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace qwen36
