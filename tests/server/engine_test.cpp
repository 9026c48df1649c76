// Engine core without HTTP: continuous batching gives each request exactly what it gets alone,
// cancellation frees a slot within one step, the queue cap refuses, and the prefix cache lets a
// second turn prefill only its new tokens with the same output as a cold run.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine_test_util.h"
#include "format/model_loader.h"
#include "model/state_snapshot.h"

namespace qwen36 {
namespace {

using test::run_until_done;

using namespace std::chrono_literals;

// The tiny transformers checkpoint of the golden tests (vocab 256): fast and deterministic.
constexpr char kDenseGqa[] = "dense-gqa";

class EngineTest : public test::GoldenModelSuite<kDenseGqa> {
 protected:
  static std::vector<int32_t> prompt(int n, int seed) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((seed * 37 + i * 11 + i * i) % 256);
    return p;
  }
  // What generate() gives for this request on a fresh state (the single-request reference).
  static std::vector<int32_t> alone(const RequestParams& p, int32_t chunk, int64_t ctx = 256) {
    return test::generate_alone(*model_, *backend_, p, chunk, ctx);
  }
};

SchedulerOptions small_options() {
  SchedulerOptions o;
  o.slots = 3;
  o.context = 256;
  o.prefill_chunk = 16;
  o.max_batch_tokens = 40;
  o.max_queue = 16;
  return o;
}

TEST_F(EngineTest, ConcurrentGreedyEqualsSingleRuns) {
  Scheduler s(*model_, small_options());
  std::vector<RequestParams> ps;
  for (int i = 0; i < 7; ++i) {
    RequestParams p;
    p.prompt = prompt(3 + i * 13, i);  // 3 .. 81 tokens: single and multi-chunk prefills
    p.max_tokens = 12 + i;
    ps.push_back(p);
  }
  // Two requests start, the rest arrive while they decode (more requests than slots).
  std::vector<std::shared_ptr<Request>> reqs;
  reqs.push_back(s.submit(ps[0]));
  reqs.push_back(s.submit(ps[1]));
  for (int i = 0; i < 4; ++i) s.step();
  for (size_t i = 2; i < ps.size(); ++i) reqs.push_back(s.submit(ps[i]));
  run_until_done(s, reqs);
  uint64_t total_tokens = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    RequestResult r = wait_for_result(*reqs[i], 1000ms);
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.tokens, alone(ps[i], 16)) << "request " << i;
    EXPECT_EQ(r.usage.prompt_tokens, int32_t(ps[i].prompt.size()));
    EXPECT_EQ(r.usage.completion_tokens, ps[i].max_tokens);
    total_tokens += ps[i].prompt.size() + size_t(ps[i].max_tokens);
  }
  // Batching happened: far fewer forward passes than one per chunk/token per request.
  const SchedulerStats st = s.stats();
  EXPECT_LT(st.steps * 2, total_tokens / 2);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.requests_finished, ps.size());
}

TEST_F(EngineTest, SeededSamplingEqualsSingleRun) {
  Scheduler s(*model_, small_options());
  std::vector<RequestParams> ps(3);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 3; ++i) {
    ps[size_t(i)].prompt = prompt(10 + i * 20, 40 + i);
    ps[size_t(i)].max_tokens = 15;
    ps[size_t(i)].sampling.temperature = 0.9f;
    ps[size_t(i)].sampling.top_k = 0;
    ps[size_t(i)].sampling.top_p = 0.95f;
    ps[size_t(i)].sampling.seed = uint64_t(100 + i);
    reqs.push_back(s.submit(ps[size_t(i)]));
  }
  run_until_done(s, reqs);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(wait_for_result(*reqs[i], 1000ms).tokens, alone(ps[i], 16));
}

TEST_F(EngineTest, StopTokenEndsWithoutEmittingIt) {
  RequestParams p;
  p.prompt = prompt(20, 3);
  p.max_tokens = 12;
  const auto ref = alone(p, 16);
  ASSERT_GE(ref.size(), 6u);
  p.stop_ids = {ref[5]};
  Scheduler s(*model_, small_options());
  auto r = s.submit(p);
  run_until_done(s, {r});
  RequestResult res = wait_for_result(*r, 1000ms);
  EXPECT_EQ(res.finish_reason, "stop");
  const auto first = std::find(ref.begin(), ref.end(), ref[5]);
  EXPECT_EQ(res.tokens, std::vector<int32_t>(ref.begin(), first));
}

