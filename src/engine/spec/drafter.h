#pragma once
// defines: Dist, DraftRequest, Drafter (what a speculative drafter proposes and how the
//          generation loop talks to it)
//
// A drafter proposes up to k tokens to follow a sequence's history; the target verifies them
// in one forward pass (spec_generate.h). Drafters that sample their drafts (MTP under
// temperature > 0) also return each draft's distribution q, which rejection sampling needs;
// deterministic drafters (n-gram, greedy MTP) leave q empty, meaning one-hot.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/sampler.h"

namespace qwen36 {

// A sparse, normalised distribution over token ids (as Sampler::distribution returns it).
using Dist = std::vector<std::pair<int32_t, float>>;

struct DraftRequest {
  int32_t slot = 0;                   // the sequence's state slot
  int32_t k = 0;                      // drafts wanted (at most)
  std::span<const int32_t> history;   // prompt + every token emitted so far (the last is not yet in the target)
  const SamplingParams* sampling = nullptr;
  uint64_t rng_seed = 0;              // for sampled drafts; the caller varies it per round
  // Filled by the drafter:
  std::vector<int32_t> tokens;        // 0..k drafts
  std::vector<Dist> q;                // empty, or one distribution per draft token
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* name() const = 0;
  // Whether observe() needs the target's post-norm hidden states (the MTP head does).
  virtual bool wants_hidden() const { return false; }
  // Target layers whose outputs observe() needs in place of the post-norm hidden state (a
  // DFlash drafter's context features); empty: none.
  virtual std::vector<int32_t> capture_layers() const { return {}; }
  // A new sequence starts in `slot`.
  virtual void reset(int32_t /*slot*/) {}
  // A new sequence continues `slot`'s state after its first `reused` tokens (a prefix-cache
  // hit: the previous sequence's history is a prefix of the new prompt); `next_token` is the
  // new prompt's token at position `reused`. A drafter that cannot carry its own state over
  // forgets the slot, which costs acceptance, never correctness.
  virtual void resume(int32_t slot, int32_t /*reused*/, int32_t /*next_token*/) { reset(slot); }
  // The target has committed positions pos0 .. pos0 + n - 1 of `slot`: hidden holds their
  // post-norm hidden states (n rows, or empty when !wants_hidden()), next_tokens the token
  // that follows each (the last one sampled but not yet run through the target). A drafter
  // with capture_layers() gets those layers' outputs instead ([n, layers · hidden]); it may
  // be called once per prefill chunk, and its next_tokens may be empty.
  virtual void observe(int32_t /*slot*/, int32_t /*pos0*/, std::span<const float> /*hidden*/,
                       std::span<const int32_t> /*next_tokens*/) {}
  // Fills tokens (and q) of every request; requests of one call may be batched.
  virtual void propose(std::span<DraftRequest> requests) = 0;
};

}  // namespace qwen36
