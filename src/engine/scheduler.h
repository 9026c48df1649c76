#pragma once
// defines: SchedulerOptions, SchedulerStats, Histogram, QueueFull, Scheduler (the engine core:
//          continuous batching of many requests over one model and one ModelState)
//
// Each step builds ONE ForwardBatch: a decode token for every running sequence plus prefill
// chunks of sequences still reading their prompt, so new requests join running ones at every
// step. A request is admitted when a state slot is free (or cached and reusable, see
// PrefixCache); the rest wait in a bounded queue. One thread (the engine thread, or a test
// calling step()) owns the model; other threads only submit, cancel and read stats.
//
// Prefill chunks start at multiples of prefill_chunk from where a sequence's prefill began,
// exactly as generate() chunks a prompt, so a request's numerics do not depend on what else
// shares its batches.
//
// With speculative decoding (SchedulerOptions::spec), a decoding sequence's batch entry is
// [pending token, drafts...] verified in the same forward; the round itself (drafting,
// acceptance, commit of the accepted prefix) lives in engine/spec/spec_step.h.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/prefix_cache.h"
#include "engine/snapshot_cache.h"
#include "engine/request.h"
#include "engine/spec/metrics.h"
#include "engine/spec/spec_generate.h"
#include "engine/spec/spec_step.h"
#include "model/qwen36.h"

namespace qwen36 {

struct SchedulerOptions {
  int32_t slots = 4;             // sequences that run at once (state slots)
  int64_t context = 4096;        // positions per slot (prompt + generated)
  int32_t prefill_chunk = 256;   // prompt tokens per sequence per step
  int32_t max_batch_tokens = 512;  // step budget; one prefill chunk always fits
  int32_t max_queue = 64;        // waiting requests; more are refused (QueueFull)
  bool prefix_cache = true;
  DType kv_type = DType::F32;    // attention cache element type
  DType state_type = DType::F32;  // DeltaNet recurrent state element type
  // Bytes of a token, for streamed text and stop strings (empty: no text).
  std::function<std::string(int32_t)> token_text;
  // Every token's bytes, for requests with an output constraint (null: such requests are refused).
  std::shared_ptr<const TokenTrie> vocab;
  // Speculative decoding of every decoding sequence (method None: off). MTP needs a model
  // with an MTP head (the scheduler's state then holds the MTP cache).
  SpecOptions spec = no_speculation();
  // Tests: a drafter to use in place of spec.method's (spec.method must not be None).
  std::function<std::unique_ptr<Drafter>(Model&, ModelState&)> spec_drafter;
  // Prefix-cache checkpoints (engine/snapshot_cache.h): while a prompt is read, its slot's state
  // is saved every `interval` positions, so later prompts sharing a beginning resume from there.
  // Off unless a budget is given; off with MTP drafting (its drafter's host rows are not part of a
  // snapshot) and with tensor parallelism (a snapshot holds rank 0's state only).
  SnapshotCacheOptions snapshots;
};

// Cumulative Prometheus-style histogram (seconds).
struct Histogram {
  static constexpr double kBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  static constexpr size_t kBuckets = sizeof(kBounds) / sizeof(kBounds[0]);
  uint64_t counts[kBuckets + 1] = {};  // last: +Inf
  uint64_t total = 0;
  double sum = 0;
  void add(double v);
};

struct SchedulerStats {
  int32_t running = 0, waiting = 0;
  int32_t slots = 0, slots_busy = 0, slots_cached = 0;
  int64_t context = 0;
  int64_t kv_positions_used = 0;  // positions held by running sequences
  uint64_t requests_finished = 0, requests_rejected = 0, requests_cancelled = 0;
  uint64_t prompt_tokens = 0;         // of admitted requests
  uint64_t prompt_tokens_cached = 0;  // of which came from the prefix cache
  uint64_t prefilled_tokens = 0;      // prompt tokens actually run through the model
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;
  uint64_t logit_rows_to_host = 0;  // output rows whose whole logits came to the host (the rest: sampled on the backend)
  Histogram ttft, inter_token;
  // Speculative decoding: rounds that carried drafts, drafted / accepted per position
  // (spec.drafted_at[i]: drafts at depth i + 1), mean accepted length.
  SpecMetrics spec;
  uint64_t spec_undrafted = 0;  // decode tokens of sequences that had no drafts that step (spec on)
  SnapshotCacheStats snapshots;  // prefix-cache checkpoints
  double cache_hit_rate() const { return prompt_tokens ? double(prompt_tokens_cached) / double(prompt_tokens) : 0; }
};

// submit() when the queue is full (HTTP 503).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Scheduler {
 public:
  // Prompt positions of a prompt_logprobs request read in one step (each an output row of logits:
  // a memory plan counts them beside the decode rows).
  static constexpr int32_t kPromptLogprobRows = 32;