TEST_F(EngineTest, StopStringTruncatesText) {
  SchedulerOptions o = small_options();
  o.token_text = [](int32_t t) { return std::string(1, char('a' + t % 26)); };
  RequestParams p;
  p.prompt = prompt(12, 9);
  p.max_tokens = 16;
  std::string full;
  for (int32_t t : alone(p, 16)) full += char('a' + t % 26);
  p.stop_strings = {full.substr(6, 3), "not-there"};
  const std::string want = full.substr(0, full.find(full.substr(6, 3)));
  Scheduler s(*model_, o);
  auto r = s.submit(p);
  run_until_done(s, {r});
  RequestResult res = wait_for_result(*r, 1000ms);
  EXPECT_EQ(res.finish_reason, "stop");
  EXPECT_EQ(res.text, want);
}

// min_tokens: the stop ids cannot be drawn (nor stop strings match) before that many tokens;
// include_stop_string keeps a stop string's text.
TEST_F(EngineTest, MinTokensHoldsStopsAndTheStopStringCanBeKept) {
  SchedulerOptions o = small_options();
  o.token_text = [](int32_t t) { return std::string(1, char('a' + t % 26)); };
  RequestParams p;
  p.prompt = prompt(20, 3);
  p.max_tokens = 12;
  const auto ref = alone(p, 16);
  ASSERT_EQ(ref.size(), 12u);
  const int32_t stop = ref[2];
  const size_t first = size_t(std::find(ref.begin(), ref.end(), stop) - ref.begin());
  p.stop_ids = {stop};
  p.min_tokens = 7;
  Scheduler s(*model_, o);
  auto r = s.submit(p);
  run_until_done(s, {r});
  RequestResult res = wait_for_result(*r, 1000ms);
  ASSERT_GE(res.tokens.size(), 7u) << "finished " << res.finish_reason;
  for (size_t i = 0; i < 7; ++i) EXPECT_NE(res.tokens[i], stop) << i;
  EXPECT_EQ(std::vector<int32_t>(res.tokens.begin(), res.tokens.begin() + std::ptrdiff_t(first)),
            std::vector<int32_t>(ref.begin(), ref.begin() + std::ptrdiff_t(first)))
      << "the same draws until the stop id was the greedy one";
  const std::vector<int32_t> held(res.tokens.begin(), res.tokens.end());

  // A stop string found in the first tokens' text is passed over until min_tokens are out.
  std::string text;
  for (int32_t t : held) text += char('a' + t % 26);
  RequestParams q = p;
  q.stop_strings = {text.substr(1, 1)};
  q.include_stop_string = true;
  auto r2 = s.submit(q);
  run_until_done(s, {r2});
  const RequestResult got = wait_for_result(*r2, 1000ms);
  const size_t end = text.find(text[1], 6);  // the first match in the text of the 7th token on
  EXPECT_EQ(got.finish_reason, end != std::string::npos ? "stop" : res.finish_reason) << text;
  EXPECT_EQ(got.text, end == std::string::npos ? text : text.substr(0, end + 1)) << text;

  RequestParams bad = p;
  bad.min_tokens = -1;
  EXPECT_THROW(s.submit(bad), Error);
  bad = p;
  bad.stop_ids = {1 << 20};
  EXPECT_THROW(s.submit(bad), Error);
}

TEST_F(EngineTest, LogprobsAreNormalisedAndRankTheGreedyTokenFirst) {
  RequestParams p;
  p.prompt = prompt(8, 5);
  p.max_tokens = 4;
  p.top_logprobs = 3;
  Scheduler s(*model_, small_options());
  auto r = s.submit(p);
  run_until_done(s, {r});
  RequestResult res = wait_for_result(*r, 1000ms);
  ASSERT_EQ(res.logprobs.size(), 4u);
  for (const TokenLogprob& lp : res.logprobs) {
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);
    EXPECT_EQ(lp.rank, 1) << "greedy: the most likely token";
    EXPECT_FLOAT_EQ(lp.top[0].second, lp.logprob);
    EXPECT_LE(lp.logprob, 0.f);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_LE(std::exp(lp.top[0].second) + std::exp(lp.top[1].second) + std::exp(lp.top[2].second), 1.0001);
  }
}

