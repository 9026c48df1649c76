#include "engine/spec/spec_generate.h"

#include <algorithm>
#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/spec/dflash_drafter.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/mtp_drafter.h"
#include "engine/spec/rejection.h"
#include "engine/spec/spec_step.h"

namespace qwen36 {

SpecMethod parse_spec_method(const std::string& s) {
  if (s == "mtp") return SpecMethod::Mtp;
  if (s == "ngram") return SpecMethod::Ngram;
  if (s == "dflash") return SpecMethod::Dflash;
  if (s == "none") return SpecMethod::None;
  fail("unknown speculative method \"{}\" (mtp, ngram, dflash or none)", s);
}

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::Mtp: return "mtp";
    case SpecMethod::Ngram: return "ngram";
    case SpecMethod::Dflash: return "dflash";
    case SpecMethod::None: break;
  }
  return "none";
}

std::unique_ptr<Drafter> make_drafter(SpecMethod method, Model& model, ModelState& state, const NgramOptions& ngram) {
  switch (method) {
    case SpecMethod::Mtp: return std::make_unique<MtpDrafter>(model, state);
    case SpecMethod::Ngram: return std::make_unique<NgramDrafter>(ngram);
    case SpecMethod::Dflash: fail("speculative method dflash is not available here yet (it needs --draft-model; qwen36 run has it)");
    case SpecMethod::None: break;
  }
  return nullptr;
}

std::unique_ptr<Drafter> make_drafter(const SpecOptions& spec, Model& model, ModelState& state) {
  if (spec.method != SpecMethod::Dflash) return make_drafter(spec.method, model, state, spec.ngram);
  QWEN36_CHECK(!spec.draft_model.empty(), "--spec dflash needs a drafter checkpoint (--draft-model PATH)");
  // A tree needs each block position's top-K; the chain only the argmax.
  return load_dflash_drafter(spec.draft_model, model, model.backend(), state.slots(), state.capacity(), spec.dflash,
                             spec.tree_budget > 0 ? kTreeTopK : 0);
}

SpecOptions parse_speculative_config(const std::string& text) {
  const char* keys = "method, model, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("--speculative-config: not valid JSON ({})", e.what());
  }
  QWEN36_CHECK(j.is_object(), "--speculative-config: expected a JSON object like {{\"method\":\"mtp\",\"num_speculative_tokens\":3}}");
  auto int_of = [](const nlohmann::json& v, const std::string& key, int64_t lo, int64_t hi) {
    QWEN36_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
                 "--speculative-config: \"{}\" must be an integer in {}..{}, not {}", key, lo, hi, v.dump());
    return int32_t(v.get<int64_t>());
  };
  SpecOptions o;
  bool has_method = false, lookup = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "method") {
      QWEN36_CHECK(v.is_string(), "--speculative-config: \"method\" must be a string (mtp, ngram, dflash or none), not {}", v.dump());
      const std::string m = v.get<std::string>();
      QWEN36_CHECK(m == "mtp" || m == "ngram" || m == "dflash" || m == "none",
                   "--speculative-config: \"method\" \"{}\" is not supported (mtp, ngram, dflash or none)", m);
      o.method = parse_spec_method(m);
      has_method = true;
    } else if (key == "num_speculative_tokens") {
      o.draft_n = int_of(v, key, 1, 16);
      o.dflash.block_size = o.draft_n + 1;
    } else if (key == "model") {
      QWEN36_CHECK(v.is_string() && !v.get<std::string>().empty(), "--speculative-config: \"model\" must be a path, not {}", v.dump());
      o.draft_model = v.get<std::string>();
    } else if (key == "prompt_lookup_max") {
      o.ngram.max_n = int_of(v, key, 1, 64);
      lookup = true;
    } else if (key == "prompt_lookup_min") {
      o.ngram.min_n = int_of(v, key, 1, 64);
      lookup = true;
    } else {
      fail("--speculative-config: unknown key \"{}\" (known: {})", key, keys);
    }
  }
  QWEN36_CHECK(has_method, "--speculative-config: \"method\" is missing (mtp, ngram or none)");
  QWEN36_CHECK(o.draft_model.empty() || o.method == SpecMethod::Dflash,
               "--speculative-config: \"model\" (a drafter checkpoint) applies to method dflash only");
  QWEN36_CHECK(!lookup || o.method == SpecMethod::Ngram,
               "--speculative-config: \"prompt_lookup_max\"/\"prompt_lookup_min\" apply to method ngram only");
  QWEN36_CHECK(o.ngram.min_n <= o.ngram.max_n, "--speculative-config: \"prompt_lookup_min\" {} exceeds \"prompt_lookup_max\" {}",
               o.ngram.min_n, o.ngram.max_n);
  return o;
}