  Scheduler(Model& model, SchedulerOptions opts);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates and queues a request (thread-safe). Throws Error for a bad request (for example
  // a prompt that does not fit the context) and QueueFull when the queue is at its cap.
  std::shared_ptr<Request> submit(RequestParams params);

  // One engine step; false when there was nothing to do. Call from one thread only, and not
  // while the engine thread runs.
  bool step();
  void start();  // runs steps on an engine thread until stop()
  // Graceful end: lets running work finish for up to `drain`, then cancels what is left
  // (every request gets its Finished event) and joins the engine thread.
  void stop(std::chrono::milliseconds drain = std::chrono::milliseconds(0));

  // The prefix cache's checkpoints in a file (engine/snapshot_file.h), while the engine thread is
  // not running. `model_id` names the weights (the CLI's model_identity: files, sizes, times,
  // adapters); the fingerprint adds the cache element types and the state's layout.
  std::string checkpoint_fingerprint(const std::string& model_id) const;
  size_t save_checkpoints(const std::string& path, const std::string& model_id);
  // Inserts a file's checkpoints within the budgets (the most recently used kept); a file of
  // another fingerprint, or one that cannot be read, is logged and left alone: 0 inserted.
  size_t load_checkpoints(const std::string& path, const std::string& model_id);

  SchedulerStats stats() const;
  const SchedulerOptions& options() const { return opts_; }
  const Model& model() const { return model_; }

 private:
  struct Sequence;
  struct Pending {
    std::shared_ptr<Request> req;
    RequestParams params;
    std::chrono::steady_clock::time_point submitted;
  };
  bool has_work_locked() const;
  void admit_waiting();
  void finish(Sequence& s, const std::string& reason, const std::string& error = {});
  void reap();  // releases the slots of finished sequences and drops them
  void checkpoint(Sequence& s);  // saves a prefix-cache checkpoint when s stands at one
  // Adds s's logit_bias to a row of its logits and masks it with its output constraint; false
  // when no token remains (s finished with an error).
  bool shape(Sequence& s, std::span<float> row);
  // A Prompt event: the logprob of prompt token pos + 1 from the row of position pos.
  void emit_prompt_logprob(Sequence& s, int32_t pos, std::span<const float> row);
  void on_logits(Sequence& s, std::span<float> logits);
  // Emits `tok` (raw: its row's logits before sampling, for logprobs; fed: the tokens the slot
  // holds once tok is pending) and ends the sequence on a stop or at its length.
  SpecStepper::Emit emit(Sequence& s, int32_t tok, std::span<const float> raw, int32_t fed);
  void observe_prefill(Sequence& s, int32_t pos0, int32_t count, int32_t row);
  void add_spec_turns(ForwardBatch& batch, std::vector<SpecTurn>& turns, std::vector<Sequence*>& owners);
  void run_loop();

  Model& model_;
  SchedulerOptions opts_;
  ModelState state_;
  PrefixCache cache_;
  SnapshotCache snaps_;
  std::unique_ptr<SpecStepper> spec_;  // null: no speculative decoding
  std::vector<float> logits_, hidden_;

  mutable std::mutex mu_;  // guards incoming_, waiting count, stats_, stopping_
  std::condition_variable wake_;
  std::deque<Pending> incoming_;
  int32_t queued_ = 0;  // submitted, not yet admitted (counts against max_queue)
  SchedulerStats stats_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;

  // Engine-thread only.
  std::deque<Pending> waiting_;
  std::list<Sequence> running_;
  std::thread thread_;
};

}  // namespace qwen36