// Prompt logprobs score each prompt token from the position before it: over a prompt that is
// an earlier request's prompt + answer they equal that answer's logprobs (the same rows, read by
// prefill instead of decode), the cached prefix is not used, and max_tokens 0 still reads it.
TEST_F(EngineTest, PromptLogprobsEqualTheDecodedOnes) {
  SchedulerOptions o = small_options();
  o.slots = 1;  // the second request finds the first one's state cached in the slot
  Scheduler s(*model_, o);
  RequestParams a;
  a.prompt = prompt(40, 2);  // more than kPromptLogprobRows: the prompt is read in two chunks
  a.max_tokens = 6;
  a.top_logprobs = 2;
  auto ra = s.submit(a);
  run_until_done(s, {ra});
  const RequestResult first = wait_for_result(*ra, 1000ms);
  ASSERT_EQ(first.tokens.size(), 6u);

  RequestParams b;
  b.prompt = a.prompt;
  b.prompt.insert(b.prompt.end(), first.tokens.begin(), first.tokens.end());
  b.max_tokens = 0;
  b.prompt_logprobs = 2;
  auto rb = s.submit(b);
  run_until_done(s, {rb});
  const RequestResult scored = wait_for_result(*rb, 1000ms);
  EXPECT_EQ(scored.finish_reason, "length");
  EXPECT_TRUE(scored.tokens.empty());
  EXPECT_EQ(scored.usage.cached_tokens, 0) << "read from the start";
  ASSERT_EQ(scored.prompt_logprobs.size(), b.prompt.size() - 1);
  for (size_t i = 0; i < scored.prompt_logprobs.size(); ++i) {
    const TokenLogprob& lp = scored.prompt_logprobs[i];
    EXPECT_EQ(lp.token, b.prompt[i + 1]) << i;
    ASSERT_EQ(lp.top.size(), 2u);
    EXPECT_LE(lp.logprob, lp.top[0].second + 1e-6f);
    EXPECT_LE(lp.logprob, 0.f);
  }
  for (size_t j = 0; j < first.logprobs.size(); ++j) {  // the answer's tokens, scored both ways
    const TokenLogprob& decoded = first.logprobs[j];
    const TokenLogprob& read = scored.prompt_logprobs[a.prompt.size() - 1 + j];
    EXPECT_EQ(read.token, decoded.token);
    EXPECT_NEAR(read.logprob, decoded.logprob, 1e-4) << j;
    EXPECT_EQ(read.top[0].first, decoded.top[0].first) << j;
  }

  RequestParams c = b;  // with an answer too: the prompt events come first
  c.max_tokens = 2;
  auto rc = s.submit(c);
  run_until_done(s, {rc});
  const RequestResult both = wait_for_result(*rc, 1000ms);
  EXPECT_EQ(both.prompt_logprobs.size(), b.prompt.size() - 1);
  EXPECT_EQ(both.tokens.size(), 2u);
  RequestParams bad = b;
  bad.prompt_logprobs = 21;
  EXPECT_THROW(s.submit(bad), Error);
}

