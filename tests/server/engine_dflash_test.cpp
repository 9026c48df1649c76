// DFlash block drafting inside the continuous-batching scheduler (no HTTP), on the committed
// fixture drafter tests/data/dflash/dense-mtp-b16 and its target tests/data/golden/dense-mtp:
// - lossless: greedy output with `spec.method = dflash` (the scheduler loads the drafter from
//   spec.draft_model, as `serve --spec dflash --draft-model DIR` does) equals plain generate()
//   alone and with 4 concurrent sequences, prompts inside and past the 12-token sliding
//   window, some sequences prefilling while others verify;
// - the same through a wrapper that keeps the real drafter's capture / observe / propose path
//   but replaces its drafts with the known continuation, corrupted every other round (the
//   random fixture drafter is almost never right, so this is what commits long accepted
//   runs): the drafter's context stays exactly at the pending token every round;
// - a prefix-cache hit in the same slot keeps the drafter's context (DFlashDrafter::resume):
//   the second turn drafts from its first round and equals a cold run;
// - DDTree rounds (a tree of drafts per sequence and step) equal plain generation too.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "engine_test_util.h"
#include "engine/spec/dflash_drafter.h"
#include "format/model_loader.h"

namespace qwen36 {
namespace {

using namespace std::chrono_literals;

const std::string kTarget = std::string(QWEN36_TEST_DATA) + "/golden/dense-mtp";
const std::string kDrafter = std::string(QWEN36_TEST_DATA) + "/dflash/dense-mtp-b16";

// The real drafter, its drafts replaced by the known greedy continuation of the longest
// matching prompt, one draft wrong every other round; counts rounds whose context lagged.
class OracleOverDFlash final : public test::ForwardingDrafter<DFlashDrafter> {
 public:
  OracleOverDFlash(std::unique_ptr<DFlashDrafter> d, std::map<std::vector<int32_t>, std::vector<int32_t>> refs)
      : ForwardingDrafter(std::move(d)), refs_(std::move(refs)) {}
  const char* name() const override { return "dflash+oracle"; }
  void propose(std::span<DraftRequest> reqs) override {
    ForwardingDrafter::propose(reqs);
    for (DraftRequest& r : reqs) {
      if (inner().context_len(r.slot) != int32_t(r.history.size()) - 1) ++lagged;
      if (r.tokens.empty()) continue;
      ++blocks;
      const auto known = test::known_continuation(refs_, r.history, r.tokens.size());
      if (!known) continue;
      std::copy(known->begin(), known->end(), r.tokens.begin());
      if (++round_ % 2 == 0) {
        const size_t at = round_ / 2 % r.tokens.size();
        r.tokens[at] = (r.tokens[at] + 1) % 128;
      }
    }
  }
  int lagged = 0, blocks = 0;

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> refs_;
  size_t round_ = 0;
};

class EngineDFlashTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(1).release();
    model_ = new Model(load_model_weights(kTarget), *backend_);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete backend_;
  }
  static std::vector<int32_t> prompt(int n, int seed) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((seed * 37 + i * 11 + i * i) % 127);
    return p;
  }
  static std::vector<int32_t> alone(const RequestParams& p) { return test::generate_alone(*model_, *backend_, p, 16); }
  static SchedulerOptions options() {
    SchedulerOptions o;
    o.slots = 4;
    o.context = 256;
    o.prefill_chunk = 16;
    o.max_batch_tokens = 96;
    o.max_queue = 32;
    o.spec.method = SpecMethod::Dflash;
    o.spec.draft_model = kDrafter;
    o.spec.draft_n = 15;  // the fixture's block of 16
    o.snapshots.interval = 8;  // asked for, and turned off by the scheduler for dflash
    o.snapshots.device_bytes = size_t(64) << 20;
    return o;
  }
  static std::vector<RequestResult> run_all(Scheduler& s, const std::vector<RequestParams>& ps) {
    std::vector<std::shared_ptr<Request>> reqs;
    for (const RequestParams& p : ps) reqs.push_back(s.submit(p));
    test::run_until_done(s, reqs);
    std::vector<RequestResult> out;
    for (auto& r : reqs) out.push_back(wait_for_result(*r, 1000ms));
    return out;
  }
  static std::vector<RequestParams> requests(int n) {
    std::vector<RequestParams> ps;
    for (int i = 0; i < n; ++i) {
      RequestParams p;
      p.prompt = prompt(4 + 13 * i, i);  // 4, 17, 30, 43 tokens: inside and past the window
      p.max_tokens = 24 + 3 * i;
      ps.push_back(p);
    }
    return ps;
  }

  static Backend* backend_;
  static Model* model_;
};
Backend* EngineDFlashTest::backend_ = nullptr;
Model* EngineDFlashTest::model_ = nullptr;

TEST_F(EngineDFlashTest, GreedyEqualsPlainOneAndFourConcurrent) {
  for (int n : {1, 4}) {
    Scheduler s(*model_, options());
    const auto ps = requests(n);
    const auto rs = run_all(s, ps);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(rs[size_t(i)].tokens, alone(ps[size_t(i)])) << n << " concurrent, request " << i;
      EXPECT_EQ(rs[size_t(i)].finish_reason, "length");
    }
    const SchedulerStats st = s.stats();
    EXPECT_GT(st.spec.drafted, 0u);
    EXPECT_LE(st.spec.drafted_at.size(), 15u);
    EXPECT_EQ(st.snapshots.saved, 0u);  // checkpoints are off with dflash
    EXPECT_EQ(st.logit_rows_to_host, 0u);  // greedy rows sampled on the backend
    std::printf("[ dflash, %d concurrent ] %s\n", n, st.spec.summary().c_str());
  }
}

