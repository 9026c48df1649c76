// Speculative decoding inside the continuous-batching scheduler (no HTTP):
// - lossless: greedy output with MTP, n-gram and an oracle drafter (long accepted runs, bonus
//   tokens and rejections at every depth) equals plain generate() token for token, alone and
//   with 8 concurrent sequences of mixed prompt lengths, some joining mid-run, drafting and
//   non-drafting sequences sharing batches;
// - stop ids, stop strings and max_tokens falling inside a round end exactly where the plain
//   scheduler ends, and the slot is cached under exactly the tokens its state holds: a second
//   turn then reuses it and equals a cold run (also after a cancelled drafting sequence);
// - sampling: with temperature, the first three tokens follow the target's exact joint
//   distribution with and without speculation (chi-square, tests/unit/spec's helpers);
// - the counters are consistent and logprobs equal the plain path's.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "../unit/spec/spec_test_util.h"
#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine_test_util.h"
#include "format/model_loader.h"
#include "text/tokenizer.h"

namespace qwen36 {
namespace {

using test::run_until_done;

using namespace std::chrono_literals;

// Drafts the known greedy continuation of each prompt (the longest prompt that starts the
// history); with `corrupt`, one draft of every other round is wrong.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::map<std::vector<int32_t>, std::vector<int32_t>> refs, bool corrupt)
      : refs_(std::move(refs)), corrupt_(corrupt) {}
  const char* name() const override { return "oracle"; }
  void propose(std::span<DraftRequest> reqs) override {
    for (DraftRequest& r : reqs) {
      r.tokens.clear();
      const auto known = test::known_continuation(refs_, r.history, size_t(r.k));
      if (!known) continue;
      r.tokens = *known;
      if (corrupt_ && ++round_ % 2 == 0 && !r.tokens.empty()) {
        const size_t at = round_ / 2 % r.tokens.size();
        r.tokens[at] = (r.tokens[at] + 1) % 7;
      }
    }
  }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> refs_;
  bool corrupt_;
  size_t round_ = 0;
};

// The golden fixture with real MTP weights (vocab 128); its greedy output repeats itself, so
// n-gram lookup finds matches too.
constexpr char kDenseMtp[] = "dense-mtp";

class EngineSpecTest : public test::GoldenModelSuite<kDenseMtp> {
 protected:
  static int32_t vocab() { return int32_t(model_->config().vocab_size); }
  // Odd seeds repeat a 5-token pattern after the first 6 tokens (n-gram material).
  static std::vector<int32_t> prompt(int n, int seed) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i)
      p.push_back(seed % 2 && i >= 6 ? p[size_t(i - 5)] : (seed * 37 + i * 11 + i * i) % vocab());
    return p;
  }
  static std::vector<int32_t> alone(const RequestParams& p, int64_t ctx = 256) {
    return test::generate_alone(*model_, *backend_, p, 16, ctx);
  }
  static SchedulerOptions options(SpecMethod m, int32_t k = 3, bool adaptive = false) {
    SchedulerOptions o;
    o.slots = 8;
    o.context = 256;
    o.prefill_chunk = 16;
    o.max_batch_tokens = 64;
    o.max_queue = 32;
    o.spec.method = m;
    o.spec.draft_n = k;
    o.spec.adaptive = adaptive;
    o.token_text = [](int32_t t) { return std::string(1, char('a' + t % 26)); };
    return o;
  }
  static void with_oracle(SchedulerOptions& o, std::map<std::vector<int32_t>, std::vector<int32_t>> refs,
                          bool corrupt) {
    o.spec.method = SpecMethod::Ngram;  // any method but None; the oracle replaces its drafter
    o.spec_drafter = [refs = std::move(refs), corrupt](Model&, ModelState&) {
      return std::make_unique<OracleDrafter>(refs, corrupt);
    };
  }
  static RequestResult run_one(Scheduler& s, const RequestParams& p) {
    auto r = s.submit(p);
    run_until_done(s, {r});
    return wait_for_result(*r, 1000ms);
  }
  // The counters of rounds agree with each other (and, without stops, with the tokens).
  static void expect_consistent(const SchedulerStats& st) {
    const SpecMetrics& m = st.spec;
    uint64_t d = 0, a = 0;
    for (size_t i = 0; i < m.drafted_at.size(); ++i) {
      EXPECT_LE(m.accepted_at[i], m.drafted_at[i]) << "position " << i + 1;
      if (i > 0) {
        EXPECT_LE(m.drafted_at[i], m.drafted_at[i - 1]);
        EXPECT_LE(m.accepted_at[i], m.accepted_at[i - 1]);
      }
      d += m.drafted_at[i];
      a += m.accepted_at[i];
    }
    EXPECT_EQ(d, m.drafted);
    EXPECT_EQ(a, m.accepted);
    EXPECT_LE(m.accepted, m.drafted);
    EXPECT_EQ(m.emitted, m.accepted + m.rounds);
    EXPECT_EQ(m.drafted_at.empty() ? 0u : m.drafted_at[0], m.rounds);
  }
};

