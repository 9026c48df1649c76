#pragma once
// defines: expect_device_chain_drafts_equal (tests/unit/spec/mtp_draft_test.cpp on the CPU,
//          tests/gpu/test_cuda_spec.cpp on CUDA)
//
// MtpDrafter's greedy rounds chained on the backend (Model::mtp_draft_greedy) against the same
// drafter through mtp_forward and the host's sampler: three sequences drafting together (k
// drafts each, or each its own k) for
// five rounds (the first catching up over the prompt, the others over two accepted rows, so a
// backend that records steps runs each eagerly, records it and replays it), on two states fed
// the same target rows. The drafts must be equal token for token, and so must the MTP K/V
// caches after the last round: the chained steps write the same rows as mtp_forward's.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/spec/mtp_drafter.h"
#include "model/qwen36.h"
#include "model/state.h"

namespace qwen36::test {

// ks: drafts wanted per sequence each round (all equal: the MTP caches are compared too; else
// the backend runs the longest chain's steps for all, whose extra rows the caches then differ by).
inline void expect_device_chain_drafts_equal(Model& model, Backend& backend, const std::string& what,
                                             const std::vector<int32_t>& ks = {3, 3, 3}) {
  const ModelConfig& c = model.config();
  const int64_t V = c.vocab_size, H = c.hidden_size;
  std::vector<std::vector<int32_t>> prompts = {{5, 17, 3, 99, 42}, {7, 7, 250, 8, 1, 64, 33, 12, 9}, {400, 2}};
  for (auto& p : prompts)
    for (int32_t& t : p) t = int32_t(t % V);  // the fixtures' vocabularies are small
  const int32_t S = int32_t(prompts.size());
  struct Side {
    std::unique_ptr<ModelState> state;
    std::unique_ptr<MtpDrafter> drafter;
    std::vector<std::vector<int32_t>> drafts;  // every round's, every sequence's
  };
  Side sides[2];
  for (int d = 0; d < 2; ++d) {
    sides[d].state = std::make_unique<ModelState>(backend, c, S, 64, /*with_mtp=*/true);
    sides[d].drafter = std::make_unique<MtpDrafter>(model, *sides[d].state, /*device_chain=*/d == 0);
  }
  const SamplingParams greedy = SamplingParams::greedy();
  std::vector<std::vector<int32_t>> history(prompts.begin(), prompts.end());
  std::vector<int32_t> pos(size_t(S), 0);
  // The target over `tokens` of sequence s at pos[s] on both sides, its rows observed with the
  // token after each (the last row's: the target's argmax, appended to the history).
  auto run_target = [&](int32_t s, const std::vector<int32_t>& tokens) {
    const int32_t n = int32_t(tokens.size());
    std::vector<float> logits(size_t(n * V)), hidden(size_t(n * H));
    for (int d = 0; d < 2; ++d)
      model.forward(ForwardBatch::single(tokens, pos[size_t(s)], s, /*all_logits=*/true), *sides[d].state,
                    logits.data(), hidden.data());
    const float* last = logits.data() + (n - 1) * V;
    const int32_t next = int32_t(std::max_element(last, last + V) - last);
    std::vector<int32_t> nexts(tokens.begin() + 1, tokens.end());
    nexts.push_back(next);
    for (int d = 0; d < 2; ++d) sides[d].drafter->observe(s, pos[size_t(s)], hidden, nexts);
    pos[size_t(s)] += n;
    history[size_t(s)].push_back(next);
  };
  for (int32_t s = 0; s < S; ++s) run_target(s, prompts[size_t(s)]);
  for (int round = 0; round < 5; ++round) {
    std::vector<int32_t> first(static_cast<size_t>(S));
    for (int d = 0; d < 2; ++d) {
      std::vector<DraftRequest> reqs(static_cast<size_t>(S));
      for (int32_t s = 0; s < S; ++s) {
        reqs[size_t(s)].slot = s;
        reqs[size_t(s)].k = ks[size_t(s)];
        reqs[size_t(s)].history = history[size_t(s)];
        reqs[size_t(s)].sampling = &greedy;
      }
      sides[d].drafter->propose(reqs);
      for (int32_t s = 0; s < S; ++s) {
        ASSERT_EQ(int32_t(reqs[size_t(s)].tokens.size()), ks[size_t(s)]) << what << " round " << round;
        sides[d].drafts.push_back(reqs[size_t(s)].tokens);
        first[size_t(s)] = reqs[size_t(s)].tokens[0];
      }
    }
    // Accept the first draft: the target runs [pending token, draft 1].
    for (int32_t s = 0; s < S; ++s) {
      const int32_t pending = history[size_t(s)].back();
      history[size_t(s)].push_back(first[size_t(s)]);
      run_target(s, {pending, first[size_t(s)]});
    }
  }
  EXPECT_EQ(sides[0].drafter->device_rounds(), 5) << what << ": rounds drafted on the backend";
  EXPECT_EQ(sides[1].drafter->device_rounds(), 0) << what;
  EXPECT_EQ(sides[0].drafts, sides[1].drafts) << what << ": drafts chained on the backend differ from mtp_forward's";
  if (std::any_of(ks.begin(), ks.end(), [&](int32_t k) { return k != ks[0]; })) return;
  for (auto cache : {&ModelState::mtp_k_cache, &ModelState::mtp_v_cache}) {
    std::vector<std::byte> a((sides[0].state.get()->*cache)().nbytes()), b(a.size());
    backend.copy_to_host((sides[0].state.get()->*cache)(), a.data());
    backend.copy_to_host((sides[1].state.get()->*cache)(), b.data());
    EXPECT_TRUE(a == b) << what << ": the MTP caches differ";
  }
}

}  // namespace qwen36::test
