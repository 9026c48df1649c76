#include "engine/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

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

  Sequence(Pending p, int32_t slot_, int32_t reused)
      : in(std::move(p)), sampler(in.params.sampling), text(in.params.stop_strings), slot(slot_),
        tokens(in.params.prompt), n_prompt(int32_t(tokens.size())), n_fed(reused), prefill_start(reused),
        n_cached(reused) {}
  bool prefilling() const { return n_fed < n_prompt; }
};

Scheduler::Scheduler(Model& model, SchedulerOptions opts)
    : model_(model),
      opts_(std::move(opts)),
      state_(model.backend(), model.config(), opts_.slots, opts_.context, false, opts_.kv_type),
      cache_(opts_.slots, opts_.prefix_cache) {
  QWEN36_CHECK(opts_.prefill_chunk > 0, "prefill chunk {} must be positive", opts_.prefill_chunk);
  QWEN36_CHECK(opts_.max_batch_tokens > 0, "batch token budget {} must be positive", opts_.max_batch_tokens);
  QWEN36_CHECK(opts_.max_queue >= 0, "queue cap {} must be >= 0", opts_.max_queue);
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
  QWEN36_CHECK(p.top_logprobs >= -1 && p.top_logprobs <= 20, "top_logprobs {} must be between 0 and 20",
               p.top_logprobs);
  QWEN36_CHECK(p.stop_strings.empty() || opts_.token_text, "stop strings need a tokenizer");
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
    if (front.params.max_tokens == 0) {  // nothing to generate: no need to read the prompt
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
    if (g.reused == 0) state_.reset_slot(g.slot);
    running_.emplace_back(std::move(front), g.slot, g.reused);
    waiting_.pop_front();
    std::lock_guard lock(mu_);
    --queued_;
    stats_.prompt_tokens += uint64_t(running_.back().n_prompt);
    stats_.prompt_tokens_cached += uint64_t(g.reused);
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
  s.in.req->push(std::move(ev), &u);
  // After an error the slot's state is unknown, so it must not be reused as a cached prefix.
  cache_.release(s.slot, reason == "error" ? std::vector<int32_t>{}
                                           : std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + s.n_fed));
  std::lock_guard lock(mu_);
  ++stats_.requests_finished;
  if (reason == "cancelled") ++stats_.requests_cancelled;
}

void Scheduler::on_logits(Sequence& s, std::span<float> logits) {
  std::optional<TokenLogprob> lp;
  std::vector<float> raw;
  if (s.in.params.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());  // the sampler edits logits
  const int32_t tok = s.sampler.sample(logits, s.tokens);
  const auto& stops = s.in.params.stop_ids;
  if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
    finish(s, "stop");
    return;
  }
  if (!raw.empty()) {
    const float mx = *std::max_element(raw.begin(), raw.end());
    double z = 0;
    for (float v : raw) z += std::exp(double(v - mx));
    const float lse = mx + float(std::log(z));
    lp.emplace();
    lp->token = tok;
    lp->logprob = raw[size_t(tok)] - lse;
    std::vector<int32_t> ids(raw.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t k = size_t(s.in.params.top_logprobs);
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(),
                      [&](int32_t a, int32_t b) { return raw[size_t(a)] > raw[size_t(b)]; });
    for (size_t i = 0; i < k; ++i) lp->top.emplace_back(ids[i], raw[size_t(ids[i])] - lse);
  }
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
  if (opts_.token_text) ev.text = s.text.push(opts_.token_text(tok));
  ev.logprob = std::move(lp);
  s.in.req->push(std::move(ev));
  if (s.text.matched())
    finish(s, "stop");
  else if (s.n_generated >= s.in.params.max_tokens || s.n_fed + 1 >= opts_.context)
    finish(s, "length");  // the same context rule as generate(): the next token must still fit
}

bool Scheduler::step() {
  bool worked = false;
  {
    std::lock_guard lock(mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
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
  worked |= std::erase_if(running_, [](const Sequence& s) { return s.done; }) > 0;
  admit_waiting();

  // One batch: decode tokens first, then prefill chunks in admission order within the budget.
  ForwardBatch batch;
  std::vector<Sequence*> run_owner, row_owner;
  auto add_run = [&](Sequence& s, int32_t count, bool wants_logits) {
    const int32_t begin = int32_t(batch.tokens.size());
    batch.tokens.insert(batch.tokens.end(), s.tokens.begin() + s.n_fed, s.tokens.begin() + s.n_fed + count);
    batch.runs.push_back({s.slot, s.n_fed, begin, count});
    run_owner.push_back(&s);
    if (wants_logits) {
      batch.output_rows.push_back(begin + count - 1);
      row_owner.push_back(&s);
    }
  };
  for (Sequence& s : running_)
    if (!s.prefilling()) add_run(s, 1, true);
  int32_t budget = opts_.max_batch_tokens - int32_t(batch.tokens.size());
  bool any_prefill = false;
  for (Sequence& s : running_) {
    if (!s.prefilling()) continue;
    const int32_t done_chunks = (s.n_fed - s.prefill_start) / opts_.prefill_chunk;
    const int32_t end = std::min(s.n_prompt, s.prefill_start + (done_chunks + 1) * opts_.prefill_chunk);
    const int32_t count = end - s.n_fed;
    if (any_prefill && count > budget) break;  // keep FIFO order: later prompts wait their turn
    add_run(s, count, end == s.n_prompt);
    budget -= count;
    any_prefill = true;
  }

  if (!batch.tokens.empty()) {
    worked = true;
    const int64_t V = model_.config().vocab_size;
    logits_.resize(batch.output_rows.size() * size_t(V));
    try {
      model_.forward(batch, state_, logits_.data());
    } catch (const std::exception& e) {
      spdlog::error("forward pass failed: {}", e.what());
      for (Sequence* s : run_owner) finish(*s, "error", e.what());
      run_owner.clear();
      row_owner.clear();
    }
    uint64_t prefilled = 0;
    for (size_t i = 0; i < run_owner.size(); ++i) {
      if (run_owner[i]->prefilling()) prefilled += uint64_t(batch.runs[i].count);
      run_owner[i]->n_fed += batch.runs[i].count;
    }
    for (size_t i = 0; i < row_owner.size(); ++i)
      on_logits(*row_owner[i], std::span(logits_).subspan(i * size_t(V), size_t(V)));
    std::erase_if(running_, [](const Sequence& s) { return s.done; });
    std::lock_guard lock(mu_);
    ++stats_.steps;
    stats_.prefilled_tokens += prefilled;
  }
  std::lock_guard lock(mu_);
  stats_.running = int32_t(running_.size());
  stats_.waiting = queued_;
  stats_.slots_busy = cache_.busy();
  stats_.slots_cached = cache_.cached();
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