TEST_F(EngineSpecTest, OneSequenceGreedyEqualsPlain) {
  for (SpecMethod m : {SpecMethod::Mtp, SpecMethod::Ngram}) {
    for (int32_t k : {1, 3, 5}) {
      Scheduler s(*model_, options(m, k, /*adaptive=*/k == 5));
      for (int i = 0; i < 3; ++i) {
        RequestParams p;
        p.prompt = prompt(5 + 19 * i, i);
        p.max_tokens = 30;
        const RequestResult r = run_one(s, p);
        EXPECT_EQ(r.tokens, alone(p)) << spec_method_name(m) << " k=" << k << " prompt " << i;
        EXPECT_EQ(r.finish_reason, "length");
      }
      const SchedulerStats st = s.stats();
      expect_consistent(st);
      EXPECT_EQ(st.generated_tokens, 3u + st.spec.emitted + st.spec_undrafted);  // first tokens + rounds
      EXPECT_GT(st.spec.drafted, 0u) << spec_method_name(m);
      EXPECT_LE(st.spec.drafted_at.size(), size_t(k));
      // Greedy rows are sampled on the backend (a turn's verify rows and a prompt's last row):
      // no row's logits come to the host.
      EXPECT_EQ(st.logit_rows_to_host, 0u) << spec_method_name(m);
      std::printf("[ %s k=%d ] %s\n", spec_method_name(m), k, st.spec.summary().c_str());
    }
  }
}

TEST_F(EngineSpecTest, EightConcurrentMixedGreedyEqualsPlain) {
  std::vector<RequestParams> ps;
  std::map<std::vector<int32_t>, std::vector<int32_t>> refs;
  for (int i = 0; i < 10; ++i) {
    RequestParams p;
    p.prompt = prompt(3 + i * 9, i);  // 3 .. 84 tokens: one to six prefill chunks
    p.max_tokens = 18 + i;
    ps.push_back(p);
    refs[p.prompt] = alone(p);
  }
  for (const char* which : {"mtp", "ngram", "oracle"}) {
    SchedulerOptions o = options(SpecMethod::Mtp, 4);
    if (std::string(which) == "ngram") o.spec.method = SpecMethod::Ngram;
    if (std::string(which) == "oracle") with_oracle(o, refs, /*corrupt=*/true);
    Scheduler s(*model_, o);
    // Five start, five join while they decode (two of those wait for a slot).
    std::vector<std::shared_ptr<Request>> reqs;
    for (size_t i = 0; i < 5; ++i) reqs.push_back(s.submit(ps[i]));
    for (int i = 0; i < 6; ++i) s.step();
    for (size_t i = 5; i < ps.size(); ++i) reqs.push_back(s.submit(ps[i]));
    run_until_done(s, reqs);
    uint64_t completion = 0;
    for (size_t i = 0; i < ps.size(); ++i) {
      const RequestResult r = wait_for_result(*reqs[i], 1000ms);
      EXPECT_EQ(r.tokens, refs[ps[i].prompt]) << which << " request " << i;
      EXPECT_EQ(r.usage.completion_tokens, int32_t(r.tokens.size()));
      completion += r.tokens.size();
    }
    const SchedulerStats st = s.stats();
    expect_consistent(st);
    EXPECT_EQ(st.generated_tokens, completion);
    EXPECT_EQ(st.generated_tokens, ps.size() + st.spec.emitted + st.spec_undrafted);
    EXPECT_GT(st.spec.rounds, 0u) << which;
    std::printf("[ %s batch ] %llu steps, %llu undrafted decode tokens; %s\n", which,
                static_cast<unsigned long long>(st.steps), static_cast<unsigned long long>(st.spec_undrafted),
                st.spec.summary().c_str());
    if (std::string(which) == "oracle") {
      EXPECT_GT(st.spec.accepted, st.spec.drafted / 2);
      EXPECT_GT(st.spec.accepted_at.back(), 0u);  // full rounds with a bonus token happened
    }
  }
}

