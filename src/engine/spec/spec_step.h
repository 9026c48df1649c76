#pragma once
// defines: SpecVerdict, verify_round, next_draft_n, draft_room (one sequence's round of
//          speculative decoding, shared by spec_generate_batch and the scheduler),
//          SpecSeqState, SpecTurn, SpecStepper (the speculative side of a continuous-batching
//          step, driven by engine/scheduler.cpp)
//
// Inside the scheduler, every step a sequence past its prefill is a "turn": the drafter
// proposes up to k tokens for it (propose), its run in the step's ONE forward batch carries
// [pending token, drafts...] as a verify run (add_run) next to plain decode tokens and prefill
// chunks of other sequences, and after the forward finish_round accepts a prefix (exact match
// or rejection sampling), emits the tokens one by one through the scheduler's callback (which
// may end the sequence mid-round: stop id, stop string, max_tokens) and queues the DeltaNet
// commit of exactly the tokens whose state the slot must hold; commit() applies the step's
// commits together.
//
// DFlash (a drafter with capture_layers()): the scheduler asks the step's forward for those
// target layers' outputs at every row; prefill chunks go to observe_captured, and the kept
// rows of each verify run to the drafter from finish_round, so each slot's drafter context
// (its K/V rows) always covers exactly the positions the slot holds. A round drafts the whole
// block: draft_n is the block size − 1.

#include <functional>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "engine/spec/dflash_drafter.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/drafter.h"
#include "engine/spec/metrics.h"
#include "engine/spec/spec_generate.h"
#include "model/qwen36.h"

namespace qwen36 {

struct SpecVerdict {
  int32_t accepted = 0;  // leading drafts accepted
  int32_t next = -1;     // the target's own token after them (correction, or bonus when all passed)
};

// Verifies draft.tokens (m of them) against the target's m + 1 logit rows (`rows`, [m + 1,
// vocab]; row i is the distribution after history + drafts[0..i)), editing them in place
// (penalties, temperature). Greedy: exact match against argmax; otherwise rejection sampling
// with draft.q (rejection.h) drawing from `rng`. `accept` (benchmarks only, see
// SpecOptions::accept_override) replaces the decision for draft i.
SpecVerdict verify_round(std::span<float> rows, int64_t vocab, const DraftRequest& draft, Sampler& sampler,
                         std::mt19937_64& rng, std::span<const int32_t> history, bool greedy,
                         const std::function<bool(int32_t)>& accept = {});

// verify_round for greedy rows without penalties whose argmax is already known (argmax[i]: row
// i's, e.g. sampled on the device): the same verdict from m + 1 token ids.
SpecVerdict verify_greedy(std::span<const int32_t> argmax, std::span<const int32_t> drafts,
                          const std::function<bool(int32_t)>& accept = {});

// A tree round's verdict (DDTree, engine/spec/draft_tree.h): the target's own token after every
// node's path, drawn from `rows` ([tree.size(), vocab]; node n's row is the distribution after
// history + n's path below the root; `history` ends with the root, the pending token) as
// generate() would (greedy: the argmax), then the walk down while that token names a child
// (follow_draft_tree). Lossless under sampling too: each emitted token is the target's draw
// given the tokens before it (a node's draw counts only when the walk stands on that node),
// whatever the drafter proposed — rejection sampling over deterministic siblings reduces to
// this. `accept` (benchmarks, SpecOptions::accept_override): the walk instead goes down to a
// node's most probable child while accept(depth) says so, and the target's token after the
// last node follows, as on a real rejection.
TreeWalk verify_tree(std::span<float> rows, int64_t vocab, const DraftTree& tree, Sampler& sampler,
                     std::mt19937_64& rng, std::span<const int32_t> history,
                     const std::function<bool(int32_t)>& accept = {});
// verify_tree's walk from the target's tokens already drawn (next[n]: the token after node n's
// path; greedy rows without penalties: their argmax, e.g. sampled on the device).
TreeWalk verify_tree_greedy(std::span<const int32_t> next, const DraftTree& tree,
                            const std::function<bool(int32_t)>& accept = {});

// Shapes the verify row that follows `path` (the round's drafts before it) with a request's
// logit_bias and output constraint; false when the path itself breaks the constraint (that row
// is never read: verification rejects the draft before it).
using RowShaper = std::function<bool(std::span<const int32_t> path, std::span<float> row)>;
// A chain's rows ([m + 1, vocab]): row j follows drafts 0..j-1; stops at the first refused path.
void shape_chain_rows(const RowShaper& shape, std::span<const int32_t> drafts, std::span<float> rows, int64_t vocab);
// A tree's rows ([tree.size(), vocab]): node n's row follows its path below the root.
void shape_tree_rows(const RowShaper& shape, const DraftTree& tree, std::span<float> rows, int64_t vocab);

// A tree round's commit: `nodes` are the kept path, the root first (SpecCommit::path).
SpecCommit tree_commit(int32_t slot, int32_t pos0, std::span<const int32_t> nodes);
// Those nodes' rows of a verify run's per-row outputs (`width` floats a row; the run's token 0 at
// batch row `begin`), in path order: the drafter's new context after a tree round.
std::vector<float> path_rows(std::span<const float> rows, int32_t begin, std::span<const int32_t> nodes, size_t width);

// The next round's draft count of a sequence that drafted `drafted` and got `accepted` with k
// (SpecOptions::adaptive; unchanged when not adaptive or when it did not draft).
int32_t next_draft_n(const SpecOptions& o, int32_t k, int32_t drafted, int32_t accepted);

// Drafts a round may carry: it emits at most drafts + 1 tokens (`tokens_left` may still be
// emitted) and writes positions pos .. pos + drafts, the last of which must leave room for
// one more token in a context of `capacity` (generate()'s rule).
int32_t draft_room(int32_t tokens_left, int64_t capacity, int32_t pos);

// A running sequence's speculative state, kept by the scheduler.
struct SpecSeqState {
  int32_t k = 0;         // drafts to ask for next round (adaptive)
  std::mt19937_64 rng;   // every draw of the request (seeded with its sampling seed)
  DraftRequest draft;    // this step's drafts
  DraftTree tree;        // tree rounds (SpecOptions::tree_budget): this step's tree over them
};

// One decoding sequence in one step, as the scheduler describes it.
struct SpecTurn {
  SpecSeqState* st = nullptr;
  Sampler* sampler = nullptr;           // the request's filters and penalties (distributions only)
  const SamplingParams* sampling = nullptr;
  int32_t slot = 0;
  int32_t pos = 0;                      // position of the pending token = tokens the slot holds
  std::span<const int32_t> history;     // tokens so far, back() pending; valid until emission
  int32_t room = 0;                     // draft_room() of the sequence
  bool want_raw = false;                // the emit callback wants each row's raw logits (logprobs)
  RowShaper shape;                      // the request's logit_bias / output constraint, or none
  int32_t begin = -1, out_row = -1;     // set by add_run: its first batch row, its first output row
  // Set after the forward when the backend sampled the turn's rows (greedy_rows): each row's
  // argmax, in the run's order; empty: finish_round reads the rows' logits.
  std::span<const int32_t> argmax;
};

class SpecStepper {
 public:
  // `custom` replaces the drafter of opts.method (tests). Throws a clear Error when the method
  // cannot run (MTP without an MTP head or without an MTP cache in `state`).
  SpecStepper(Model& model, ModelState& state, const SpecOptions& opts, std::unique_ptr<Drafter> custom = nullptr);
  const SpecOptions& options() const { return opts_; }
  // Whether forward() must return every row's hidden state for observe()/finish_round.
  bool wants_hidden() const { return drafter_->wants_hidden(); }
  // Target layers whose outputs forward() must return for every row (ForwardBatch::
  // capture_layers; empty: none), for observe_captured() and finish_round's `captured`.
  const std::vector<int32_t>& capture_layers() const { return capture_; }

