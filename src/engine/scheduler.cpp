#include "engine/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "engine/snapshot_file.h"

namespace qwen36 {

using Clock = std::chrono::steady_clock;

static double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Histogram::add(double v) {
  size_t i = 0;
  while (i < kBuckets && v > kBounds[i]) ++i;
  ++counts[i];
  ++total;
  sum += v;
}

struct Scheduler::Sequence {
  Pending in;
  Sampler sampler;
  StopTextFilter text;
  int32_t slot = -1;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int32_t n_prompt = 0;
  int32_t n_fed = 0;          // tokens whose state the slot holds (positions 0 .. n_fed-1)
  int32_t prefill_start = 0;  // where this request's prefill began (after the cached prefix)
  int32_t n_generated = 0;
  int32_t n_cached = 0;
  Clock::time_point first_token, last_token;
  bool done = false;
  bool failed = false;  // ended by an error: the slot's state is unknown
  SpecSeqState spec;    // with speculative decoding
  std::optional<TokenConstraint> constraint;  // structured output
  // reasoning_budget: where the answer stands (Before the model opens it, Open, Closed or no
  // budget) and how many tokens it reasoned.
  enum class Reasoning : uint8_t { Before, Open, Closed };
  Reasoning reasoning = Reasoning::Closed;
  int64_t reasoning_tokens = 0;