// Every round of the oracle is accepted in full, so each stop below falls inside a round with
// accepted drafts after it. The plain scheduler is the reference for tokens, text and reason;
// the slot must then be cached under exactly the tokens its state holds (second turn = cold).
TEST_F(EngineSpecTest, StopsInsideARoundEndLikeThePlainPathAndCacheTheRightState) {
  RequestParams base;
  base.prompt = prompt(21, 4);
  base.max_tokens = 24;
  const std::vector<int32_t> ref = alone(base);
  ASSERT_EQ(ref.size(), 24u);
  std::string text;
  for (int32_t t : ref) text += char('a' + t % 26);

  std::vector<RequestParams> variants;
  RequestParams v = base;
  v.stop_ids = {ref[9]};  // stop id: the sequence ends before its first occurrence
  variants.push_back(v);
  v = base;
  v.stop_strings = {text.substr(7, 2)};
  variants.push_back(v);
  v = base;
  v.max_tokens = 10;
  variants.push_back(v);
  v = base;
  v.stop_ids = {ref[3]};  // masked in the drafts' rows as in the plain path's until min_tokens are out
  v.min_tokens = 8;
  variants.push_back(v);
  v = base;  // a reasoning opened by the fourth token, closed by force six tokens later
  v.reasoning_budget = 6;
  v.reasoning_start = ref[3];
  v.reasoning_end = 0;
  while (std::find(ref.begin(), ref.end(), v.reasoning_end) != ref.end()) ++v.reasoning_end;
  variants.push_back(v);
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const RequestParams& p = variants[vi];
    Scheduler plain(*model_, options(SpecMethod::None));
    const RequestResult want = run_one(plain, p);
    SchedulerOptions o = options(SpecMethod::Mtp, 5);
    // Turn 2's continuation is in the oracle too, so it drafts there as well.
    RequestParams t2 = p;
    t2.prompt.insert(t2.prompt.end(), want.tokens.begin(), want.tokens.end());
    const std::vector<int32_t> user = prompt(9, 6);
    t2.prompt.insert(t2.prompt.end(), user.begin(), user.end());
    t2.stop_ids.clear();
    t2.stop_strings.clear();
    t2.min_tokens = 0;
    t2.reasoning_budget = -1;  // the reference (generate) knows neither
    t2.max_tokens = 12;
    const std::vector<int32_t> cold = alone(t2);
    with_oracle(o, {{base.prompt, ref}, {t2.prompt, cold}}, /*corrupt=*/false);
    Scheduler s(*model_, o);
    const RequestResult got = run_one(s, p);
    EXPECT_EQ(got.tokens, want.tokens) << "variant " << vi;
    EXPECT_EQ(got.text, want.text) << "variant " << vi;
    EXPECT_EQ(got.finish_reason, want.finish_reason) << "variant " << vi;
    EXPECT_GT(s.stats().spec.accepted, 0u);

    const RequestResult second = run_one(s, t2);
    EXPECT_EQ(second.tokens, cold) << "variant " << vi;
    // The plain path caches prompt + answer, less the last answer token unless a stop id
    // (never fed) followed it. Speculation holds the same, except that the token completing
    // the stop string was an accepted draft whose state the round kept too: one more.
    const RequestResult plain_second = run_one(plain, t2);
    EXPECT_EQ(second.usage.cached_tokens, plain_second.usage.cached_tokens + (vi == 1 ? 1 : 0)) << "variant " << vi;
    EXPECT_GE(second.usage.cached_tokens, int32_t(p.prompt.size() + want.tokens.size()) - 1);
  }
}

