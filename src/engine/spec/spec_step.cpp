#include "engine/spec/spec_step.h"

#include <algorithm>

#include "core/error.h"
#include "engine/spec/dflash_drafter.h"
#include "engine/spec/rejection.h"

namespace qwen36 {

SpecVerdict verify_round(std::span<float> rows, int64_t vocab, const DraftRequest& draft, Sampler& sampler,
                         std::mt19937_64& rng, std::span<const int32_t> history, bool greedy,
                         const std::function<bool(int32_t)>& accept) {
  const std::vector<int32_t>& drafts = draft.tokens;
  const int32_t m = int32_t(drafts.size());
  QWEN36_CHECK(int64_t(rows.size()) >= int64_t(m + 1) * vocab, "verify: {} logits for {} rows", rows.size(), m + 1);
  std::vector<int32_t> hist(history.begin(), history.end());  // + drafts accepted so far (penalties see them)
  SpecVerdict v;
  for (int32_t i = 0; i <= m; ++i) {
    const Dist p = sampler.distribution(rows.subspan(size_t(i) * size_t(vocab), size_t(vocab)), hist);
    if (i == m) {  // every draft accepted: the bonus token
      v.next = greedy ? p.front().first : draw(p, rng);
      break;
    }
    bool ok;
    if (accept) {
      ok = accept(i);
      if (!ok) v.next = greedy ? p.front().first : draw(p, rng);
    } else if (greedy) {
      ok = drafts[size_t(i)] == p.front().first;
      v.next = p.front().first;
    } else {
      ok = accept_or_recover(p, draft.q.empty() ? Dist{} : draft.q[size_t(i)], drafts[size_t(i)], rng, &v.next);
    }
    if (!ok) break;
    ++v.accepted;
    hist.push_back(drafts[size_t(i)]);
  }
  return v;
}

int32_t next_draft_n(const SpecOptions& o, int32_t k, int32_t drafted, int32_t accepted) {
  if (!o.adaptive || drafted <= 0) return k;
  return accepted == drafted ? std::min(o.draft_n, k + 1) : std::max(1, accepted + 1);
}

int32_t draft_room(int32_t tokens_left, int64_t capacity, int32_t pos) {
  return int32_t(std::min<int64_t>(tokens_left - 1, capacity - 2 - pos));
}

SpecStepper::SpecStepper(Model& model, ModelState& state, const SpecOptions& opts, std::unique_ptr<Drafter> custom)
    : model_(model), state_(state), opts_(opts), drafter_(std::move(custom)) {
  QWEN36_CHECK(opts.draft_n >= 1 && opts.draft_n <= 16, "speculative draft count {} is out of range (1..16)",
               opts.draft_n);
  if (!drafter_) {
    QWEN36_CHECK(opts.method != SpecMethod::None, "speculative decoding needs a method (mtp, ngram or dflash)");
    drafter_ = make_drafter(opts, model, state);  // MTP checks for its head and cache; dflash loads its drafter
  }
  if (const auto* d = dynamic_cast<const DFlashDrafter*>(drafter_.get())) opts_.draft_n = d->block_size() - 1;
  capture_ = drafter_->capture_layers();
  state.enable_speculation(opts_.draft_n + 1);
}

void SpecStepper::begin(SpecSeqState& st, int32_t slot, std::span<const int32_t> prompt, int32_t reused,
                        uint64_t seed) {
  st.k = opts_.draft_n;
  st.rng.seed(seed);
  st.draft = DraftRequest{};
  if (reused > 0)
    drafter_->resume(slot, reused, prompt[size_t(reused)]);
  else
    drafter_->reset(slot);
}

int32_t SpecStepper::sample(SpecSeqState& st, Sampler& sampler, std::span<float> logits,
                            std::span<const int32_t> history, const SamplingParams& sampling) {
  return verify_round(logits, int64_t(logits.size()), DraftRequest{}, sampler, st.rng, history,
                      sampling.temperature == 0.0f)
      .next;
}

void SpecStepper::observe(int32_t slot, int32_t pos0, std::span<const float> hidden,
                          std::span<const int32_t> next_tokens) {
  if (drafter_->wants_hidden()) drafter_->observe(slot, pos0, hidden, next_tokens);
}

void SpecStepper::observe_captured(int32_t slot, int32_t pos0, std::span<const float> features) {
  if (!capture_.empty()) drafter_->observe(slot, pos0, features, {});
}

void SpecStepper::propose(std::span<SpecTurn> turns, int32_t draft_budget) {
  std::vector<DraftRequest> reqs;
  std::vector<SpecTurn*> who;
  for (SpecTurn& t : turns) {
    t.st->draft = DraftRequest{};
    const int32_t k = std::min({t.st->k, t.room, draft_budget});
    if (k <= 0) continue;
    draft_budget -= k;
    DraftRequest r;
    r.slot = t.slot;
    r.k = k;
    r.history = t.history;
    r.sampling = t.sampling;
    r.rng_seed = t.st->rng();
    reqs.push_back(std::move(r));
    who.push_back(&t);
  }
  if (reqs.empty()) return;
  drafter_->propose(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    QWEN36_CHECK(int32_t(reqs[i].tokens.size()) <= reqs[i].k, "{} drafter proposed too many tokens", drafter_->name());
    who[i]->st->draft = std::move(reqs[i]);
  }
}

void SpecStepper::add_run(SpecTurn& t, ForwardBatch& batch) const {
  const std::vector<int32_t>& drafts = t.st->draft.tokens;
  const int32_t n = 1 + int32_t(drafts.size());
  t.begin = int32_t(batch.tokens.size());
  t.out_row = int32_t(batch.output_rows.size());
  if (n > 1) batch.verify_runs.push_back(int32_t(batch.runs.size()));
  batch.runs.push_back({t.slot, t.pos, t.begin, n});
  batch.tokens.push_back(t.history.back());
  batch.tokens.insert(batch.tokens.end(), drafts.begin(), drafts.end());
  for (int32_t i = 0; i < n; ++i) batch.output_rows.push_back(t.begin + i);
}

int32_t SpecStepper::finish_round(SpecTurn& t, std::span<float> logits, std::span<const float> hidden,
                                  const EmitFn& emit, std::span<const float> captured) {
  const size_t V = size_t(model_.config().vocab_size), H = size_t(model_.config().hidden_size);
  const DraftRequest& d = t.st->draft;
  const int32_t m = int32_t(d.tokens.size());
  const std::span<float> rows = logits.subspan(size_t(t.out_row) * V, size_t(m + 1) * V);
  std::vector<float> raw;
  if (t.want_raw) raw.assign(rows.begin(), rows.end());  // verify_round edits the rows
  const SpecVerdict v =
      verify_round(rows, int64_t(V), d, *t.sampler, t.st->rng, t.history, t.sampling->temperature == 0.0f);
  t.history = {};  // emission below grows the sequence's tokens
  std::vector<int32_t> out(d.tokens.begin(), d.tokens.begin() + v.accepted);
  out.push_back(v.next);
  int32_t emitted = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::span<const float> raw_row = raw.empty() ? std::span<const float>{} : std::span<const float>(raw).subspan(i * V, V);
    const Emit e = emit(out[i], raw_row, t.pos + int32_t(i) + 1);
    if (e != Emit::Refused) ++emitted;
    if (e != Emit::More) break;
  }
  // The slot keeps the pending token and each accepted draft that was also emitted: a draft
  // past a stop is dropped, so the state matches the tokens the sequence reports (and the
  // history its slot is cached under). A stop id that was itself an accepted draft is not
  // emitted and so not kept either.
  const int32_t keep = std::min(v.accepted, emitted) + 1;
  if (m > 0) commits_.push_back({t.slot, keep});  // a plain decode run already advanced its state
  metrics_.add_round(m, v.accepted);
  t.st->k = next_draft_n(opts_, t.st->k, m, v.accepted);
  // Row j pairs position pos + j with the token that follows it, out[j].
  if (!hidden.empty() && drafter_->wants_hidden())
    drafter_->observe(t.slot, t.pos, hidden.subspan(size_t(t.begin) * H, size_t(keep) * H),
                      std::span<const int32_t>(out).first(size_t(keep)));
  if (!captured.empty() && !capture_.empty()) {  // the kept rows: the drafter's new context
    const size_t F = capture_.size() * H;
    drafter_->observe(t.slot, t.pos, captured.subspan(size_t(t.begin) * F, size_t(keep) * F),
                      std::span<const int32_t>(out).first(size_t(keep)));
  }
  return keep;
}

void SpecStepper::commit() {
  model_.commit_speculative(state_, commits_);
  commits_.clear();
}

SpecMetrics SpecStepper::take_metrics() {
  SpecMetrics m;
  std::swap(m, metrics_);
  return m;
}

}  // namespace qwen36