// The reasoning budget: once that many tokens were drawn inside the reasoning, its end token
// is next; opened by the prompt, or by the model's start token.
TEST_F(EngineTest, ReasoningBudgetForcesTheEnd) {
  Scheduler s(*model_, small_options());
  RequestParams p;
  p.prompt = prompt(10, 4);
  p.max_tokens = 12;
  const auto ref = alone(p, 16);
  ASSERT_EQ(ref.size(), 12u);
  int32_t end = 0;  // a token the free run never draws
  while (std::find(ref.begin(), ref.end(), end) != ref.end()) ++end;
  auto run = [&](RequestParams q) {
    auto r = s.submit(q);
    run_until_done(s, {r});
    return wait_for_result(*r, 1000ms).tokens;
  };
  RequestParams opened = p;  // the prompt opened the reasoning
  opened.reasoning_budget = 4;
  opened.reasoning_end = end;
  const auto a = run(opened);
  ASSERT_GE(a.size(), 5u);
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 4), std::vector<int32_t>(ref.begin(), ref.begin() + 4));
  EXPECT_EQ(a[4], end);
  EXPECT_EQ(std::count(a.begin(), a.end(), end), 1) << "once closed, the budget is over";

  RequestParams later = opened;  // opened by the model's third token
  later.reasoning_start = ref[2];
  const auto b = run(later);
  const size_t open_at = size_t(std::find(ref.begin(), ref.end(), ref[2]) - ref.begin());
  ASSERT_GE(b.size(), open_at + 6);
  EXPECT_EQ(b[open_at + 5], end) << "four tokens after the start token";
  EXPECT_EQ(std::count(b.begin(), b.begin() + std::ptrdiff_t(open_at) + 5, end), 0);

  RequestParams zero = opened;
  zero.reasoning_budget = 0;
  EXPECT_EQ(run(zero).front(), end);
  RequestParams bad = opened;
  bad.reasoning_end = -1;
  EXPECT_THROW(s.submit(bad), Error);
}

// Priority: with one slot, waiting requests are admitted by their priority value (lower first),
// equal values in arrival order.
TEST_F(EngineTest, LowerPriorityValuesAreAdmittedFirst) {
  SchedulerOptions o = small_options();
  o.slots = 1;
  o.prefix_cache = false;
  Scheduler s(*model_, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int32_t pri : {0, 5, -1, 0}) {
    RequestParams p;
    p.prompt = prompt(6, int(reqs.size()));
    p.max_tokens = 3;
    p.priority = pri;
    reqs.push_back(s.submit(p));
  }
  run_until_done(s, reqs);
  std::vector<double> ttft;
  for (auto& r : reqs) ttft.push_back(wait_for_result(*r, 1000ms).usage.ttft_seconds);
  EXPECT_LT(ttft[2], ttft[0]) << "priority -1 before 0";
  EXPECT_LT(ttft[0], ttft[3]) << "equal priorities in arrival order";
  EXPECT_LT(ttft[3], ttft[1]) << "priority 5 last";
}

TEST_F(EngineTest, CancelFreesTheSlotWithinOneStep) {
  SchedulerOptions o = small_options();
  o.slots = 1;
  Scheduler s(*model_, o);
  RequestParams long_req;
  long_req.prompt = prompt(10, 1);
  long_req.max_tokens = 200;
  auto a = s.submit(long_req);
  for (int i = 0; i < 3; ++i) s.step();
  RequestParams next;
  next.prompt = prompt(5, 2);
  next.max_tokens = 3;
  auto b = s.submit(next);
  s.step();
  EXPECT_EQ(s.stats().waiting, 1);  // b waits: the only slot is busy
  a->cancel();
  s.step();  // one step: a is finished and b runs in its slot
  EXPECT_TRUE(a->finished());
  EXPECT_EQ(wait_for_result(*a, 100ms).finish_reason, "cancelled");
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.requests_cancelled, 1u);
  run_until_done(s, {b});
  EXPECT_EQ(wait_for_result(*b, 100ms).tokens, alone(next, 16));
}

TEST_F(EngineTest, QueueCapRefusesAndBadRequestsThrow) {
  SchedulerOptions o = small_options();
  o.max_queue = 2;
  Scheduler s(*model_, o);
  RequestParams p;
  p.prompt = prompt(4, 0);
  p.max_tokens = 2;
  auto r1 = s.submit(p), r2 = s.submit(p);
  EXPECT_THROW(s.submit(p), QueueFull);
  EXPECT_EQ(s.stats().requests_rejected, 1u);
  run_until_done(s, {r1, r2});
  EXPECT_NO_THROW(s.submit(p));  // the queue drained

  RequestParams bad = p;
  bad.prompt.clear();
  EXPECT_THROW(s.submit(bad), Error);
  bad.prompt = prompt(256, 0);  // context is 256: no room to generate
  EXPECT_THROW(s.submit(bad), Error);
  bad = p;
  bad.prompt[0] = 256;
  EXPECT_THROW(s.submit(bad), Error);
  bad = p;
  bad.max_tokens = -1;
  EXPECT_THROW(s.submit(bad), Error);
  bad = p;
  bad.sampling.top_p = 2;
  EXPECT_THROW(s.submit(bad), Error);
  bad = p;
  bad.top_logprobs = 21;
  EXPECT_THROW(s.submit(bad), Error);
  bad = p;
  bad.stop_strings = {"x"};  // no token_text in these options
  EXPECT_THROW(s.submit(bad), Error);
}