TEST_F(EngineSpecTest, CancelledDraftingSequenceFreesItsSlotAndItsCacheIsExact) {
  SchedulerOptions o = options(SpecMethod::Mtp, 3);
  o.slots = 1;
  Scheduler s(*model_, o);
  RequestParams a;
  a.prompt = prompt(30, 5);
  a.max_tokens = 120;
  auto ra = s.submit(a);
  for (int i = 0; i < 30 && s.stats().generated_tokens < 12; ++i) s.step();
  ASSERT_GT(s.stats().spec.rounds, 0u);
  RequestParams b;
  b.prompt = prompt(7, 8);
  b.max_tokens = 10;
  auto rb = s.submit(b);
  s.step();
  EXPECT_EQ(s.stats().waiting, 1);
  ra->cancel();
  s.step();  // one step: a is finished and b runs in its slot
  const RequestResult got_a = wait_for_result(*ra, 100ms);
  EXPECT_EQ(got_a.finish_reason, "cancelled");
  EXPECT_EQ(s.stats().running, 1);
  run_until_done(s, {rb});
  EXPECT_EQ(wait_for_result(*rb, 100ms).tokens, alone(b));

  // a's answer so far is a prefix of its plain output; a follow-up on it equals a cold run.
  const std::vector<int32_t> full = alone(a);
  ASSERT_LE(got_a.tokens.size(), full.size());
  EXPECT_TRUE(std::equal(got_a.tokens.begin(), got_a.tokens.end(), full.begin()));
  Scheduler s2(*model_, options(SpecMethod::Mtp, 3));
  auto ra2 = s2.submit(a);
  for (int i = 0; i < 30 && s2.stats().generated_tokens < 12; ++i) s2.step();
  ra2->cancel();
  s2.step();
  const RequestResult partial = wait_for_result(*ra2, 100ms);
  RequestParams follow = a;
  follow.prompt.insert(follow.prompt.end(), partial.tokens.begin(), partial.tokens.end());
  const std::vector<int32_t> user = prompt(11, 10);
  follow.prompt.insert(follow.prompt.end(), user.begin(), user.end());
  follow.max_tokens = 15;
  const RequestResult f = run_one(s2, follow);
  EXPECT_EQ(f.usage.cached_tokens, int32_t(a.prompt.size() + partial.tokens.size()) - 1);
  EXPECT_EQ(f.tokens, alone(follow));
}

TEST_F(EngineSpecTest, SecondTurnWithMtpReusesTheSlotAndMatchesColdRun) {
  Scheduler s(*model_, options(SpecMethod::Mtp, 3));
  RequestParams t1;
  t1.prompt = prompt(40, 7);
  t1.max_tokens = 14;
  const RequestResult a = run_one(s, t1);
  ASSERT_EQ(a.tokens.size(), 14u);
  RequestParams t2 = t1;
  t2.prompt.insert(t2.prompt.end(), a.tokens.begin(), a.tokens.end());
  const std::vector<int32_t> user = prompt(23, 8);
  t2.prompt.insert(t2.prompt.end(), user.begin(), user.end());
  t2.max_tokens = 20;
  const RequestResult b = run_one(s, t2);
  EXPECT_EQ(b.usage.cached_tokens, 40 + 14 - 1);
  EXPECT_EQ(b.tokens, alone(t2));
}

