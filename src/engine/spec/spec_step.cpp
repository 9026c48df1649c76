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

SpecVerdict verify_greedy(std::span<const int32_t> argmax, std::span<const int32_t> drafts,
                          const std::function<bool(int32_t)>& accept) {
  const int32_t m = int32_t(drafts.size());
  QWEN36_CHECK(int64_t(argmax.size()) >= int64_t(m) + 1, "verify: {} rows for {} drafts", argmax.size(), m);
  SpecVerdict v;
  for (int32_t i = 0; i <= m; ++i) {
    v.next = argmax[size_t(i)];
    if (i == m || !(accept ? accept(i) : drafts[size_t(i)] == v.next)) break;
    ++v.accepted;
  }
  return v;
}

TreeWalk verify_tree(std::span<float> rows, int64_t vocab, const DraftTree& tree, Sampler& sampler,
                     std::mt19937_64& rng, std::span<const int32_t> history,
                     const std::function<bool(int32_t)>& accept) {
  const size_t V = size_t(vocab);
  QWEN36_CHECK(rows.size() >= size_t(tree.size()) * V, "verify: {} logits for a tree of {}", rows.size(), tree.size());
  std::vector<int32_t> next(size_t(tree.size()));
  std::vector<int32_t> hist(history.begin(), history.end());  // ends with the root (the pending token)
  const size_t base = hist.size();
  for (int32_t n = 0; n < tree.size(); ++n) {
    hist.resize(base + size_t(tree.depth[size_t(n)]));  // the history, then node n's path below the root
    for (int32_t a = n; a > 0; a = tree.parent[size_t(a)])
      hist[base + size_t(tree.depth[size_t(a)]) - 1] = tree.token[size_t(a)];
    next[size_t(n)] = draw(sampler.distribution(rows.subspan(size_t(n) * V, V), hist), rng);
  }
  return verify_tree_greedy(next, tree, accept);
}

TreeWalk verify_tree_greedy(std::span<const int32_t> next, const DraftTree& tree,
                            const std::function<bool(int32_t)>& accept) {
  QWEN36_CHECK(int64_t(next.size()) >= tree.size(), "verify: {} tokens for a tree of {}", next.size(), tree.size());
  if (!accept) return follow_draft_tree(tree, next.first(size_t(tree.size())));
  TreeWalk w;
  int32_t at = 0;
  for (;;) {
    int32_t child = -1;  // nodes come in decreasing probability: the first child found is the best
    for (int32_t n = at + 1; n < tree.size() && child < 0; ++n)
      if (tree.parent[size_t(n)] == at) child = n;
    if (child < 0 || !accept(tree.depth[size_t(child)] - 1)) break;
    w.accepted.push_back(child);
    at = child;
  }
  w.bonus = next[size_t(at)];
  return w;
}

SpecCommit tree_commit(int32_t slot, int32_t pos0, std::span<const int32_t> nodes) {
  SpecCommit cm{slot, int32_t(nodes.size()), pos0, 0};
  for (int32_t n : nodes) cm.path |= uint64_t(1) << n;
  return cm;
}

