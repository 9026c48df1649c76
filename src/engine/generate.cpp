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
    TokenConstraint* mask = opts.constraint && opts.constraint->masks() ? opts.constraint : nullptr;
    req.take = [&](int32_t, const SampleCandidates& cand) {
      if (mask) return false;  // the whole row comes to the host, to be masked
      tok = sampler.sample_from_candidates(cand);
      return tok.has_value();
    };
    req.full_logits = logits.data();
    model.forward_sample(batch, state, req);
    if (tok) return *tok;
    if (mask) QWEN36_CHECK(mask->apply(logits) > 0, "the output constraint admits no token here");
    return sampler.sample_penalised(logits);
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

  int32_t pos = int32_t(prompt.size());  // where the next decode step writes
  res.stop_reason = "length";
  // Takes the next token; false: generation ends (stop_reason says why).
  auto take = [&](int32_t t) {
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end()) {
      res.stop_reason = "eos";
      return false;
    }
    QWEN36_CHECK(!opts.constraint || opts.constraint->accept(t), "token {} breaks the output constraint", t);
    res.tokens.push_back(t);
    history.push_back(t);
    if (on_token && !on_token(t)) {
      res.stop_reason = "cancelled";
      return false;
    }
    if (opts.constraint && opts.constraint->finished()) {
      res.stop_reason = "document";
      return false;
    }
    if (int32_t(res.tokens.size()) == opts.max_tokens) return false;
    if (pos + 1 >= state.capacity()) {
      res.stop_reason = "context";
      return false;
    }
    return true;
  };
  const SamplingParams& sp = opts.sampling;
  const bool argmax = sp.temperature == 0 && sp.repetition_penalty == 1 && sp.presence_penalty == 0 &&
                      sp.frequency_penalty == 0 && !opts.constraint;
  if (opts.max_tokens > 0 && take(tok)) {
    if (argmax) {
      // The tokens stay on the backend from step to step (Model::decode_greedy); on_token hears
      // of each one step later than the backend has it, and an end found there leaves at most
      // one step more run in the slot (reset by the next generate).
      const int32_t p0 = pos;
      const int64_t steps = std::min<int64_t>(opts.max_tokens - int64_t(res.tokens.size()), state.capacity() - 1 - p0);
      const SeqRun run{slot, p0, 0, 1};
      model.decode_greedy(std::span(&tok, 1), std::span(&run, 1), state, steps,
                          [&](int64_t j, std::span<const int32_t> ids) {
                            pos = p0 + int32_t(j) + 1;
                            return take(ids[0]);
                          });
    } else {
      do {
        const int32_t one[1] = {tok};
        tok = forward_sample(ForwardBatch::single(one, pos++, slot));
      } while (take(tok));
    }
  }
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace qwen36