// A proposal as dense draft distributions (one row of `vocab` per draft).
using Proposal = std::vector<std::vector<float>>;

// Forwards to an MTP drafter and records every proposal.
class RecordingDrafter final : public test::ForwardingDrafter<Drafter> {
 public:
  RecordingDrafter(std::unique_ptr<Drafter> inner, int32_t vocab, std::vector<Proposal>* log)
      : ForwardingDrafter(std::move(inner)), vocab_(vocab), log_(log) {}
  void propose(std::span<DraftRequest> reqs) override {
    ForwardingDrafter::propose(reqs);
    for (const DraftRequest& r : reqs) {
      Proposal p;
      for (const Dist& q : r.q) {
        p.emplace_back(size_t(vocab_), 0.0f);
        for (const auto& [t, w] : q) p.back()[size_t(t)] = w;
      }
      log_->push_back(std::move(p));
    }
  }

 private:
  int32_t vocab_;
  std::vector<Proposal>* log_;
};

// A reused slot's MTP cache is what a cold run builds (MtpDrafter::resume): the MTP draft
// distributions of a second turn (sampled, so the drafter returns them) are those of the same
// prompt run cold, to f32 rounding. Stale MTP entries at the reused boundary would show here.
TEST_F(EngineSpecTest, MtpDraftsOfAReusedSlotEqualAColdRun) {
  auto recording = [](std::vector<Proposal>* log) {
    SchedulerOptions o = options(SpecMethod::Mtp, 3);
    o.spec_drafter = [log](Model& m, ModelState& st) {
      return std::make_unique<RecordingDrafter>(make_drafter(SpecMethod::Mtp, m, st, {}),
                                                int32_t(m.config().vocab_size), log);
    };
    return o;
  };
  std::vector<Proposal> warm_log, cold_log;
  Scheduler warm(*model_, recording(&warm_log));
  RequestParams t1;
  t1.prompt = prompt(37, 2);
  t1.max_tokens = 15;
  const RequestResult a = run_one(warm, t1);
  RequestParams t2 = t1;
  t2.prompt.insert(t2.prompt.end(), a.tokens.begin(), a.tokens.end());
  const std::vector<int32_t> user = prompt(12, 9);
  t2.prompt.insert(t2.prompt.end(), user.begin(), user.end());
  t2.max_tokens = 25;
  t2.sampling.temperature = 1.0f, t2.sampling.top_k = 0, t2.sampling.top_p = 1.0f, t2.sampling.min_p = 0.0f;
  t2.sampling.seed = 77;
  const size_t from = warm_log.size();
  const RequestResult b = run_one(warm, t2);
  ASSERT_GT(b.usage.cached_tokens, 0);
  Scheduler cold(*model_, recording(&cold_log));
  const RequestResult c = run_one(cold, t2);
  EXPECT_EQ(b.tokens, c.tokens);  // the same seeded draws from the same distributions
  ASSERT_EQ(warm_log.size() - from, cold_log.size());
  ASSERT_FALSE(cold_log.empty());
  float worst = 0;
  for (size_t i = 0; i < cold_log.size(); ++i) {
    const Proposal& w = warm_log[from + i];
    ASSERT_EQ(w.size(), cold_log[i].size()) << "proposal " << i;
    for (size_t d = 0; d < w.size(); ++d)
      for (size_t t = 0; t < w[d].size(); ++t) worst = std::max(worst, std::abs(w[d][t] - cold_log[i][d][t]));
  }
  EXPECT_LT(worst, 1e-4f) << "largest difference of a draft probability";
}