TEST_F(EngineTest, MaxTokensZeroAndContextEnd) {
  Scheduler s(*model_, small_options());
  RequestParams p;
  p.prompt = prompt(6, 4);
  p.max_tokens = 0;
  auto r0 = s.submit(p);
  p.prompt = prompt(250, 4);  // 256 positions: generation stops at the context end
  p.max_tokens = 100;
  auto r1 = s.submit(p);
  run_until_done(s, {r0, r1});
  RequestResult a = wait_for_result(*r0, 100ms), b = wait_for_result(*r1, 100ms);
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_TRUE(a.tokens.empty());
  EXPECT_EQ(b.finish_reason, "length");
  EXPECT_EQ(b.tokens, alone(p, 16));
  EXPECT_EQ(b.tokens.size(), 6u);
}

TEST_F(EngineTest, SecondTurnPrefillsOnlyNewTokensAndMatchesColdRun) {
  SchedulerOptions o = small_options();
  o.slots = 2;
  Scheduler s(*model_, o);
  RequestParams t1;
  t1.prompt = prompt(40, 7);
  t1.max_tokens = 10;
  auto r1 = s.submit(t1);
  run_until_done(s, {r1});
  RequestResult a = wait_for_result(*r1, 100ms);
  ASSERT_EQ(a.tokens.size(), 10u);

  // Turn 2 = turn 1 + its answer + a new user message (as a chat template would render it).
  RequestParams t2 = t1;
  t2.prompt.insert(t2.prompt.end(), a.tokens.begin(), a.tokens.end());
  const std::vector<int32_t> user = prompt(23, 8);
  t2.prompt.insert(t2.prompt.end(), user.begin(), user.end());
  t2.max_tokens = 12;
  const uint64_t prefilled_before = s.stats().prefilled_tokens;
  auto r2 = s.submit(t2);
  run_until_done(s, {r2});
  RequestResult b = wait_for_result(*r2, 100ms);

  // The slot held turn 1's prompt and every answer token but the last (never fed back).
  const int32_t reused = 40 + 10 - 1;
  EXPECT_EQ(b.usage.cached_tokens, reused);
  EXPECT_EQ(s.stats().prefilled_tokens - prefilled_before, t2.prompt.size() - size_t(reused));
  EXPECT_EQ(b.tokens, alone(t2, 16));  // identical to a cold run of the whole prompt
  const SchedulerStats st = s.stats();
  EXPECT_NEAR(st.cache_hit_rate(), double(reused) / double(40 + t2.prompt.size()), 1e-9);

  // A prompt that diverges from the cached history cannot use it (DeltaNet state is not
  // truncatable): it runs cold, and still matches.
  RequestParams t3 = t2;
  t3.prompt[5] = (t3.prompt[5] + 1) % 256;
  auto r3 = s.submit(t3);
  run_until_done(s, {r3});
  RequestResult c = wait_for_result(*r3, 100ms);
  EXPECT_EQ(c.usage.cached_tokens, 0);
  EXPECT_EQ(c.tokens, alone(t3, 16));
}

