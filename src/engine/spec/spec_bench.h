#pragma once
// defines: RepeatDrafter (stand-in drafter: k copies of the last token), SimulatedAcceptance
//          (per-position accept probabilities for SpecOptions::accept_override), spec_bench_run
//          (one greedy speculative decode of a batch of prompts, as `qwen36 bench --spec` times it)
//
// Header-only: these are thin layers over spec_generate_batch, shared by the bench command and
// its tests so that both exercise exactly the same path.

#include <algorithm>
#include <random>
#include <vector>

#include "engine/spec/spec_generate.h"

namespace qwen36 {

// Drafts without a draft model: the last token k times. Used with simulated acceptance on
// checkpoints that have no MTP head: the target's verify pass and the commit are what is
// being timed, and those do not depend on which tokens are drafted.
class RepeatDrafter final : public Drafter {
 public:
  const char* name() const override { return "repeat-last stand-in"; }
  void propose(std::span<DraftRequest> requests) override {
    for (DraftRequest& r : requests) r.tokens.assign(size_t(r.k), r.history.back());
  }
};

// Accepts draft i of a round with probability p[i] (the last value beyond the list),
// conditional on drafts 0..i-1 having been accepted: spec_generate_batch only asks for
// position i after accepting i-1, and the first refusal ends the round. Fixed seed, so a
// bench run is reproducible. Counts its own trials so the conditional rates can be reported.
struct SimulatedAcceptance {
  std::vector<double> p;
  std::mt19937_64 rng;
  std::vector<uint64_t> trials, hits;  // per position

  explicit SimulatedAcceptance(std::vector<double> probs, uint64_t seed = 0x5eed)
      : p(std::move(probs)), rng(seed), trials(p.size()), hits(p.size()) {}

  // The callback for SpecOptions::accept_override; `this` must outlive its use.
  std::function<bool(int32_t, int32_t)> callback() {
    return [this](int32_t, int32_t i) {
      const size_t at = std::min(size_t(i), p.size() - 1);
      if (size_t(i) >= trials.size()) {
        trials.resize(size_t(i) + 1);
        hits.resize(size_t(i) + 1);
      }
      const bool ok = std::uniform_real_distribution<double>(0, 1)(rng) < p[at];
      ++trials[size_t(i)];
      hits[size_t(i)] += ok;
      return ok;
    };
  }
  std::vector<double> rates() const {  // measured conditional acceptance per position reached
    size_t n = trials.size();
    while (n > 0 && trials[n - 1] == 0) --n;
    std::vector<double> r(n);
    for (size_t i = 0; i < r.size(); ++i) r[i] = trials[i] ? double(hits[i]) / double(trials[i]) : 0;
    return r;
  }
};

struct SpecBenchRun {
  std::vector<SpecResult> results;  // per prompt
  SpecMetrics metrics;              // merged over the prompts
  double decode_seconds = 0;        // the decode rounds (prefill and the first token excluded)
  int64_t decoded_tokens = 0;       // tokens emitted by those rounds, all sequences
  int64_t target_passes = 0;
  SpecPhases phases;                // where the rounds' time went
  double tok_s() const { return decode_seconds > 0 ? double(decoded_tokens) / decode_seconds : 0; }
};

// Prompt b decodes greedily in slot b, max_tokens tokens, no stop ids. drafter null: the same
// loop without drafts (the bench's baseline).
inline SpecBenchRun spec_bench_run(Model& model, ModelState& state, const std::vector<std::vector<int32_t>>& prompts,
                                   int32_t max_tokens, const SpecOptions& spec, Drafter* drafter) {
  std::vector<SpecSequence> seqs(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    seqs[b].prompt = prompts[b];
    seqs[b].opts.max_tokens = max_tokens;
    seqs[b].opts.sampling = SamplingParams::greedy();
    seqs[b].slot = int32_t(b);
  }
  SpecBenchRun run;
  run.results = spec_generate_batch(model, state, seqs, spec, drafter);
  for (const SpecResult& r : run.results) {
    run.metrics.merge(r.metrics);
    run.decoded_tokens += std::max<int64_t>(0, int64_t(r.gen.tokens.size()) - 1);
    run.decode_seconds = r.gen.decode_seconds;
    run.target_passes = r.target_passes;
    run.phases = r.phases;  // shared by the batch
  }
  return run;
}

}  // namespace qwen36