TEST_F(EngineSpecTest, LogprobsEqualThePlainPath) {
  RequestParams p;
  p.prompt = prompt(13, 3);
  p.max_tokens = 12;
  p.top_logprobs = 3;
  Scheduler plain(*model_, options(SpecMethod::None));
  const RequestResult want = run_one(plain, p);
  Scheduler s(*model_, options(SpecMethod::Ngram, 4));
  const RequestResult got = run_one(s, p);
  // Logprobs read every row raw: all come to the host (the prompt's last and each round's).
  EXPECT_EQ(s.stats().logit_rows_to_host, 1 + s.stats().spec.rounds + s.stats().spec.drafted + s.stats().spec_undrafted);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_EQ(got.logprobs[i].token, want.logprobs[i].token);
    // Verify rows and decode rows run different kernels paths; f32 rounding only.
    EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4);
    ASSERT_EQ(got.logprobs[i].top.size(), 3u);
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(got.logprobs[i].top[j].first, want.logprobs[i].top[j].first);
  }
}

TEST_F(EngineSpecTest, MtpWithoutAnMtpHeadIsAClearError) {
  Model plain(load_model_weights(std::string(QWEN36_TEST_DATA) + "/golden/dense-gqa"), *backend_);
  try {
    Scheduler s(plain, options(SpecMethod::Mtp));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MTP head"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((Scheduler{plain, options(SpecMethod::Ngram)}));
}

constexpr float kSamplingTemp = 5.0f;  // largest joint cell 0.035 (far from uniform); MTP drafts 65 % accepted

// With temperature, speculation must not change what is sampled: the first three tokens of
// many seeded requests (32 at a time, MTP or n-gram drafts of 2 verified per round) follow the
// target's exact joint distribution, as they do without speculation.
TEST(EngineSpecSampling, TokensFollowTheTargetJointDistribution) {
  auto be = make_cpu_backend(1);
  // A 2-layer (DeltaNet + attention) random model with an MTP head, small enough that many
  // thousands of requests take seconds; 6 tokens: 216 joint cells.
  ModelConfig c = model_preset("tiny-dense", 2);
  c.vocab_size = 6;
  c.intermediate_size = 128;
  c.validate();
  Model model(make_random_weights(c, DType::F32, 21, /*with_mtp=*/true), *be);
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2};  // repeats: n-gram lookup proposes
  const float temp = kSamplingTemp;
  const auto joint = test::exact_joint(model, *be, prompt, temp);
  std::printf("largest joint cell %.4f\n", *std::max_element(joint.begin(), joint.end()));
  const int64_t V = c.vocab_size;
  for (SpecMethod method : {SpecMethod::None, SpecMethod::Mtp, SpecMethod::Ngram}) {
    SchedulerOptions o;
    o.slots = 32;  // the step cost is the weights' read: batch many requests per step
    o.context = 32;
    o.max_queue = 128;
    o.prefix_cache = false;
    o.spec.method = method;
    o.spec.draft_n = 2;
    Scheduler s(model, o);
    const uint64_t N = 2000;
    std::vector<uint64_t> counts(joint.size());
    for (uint64_t done = 0; done < N;) {
      std::vector<std::shared_ptr<Request>> reqs;
      for (uint64_t i = 0; i < 96 && done + i < N; ++i) {
        RequestParams p;
        p.prompt = prompt;
        p.max_tokens = 4;  // t1 from the prefill, then one round verifying 2 drafts (t2, t3)
        p.sampling.temperature = temp, p.sampling.top_k = 0, p.sampling.top_p = 1.0f, p.sampling.min_p = 0.0f;
        p.sampling.seed = 5000 + done + i;
        reqs.push_back(s.submit(p));
      }
      for (int i = 0; i < 1000 && !std::all_of(reqs.begin(), reqs.end(), [](auto& r) { return r->finished(); }); ++i)
        s.step();
      for (auto& r : reqs) {
        const RequestResult res = wait_for_result(*r, 100ms);
        ASSERT_EQ(res.tokens.size(), 4u);
        ++counts[size_t((res.tokens[0] * V + res.tokens[1]) * V + res.tokens[2])];
      }
      done += reqs.size();
    }
    int dof = 0;
    const double chi = test::chi_square(joint, counts, N, &dof);
    const SchedulerStats st = s.stats();
    std::printf("[ %s ] chi-square %.1f (dof %d, 0.1%% critical %.1f); %s\n", spec_method_name(method), chi, dof,
                test::chi_square_critical_001(dof), st.spec.summary().c_str());
    EXPECT_LT(chi, test::chi_square_critical_001(dof)) << spec_method_name(method);
    if (method != SpecMethod::None) {
      EXPECT_GT(st.spec.drafted, N / 2) << "drafts must actually be verified for this test to mean anything";
      EXPECT_GT(st.spec.accepted, 0u);
      EXPECT_LT(st.spec.accepted, st.spec.drafted);
    }
  }
}