  // A sequence starts in `slot`, whose state already holds `reused` tokens of `prompt`.
  void begin(SpecSeqState& st, int32_t slot, std::span<const int32_t> prompt, int32_t reused, uint64_t seed);
  // A token from `logits` (the prefill's last row), drawn with the sequence's own stream.
  int32_t sample(SpecSeqState& st, Sampler& sampler, std::span<float> logits, std::span<const int32_t> history,
                 const SamplingParams& sampling);
  // The target has committed positions pos0.. of `slot` outside a round (prefill chunks).
  void observe(int32_t slot, int32_t pos0, std::span<const float> hidden, std::span<const int32_t> next_tokens);
  // The same for a drafter with capture_layers(): rows of captured layer outputs.
  void observe_captured(int32_t slot, int32_t pos0, std::span<const float> features);

  // Drafts for every turn into turn.st->draft: at most min(k, room) each, and no more than
  // `draft_budget` in all (the step's token budget left after one row per turn).
  void propose(std::span<SpecTurn> turns, int32_t draft_budget);
  // Appends the turn's run [pending, drafts...] to `batch` (a verify run when it drafted),
  // every row an output row.
  void add_run(SpecTurn& t, ForwardBatch& batch) const;
  // Output rows of the turn's run (after add_run).
  static int32_t rows(const SpecTurn& t);
  // Whether the turn's verdict needs only its rows' argmax (greedy, no penalties, no shaping,
  // no raw rows for logprobs): the backend may sample them, and their logits stay there.
  static bool greedy_rows(const SpecTurn& t);

  // How the scheduler took a token: emitted and the sequence goes on; emitted and it ended;
  // not emitted (a stop id) and it ended.
  enum class Emit { More, Last, Refused };
  using EmitFn = std::function<Emit(int32_t token, std::span<const float> raw_logits, int32_t fed)>;
  // After the forward: accepts, emits each token through `emit` (fed: the tokens the slot holds
  // once this token is the pending one), queues the commit and returns how many of the turn's
  // tokens the slot holds after commit(): the pending token and every accepted draft that was
  // emitted, so the slot's state is always that of the sequence's first pos + kept tokens.
  // logits: the step's output rows (the turn's are not read when t.argmax holds them); hidden:
  // every batch row (or empty); captured: every batch row's captured layer outputs (with
  // capture_layers(), else empty).
  int32_t finish_round(SpecTurn& t, std::span<float> logits, std::span<const float> hidden, const EmitFn& emit,
                       std::span<const float> captured = {});
  // Model::commit_speculative for every round finished since the last call.
  void commit();
  // Counters since the last call.
  SpecMetrics take_metrics();

 private:
  Model& model_;
  ModelState& state_;
  SpecOptions opts_;
  int32_t finish_tree_round(SpecTurn& t, std::span<float> logits, const EmitFn& emit, std::span<const float> captured);
  // SpecOptions::accept_override bound to `slot` (benchmarks: bench-serve's simulated
  // acceptance), or empty: the target decides.
  std::function<bool(int32_t)> accept_of(int32_t slot) const;

  std::unique_ptr<Drafter> drafter_;
  DFlashDrafter* tree_drafter_ = nullptr;  // tree rounds (opts.tree_budget > 0): drafter_, for its top-K
  std::vector<int32_t> capture_;
  std::vector<SpecCommit> commits_;
  SpecMetrics metrics_;
};

}  // namespace qwen36