namespace {

using clock = std::chrono::steady_clock;

// One running sequence.
struct Live {
  SpecSequence* in;
  SpecResult res;
  std::vector<int32_t> history;  // prompt + emitted tokens; the last emitted one is pending
  int32_t pos = 0;               // positions the target has run (= position of the pending token)
  int32_t k = 0;                 // drafts to ask for next round
  bool done = false;
  Sampler sampler;               // distributions only (filters, penalties); draws use rng
  std::mt19937_64 rng;
  DraftRequest draft;
  DraftTree tree;  // this round's draft tree (tree rounds: SpecOptions::tree_budget)
  Live(SpecSequence& s, int32_t k0)
      : in(&s), history(s.prompt), k(k0), sampler(s.opts.sampling), rng(s.opts.sampling.seed) {}

  // Emits `tok` as generate() would: a stop id ends without emitting; so do max_tokens,
  // a cancelling callback, and the context filling up (checked by the caller).
  bool emit(int32_t tok) {
    const GenerateOptions& o = in->opts;
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), tok) != o.stop_ids.end()) return finish("eos");
    QWEN36_CHECK(!o.constraint || o.constraint->accept(tok), "token {} breaks the output constraint", tok);
    res.gen.tokens.push_back(tok);
    history.push_back(tok);
    if (in->on_token && !in->on_token(tok)) return finish("cancelled");
    if (o.constraint && o.constraint->finished()) return finish("document");
    if (int32_t(res.gen.tokens.size()) >= o.max_tokens) return finish("length");
    return true;
  }
  // The sequence's output constraint on verify rows (none: null).
  RowShaper shaper() const {
    TokenConstraint* c = in->opts.constraint;
    if (!c) return {};
    return [c](std::span<const int32_t> path, std::span<float> row) { return c->apply_after(path, row); };
  }
  bool finish(const char* why) {
    res.gen.stop_reason = why;
    done = true;
    return false;
  }
};

void check_sequence(const SpecSequence& s, const Model& model, const ModelState& state) {
  QWEN36_CHECK(!s.prompt.empty(), "the prompt is empty");
  QWEN36_CHECK(s.opts.max_tokens >= 0, "max_tokens {} must be >= 0", s.opts.max_tokens);
  QWEN36_CHECK(s.opts.prefill_chunk > 0, "prefill chunk must be positive");
  QWEN36_CHECK(s.slot >= 0 && s.slot < state.slots(), "slot {} out of range", s.slot);
  for (int32_t t : s.prompt)
    QWEN36_CHECK(t >= 0 && t < model.config().vocab_size, "prompt token {} is outside the vocabulary", t);
  QWEN36_CHECK(int64_t(s.prompt.size()) < state.capacity(), "the prompt ({} tokens) does not fit the context ({})",
               s.prompt.size(), state.capacity());
}