// Prefix-cache checkpoints: two users share a 40-token system prompt. The first request saves
// the state at 16, 32 and 48 tokens while it reads its prompt; the second resumes from 32 (its
// slot holds nothing of it: different history), prefills only the rest, and answers exactly as
// a cold run. Device and host tiers both serve.
TEST_F(EngineTest, SharedPrefixResumesFromACheckpoint) {
  for (bool host : {false, true}) {
    SchedulerOptions o = small_options();
    o.slots = 2;
    o.snapshots = {.interval = 16, .device_bytes = host ? 0 : size_t(64) << 20, .host_bytes = size_t(64) << 20};
    Scheduler s(*model_, o);
    const std::vector<int32_t> system = prompt(40, 3);
    RequestParams a, b;
    a.prompt = system;
    b.prompt = system;
    const std::vector<int32_t> qa = prompt(9, 4), qb = prompt(13, 5);
    a.prompt.insert(a.prompt.end(), qa.begin(), qa.end());
    b.prompt.insert(b.prompt.end(), qb.begin(), qb.end());
    a.max_tokens = b.max_tokens = 8;
    auto ra = s.submit(a);
    run_until_done(s, {ra});
    EXPECT_EQ(s.stats().snapshots.saved, 3u);  // at 16, 32 and 48 (the last holds a's own question)
    const uint64_t before = s.stats().prefilled_tokens;
    auto rb = s.submit(b);
    run_until_done(s, {rb});
    const RequestResult res = wait_for_result(*rb, 100ms);
    EXPECT_EQ(res.usage.cached_tokens, 32) << (host ? "host" : "device");
    EXPECT_EQ(s.stats().prefilled_tokens - before, b.prompt.size() - 32);
    EXPECT_EQ(res.tokens, alone(b, 16));
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.snapshots.hits, 1u);
    EXPECT_GT(host ? st.snapshots.host_bytes : st.snapshots.device_bytes, 0u);
    EXPECT_EQ(host ? st.snapshots.device_bytes : st.snapshots.host_bytes, 0u);
  }
}

// The checkpoints in a file (serve --prefix-cache-file): a server that saved them at shutdown
// lets a new one resume the shared prompt beginning on its first request, answering exactly as a
// cold run; a file for other weights, a truncated file and a smaller budget are handled (ignored,
// ignored, the most recently used kept).
TEST_F(EngineTest, CheckpointsSurviveARestartThroughAFile) {
  const std::string file = (std::filesystem::temp_directory_path() / "qwen36-engine-checkpoints.bin").string();
  auto snapshot_bytes_for = [](int64_t n) {
    ModelState st(*backend_, model_->config(), 1, 256, model_->has_mtp());
    return snapshot_bytes(st, n);
  };
  SchedulerOptions o = small_options();
  o.slots = 2;
  o.snapshots = {.interval = 16, .device_bytes = size_t(64) << 20, .host_bytes = 0};
  const std::vector<int32_t> system = prompt(40, 3);
  RequestParams a, b;
  a.prompt = b.prompt = system;
  const std::vector<int32_t> qa = prompt(9, 4), qb = prompt(13, 5);
  a.prompt.insert(a.prompt.end(), qa.begin(), qa.end());
  b.prompt.insert(b.prompt.end(), qb.begin(), qb.end());
  a.max_tokens = b.max_tokens = 8;
  {
    Scheduler first(*model_, o);
    auto ra = first.submit(a);
    run_until_done(first, {ra});
    ASSERT_EQ(first.stats().snapshots.saved, 3u);  // 16, 32, 48
    EXPECT_EQ(first.save_checkpoints(file, "weights A"), 3u);
  }
  {
    Scheduler second(*model_, o);  // device tier
    EXPECT_EQ(second.load_checkpoints(file, "weights A"), 3u);
    auto rb = second.submit(b);
    run_until_done(second, {rb});
    const RequestResult res = wait_for_result(*rb, 100ms);
    EXPECT_EQ(res.usage.cached_tokens, 32);
    EXPECT_EQ(res.tokens, alone(b, 16));
  }
  {
    SchedulerOptions host = o;  // host tier, room for two of the three: the two used last
    host.snapshots = {.interval = 16, .device_bytes = 0, .host_bytes = snapshot_bytes_for(48) + snapshot_bytes_for(32)};
    Scheduler third(*model_, host);
    EXPECT_EQ(third.load_checkpoints(file, "weights A"), 3u);
    EXPECT_EQ(third.stats().snapshots.entries, 2);
    EXPECT_EQ(third.stats().snapshots.evicted, 1u);
  }
  {
    Scheduler other(*model_, o);
    EXPECT_EQ(other.load_checkpoints(file, "weights B"), 0u);  // another model's states
    EXPECT_EQ(other.stats().snapshots.entries, 0);
  }
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  Scheduler truncated(*model_, o);
  EXPECT_EQ(truncated.load_checkpoints(file, "weights A"), 0u);
  std::filesystem::remove(file);
}