TEST_F(EngineDFlashTest, LongAcceptedRunsKeepTheDrafterInStep) {
  for (int n : {1, 4}) {
    const auto ps = requests(n);
    std::map<std::vector<int32_t>, std::vector<int32_t>> refs;
    for (const RequestParams& p : ps) refs[p.prompt] = alone(p);
    SchedulerOptions o = options();
    OracleOverDFlash* seen = nullptr;
    o.spec_drafter = [&](Model& m, ModelState& st) {
      auto d = std::make_unique<OracleOverDFlash>(
          load_dflash_drafter(kDrafter, m, m.backend(), st.slots(), st.capacity()), refs);
      seen = d.get();
      return d;
    };
    Scheduler s(*model_, o);
    const auto rs = run_all(s, ps);
    for (int i = 0; i < n; ++i) EXPECT_EQ(rs[size_t(i)].tokens, refs[ps[size_t(i)].prompt]) << n << " concurrent, " << i;
    ASSERT_NE(seen, nullptr);
    EXPECT_EQ(seen->lagged, 0);
    EXPECT_GT(seen->blocks, 0);
    const SchedulerStats st = s.stats();
    EXPECT_GT(st.spec.mean_accepted_length(), 3.0) << st.spec.summary();
    std::printf("[ dflash+oracle, %d concurrent ] %s\n", n, st.spec.summary().c_str());
  }
}

TEST_F(EngineDFlashTest, PrefixReuseKeepsTheDrafterContext) {
  SchedulerOptions o = options();
  o.slots = 1;
  OracleOverDFlash* seen = nullptr;
  o.spec_drafter = [&](Model& m, ModelState& st) {
    auto d = std::make_unique<OracleOverDFlash>(load_dflash_drafter(kDrafter, m, m.backend(), st.slots(), st.capacity()),
                                                std::map<std::vector<int32_t>, std::vector<int32_t>>{});
    seen = d.get();
    return d;
  };
  Scheduler s(*model_, o);
  RequestParams first;
  first.prompt = prompt(20, 3);
  first.max_tokens = 10;
  const RequestResult r1 = run_all(s, {first}).front();
  EXPECT_EQ(r1.tokens, alone(first));
  RequestParams second = first;  // the first turn's history and a few more tokens
  second.prompt.insert(second.prompt.end(), r1.tokens.begin(), r1.tokens.end());
  for (int i = 0; i < 5; ++i) second.prompt.push_back((7 * i + 5) % 127);
  second.max_tokens = 20;
  const int blocks_before = seen->blocks;
  const RequestResult r2 = run_all(s, {second}).front();
  EXPECT_EQ(r2.tokens, alone(second));
  EXPECT_GT(r2.usage.cached_tokens, 0);
  EXPECT_EQ(seen->lagged, 0);                  // drafted from the first round of the second turn
  EXPECT_GT(seen->blocks, blocks_before);
}

// DDTree rounds in the scheduler (spec.tree_budget, `serve --tree-budget`): each decoding
// sequence's tree is one verify run with parents, next to other sequences' prefill chunks and
// decode rows; greedy output equals plain generate() alone and with 4 concurrent sequences
// (budgets 5 and 22), some tree nodes are accepted (their paths committed: K/V rows moved,
// DeltaNet inputs replayed), and with top_logprobs a tree round's tokens report the logprobs of
// their nodes' rows, equal to the plain path's.
TEST_F(EngineDFlashTest, TreeRoundsEqualPlainGeneration) {
  uint64_t accepted = 0;
  for (int32_t budget : {5, 22})
    for (int n : {1, 4}) {
      SchedulerOptions o = options();
      o.spec.tree_budget = budget;
      Scheduler s(*model_, o);
      const auto ps = requests(n);
      const auto rs = run_all(s, ps);
      for (int i = 0; i < n; ++i)
        EXPECT_EQ(rs[size_t(i)].tokens, alone(ps[size_t(i)])) << "budget " << budget << ", " << n << " concurrent, " << i;
      const SchedulerStats st = s.stats();
      EXPECT_GT(st.spec.drafted, 0u);
      EXPECT_EQ(st.logit_rows_to_host, 0u);  // greedy tree rounds sampled on the backend
      accepted += st.spec.accepted;
      std::printf("[ dflash tree budget %d, %d concurrent ] %s\n", budget, n, st.spec.summary().c_str());
    }
  EXPECT_GT(accepted, 0u) << "no tree node was accepted: the path commit went untested";
  RequestParams p = requests(2)[1];
  p.top_logprobs = 3;
  SchedulerOptions plain_opts = options();
  plain_opts.spec = no_speculation();
  Scheduler plain(*model_, plain_opts);
  const RequestResult want = run_all(plain, {p}).front();
  SchedulerOptions o = options();
  o.spec.tree_budget = 22;
  Scheduler s(*model_, o);
  const RequestResult got = run_all(s, {p}).front();
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_EQ(got.logprobs[i].token, want.logprobs[i].token);
    EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4) << "token " << i;
    ASSERT_EQ(got.logprobs[i].top.size(), 3u);
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(got.logprobs[i].top[j].first, want.logprobs[i].top[j].first);
  }
}

}  // namespace
}  // namespace qwen36