// Prefill in generate()'s chunks; returns the last row's logits. With `hidden`, every
// prompt row's post-norm hidden state too (the MTP's first inputs). With `capture_to`, every
// chunk's captured layer outputs go to that drafter's observe() as the chunk finishes.
void prefill(Model& model, ModelState& state, const SpecSequence& s, std::vector<float>& logits,
             std::vector<float>* hidden, Drafter* capture_to = nullptr) {
  const std::vector<int32_t>& prompt = s.prompt;
  const size_t H = size_t(model.config().hidden_size);
  if (hidden) hidden->resize(prompt.size() * H);
  for (size_t b = 0; b < prompt.size(); b += size_t(s.opts.prefill_chunk)) {
    const size_t n = std::min(prompt.size() - b, size_t(s.opts.prefill_chunk));
    const bool last = b + n == prompt.size();
    ForwardBatch batch = ForwardBatch::single(std::span(prompt).subspan(b, n), int32_t(b), s.slot, false);
    if (!last) batch.output_rows.clear();
    if (hidden || capture_to)
      for (int32_t i = 0; i < int32_t(n); ++i) batch.hidden_rows.push_back(i);
    std::vector<float> captured;
    if (capture_to) {
      batch.capture_layers = capture_to->capture_layers();
      captured.resize(n * batch.capture_layers.size() * H);
    }
    model.forward(batch, state, last ? logits.data() : nullptr, hidden ? hidden->data() + b * H : nullptr,
                  capture_to ? captured.data() : nullptr);
    if (capture_to) capture_to->observe(s.slot, int32_t(b), captured, {});
  }
}

}  // namespace