TEST_F(EngineTest, EngineThreadServesConcurrentSubmittersAndStopCancels) {
  Scheduler s(*model_, small_options());
  s.start();
  std::vector<RequestParams> ps(6);
  std::vector<RequestResult> got(6);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i].prompt = prompt(5 + int(i) * 7, int(i) + 20);
    ps[i].max_tokens = 10;
    clients.emplace_back([&, i] { got[i] = wait_for_result(*s.submit(ps[i]), 20000ms); });
  }
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(got[i].tokens, alone(ps[i], 16)) << i;

  RequestParams endless;
  endless.prompt = prompt(5, 1);
  endless.max_tokens = 100000;
  auto r = s.submit(endless);
  std::this_thread::sleep_for(20ms);
  s.stop();
  RequestResult res = wait_for_result(*r, 1000ms);
  EXPECT_EQ(res.finish_reason, "cancelled");
  EXPECT_THROW(s.submit(endless), Error);
}

TEST(PrefixCacheTest, LongestProperPrefixThenFreeThenLru) {
  PrefixCache c(2);
  const std::vector<int32_t> a = {1, 2, 3}, b = {7, 8};
  auto g1 = c.acquire(a), g2 = c.acquire(b);
  EXPECT_EQ(g1.reused, 0);
  EXPECT_NE(g1.slot, g2.slot);
  EXPECT_EQ(c.acquire(a).slot, -1);  // both busy
  c.release(g1.slot, a);
  c.release(g2.slot, b);
  EXPECT_EQ(c.cached(), 2);
  auto g3 = c.acquire(std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_EQ(g3.slot, g1.slot);
  EXPECT_EQ(g3.reused, 3);
  c.release(g3.slot, {1, 2, 3, 4});
  // An exact match is not reusable (one token must run for logits); nothing matches → LRU (b's).
  auto g4 = c.acquire(std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_EQ(g4.reused, 0);
  EXPECT_EQ(g4.slot, g2.slot);
  PrefixCache off(1, false);
  off.release(off.acquire(a).slot, a);
  EXPECT_EQ(off.cached(), 0);
}

TEST(StopTextFilterTest, HoldsPartialStopsAndUtf8) {
  StopTextFilter f({"END", "xy"});
  EXPECT_EQ(f.push("hello E"), "hello ");
  EXPECT_EQ(f.push("N"), "");
  EXPECT_EQ(f.push("o"), "ENo");  // not a stop after all
  EXPECT_EQ(f.push("\xc3"), "");    // first byte of "é"
  EXPECT_EQ(f.push("\xa9!x"), "\xc3\xa9!");
  EXPECT_EQ(f.push("y tail"), "");
  EXPECT_TRUE(f.matched());
  EXPECT_EQ(f.stop(), "xy");
  EXPECT_EQ(f.flush(), "");
  StopTextFilter earliest({"later", "b"});  // both in one push: the one that starts first
  EXPECT_EQ(earliest.push("a b later"), "a ");
  EXPECT_EQ(earliest.stop(), "b");
  StopTextFilter first({"bc", "abc"});
  EXPECT_EQ(first.push("xabc"), "x");
  EXPECT_EQ(first.stop(), "abc");
  StopTextFilter g;
  EXPECT_EQ(g.push("ab\xe2\x82"), "ab");
  EXPECT_EQ(g.flush(), "\xe2\x82");
}

TEST(StopTextFilterTest, IncludedStopAndArming) {
  StopTextFilter inc({"END"}, /*include=*/true);
  EXPECT_EQ(inc.push("ab E"), "ab ");
  EXPECT_EQ(inc.push("ND tail"), "END");
  EXPECT_TRUE(inc.matched());
  StopTextFilter held({"END"}, false, /*armed=*/false);
  EXPECT_EQ(held.push("x END \xc3"), "x END ");  // passed through, but a cut character waits
  EXPECT_FALSE(held.matched());
  held.arm();
  EXPECT_EQ(held.push("\xa9 EN"), "\xc3\xa9 ");
  EXPECT_EQ(held.push("D"), "");
  EXPECT_EQ(held.stop(), "END");
}

}  // namespace
}  // namespace qwen36
