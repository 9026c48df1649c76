#pragma once
// defines: SpecMethod, SpecOptions, SpecSequence, spec_generate_batch, spec_generate
//          (generation with speculative decoding; mirrors engine/generate.h),
//          parse_speculative_config (vLLM-style --speculative-config JSON)
//
// Every round, for each running sequence: the drafter proposes up to k tokens; ONE target
// forward runs [pending token, drafts...] for every sequence together (sequences without
// drafts run their one decode token in the same batch); acceptance is exact (greedy) or by
// rejection sampling (rejection.h), so the output follows the target's distribution; the
// DeltaNet state is then advanced by the accepted prefix only (Model::commit_speculative),
// attention KV past it is simply overwritten later.
//
// Prompts are prefilled one sequence at a time in the same chunks generate() uses, so a
// greedy run reproduces generate() token for token (up to f32 rounding differences between
// batch shapes in the matmul, which do not show on the tested models).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/spec/drafter.h"
#include "engine/spec/metrics.h"
#include "engine/spec/ngram_drafter.h"
#include "model/dflash.h"

namespace qwen36 {

enum class SpecMethod : uint8_t { None, Mtp, Ngram, Dflash };
SpecMethod parse_spec_method(const std::string& s);  // "mtp", "ngram", "dflash", "none"; throws Error otherwise
const char* spec_method_name(SpecMethod m);

struct SpecOptions {
  SpecMethod method = SpecMethod::Mtp;
  int32_t draft_n = 3;    // k: drafts per round at most
  bool adaptive = false;  // per sequence: k grows by one after a fully accepted round, else
                          // drops to (accepted + 1): fewer wasted drafts where they fail
  NgramOptions ngram;
  // DFlash (engine/spec/dflash_drafter.h): the drafter checkpoint, its block size and block
  // causality. It drafts block_size − 1 tokens a round: spec_generate sets draft_n to that.
  std::string draft_model;
  DFlashOptions dflash;
  // DFlash (greedy or sampled sequences): each round verifies a DDTree of up to this many drafts
  // (engine/spec/draft_tree.h: the most probable paths through the drafter's per-position
  // top-K) in one target pass instead of the block's argmax chain; 0: the chain.
  int32_t tree_budget = 0;
  // Benchmarks only (qwen36 bench / bench-serve --simulate-acceptance; spec_generate_batch and
  // the scheduler's SpecStepper): when set, it decides whether draft
  // i (0-based depth) of a round of `slot` is accepted, in place of checking it against the
  // target; the first refusal ends the round and the target's own token at that row follows,
  // as on a real rejection. Accepted drafts are emitted and committed through the same path
  // (Model::commit_speculative), so the timing includes the same rollback; the output then no
  // longer follows the target's distribution. Tree rounds: it decides whether the walk goes on
  // to the node's most probable child at depth i + 1.
  std::function<bool(int32_t slot, int32_t i)> accept_override;
  // Benchmarks only, with accept_override: the simulated per-position acceptance (the last value
  // beyond the list), to which a tree round calibrates the drafter's probabilities before
  // building its tree (calibrated_positions, engine/spec/draft_tree.h). Empty: the drafter's own.
  std::vector<double> simulated_confidence;
};

// Speculation off (SpecOptions' default method is MTP, for run and bench).
inline SpecOptions no_speculation() {
  SpecOptions o;
  o.method = SpecMethod::None;
  return o;
}

// `--speculative-config` JSON, vLLM style: {"method":"mtp"|"ngram"|"dflash"|"none",
// "num_speculative_tokens":K, "prompt_lookup_max":N, "prompt_lookup_min":N} (the last two
// for ngram only; dflash takes "model": the drafter path, and K + 1 as its block size). An
// unknown key or a bad value throws a one-line Error naming the key.
SpecOptions parse_speculative_config(const std::string& json);

// The drafter `method` needs (null for None). MTP drafting reads and writes state's MTP cache.
// DFlash needs the SpecOptions form (its drafter checkpoint); here it throws.
std::unique_ptr<Drafter> make_drafter(SpecMethod method, Model& model, ModelState& state, const NgramOptions& ngram);
std::unique_ptr<Drafter> make_drafter(const SpecOptions& spec, Model& model, ModelState& state);

struct SpecSequence {
  std::vector<int32_t> prompt;
  GenerateOptions opts;
  int32_t slot = 0;
  bool draft = true;  // false: this sequence decodes without drafts (it still shares batches)
  std::function<bool(int32_t)> on_token;  // optional; false stops (cancelled)
};

// Where the decode rounds' time went (host wall clock, summed over rounds; shared by the whole
// batch). Device work is asynchronous: each phase holds the device time of the work it waits
// for — the draft phase the drafter's pass (it reads the drafts back), verify the target pass
// (it reads the logits back); commit only queues its device work, which the next round's draft
// phase then waits for.
struct SpecPhases {
  double draft = 0;   // drafter passes, the drafts to the host
  double tree = 0;    // DDTree building from the drafter's top-K (tree rounds)
  double verify = 0;  // the batch's target forward, logits to the host
  double accept = 0;  // acceptance (verify_round / verify_tree), emission, the drafter's new context
  double commit = 0;  // Model::commit_speculative
  int64_t rounds = 0; // decode rounds (target passes)
  void add(const SpecPhases& o);
  std::string summary() const;  // "per round: draft 1.2 ms, ..."
};

struct SpecResult {
  GenerateResult gen;
  SpecMetrics metrics;
  int64_t target_passes = 0;  // target forwards of the decode rounds (shared by the whole batch)
  SpecPhases phases;          // of those rounds (shared by the whole batch)
};

// Generates every sequence to completion. drafter may be null (no drafting at all). `state`
// needs a slot per sequence, an MTP cache for MTP drafting; speculation buffers for k + 1
// tokens are enabled here. Sequences run in the same verify batches.
std::vector<SpecResult> spec_generate_batch(Model& model, ModelState& state, std::span<SpecSequence> seqs,
                                            const SpecOptions& spec, Drafter* drafter);

// One sequence, with the drafter of spec.method.
SpecResult spec_generate(Model& model, ModelState& state, const std::vector<int32_t>& prompt,
                         const GenerateOptions& opts, const SpecOptions& spec,
                         const std::function<bool(int32_t)>& on_token = {}, int32_t slot = 0);

}  // namespace qwen36