std::vector<SpecResult> spec_generate_batch(Model& model, ModelState& state, std::span<SpecSequence> seqs,
                                            const SpecOptions& spec, Drafter* drafter) {
  const ModelConfig& c = model.config();
  const size_t V = size_t(c.vocab_size), H = size_t(c.hidden_size);
  QWEN36_CHECK(spec.draft_n >= 1 && spec.draft_n <= 16, "--spec-draft-n {} is out of range (1..16)", spec.draft_n);
  auto* tree_drafter = spec.tree_budget > 0 ? dynamic_cast<DFlashDrafter*>(drafter) : nullptr;
  QWEN36_CHECK(spec.tree_budget == 0 || tree_drafter, "tree drafting (a tree budget of {}) needs the DFlash drafter",
               spec.tree_budget);
  QWEN36_CHECK(spec.tree_budget <= kMaxTreeBudget, "tree budget {} is out of range (1..{})", spec.tree_budget,
               kMaxTreeBudget);
  if (drafter) state.enable_speculation(std::max(spec.draft_n, spec.tree_budget) + 1);
  const bool want_hidden = drafter && drafter->wants_hidden();
  const std::vector<int32_t> capture = drafter ? drafter->capture_layers() : std::vector<int32_t>{};
  const size_t F = capture.size() * H;  // captured values per row
  std::vector<Live> live;
  live.reserve(seqs.size());
  for (SpecSequence& s : seqs) {
    check_sequence(s, model, state);
    for (const Live& l : live) QWEN36_CHECK(l.in->slot != s.slot, "two sequences share slot {}", s.slot);
    live.emplace_back(s, spec.draft_n);
  }

  // Prefill and the first token of every sequence (no drafts yet).
  std::vector<float> logits(V), hidden;
  for (Live& l : live) {
    const SpecSequence& s = *l.in;
    const auto t0 = clock::now();
    state.reset_slot(s.slot);
    if (drafter) drafter->reset(s.slot);
    l.res.gen.n_prompt = int32_t(s.prompt.size());
    l.res.gen.stop_reason = "length";
    prefill(model, state, s, logits, want_hidden && s.draft ? &hidden : nullptr,
            F && s.draft ? drafter : nullptr);
    l.res.gen.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    l.pos = int32_t(s.prompt.size());
    if (s.opts.max_tokens == 0) {
      l.done = true;
      continue;
    }
    if (TokenConstraint* m = s.opts.constraint; m && m->masks())
      QWEN36_CHECK(m->apply(logits) > 0, "the output constraint admits no token here");
    if (!l.emit(draw(l.sampler.distribution(logits, l.history), l.rng))) continue;
    if (want_hidden && s.draft) {
      std::vector<int32_t> next(s.prompt.begin() + 1, s.prompt.end());
      next.push_back(l.history.back());
      drafter->observe(s.slot, 0, hidden, next);
    }
    if (l.pos + 1 >= state.capacity()) l.finish("context");
  }

  // Decode rounds.
  const auto t_decode = clock::now();
  std::vector<float> verify_hidden, captured;
  std::vector<int32_t> greedy_rows;  // device_greedy: each verify row's argmax
  int64_t passes = 0;
  SpecPhases phases;
  auto lap = [t = clock::now()](double& into) mutable {
    const auto now = clock::now();
    into += std::chrono::duration<double>(now - t).count();
    t = now;
  };
  for (;;) {
    std::vector<Live*> active;
    for (Live& l : live)
      if (!l.done) active.push_back(&l);
    if (active.empty()) break;
    lap(phases.commit);  // the last round's commit (and loop bookkeeping)

    // 1. Drafts, within what may still be emitted and what the context holds: a round
    //    emits at most k + 1 tokens and writes positions pos .. pos + k.
    std::vector<DraftRequest> reqs;
    std::vector<Live*> drafting;
    for (Live* l : active) {
      l->draft = DraftRequest{};
      const int32_t room =
          draft_room(l->in->opts.max_tokens - int32_t(l->res.gen.tokens.size()), state.capacity(), l->pos);
      const int32_t k = std::min(l->k, room);
      if (!drafter || !l->in->draft || k <= 0) continue;
      DraftRequest r;
      r.slot = l->in->slot;
      r.k = k;
      r.history = l->history;
      r.sampling = &l->in->opts.sampling;
      r.rng_seed = l->rng();
      reqs.push_back(std::move(r));
      drafting.push_back(l);
    }
    if (!reqs.empty()) drafter->propose(reqs);
    lap(phases.draft);
    for (size_t i = 0; i < reqs.size(); ++i) {
      QWEN36_CHECK(int32_t(reqs[i].tokens.size()) <= reqs[i].k, "{} drafter proposed too many tokens", drafter->name());
      Live& l = *drafting[i];
      l.draft = std::move(reqs[i]);
      if (!tree_drafter) continue;
      // The tree spends the budget on the k block positions the round may emit; its n nodes
      // write positions pos .. pos + n − 1, which must leave the context room for one more.
      const std::vector<Dist>& own = tree_drafter->last_topk(l.in->slot);
      std::vector<Dist> calibrated;  // benchmarks with simulated acceptance only
      if (!spec.simulated_confidence.empty()) calibrated = calibrated_positions(own, spec.simulated_confidence);
      const std::vector<Dist>& top = spec.simulated_confidence.empty() ? own : calibrated;
      const int32_t depth = std::min<int32_t>(l.draft.k, int32_t(top.size()));
      const int32_t budget = int32_t(std::min<int64_t>(spec.tree_budget, state.capacity() - l.pos - 2));
      l.tree = build_draft_tree(l.history.back(), std::span(top).first(size_t(depth)), budget);
    }

    lap(phases.tree);

    // 2. One target forward: [pending, drafts...] per sequence, every row's logits.
    //    A tree round's run is its tree's nodes (root: the pending token), with parents.
    ForwardBatch batch;
    for (Live* l : active) {
      const bool tree = tree_drafter && !l->draft.tokens.empty();
      const int32_t n = tree ? l->tree.size() : 1 + int32_t(l->draft.tokens.size());
      if (n > 1) {
        batch.verify_runs.push_back(int32_t(batch.runs.size()));
        batch.verify_trees.push_back(tree ? l->tree.parent : std::vector<int32_t>{});
      }
      batch.runs.push_back({l->in->slot, l->pos, int32_t(batch.tokens.size()), n});
      if (tree) {
        batch.tokens.insert(batch.tokens.end(), l->tree.token.begin(), l->tree.token.end());
      } else {
        batch.tokens.push_back(l->history.back());
        batch.tokens.insert(batch.tokens.end(), l->draft.tokens.begin(), l->draft.tokens.end());
      }
    }
    if (!tree_drafter) batch.verify_trees.clear();
    for (int32_t i = 0; i < int32_t(batch.tokens.size()); ++i) batch.output_rows.push_back(i);
    logits.resize(batch.tokens.size() * V);
    verify_hidden.resize(want_hidden ? batch.tokens.size() * H : 0);
    batch.capture_layers = capture;
    captured.resize(batch.tokens.size() * F);
    // Greedy rounds (chains and trees) without penalties take each row's argmax on the device (forward_sample:
    // a few candidates per row to the host instead of every row's logits); a row whose
    // candidates do not decide comes back whole (full_logits) and is decided here.
    const bool device_greedy = std::all_of(active.begin(), active.end(), [](const Live* l) {
      return l->in->opts.sampling.temperature == 0.0f && !l->sampler.has_penalties() && !l->in->opts.constraint;
    });
    greedy_rows.assign(device_greedy ? batch.tokens.size() : 0, -1);
    if (device_greedy) {
      SampleRequest req;
      for (size_t si = 0; si < active.size(); ++si)
        for (int32_t j = 0; j < batch.runs[si].count; ++j)
          active[si]->sampler.add_candidate_row(active[si]->history, int64_t(V), req.rows, req.penalties, false);
      req.take = [&](int32_t row, const SampleCandidates& cand) {
        const std::optional<int32_t> t = active[0]->sampler.sample_from_candidates(cand);  // greedy: any row's sampler
        if (t) greedy_rows[size_t(row)] = *t;
        return t.has_value();
      };
      req.full_logits = logits.data();
      model.forward_sample(batch, state, req, want_hidden ? verify_hidden.data() : nullptr,
                           F ? captured.data() : nullptr);
      for (size_t row = 0; row < greedy_rows.size(); ++row)
        if (greedy_rows[row] < 0)
          greedy_rows[row] = active[0]->sampler.sample_penalised(std::span(logits).subspan(row * V, V));
    } else {
      model.forward(batch, state, logits.data(), want_hidden ? verify_hidden.data() : nullptr,
                    F ? captured.data() : nullptr);
    }
    ++passes;
    lap(phases.verify);

    // 3. Acceptance, emission, commit.
    std::vector<SpecCommit> commits;
    // A tree round: walk the verified tree, emit its path and the target's token after it,
    // commit the path (its saved DeltaNet inputs, its K/V rows moved to their positions), and
    // give the drafter the path's captured rows as its new context.
    auto finish_tree_round = [&](Live& l, const SeqRun& run) {
      std::function<bool(int32_t)> accept;
      if (spec.accept_override) accept = [&](int32_t i) { return spec.accept_override(l.in->slot, i); };
      const std::span<float> rows = std::span(logits).subspan(size_t(run.begin) * V, size_t(run.count) * V);
      if (const RowShaper shape = l.shaper()) shape_tree_rows(shape, l.tree, rows, int64_t(V));
      const TreeWalk w =
          device_greedy
              ? verify_tree_greedy(std::span(greedy_rows).subspan(size_t(run.begin), size_t(run.count)), l.tree, accept)
              : verify_tree(rows, int64_t(V), l.tree, l.sampler, l.rng, l.history, accept);
      const int32_t accepted = int32_t(w.accepted.size());
      l.res.metrics.add_round(l.tree.max_depth(), accepted);
      const std::vector<int32_t> nodes = w.path(), out = w.tokens(l.tree);
      bool alive = true;
      for (int32_t t : out)
        if (!(alive = l.emit(t))) break;
      if (!alive) return;
      if (run.count > 1) commits.push_back(tree_commit(l.in->slot, l.pos, nodes));  // (a lone root ran as a plain token)
      if (F && l.in->draft) drafter->observe(l.in->slot, l.pos, path_rows(captured, run.begin, nodes, F), out);
      l.pos += accepted + 1;
      if (l.pos + 1 >= state.capacity()) l.finish("context");
    };
    for (size_t si = 0; si < active.size(); ++si) {
      Live& l = *active[si];
      const SeqRun& run = batch.runs[si];
      if (tree_drafter && !l.draft.tokens.empty()) {
        finish_tree_round(l, run);
        continue;
      }
      const std::vector<int32_t>& drafts = l.draft.tokens;
      const int32_t m = int32_t(drafts.size());
      std::function<bool(int32_t)> accept;
      if (spec.accept_override) accept = [&](int32_t i) { return spec.accept_override(l.in->slot, i); };
      const std::span<float> rows = std::span(logits).subspan(size_t(run.begin) * V, size_t(m + 1) * V);
      if (const RowShaper shape = l.shaper()) shape_chain_rows(shape, drafts, rows, int64_t(V));
      const SpecVerdict v =
          device_greedy ? verify_greedy(std::span(greedy_rows).subspan(size_t(run.begin), size_t(m + 1)), drafts, accept)
                        : verify_round(rows, int64_t(V), l.draft, l.sampler, l.rng, l.history,
                                       l.in->opts.sampling.temperature == 0.0f, accept);
      const int32_t accepted = v.accepted, next = v.next;
      l.res.metrics.add_round(m, accepted);
      l.k = next_draft_n(spec, l.k, m, accepted);

      std::vector<int32_t> out(drafts.begin(), drafts.begin() + accepted);
      out.push_back(next);
      bool alive = true;
      for (int32_t t : out)
        if (!(alive = l.emit(t))) break;
      if (m > 0 && alive) commits.push_back({l.in->slot, accepted + 1});
      if (!alive) continue;
      if (want_hidden && l.in->draft)
        drafter->observe(l.in->slot, l.pos, std::span(verify_hidden).subspan(size_t(run.begin) * H, size_t(accepted + 1) * H),
                         out);
      if (F && l.in->draft)  // the committed rows' layer outputs: the drafter's new context
        drafter->observe(l.in->slot, l.pos, std::span(captured).subspan(size_t(run.begin) * F, size_t(accepted + 1) * F),
                         out);
      l.pos += accepted + 1;
      if (l.pos + 1 >= state.capacity()) l.finish("context");
    }
    lap(phases.accept);
    model.commit_speculative(state, commits);
  }
  lap(phases.commit);
  phases.rounds = passes;
  const double decode_s = std::chrono::duration<double>(clock::now() - t_decode).count();
  std::vector<SpecResult> results;
  for (Live& l : live) {
    l.res.gen.decode_seconds = decode_s;  // the rounds were shared
    l.res.target_passes = passes;
    l.res.phases = phases;
    results.push_back(std::move(l.res));
  }
  return results;
}

void SpecPhases::add(const SpecPhases& o) {
  draft += o.draft, tree += o.tree, verify += o.verify, accept += o.accept, commit += o.commit, rounds += o.rounds;
}

std::string SpecPhases::summary() const {
  const double n = double(std::max<int64_t>(rounds, 1)) / 1e3;
  return fmt::format("per round ({} rounds): draft {:.2f} ms, tree {:.2f}, verify {:.2f}, accept {:.2f}, commit {:.2f}",
                     rounds, draft / n, tree / n, verify / n, accept / n, commit / n);
}

SpecResult spec_generate(Model& model, ModelState& state, const std::vector<int32_t>& prompt,
                         const GenerateOptions& opts, const SpecOptions& spec,
                         const std::function<bool(int32_t)>& on_token, int32_t slot) {
  std::unique_ptr<Drafter> drafter = make_drafter(spec, model, state);
  SpecOptions o = spec;
  if (auto* d = dynamic_cast<DFlashDrafter*>(drafter.get())) o.draft_n = d->block_size() - 1;
  SpecSequence s{prompt, opts, slot, true, on_token};
  return std::move(spec_generate_batch(model, state, std::span(&s, 1), o, drafter.get()).front());
}

}  // namespace qwen36
