#include "engine/spec/mtp_drafter.h"

#include <algorithm>
#include <random>

#include "core/error.h"
#include "engine/spec/rejection.h"

namespace qwen36 {

MtpDrafter::MtpDrafter(Model& model, ModelState& state, bool device_chain)
    : model_(model), state_(state), device_chain_(device_chain) {
  QWEN36_CHECK(model.has_mtp(), "--spec mtp: this checkpoint has no MTP head");
  QWEN36_CHECK(state.has_mtp(), "MTP drafting needs a model state created with an MTP cache");
}

void MtpDrafter::reset(int32_t slot) { pending_.erase(slot); }

void MtpDrafter::resume(int32_t slot, int32_t reused, int32_t next_token) {
  auto it = pending_.find(slot);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  const int32_t n = reused - p.pos0;  // rows at positions pos0 .. reused - 1
  if (n <= 0 || n > int32_t(p.next_tokens.size())) {
    // Row reused - 1 is gone (already run with the old sequence's next token) or was never
    // observed: start from the new prompt's rows; the MTP entry at reused - 1 stays stale.
    pending_.erase(it);
    return;
  }
  p.next_tokens.resize(size_t(n));
  p.hidden.resize(size_t(n) * size_t(model_.config().hidden_size));
  p.next_tokens.back() = next_token;
}

void MtpDrafter::observe(int32_t slot, int32_t pos0, std::span<const float> hidden,
                         std::span<const int32_t> next_tokens) {
  const int64_t H = model_.config().hidden_size;
  QWEN36_CHECK(int64_t(hidden.size()) == int64_t(next_tokens.size()) * H, "MTP observe: {} hidden values for {} rows",
               hidden.size(), next_tokens.size());
  Pending& p = pending_[slot];
  if (p.next_tokens.empty()) p.pos0 = pos0;
  QWEN36_CHECK(pos0 == p.pos0 + int32_t(p.next_tokens.size()), "MTP observe: position {} does not follow {}", pos0,
               p.pos0 + int32_t(p.next_tokens.size()));
  p.hidden.insert(p.hidden.end(), hidden.begin(), hidden.end());
  p.next_tokens.insert(p.next_tokens.end(), next_tokens.begin(), next_tokens.end());
}

void MtpDrafter::propose(std::span<DraftRequest> requests) {
  const int64_t H = model_.config().hidden_size, V = model_.config().vocab_size;
  // Requests that draft this round, with their chain state.
  struct Chain {
    DraftRequest* req;
    int32_t pos;                  // MTP position of the next chained row
    std::vector<float> hidden;    // MTP output of the previous step
    std::vector<int32_t> history; // history + drafts so far (penalties see the drafts)
    std::mt19937_64 rng;
  };
  std::vector<Chain> chains;
  std::vector<float> hid;
  std::vector<int32_t> toks;
  std::vector<SeqRun> runs;
  for (DraftRequest& r : requests) {
    r.tokens.clear();
    r.q.clear();
    auto it = pending_.find(r.slot);
    if (r.k <= 0 || it == pending_.end() || it->second.next_tokens.empty()) continue;
    Pending& p = it->second;
    const int32_t n = int32_t(p.next_tokens.size());
    runs.push_back({r.slot, p.pos0, int32_t(toks.size()), n});
    hid.insert(hid.end(), p.hidden.begin(), p.hidden.end());
    toks.insert(toks.end(), p.next_tokens.begin(), p.next_tokens.end());
    chains.push_back({&r, p.pos0 + n, {}, {}, {}});  // history and rng: the host path's, set there
    pending_.erase(it);  // those rows are now in the MTP cache
  }
  if (chains.empty()) return;
  // Every chain greedy and unpenalised (the usual round): the chains run on the backend and only
  // the drafts come back (Model::mtp_draft_greedy; the same tokens). All run the longest chain's
  // steps, a shorter one keeping its first k drafts: its extra rows write MTP positions past its
  // drafts, which step 1 of a later round rewrites before any read (as a rejected draft's), and
  // which the context must hold.
  int32_t steps = 0;
  for (const Chain& ch : chains) steps = std::max(steps, ch.req->k);
  auto greedy_fits = [&](const Chain& ch) {
    const SamplingParams& p = *ch.req->sampling;
    return p.temperature == 0.0f && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f && int64_t(ch.pos) - 1 + steps <= state_.capacity();
  };
  const bool on_device = device_chain_ && !model_.peers() && std::all_of(chains.begin(), chains.end(), greedy_fits);
  if (on_device) {
    const size_t n = chains.size();
    std::vector<int32_t> drafts(size_t(steps) * n);
    model_.mtp_draft_greedy(hid, toks, runs, state_, steps, drafts.data());
    ++device_rounds_;
    for (size_t c = 0; c < n; ++c)
      for (int32_t j = 0; j < chains[c].req->k; ++j) chains[c].req->tokens.push_back(drafts[size_t(j) * n + c]);
    return;
  }
  for (Chain& ch : chains) {
    ch.history.assign(ch.req->history.begin(), ch.req->history.end());
    ch.rng.seed(ch.req->rng_seed);
  }
  std::vector<float> logits, mtp_hidden;
  // Each step: run the rows, then turn each chain's last row into its next draft (only those
  // rows get logits: catching up over a long prompt must not pay the vocabulary per row).
  auto run_step = [&](const std::vector<int32_t>& last_rows) {
    logits.resize(last_rows.size() * size_t(V));
    mtp_hidden.resize(last_rows.size() * size_t(H));
    model_.mtp_forward(hid, toks, runs, state_, logits.data(), mtp_hidden.data(), last_rows);
    for (size_t c = 0; c < last_rows.size(); ++c) {
      Chain& ch = chains[c];
      const size_t row = c;  // outputs are compact, in last_rows order
      std::span<float> l(logits.data() + row * size_t(V), size_t(V));
      Sampler sampler(*ch.req->sampling);
      Dist q = sampler.distribution(l, ch.history);
      const bool greedy = ch.req->sampling->temperature == 0.0f;
      const int32_t d = greedy ? q.front().first : draw(q, ch.rng);
      ch.req->tokens.push_back(d);
      if (!greedy) ch.req->q.push_back(std::move(q));
      ch.history.push_back(d);
      ch.hidden.assign(mtp_hidden.begin() + ptrdiff_t(row * size_t(H)), mtp_hidden.begin() + ptrdiff_t((row + 1) * size_t(H)));
    }
  };
  std::vector<int32_t> last_rows;
  for (const SeqRun& r : runs) last_rows.push_back(r.begin + r.count - 1);
  run_step(last_rows);
  // Chained steps over the requests that still want drafts; positions advance by one.
  for (int32_t step = 1;; ++step) {
    std::vector<Chain> next;
    hid.clear(), toks.clear(), runs.clear();
    for (Chain& ch : chains) {
      if (int32_t(ch.req->tokens.size()) >= ch.req->k) continue;
      runs.push_back({ch.req->slot, ch.pos - 1 + step, int32_t(toks.size()), 1});
      hid.insert(hid.end(), ch.hidden.begin(), ch.hidden.end());
      toks.push_back(ch.req->tokens.back());
      next.push_back(std::move(ch));
    }
    if (next.empty()) break;
    chains = std::move(next);
    last_rows.clear();
    for (const SeqRun& r : runs) last_rows.push_back(r.begin);
    run_step(last_rows);
  }
}

}  // namespace qwen36
