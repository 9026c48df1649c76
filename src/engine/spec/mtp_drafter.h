#pragma once
// defines: MtpDrafter (drafts with the checkpoint's multi-token-prediction head)
//
// How it drafts (vLLM's scheme, qwen36-model.md §4):
// - Step 1 runs the MTP over every target position committed since the last round: row t
//   pairs the target's post-norm hidden state at t with the token at t + 1, at MTP position
//   t. The last row pairs the last committed position with the freshly sampled token, and
//   its logits give draft 1.
// - Steps 2..k: input = the previous draft and the MTP's own normalised output (mtp_hidden),
//   position + 1.
// Step 1 rewrites the MTP KV cache at every committed position with true target hidden
// states, so entries written by chained steps of earlier rounds (drafts, possibly rejected)
// are always overwritten before they are read again: the MTP cache only ever holds what a
// non-speculative MTP pass over the accepted tokens would hold.
//
// Prefix-cache reuse (resume): a finished sequence's last committed rows are still pending
// (observed, not yet run through the MTP); the new sequence keeps those before its reused
// length and re-pairs the last of them with its own next prompt token, so the MTP cache of a
// reused slot is what a cold run would build.
//
// Drafts: greedy argmax under temperature 0 (a round whose chains all draft so runs its chains on
// the backend: Model::mtp_draft_greedy); otherwise sampled from the MTP distribution
// after the request's penalties and filters, with that distribution returned as q.

#include <map>

#include "engine/spec/drafter.h"
#include "model/qwen36.h"

namespace qwen36 {

class MtpDrafter final : public Drafter {
 public:
  // `state` must have been created with_mtp; the drafter uses its MTP KV cache.
  // device_chain: greedy rounds run Model::mtp_draft_greedy (false: every round through
  // mtp_forward and the host's sampler; tests compare the two).
  MtpDrafter(Model& model, ModelState& state, bool device_chain = true);
  const char* name() const override { return "mtp"; }
  bool wants_hidden() const override { return true; }
  void reset(int32_t slot) override;
  void resume(int32_t slot, int32_t reused, int32_t next_token) override;
  void observe(int32_t slot, int32_t pos0, std::span<const float> hidden, std::span<const int32_t> next_tokens) override;
  void propose(std::span<DraftRequest> requests) override;
  // Rounds drafted by Model::mtp_draft_greedy so far (tests, logs).
  int64_t device_rounds() const { return device_rounds_; }

 private:
  struct Pending {  // committed target rows not yet run through the MTP
    int32_t pos0 = 0;
    std::vector<float> hidden;
    std::vector<int32_t> next_tokens;
  };
  Model& model_;
  ModelState& state_;
  std::map<int32_t, Pending> pending_;  // by slot
  bool device_chain_;
  int64_t device_rounds_ = 0;
};

}  // namespace qwen36