  Sequence(Pending p, int32_t slot_, int32_t reused, const std::shared_ptr<const TokenTrie>& vocab)
      : in(std::move(p)), sampler(in.params.sampling),
        text(in.params.stop_strings, in.params.include_stop_string, in.params.min_tokens <= 0), slot(slot_),
        tokens(in.params.prompt), n_prompt(int32_t(tokens.size())), n_fed(reused), prefill_start(reused),
        n_cached(reused) {
    if (in.params.reasoning_budget >= 0)
      reasoning = in.params.reasoning_start < 0 ? Reasoning::Open : Reasoning::Before;
    if (!in.params.constraint.empty()) constraint.emplace(vocab, in.params.constraint, in.params.stop_ids);
  }
  // The reasoning's state after `tok` (its count of tokens in `reasoned`).
  Reasoning after(Reasoning r, int32_t tok, int64_t& reasoned) const {
    if (r == Reasoning::Before) return tok == in.params.reasoning_start ? Reasoning::Open : r;
    if (r == Reasoning::Closed) return r;
    if (tok == in.params.reasoning_end) return Reasoning::Closed;
    ++reasoned;
    return r;
  }
  bool prefilling() const { return n_fed < n_prompt; }
  // Whether the row of the token after the drafted `path` must have its stop ids masked (min_tokens).
  bool holds_stops(std::span<const int32_t> path = {}) const {
    return n_generated + int64_t(path.size()) < in.params.min_tokens && !in.params.stop_ids.empty();
  }
  // Whether the token after the drafted `path` must close the reasoning (its budget is spent).
  bool ends_reasoning(std::span<const int32_t> path = {}) const {
    Reasoning r = reasoning;
    int64_t reasoned = reasoning_tokens;
    for (int32_t t : path) r = after(r, t, reasoned);
    return r == Reasoning::Open && reasoned >= in.params.reasoning_budget;
  }
  // Whether this step's row must come to the host whole, for logit_bias, min_tokens, the
  // reasoning budget or the constraint's mask.
  bool shapes() const {
    return !in.params.logit_bias.empty() || holds_stops() || ends_reasoning() || (constraint && constraint->masks());
  }
  // logit_bias, the stop ids masked while min_tokens holds them, every token but the reasoning's
  // end masked once its budget is spent.
  void bias(std::span<float> row, std::span<const int32_t> path) const {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (const auto& [t, b] : in.params.logit_bias) row[size_t(t)] += b;
    if (holds_stops(path))
      for (int32_t t : in.params.stop_ids) row[size_t(t)] = kMasked;
    if (ends_reasoning(path)) {
      const size_t end = size_t(in.params.reasoning_end);
      const float keep = std::isfinite(row[end]) ? row[end] : 0.0f;
      std::fill(row.begin(), row.end(), kMasked);
      row[end] = keep;
    }
  }
};

// The checkpoint options in force: none without the prefix cache, with MTP or DFlash drafting
// (a checkpoint restores the target's state, not the drafter's per-slot context; a plain
// same-slot prefix reuse keeps both, DFlashDrafter::resume) or with tensor-parallel peers
// (see SchedulerOptions::snapshots).
static SnapshotCacheOptions snapshot_options(const SchedulerOptions& o, const Model& model) {
  SnapshotCacheOptions s = o.snapshots;
  if (!o.prefix_cache || o.spec.method == SpecMethod::Mtp || o.spec.method == SpecMethod::Dflash || model.peers())
    s.interval = 0;
  return s;
}

Scheduler::Scheduler(Model& model, SchedulerOptions opts)
    : model_(model),
      opts_(std::move(opts)),
      state_(model.backend(), model.config(), opts_.slots, opts_.context,
             /*with_mtp=*/opts_.spec.method == SpecMethod::Mtp && model.has_mtp(), opts_.kv_type, opts_.state_type),
      cache_(opts_.slots, opts_.prefix_cache),
      snaps_(snapshot_options(opts_, model)) {
  QWEN36_CHECK(opts_.prefill_chunk > 0, "prefill chunk {} must be positive", opts_.prefill_chunk);
  QWEN36_CHECK(opts_.max_batch_tokens > 0, "batch token budget {} must be positive", opts_.max_batch_tokens);
  QWEN36_CHECK(opts_.max_queue >= 0, "queue cap {} must be >= 0", opts_.max_queue);
  if (opts_.spec.method != SpecMethod::None)
    spec_ = std::make_unique<SpecStepper>(model_, state_, opts_.spec,
                                          opts_.spec_drafter ? opts_.spec_drafter(model_, state_) : nullptr);
  stats_.slots = opts_.slots;
  stats_.context = opts_.context;
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Request> Scheduler::submit(RequestParams p) {
  const ModelConfig& c = model_.config();
  QWEN36_CHECK(!p.prompt.empty(), "the prompt is empty");
  for (int32_t t : p.prompt)
    QWEN36_CHECK(t >= 0 && t < c.vocab_size, "prompt token {} is outside the vocabulary (0..{})", t, c.vocab_size - 1);
  QWEN36_CHECK(int64_t(p.prompt.size()) < opts_.context,
               "the prompt ({} tokens) does not fit the context ({} tokens)", p.prompt.size(), opts_.context);
  QWEN36_CHECK(p.max_tokens >= 0, "max_tokens {} must be >= 0", p.max_tokens);
  QWEN36_CHECK(p.min_tokens >= 0, "min_tokens {} must be >= 0", p.min_tokens);
  QWEN36_CHECK(p.reasoning_budget < 0 || (p.reasoning_end >= 0 && p.reasoning_end < c.vocab_size &&
                                           p.reasoning_start < c.vocab_size),
               "a reasoning budget needs the reasoning's end token (got {}, start {})", p.reasoning_end,
               p.reasoning_start);
  for (int32_t t : p.stop_ids)
    QWEN36_CHECK(t >= 0 && t < c.vocab_size, "stop token {} is outside the vocabulary (0..{})", t, c.vocab_size - 1);
  QWEN36_CHECK(p.top_logprobs >= -1 && p.top_logprobs <= 20, "top_logprobs {} must be between 0 and 20",
               p.top_logprobs);
  QWEN36_CHECK(p.prompt_logprobs >= -1 && p.prompt_logprobs <= 20, "prompt_logprobs {} must be between 0 and 20",
               p.prompt_logprobs);
  QWEN36_CHECK(p.stop_strings.empty() || opts_.token_text, "stop strings need a tokenizer");
  QWEN36_CHECK((!p.constraint.schema && !p.constraint.grammar) || opts_.vocab,
               "structured output needs the tokenizer's vocabulary");
  for (const auto& [t, bias] : p.logit_bias)
    QWEN36_CHECK(t >= 0 && t < c.vocab_size && (std::isfinite(bias) || bias == -INFINITY),  // -inf: never
                 "logit_bias: token {} (bias {}) is not valid", t, bias);
  p.sampling.validate();

  std::lock_guard lock(mu_);
  QWEN36_CHECK(!stopping_, "the server is shutting down");
  if (queued_ >= opts_.max_queue) {
    ++stats_.requests_rejected;
    throw QueueFull(fmt::format("the request queue is full ({} waiting)", queued_));
  }
  auto req = std::make_shared<Request>(next_id_++);
  incoming_.push_back({req, std::move(p), Clock::now()});
  ++queued_;
  wake_.notify_all();
  return req;
}

void Scheduler::admit_waiting() {
  while (!waiting_.empty()) {
    Pending& front = waiting_.front();
    if (front.params.max_tokens == 0 && front.params.prompt_logprobs < 0) {  // nothing to read the prompt for
      Pending p = std::move(front);
      waiting_.pop_front();
      { std::lock_guard lock(mu_); --queued_; }
      RequestUsage u;
      u.prompt_tokens = int32_t(p.params.prompt.size());
      u.total_seconds = seconds_between(p.submitted, Clock::now());
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::Finished;
      ev.finish_reason = "length";
      p.req->push(std::move(ev), &u);
      continue;
    }
    const PrefixCache::Grant g = cache_.acquire(front.params.prompt);
    if (g.slot < 0) return;  // every slot is busy
    // Prompt logprobs need every prompt position's logits: the prompt is read from its start.
    const bool whole = front.params.prompt_logprobs >= 0;
    int32_t reused = whole ? 0 : g.reused;
    // A checkpoint longer than what the slot holds: resume from it instead.
    if (const StateSnapshot* snap = whole ? nullptr : snaps_.find(front.params.prompt, reused)) {
      restore_snapshot(model_.backend(), *snap, state_, g.slot);
      reused = int32_t(snap->positions);
    }
    if (reused == 0) state_.reset_slot(g.slot);
    running_.emplace_back(std::move(front), g.slot, reused, opts_.vocab);
    waiting_.pop_front();
    Sequence& s = running_.back();
    if (spec_) spec_->begin(s.spec, s.slot, s.tokens, reused, s.in.params.sampling.seed);
    std::lock_guard lock(mu_);
    --queued_;
    stats_.prompt_tokens += uint64_t(running_.back().n_prompt);
    stats_.prompt_tokens_cached += uint64_t(reused);
  }
}

void Scheduler::finish(Sequence& s, const std::string& reason, const std::string& error) {
  if (s.done) return;
  s.done = true;
  const auto now = Clock::now();
  RequestUsage u;
  u.prompt_tokens = s.n_prompt;
  u.cached_tokens = s.n_cached;
  u.completion_tokens = s.n_generated;
  u.ttft_seconds = s.n_generated ? seconds_between(s.in.submitted, s.first_token) : 0;
  u.total_seconds = seconds_between(s.in.submitted, now);
  RequestEvent ev;
  ev.kind = RequestEvent::Kind::Finished;
  ev.text = s.text.flush();
  ev.finish_reason = reason;
  ev.error = error;
  if (reason == "stop" && s.text.matched()) ev.stop_string = s.text.stop();
  s.in.req->push(std::move(ev), &u);
  s.failed = reason == "error";
  std::lock_guard lock(mu_);
  ++stats_.requests_finished;
  if (reason == "cancelled") ++stats_.requests_cancelled;
}

// After a prefill chunk: save the slot's state if it now stands at a checkpoint position of its
// prompt that the cache does not hold. A failed save (out of memory) costs only the checkpoint.
void Scheduler::checkpoint(Sequence& s) {
  const std::span<const int32_t> prefix(s.tokens.data(), size_t(s.n_fed));
  if (s.done || s.n_fed > s.n_prompt || !snaps_.wants(prefix)) return;
  const auto where = snaps_.placement(snapshot_bytes(state_, s.n_fed));
  if (!where) return;
  try {
    snaps_.insert(std::vector<int32_t>(prefix.begin(), prefix.end()),
                  save_snapshot(model_.backend(), state_, s.slot, s.n_fed, *where));
  } catch (const std::exception& e) {
    spdlog::warn("prefix-cache checkpoint at {} tokens not saved: {}", s.n_fed, e.what());
  }
}

// The slot is released only here, after the step's speculative commits: a sequence that ends
// mid-round must be cached under the tokens its state holds once the commit has run (n_fed).
void Scheduler::reap() {
  for (auto it = running_.begin(); it != running_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    // After an error the slot's state is unknown, so it must not be reused as a cached prefix.
    cache_.release(it->slot, it->failed ? std::vector<int32_t>{}
                                        : std::vector<int32_t>(it->tokens.begin(), it->tokens.begin() + it->n_fed));
    it = running_.erase(it);
  }
}

static TokenLogprob logprob_of(std::span<const float> raw, int32_t tok, int32_t top) {
  const float mx = *std::max_element(raw.begin(), raw.end());
  double z = 0;
  for (float v : raw) z += std::exp(double(v - mx));
  const float lse = mx + float(std::log(z));
  TokenLogprob lp;
  lp.token = tok;
  lp.logprob = raw[size_t(tok)] - lse;
  lp.rank = 1 + int32_t(std::count_if(raw.begin(), raw.end(), [&](float v) { return v > raw[size_t(tok)]; }));
  std::vector<int32_t> ids(raw.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  const size_t k = size_t(top);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(),
                    [&](int32_t a, int32_t b) { return raw[size_t(a)] > raw[size_t(b)]; });
  for (size_t i = 0; i < k; ++i) lp.top.emplace_back(ids[i], raw[size_t(ids[i])] - lse);
  return lp;
}

bool Scheduler::shape(Sequence& s, std::span<float> row) {
  s.bias(row, {});
  if (!s.constraint || !s.constraint->masks() || s.constraint->apply(row) > 0) return true;
  finish(s, "error", "the output constraint admits no token here: no token of the vocabulary continues the document");
  return false;
}

void Scheduler::on_logits(Sequence& s, std::span<float> logits) {
  std::vector<float> raw;
  if (s.in.params.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());  // the sampler edits logits
  if (!shape(s, logits)) return;
  // With speculation every draw of a request comes from its one stream (SpecSeqState::rng).
  const int32_t tok = spec_ ? spec_->sample(s.spec, s.sampler, logits, s.tokens, s.in.params.sampling)
                            : s.sampler.sample(logits, s.tokens);
  emit(s, tok, raw, s.n_fed);
}

SpecStepper::Emit Scheduler::emit(Sequence& s, int32_t tok, std::span<const float> raw, int32_t fed) {
  const auto& stops = s.in.params.stop_ids;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    finish(s, "stop");
    return SpecStepper::Emit::Refused;
  }
  if (s.constraint && !s.constraint->accept(tok)) {  // apply() leaves no such token: a bug if seen
    finish(s, "error", fmt::format("token {} breaks the output constraint", tok));
    return SpecStepper::Emit::Refused;
  }
  std::optional<TokenLogprob> lp;
  if (!raw.empty()) lp = logprob_of(raw, tok, s.in.params.top_logprobs);
  s.tokens.push_back(tok);
  ++s.n_generated;
  const auto now = Clock::now();
  {
    std::lock_guard lock(mu_);
    ++stats_.generated_tokens;
    if (s.n_generated == 1)
      stats_.ttft.add(seconds_between(s.in.submitted, now));
    else
      stats_.inter_token.add(seconds_between(s.last_token, now));
  }
  if (s.n_generated == 1) s.first_token = now;
  s.last_token = now;
  RequestEvent ev;
  ev.token = tok;
  s.reasoning = s.after(s.reasoning, tok, s.reasoning_tokens);
  if (s.n_generated >= s.in.params.min_tokens) s.text.arm();  // stop strings count from here
  if (opts_.token_text) ev.text = s.text.push(opts_.token_text(tok));
  ev.logprob = std::move(lp);
  s.in.req->push(std::move(ev));
  if (s.text.matched() || (s.constraint && s.constraint->finished())) {  // a whole document: nothing may follow
    finish(s, "stop");
  } else if (s.n_generated >= s.in.params.max_tokens || fed + 1 >= opts_.context) {
    finish(s, "length");  // the same context rule as generate(): the next token must still fit
  } else {
    return SpecStepper::Emit::More;
  }
  return SpecStepper::Emit::Last;
}

void Scheduler::emit_prompt_logprob(Sequence& s, int32_t pos, std::span<const float> row) {
  if (s.done) return;
  RequestEvent ev;
  ev.kind = RequestEvent::Kind::Prompt;
  ev.token = s.tokens[size_t(pos) + 1];
  ev.logprob = logprob_of(row, ev.token, s.in.params.prompt_logprobs);
  s.in.req->push(std::move(ev));
}

// The MTP drafter pairs each prompt row's hidden state with the token that follows it; the
// last prompt row's follower is the first sampled token (0 when the request ended on a stop
// id: only a prefix-cache reuse can read that row, and it re-pairs it, MtpDrafter::resume).
void Scheduler::observe_prefill(Sequence& s, int32_t pos0, int32_t count, int32_t row) {
  const size_t H = size_t(model_.config().hidden_size);
  std::vector<int32_t> next(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    const size_t at = size_t(pos0 + 1 + i);
    next[size_t(i)] = at < s.tokens.size() ? s.tokens[at] : 0;
  }
  spec_->observe(s.slot, pos0, std::span<const float>(hidden_).subspan(size_t(row) * H, size_t(count) * H), next);
}

// Every decoding sequence drafts (within its room and the step budget) and joins the batch
// as [pending, drafts...].
void Scheduler::add_spec_turns(ForwardBatch& batch, std::vector<SpecTurn>& turns, std::vector<Sequence*>& owners) {
  for (Sequence& s : running_) {
    if (s.prefilling()) continue;
    SpecTurn t;
    t.st = &s.spec;
    t.sampler = &s.sampler;
    t.sampling = &s.in.params.sampling;
    t.slot = s.slot;
    t.pos = s.n_fed;
    t.history = s.tokens;
    t.room = draft_room(s.in.params.max_tokens - s.n_generated, opts_.context, s.n_fed);
    t.want_raw = s.in.params.top_logprobs >= 0;
    if (s.constraint || !s.in.params.logit_bias.empty() || s.holds_stops() ||
        s.reasoning != Sequence::Reasoning::Closed)
      t.shape = [&s](std::span<const int32_t> path, std::span<float> row) {
        s.bias(row, path);
        return !s.constraint || s.constraint->apply_after(path, row);
      };
    turns.push_back(t);
    owners.push_back(&s);
  }
  // Drafts never push the decode rows past the step budget (the activation memory plan).
  spec_->propose(turns, opts_.max_batch_tokens - int32_t(turns.size()));
  for (SpecTurn& t : turns) spec_->add_run(t, batch);
}

bool Scheduler::step() {
  bool worked = false;
  {
    std::lock_guard lock(mu_);
    while (!incoming_.empty()) {
      // Behind every waiting request of the same or a lower priority value.
      const int32_t pri = incoming_.front().params.priority;
      const auto at = std::find_if(waiting_.begin(), waiting_.end(),
                                   [&](const Pending& w) { return w.params.priority > pri; });
      waiting_.insert(at, std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  // Cancellation: a cancelled request leaves the queue or frees its slot before this batch.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (!it->req->cancelled()) {
      ++it;
      continue;
    }
    RequestUsage u;
    u.prompt_tokens = int32_t(it->params.prompt.size());
    RequestEvent ev;
    ev.kind = RequestEvent::Kind::Finished;
    ev.finish_reason = "cancelled";
    it->req->push(std::move(ev), &u);
    it = waiting_.erase(it);
    std::lock_guard lock(mu_);
    --queued_;
    ++stats_.requests_finished;
    ++stats_.requests_cancelled;
    worked = true;
  }
  for (Sequence& s : running_)
    if (s.in.req->cancelled()) finish(s, "cancelled");
  const size_t before = running_.size();
  reap();
  worked |= running_.size() != before;
  admit_waiting();

  // One batch: decode tokens first (with their drafts when speculating), then prefill chunks
  // in admission order within the budget.
  ForwardBatch batch;
  std::vector<Sequence*> run_owner, row_owner;  // plain runs; their logit rows
  std::vector<int32_t> owner_run, owner_row;    // index in batch.runs / batch.output_rows
  std::vector<int32_t> row_prompt_pos;          // per row: the prompt position it scores, or -1
  auto add_run = [&](Sequence& s, int32_t count, bool wants_logits) {
    const int32_t begin = int32_t(batch.tokens.size());
    if (s.in.params.prompt_logprobs >= 0 && s.prefilling())  // rows that score the next prompt token
      for (int32_t pos = s.n_fed; pos < s.n_fed + count && pos + 1 < s.n_prompt; ++pos) {
        owner_row.push_back(int32_t(batch.output_rows.size()));
        batch.output_rows.push_back(begin + pos - s.n_fed);
        row_owner.push_back(&s);
        row_prompt_pos.push_back(pos);
      }
    batch.tokens.insert(batch.tokens.end(), s.tokens.begin() + s.n_fed, s.tokens.begin() + s.n_fed + count);
    owner_run.push_back(int32_t(batch.runs.size()));
    batch.runs.push_back({s.slot, s.n_fed, begin, count});
    run_owner.push_back(&s);
    if (wants_logits) {
      owner_row.push_back(int32_t(batch.output_rows.size()));
      batch.output_rows.push_back(begin + count - 1);
      row_owner.push_back(&s);
      row_prompt_pos.push_back(-1);
    }
  };
  std::vector<SpecTurn> turns;  // speculating: every decoding sequence, drafts or not
  std::vector<Sequence*> turn_owner;
  if (spec_) {
    add_spec_turns(batch, turns, turn_owner);
  } else {
    for (Sequence& s : running_)
      if (!s.prefilling()) add_run(s, 1, true);
  }
  int32_t budget = opts_.max_batch_tokens - int32_t(batch.tokens.size());
  bool any_prefill = false;
  for (Sequence& s : running_) {
    if (!s.prefilling()) continue;
    const int32_t done_chunks = (s.n_fed - s.prefill_start) / opts_.prefill_chunk;
    int32_t end = std::min(s.n_prompt, s.prefill_start + (done_chunks + 1) * opts_.prefill_chunk);
    if (snaps_.enabled()) {  // a chunk also ends at each checkpoint position
      const int64_t iv = snaps_.interval();
      end = int32_t(std::min<int64_t>(end, (s.n_fed / iv + 1) * iv));
    }
    if (s.in.params.prompt_logprobs >= 0) end = std::min(end, s.n_fed + kPromptLogprobRows);
    const int32_t count = end - s.n_fed;
    if (any_prefill && count > budget) break;  // keep FIFO order: later prompts wait their turn
    add_run(s, count, end == s.n_prompt);
    budget -= count;
    any_prefill = true;
  }
  const bool want_hidden = spec_ && spec_->wants_hidden();
  // A DFlash drafter's context: the captured target layer outputs of every row.
  const size_t F = spec_ ? spec_->capture_layers().size() * size_t(model_.config().hidden_size) : 0;
  if (want_hidden || F)  // the MTP / DFlash drafter follows every committed row of every sequence
    for (int32_t i = 0; i < int32_t(batch.tokens.size()); ++i) batch.hidden_rows.push_back(i);
  if (F) batch.capture_layers = spec_->capture_layers();
  std::vector<float> captured(F * batch.hidden_rows.size());

  if (!batch.tokens.empty()) {
    worked = true;
    const size_t V = size_t(model_.config().vocab_size);
    logits_.resize(batch.output_rows.size() * V);
    hidden_.resize(want_hidden ? batch.hidden_rows.size() * size_t(model_.config().hidden_size) : 0);
    // Rows are sampled on the backend (rank 0's with tensor parallelism): only their
    // candidates come to the host, and a row's logits only when the candidates do not decide
    // its token or its request wants logprobs (which read the raw row: no penalties are
    // applied to it there). Speculating, the turns' rows come first (add_spec_turns): a turn's
    // rows stay on the backend when its verdict needs only their argmax (greedy_rows); a
    // prompt's last row when greedy without penalties (its argmax), else it comes whole (a
    // first token is drawn with the turn's own generator, SpecStepper::sample). Without
    // speculation owner_row[i] == i: rows are added with their owners.
    const size_t turn_rows = batch.output_rows.size() - row_owner.size();
    std::vector<int32_t> row_argmax(turn_rows, -1);
    std::vector<char> turn_greedy(turns.size());
    for (size_t i = 0; i < turns.size(); ++i) turn_greedy[i] = SpecStepper::greedy_rows(turns[i]);
    std::vector<std::optional<int32_t>> drawn(row_owner.size());
    uint64_t rows_to_host = 0;
    bool ok = true;
    try {
      SampleRequest req;
      std::vector<size_t> row_turn;  // turn row → its turn
      for (size_t ti = 0; ti < turns.size(); ++ti)
        for (int32_t j = 0; j < SpecStepper::rows(turns[ti]); ++j) {
          turns[ti].sampler->add_candidate_row({}, int64_t(V), req.rows, req.penalties, false);
          row_turn.push_back(ti);
        }
      for (size_t i = 0; i < row_owner.size(); ++i) {  // a prompt row's logits come raw, unpenalised
        Sequence* s = row_owner[i];
        const bool penalties = !spec_ && s->in.params.top_logprobs < 0 && row_prompt_pos[i] < 0;
        s->sampler.add_candidate_row(s->tokens, int64_t(V), req.rows, req.penalties, penalties);
      }
      req.take = [&](int32_t row, const SampleCandidates& c) {
        const bool took = [&] {
          if (size_t(row) < turn_rows) {
            const size_t ti = row_turn[size_t(row)];
            if (!turn_greedy[ti]) return false;
            const std::optional<int32_t> tok = turns[ti].sampler->sample_from_candidates(c);
            if (tok) row_argmax[size_t(row)] = *tok;  // greedy: no draw from the generator
            return tok.has_value();
          }
          const size_t i = size_t(row) - turn_rows;
          Sequence& s = *row_owner[i];
          // Speculating, a sampled first token comes from the turn's generator (on_logits).
          const bool drawn_by_spec = spec_ && (s.in.params.sampling.temperature != 0.0f || s.sampler.has_penalties());
          if (drawn_by_spec || s.in.params.top_logprobs >= 0 || s.shapes() || row_prompt_pos[i] >= 0 ||
              s.in.params.max_tokens == 0)
            return false;  // the whole row comes to the host
          drawn[i] = s.sampler.sample_from_candidates(c);
          return drawn[i].has_value();
        }();
        rows_to_host += !took;
        return took;
      };
      req.full_logits = logits_.data();
      model_.forward_sample(batch, state_, req, want_hidden ? hidden_.data() : nullptr, F ? captured.data() : nullptr);
    } catch (const std::exception& e) {
      spdlog::error("forward pass failed: {}", e.what());
      for (Sequence* s : run_owner) finish(*s, "error", e.what());
      for (Sequence* s : turn_owner) finish(*s, "error", e.what());
      ok = false;
    }
    uint64_t prefilled = 0, undrafted = 0;
    if (ok) {
      for (size_t i = 0; i < turns.size(); ++i) {
        Sequence& s = *turn_owner[i];
        if (s.spec.draft.tokens.empty()) ++undrafted;
        if (turn_greedy[i]) {  // a row whose candidates did not decide came whole: its argmax here
          const auto rows = std::span(row_argmax).subspan(size_t(turns[i].out_row), size_t(SpecStepper::rows(turns[i])));
          for (size_t j = 0; j < rows.size(); ++j)
            if (rows[j] < 0) rows[j] = argmax(std::span(logits_).subspan((size_t(turns[i].out_row) + j) * V, V));
          turns[i].argmax = rows;
        }
        const int32_t keep = spec_->finish_round(
            turns[i], logits_, hidden_,
            [&](int32_t tok, std::span<const float> raw, int32_t fed) { return emit(s, tok, raw, fed); }, captured);
        s.n_fed = turns[i].pos + keep;
      }
      if (spec_) spec_->commit();
      for (size_t i = 0; i < run_owner.size(); ++i) {
        const SeqRun& run = batch.runs[size_t(owner_run[i])];
        if (run_owner[i]->prefilling()) prefilled += uint64_t(run.count);
        run_owner[i]->n_fed += run.count;
        checkpoint(*run_owner[i]);
      }
      for (size_t i = 0; i < row_owner.size(); ++i) {
        Sequence& s = *row_owner[i];
        const std::span<float> row = std::span(logits_).subspan(size_t(owner_row[i]) * V, V);
        if (row_prompt_pos[i] >= 0) {
          emit_prompt_logprob(s, row_prompt_pos[i], row);
          continue;
        }
        if (s.in.params.max_tokens == 0) {  // the prompt was read for its logprobs only
          finish(s, "length");
          continue;
        }
        if (drawn[i])
          emit(s, *drawn[i], {}, s.n_fed);
        else if (!spec_ && s.in.params.top_logprobs < 0) {  // penalties already applied
          if (shape(s, row)) emit(s, s.sampler.sample_penalised(row), {}, s.n_fed);
        }
        else
          on_logits(s, row);
      }
      if (want_hidden)  // every plain run is a prefill chunk here
        for (size_t i = 0; i < run_owner.size(); ++i) {
          const SeqRun& run = batch.runs[size_t(owner_run[i])];
          observe_prefill(*run_owner[i], run.pos0, run.count, run.begin);
        }
      if (F)  // every plain run is a prefill chunk here
        for (size_t i = 0; i < run_owner.size(); ++i) {
          const SeqRun& run = batch.runs[size_t(owner_run[i])];
          spec_->observe_captured(run_owner[i]->slot, run.pos0,
                                  std::span<const float>(captured).subspan(size_t(run.begin) * F, size_t(run.count) * F));
        }
    }
    reap();
    std::lock_guard lock(mu_);
    ++stats_.steps;
    stats_.prefilled_tokens += prefilled;
    stats_.logit_rows_to_host += rows_to_host;
    if (spec_) {
      stats_.spec.merge(spec_->take_metrics());
      stats_.spec_undrafted += undrafted;
    }
  }
  std::lock_guard lock(mu_);
  stats_.running = int32_t(running_.size());
  stats_.waiting = queued_;
  stats_.slots_busy = cache_.busy();
  stats_.slots_cached = cache_.cached();
  stats_.snapshots = snaps_.stats();
  stats_.kv_positions_used = 0;
  for (const Sequence& s : running_) stats_.kv_positions_used += s.n_fed;
  return worked;
}

// Uses only fields guarded by mu_ (stats_.running is refreshed at the end of every step), so
// any thread may ask.
SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool Scheduler::has_work_locked() const { return queued_ > 0 || stats_.running > 0; }

void Scheduler::run_loop() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      // The timeout lets a cancel() of an idle queue be noticed without a notify.
      wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_ || has_work_locked(); });
      if (stopping_) return;
    }
    try {
      step();
    } catch (const std::exception& e) {  // a bug must not kill the engine thread silently
      spdlog::error("engine step failed: {}", e.what());
    }
  }
}

