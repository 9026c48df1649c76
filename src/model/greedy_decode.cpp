// Greedy decoding with the tokens chained on the backend (Model::decode_greedy): the argmax of a
// step's logits is written where the next step's embedding reads its tokens, inside the step's
// recording, so the host neither samples nor sends tokens back, and it queues step j + 1 before
// it waits for step j's tokens. What that hides is the host's share of a step (set_batch, the
// recording's launch, the sampling launches and their copy), which a step-by-step loop pays with
// the device idle: ~0.1 ms a step on an H200 (bench/RESULTS.md, session 31).
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "model/model_scratch.h"
#include "model/qwen36.h"

namespace qwen36 {

void Model::decode_greedy(std::span<const int32_t> tokens, std::span<const SeqRun> runs, ModelState& state,
                          int64_t steps, const std::function<bool(int64_t, std::span<const int32_t>)>& on_step) {
  const int64_t R = int64_t(runs.size());
  QWEN36_CHECK(R >= 1 && int64_t(tokens.size()) == R, "decode_greedy: {} tokens for {} runs", tokens.size(), R);
  for (int64_t i = 0; i < R; ++i)
    QWEN36_CHECK(runs[size_t(i)].begin == i && runs[size_t(i)].count == 1,
                 "decode_greedy: run {} is not the one-token run of row {}", i, i);
  for (int32_t t : tokens)
    QWEN36_CHECK(t >= 0 && t < w_.config.vocab_size, "decode_greedy: token {} is outside the vocabulary", t);
  if (steps <= 0) return;
  QWEN36_CHECK(steps <= state.capacity(), "decode_greedy: {} steps do not fit a context of {}", steps,
               state.capacity());
  check_runs(runs, R, state, int32_t(steps - 1));  // the last step writes position pos0 + steps − 1

  ForwardBatch batch;
  batch.tokens.assign(tokens.begin(), tokens.end());
  batch.runs.assign(runs.begin(), runs.end());
  for (int32_t i = 0; i < int32_t(R); ++i) batch.output_rows.push_back(i);
  auto at_step = [&](int64_t j) {
    for (int64_t i = 0; i < R; ++i) batch.runs[size_t(i)].pos0 = runs[size_t(i)].pos0 + int32_t(j);
  };

  // QWEN36_GREEDY_CHAIN=off: every step waits for its tokens, as without recorded steps (the
  // step-by-step loop, for comparisons).
  static const bool chain_off = [] {
    const char* v = std::getenv("QWEN36_GREEDY_CHAIN");
    return v && std::string_view(v) == "off";
  }();
  if (chain_off || peers_ || host_ || R > 64) {  // no recorded steps: each waits for its tokens
    SampleRequest greedy;
    greedy.rows.assign(size_t(R), SampleRowParams{});
    greedy.k = 1;  // the top candidate is the argmax whatever the row's temperature
    greedy.take = [&](int32_t row, const SampleCandidates& cand) {
      batch.tokens[size_t(row)] = cand.ids[0];
      return true;
    };
    for (int64_t j = 0; j < steps; ++j) {
      at_step(j);
      forward_sample(batch, state, greedy);
      if (!on_step(j, batch.tokens)) return;
    }
    return;
  }

  if (!chain_ids_ || chain_ids_->size() < size_t(R) * sizeof(int32_t))
    chain_ids_ = backend_.alloc(std::max<size_t>(size_t(R), 64) * sizeof(int32_t));
  Tensor ids(chain_ids_->data(), DType::I32, {R});
  backend_.upload(tokens.data(), ids.data, ids.nbytes());
  // The tables' tokens are placeholders from step 1 on (the steps read `ids`); the host copies
  // of two steps' tokens alternate: step j's lands while step j + 1 runs.
  std::vector<int32_t> host[2] = {std::vector<int32_t>(size_t(R)), std::vector<int32_t>(size_t(R))};
  uint64_t ticket[2] = {0, 0};
  for (int64_t j = 0; j < steps; ++j) {
    at_step(j);
    ws_->begin(backend_);
    backend_.set_batch(batch.tokens, batch.runs, batch.output_rows);
    const bool ran = decode_step(batch, state, nullptr, nullptr, nullptr, nullptr, &ids);
    QWEN36_CHECK(ran, "decode_greedy: the backend did not run a chained decode step");
    ticket[j % 2] = backend_.download(ids, host[j % 2].data());
    if (j > 0) {
      backend_.wait_download(ticket[(j - 1) % 2]);
      if (!on_step(j - 1, host[(j - 1) % 2])) return;  // step j's download is never read
    }
  }
  backend_.wait_download(ticket[(steps - 1) % 2]);
  on_step(steps - 1, host[(steps - 1) % 2]);
}

}  // namespace qwen36
