#pragma once
// defines: expect_greedy_chain_equals_stepwise (tests/unit/engine/greedy_decode_test.cpp on the
//          CPU, tests/gpu/test_cuda_spec.cpp on CUDA)
//
// Model::decode_greedy (the tokens chained on the backend, read one step behind) against a
// step-by-step greedy loop: each step a forward pass whose logits come to the host, the argmax
// taken there (lowest id on ties). Three sequences at different positions (prompts of 5, 9 and
// 2 tokens) decode together, on two states fed the same prompts: the chain's 6 steps (so a
// backend that records decode steps runs its first eagerly, records the second and replays the
// rest) must give the loop's tokens at every step, on_step must hear of steps 0..5 in order, and
// one more step on each state afterwards must give the same logits (the caches and DeltaNet
// states are the loop's). Then a chain stopped by on_step at step 2 hears of steps 0..2 only.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "model/qwen36.h"
#include "model/state.h"

namespace qwen36::test {

inline void expect_greedy_chain_equals_stepwise(Model& model, Backend& backend, const std::string& what) {
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size;
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 99, 42}, {7, 7, 250, 8, 1, 64, 33, 12, 9}, {400, 2}};
  for (auto& p : prompts)
    for (int32_t& t : p) t = int32_t(t % V);  // the fixtures' vocabularies are small
  const int32_t S = int32_t(prompts.size());
  constexpr int64_t kSteps = 6;
  ModelState chained(backend, c, S, 64, false), stepwise(backend, c, S, 64, false);
  auto argmax = [&](const float* row) { return int32_t(std::max_element(row, row + V) - row); };
  // Each prompt prefilled on both states; its argmax is the sequence's first decode token.
  std::vector<int32_t> first(static_cast<size_t>(S));
  std::vector<SeqRun> runs;
  std::vector<float> logits(size_t(S * V));
  for (int32_t s = 0; s < S; ++s) {
    const auto& p = prompts[size_t(s)];
    for (ModelState* st : {&chained, &stepwise})
      model.forward(ForwardBatch::single(p, 0, s), *st, logits.data());
    first[size_t(s)] = argmax(logits.data());
    runs.push_back({s, int32_t(p.size()), s, 1});
  }

  std::vector<std::vector<int32_t>> got;
  model.decode_greedy(first, runs, chained, kSteps, [&](int64_t j, std::span<const int32_t> ids) {
    EXPECT_EQ(j, int64_t(got.size())) << what;
    got.emplace_back(ids.begin(), ids.end());
    return true;
  });
  ASSERT_EQ(int64_t(got.size()), kSteps) << what;

  ForwardBatch batch;
  batch.tokens = first;
  batch.runs = runs;
  for (int32_t s = 0; s < S; ++s) batch.output_rows.push_back(s);
  for (int64_t j = 0; j < kSteps; ++j) {
    model.forward(batch, stepwise, logits.data());
    for (int32_t s = 0; s < S; ++s) {
      const int32_t want = argmax(logits.data() + s * V);
      EXPECT_EQ(got[size_t(j)][size_t(s)], want) << what << ": step " << j << ", sequence " << s;
      batch.tokens[size_t(s)] = want;
      ++batch.runs[size_t(s)].pos0;
    }
  }
  // One more step on each state from the same tokens: the same logits.
  std::vector<float> after_chain(size_t(S * V));
  model.forward(batch, chained, after_chain.data());
  model.forward(batch, stepwise, logits.data());
  float worst = 0;
  for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(after_chain[i] - logits[i]));
  EXPECT_LE(worst, 1e-4f) << what << ": the states after the chain differ from the loop's";

  // Stopped by on_step at step 2: steps 0..2 heard of, nothing after.
  std::vector<int64_t> heard;
  for (SeqRun& r : runs) r.pos0 += int32_t(kSteps + 1);
  model.decode_greedy(batch.tokens, runs, chained, kSteps, [&](int64_t j, std::span<const int32_t>) {
    heard.push_back(j);
    return j < 2;
  });
  EXPECT_EQ(heard, (std::vector<int64_t>{0, 1, 2})) << what;
}

}  // namespace qwen36::test