std::string Scheduler::checkpoint_fingerprint(const std::string& model_id) const {
  return fmt::format("{}; weights {}; kv {}; state {}; {} / {} bytes at 1 / 2 positions", model_.config().summary(),
                     model_id, dtype_name(opts_.kv_type), dtype_name(opts_.state_type), snapshot_bytes(state_, 1),
                     snapshot_bytes(state_, 2));
}

size_t Scheduler::save_checkpoints(const std::string& path, const std::string& model_id) {
  QWEN36_CHECK(!thread_.joinable(), "checkpoints are saved while the engine is stopped");
  return write_snapshot_file(path, checkpoint_fingerprint(model_id), model_.backend(), snaps_);
}

size_t Scheduler::load_checkpoints(const std::string& path, const std::string& model_id) {
  QWEN36_CHECK(!thread_.joinable(), "checkpoints are loaded before the engine starts");
  if (!snaps_.enabled()) {
    spdlog::warn("{}: not read, prefix-cache checkpoints are off (--snapshot-interval, --snapshot-mem / --cache-ram)",
                 path);
    return 0;
  }
  SnapshotFile f;
  try {
    f = read_snapshot_file(path);
  } catch (const Error& e) {
    spdlog::warn("prefix-cache checkpoints not read: {}", e.what());
    return 0;
  }
  if (const std::string here = checkpoint_fingerprint(model_id); f.fingerprint != here) {
    spdlog::warn("{}: written for another model or cache type, not read ({} there, {} here)", path, f.fingerprint,
                 here);
    return 0;
  }
  size_t loaded = 0;
  for (SnapshotFile::Entry& e : f.entries) {
    const int64_t n = int64_t(e.prefix.size());
    const std::optional<bool> where = snaps_.placement(e.bytes.size());
    // Only prefixes the cache would look for (interval multiples that fit a slot) are kept.
    if (e.positions != n || n % snaps_.interval() != 0 || n >= opts_.context || !where ||
        e.bytes.size() != snapshot_bytes(state_, n) || !snaps_.wants(e.prefix))
      continue;
    snaps_.insert(std::move(e.prefix), snapshot_from_host(model_.backend(), std::move(e.bytes), n, *where));
    ++loaded;
  }
  spdlog::info("{}: {} of {} prefix-cache checkpoints read", path, loaded, f.entries.size());
  std::lock_guard lock(mu_);
  stats_.snapshots = snaps_.stats();
  return loaded;
}

void Scheduler::start() {
  QWEN36_CHECK(!thread_.joinable(), "the engine thread is already running");
  thread_ = std::thread([this] { run_loop(); });
}

void Scheduler::stop(std::chrono::milliseconds drain) {
  const auto deadline = Clock::now() + drain;
  if (thread_.joinable()) {
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mu_);
        if (!has_work_locked()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Now this thread owns the engine: cancel whatever is left so every caller gets an answer.
  std::vector<std::shared_ptr<Request>> left;
  {
    std::lock_guard lock(mu_);
    for (Pending& p : incoming_) left.push_back(p.req);
  }
  for (Pending& p : waiting_) left.push_back(p.req);
  for (Sequence& s : running_) left.push_back(s.in.req);
  for (auto& r : left) r->cancel();
  step();  // drains incoming, finishes every cancelled request
}

}  // namespace qwen36
