#pragma once
// defines: VerifyResult, verify_drafts (lossless acceptance of k drafts against the target)
//
// Leviathan et al. 2023 / Chen et al. 2023, as vLLM's rejection sampler applies them:
// - greedy: accept draft i iff it equals argmax p_i; at the first mismatch emit argmax p_i;
// - sampling: accept draft x with probability min(1, p(x)/q(x)); on rejection emit a token
//   drawn from norm(max(0, p − q)) and stop; q one-hot (deterministic drafts) reduces this
//   to accepting with probability p(x) and drawing from p with x removed;
// - if every draft is accepted, a bonus token is drawn from p_k.
// Every emitted token is then distributed exactly as the target alone would sample it.

#include <random>
#include <span>

#include "engine/spec/drafter.h"

namespace qwen36 {

// One accept/reject decision: p, q target and draft distributions (q empty: one-hot on
// draft). Returns true when accepted; otherwise *replacement gets the recovered token.
bool accept_or_recover(const Dist& p, const Dist& q, int32_t draft, std::mt19937_64& rng, int32_t* replacement);

// A token drawn from p (sparse, normalised).
int32_t draw(const Dist& p, std::mt19937_64& rng);

}  // namespace qwen36