// Throughput figures, run by hand: QWEN36_SPEC_BENCH_MODEL=models/qwen36-small-code-q8_0.gguf
// (a GGUF with an MTP head and its tokenizer). Greedy, 128 tokens per request without stop
// ids (the small model loops after its natural end, which inflates acceptance), prompts = the
// first 1,500 bytes of Python stdlib files; 1 and 8 concurrent streams, without and with
// speculation. Prints generated tokens per second of wall time (prefill included).
TEST(EngineSpecBench, ThroughputWithAndWithoutSpeculation) {
  const char* path = std::getenv("QWEN36_SPEC_BENCH_MODEL");
  if (!path || !*path) GTEST_SKIP() << "set QWEN36_SPEC_BENCH_MODEL to a GGUF with an MTP head";
  auto be = make_cpu_backend(0);
  Model model(load_model_weights(path), *be);
  const text::Tokenizer tok = text::Tokenizer::from_file(path);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* f : {"json/encoder.py", "email/utils.py", "json/decoder.py", "email/header.py", "csv.py",
                        "textwrap.py", "shlex.py", "string.py"}) {
    std::ifstream in(std::string("/usr/lib/python3.11/") + f);
    std::string text(1500, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    text.resize(size_t(in.gcount()));
    if (!text.empty()) prompts.push_back(tok.encode(text, false));
  }
  ASSERT_EQ(prompts.size(), 8u) << "the Python 3.11 stdlib files were not found";
  for (int streams : {1, 8}) {
    for (const char* method : {"none", "ngram", "mtp"}) {
      for (int32_t k : {3, 5}) {
        if (std::string(method) == "none" && k == 5) continue;
        SchedulerOptions o;
        o.slots = 8;
        o.context = 1024;
        o.prefill_chunk = 256;
        o.max_batch_tokens = 512;
        o.prefix_cache = false;
        o.spec.method = parse_spec_method(method);
        o.spec.draft_n = k;
        Scheduler s(model, o);
        std::vector<std::shared_ptr<Request>> reqs;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < streams; ++i) {
          RequestParams p;
          p.prompt = prompts[size_t(i)];
          p.max_tokens = 128;
          reqs.push_back(s.submit(p));
        }
        while (!std::all_of(reqs.begin(), reqs.end(), [](auto& r) { return r->finished(); })) s.step();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const SchedulerStats st = s.stats();
        std::printf("[ CPU small model, %d stream(s), %s k=%d ] %llu tokens in %.2f s: %.1f tok/s, %llu steps; %s\n",
                    streams, method, std::string(method) == "none" ? 0 : k,
                    static_cast<unsigned long long>(st.generated_tokens), sec, double(st.generated_tokens) / sec,
                    static_cast<unsigned long long>(st.steps), st.spec.summary().c_str());
      }
    }
  }
}

}  // namespace
}  // namespace qwen36