std::vector<float> path_rows(std::span<const float> rows, int32_t begin, std::span<const int32_t> nodes, size_t width) {
  std::vector<float> out;
  out.reserve(nodes.size() * width);
  for (int32_t n : nodes) {
    const auto row = rows.subspan((size_t(begin) + size_t(n)) * width, width);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
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
  if (opts_.tree_budget > 0) {
    tree_drafter_ = dynamic_cast<DFlashDrafter*>(drafter_.get());
    QWEN36_CHECK(tree_drafter_, "tree drafting (a tree budget of {}) needs the DFlash drafter", opts_.tree_budget);
    QWEN36_CHECK(opts_.tree_budget <= kMaxTreeBudget, "tree budget {} is out of range (1..{})", opts_.tree_budget,
                 kMaxTreeBudget);
  }
  capture_ = drafter_->capture_layers();
  state.enable_speculation(std::max(opts_.draft_n, opts_.tree_budget) + 1);
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
  std::vector<int32_t> nodes;  // tree rounds: each drafting turn's node budget
  for (SpecTurn& t : turns) {
    t.st->draft = DraftRequest{};
    t.st->tree = DraftTree{};
    // A chain round's k drafts, or a tree over k block positions whose nodes (the step's
    // budget counts them) write positions pos .. pos + nodes, leaving the context room for one
    // more; either emits at most k + 1 tokens.
    const int32_t k = std::min({t.st->k, t.room, tree_drafter_ ? t.room : draft_budget});
    const int32_t n = tree_drafter_ ? int32_t(std::min<int64_t>({opts_.tree_budget, state_.capacity() - 2 - t.pos,
                                                                  draft_budget}))
                                    : k;
    if (k <= 0 || n <= 0) continue;
    draft_budget -= n;
    nodes.push_back(n);
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
    SpecSeqState& st = *who[i]->st;
    st.draft = std::move(reqs[i]);
    if (!tree_drafter_ || st.draft.tokens.empty()) continue;
    const std::vector<Dist>& own = tree_drafter_->last_topk(st.draft.slot);
    // Simulated acceptance (benchmarks): the drafter's probabilities calibrated to the simulated
    // rates, as spec_generate_batch's tree rounds do (calibrated_positions).
    const std::vector<Dist> calibrated = opts_.simulated_confidence.empty()
                                             ? std::vector<Dist>{}
                                             : calibrated_positions(own, opts_.simulated_confidence);
    const std::vector<Dist>& top = opts_.simulated_confidence.empty() ? own : calibrated;
    const size_t depth = std::min<size_t>(size_t(st.draft.k), top.size());
    st.tree = build_draft_tree(who[i]->history.back(), std::span(top).first(depth), nodes[i]);
  }
}

std::function<bool(int32_t)> SpecStepper::accept_of(int32_t slot) const {
  if (!opts_.accept_override) return {};
  return [this, slot](int32_t i) { return opts_.accept_override(slot, i); };
}

int32_t SpecStepper::rows(const SpecTurn& t) {
  return t.st->tree.size() > 1 ? t.st->tree.size() : 1 + int32_t(t.st->draft.tokens.size());
}

bool SpecStepper::greedy_rows(const SpecTurn& t) {
  return t.sampling->temperature == 0.0f && !t.shape && !t.want_raw && !t.sampler->has_penalties();
}

void SpecStepper::add_run(SpecTurn& t, ForwardBatch& batch) const {
  const std::vector<int32_t>& drafts = t.st->draft.tokens;
  const DraftTree& tree = t.st->tree;
  const bool treed = tree.size() > 1;
  const int32_t n = rows(t);
  t.begin = int32_t(batch.tokens.size());
  t.out_row = int32_t(batch.output_rows.size());
  if (n > 1) {
    // verify_trees: every verify run's parents (empty: a chain), or no entries at all.
    if (treed) batch.verify_trees.resize(batch.verify_runs.size());
    batch.verify_runs.push_back(int32_t(batch.runs.size()));
    if (treed || !batch.verify_trees.empty()) batch.verify_trees.push_back(treed ? tree.parent : std::vector<int32_t>{});
  }
  batch.runs.push_back({t.slot, t.pos, t.begin, n});
  if (treed) {
    batch.tokens.insert(batch.tokens.end(), tree.token.begin(), tree.token.end());  // the root: the pending token
  } else {
    batch.tokens.push_back(t.history.back());
    batch.tokens.insert(batch.tokens.end(), drafts.begin(), drafts.end());
  }
  for (int32_t i = 0; i < n; ++i) batch.output_rows.push_back(t.begin + i);
}

int32_t SpecStepper::finish_round(SpecTurn& t, std::span<float> logits, std::span<const float> hidden,
                                  const EmitFn& emit, std::span<const float> captured) {
  if (t.st->tree.size() > 1) return finish_tree_round(t, logits, emit, captured);
  const size_t V = size_t(model_.config().vocab_size), H = size_t(model_.config().hidden_size);
  const DraftRequest& d = t.st->draft;
  const int32_t m = int32_t(d.tokens.size());
  std::vector<float> raw;
  SpecVerdict v;
  if (!t.argmax.empty()) {  // greedy_rows: sampled on the backend
    v = verify_greedy(t.argmax, d.tokens, accept_of(t.slot));
  } else {
    const std::span<float> rows = logits.subspan(size_t(t.out_row) * V, size_t(m + 1) * V);
    if (t.want_raw) raw.assign(rows.begin(), rows.end());  // verify_round edits the rows
    if (t.shape) shape_chain_rows(t.shape, d.tokens, rows, int64_t(V));
    v = verify_round(rows, int64_t(V), d, *t.sampler, t.st->rng, t.history, t.sampling->temperature == 0.0f,
                     accept_of(t.slot));
  }
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

void shape_chain_rows(const RowShaper& shape, std::span<const int32_t> drafts, std::span<float> rows, int64_t vocab) {
  const size_t V = size_t(vocab);
  for (size_t j = 0; j <= drafts.size(); ++j)
    if (!shape(drafts.first(j), rows.subspan(j * V, V))) break;
}

void shape_tree_rows(const RowShaper& shape, const DraftTree& tree, std::span<float> rows, int64_t vocab) {
  const size_t V = size_t(vocab);
  for (int32_t n = 0; n < tree.size(); ++n) shape(tree.path_tokens(n), rows.subspan(size_t(n) * V, V));
}

// A tree round: the walk of the verified tree picks a path (verify_tree); its tokens and the
// target's token after it are emitted, the slot keeps the root and the emitted path nodes (their
// saved DeltaNet inputs replayed, K/V rows moved to their positions: SpecCommit::path), and
// those nodes' captured rows become the drafter's new context.
int32_t SpecStepper::finish_tree_round(SpecTurn& t, std::span<float> logits, const EmitFn& emit,
                                       std::span<const float> captured) {
  const size_t V = size_t(model_.config().vocab_size);
  const DraftTree& tree = t.st->tree;
  std::vector<float> raw;
  TreeWalk w;
  if (!t.argmax.empty()) {  // greedy_rows: sampled on the backend
    w = verify_tree_greedy(t.argmax, tree, accept_of(t.slot));
  } else {
    const std::span<float> rows = logits.subspan(size_t(t.out_row) * V, size_t(tree.size()) * V);
    if (t.want_raw) raw.assign(rows.begin(), rows.end());  // verify_tree edits the rows
    if (t.shape) shape_tree_rows(t.shape, tree, rows, int64_t(V));
    w = verify_tree(rows, int64_t(V), tree, *t.sampler, t.st->rng, t.history, accept_of(t.slot));
  }
  t.history = {};  // emission below grows the sequence's tokens
  const int32_t accepted = int32_t(w.accepted.size());
  const std::vector<int32_t> nodes = w.path(), out = w.tokens(tree);  // out[i] follows node nodes[i]'s path
  int32_t emitted = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::span<const float> raw_row =
        raw.empty() ? std::span<const float>{} : std::span<const float>(raw).subspan(size_t(nodes[i]) * V, V);
    const Emit e = emit(out[i], raw_row, t.pos + int32_t(i) + 1);
    if (e != Emit::Refused) ++emitted;
    if (e != Emit::More) break;
  }
  const int32_t keep = std::min(accepted, emitted) + 1;  // as finish_round: no draft past a stop
  const std::span<const int32_t> kept = std::span(nodes).first(size_t(keep));
  commits_.push_back(tree_commit(t.slot, t.pos, kept));
  metrics_.add_round(tree.max_depth(), accepted);
  if (!captured.empty() && !capture_.empty()) {
    const size_t F = capture_.size() * size_t(model_.config().hidden_size);
    drafter_->observe(t.slot, t.pos, path_rows(captured, t.begin, kept, F), std::span(out).first(size_t(keep)));
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
