// The GDN rollback design: verify runs only READ the DeltaNet state (read-only ops), and the
// commit replays the accepted prefix. Checked here:
// - the read-only conv and delta-rule ops give the plain ops' outputs bit for bit and leave
//   the state untouched;
// - at model level, a verify run of n tokens followed by commit(keep) leaves every DeltaNet
//   conv and recurrent state where `keep` plain decode steps leave it, for keep = 0..n, and
//   the verify logits equal the decode logits;
// - verify_greedy (argmax ids, e.g. from the device) gives verify_round's greedy verdict;
// - n-gram lookup.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "../backend/cpu_ops_test_util.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/spec/spec_step.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

using test::Rng;

std::vector<float> random_vec(Rng& r, size_t n, float lo = -1, float hi = 1) { return r.vec(n, lo, hi); }

TEST(ReadonlyOps, ConvMatchesPlainOpAndLeavesStateAlone) {
  auto be = make_cpu_backend(1);
  Rng r(11);
  const int64_t T = 9, C = 12, K = 4, slots = 3;
  std::vector<float> x = random_vec(r, size_t(T * C)), w = random_vec(r, size_t(C * K));
  std::vector<float> st = random_vec(r, size_t(slots * C * (K - 1)));
  const std::vector<SeqRun> runs = {{2, 7, 0, 5}, {0, 3, 5, 4}};
  std::vector<float> x_plain = x, st_plain = st, x_ro = x, st_ro = st;
  Tensor xp = test::f32(x_plain, {T, C}), wt = test::f32(w, {C, K}), sp = test::f32(st_plain, {slots, C, K - 1});
  Tensor xr = test::f32(x_ro, {T, C}), sr = test::f32(st_ro, {slots, C, K - 1});
  be->causal_conv1d_silu(xp, wt, sp, runs);
  be->causal_conv1d_silu_readonly(xr, wt, sr, runs);
  EXPECT_EQ(0, std::memcmp(x_plain.data(), x_ro.data(), x.size() * sizeof(float)));
  EXPECT_EQ(st_ro, st);          // read only
  EXPECT_NE(st_plain, st);       // (the plain op does advance it)
}

TEST(ReadonlyOps, DeltaRuleMatchesRecurrentOpAndLeavesStateAlone) {
  auto be = make_cpu_backend(1);
  Rng r(12);
  const int64_t T = 7, Hk = 2, Hv = 4, dk = 16, dv = 8, slots = 3;
  std::vector<float> q = random_vec(r, size_t(T * Hk * dk)), k = random_vec(r, size_t(T * Hk * dk));
  std::vector<float> v = random_vec(r, size_t(T * Hv * dv)), g = random_vec(r, size_t(T * Hv), -1.0f, 0.0f);
  std::vector<float> beta = random_vec(r, size_t(T * Hv), 0.0f, 1.0f);
  std::vector<float> st = random_vec(r, size_t(slots * Hv * dk * dv), -0.5f, 0.5f);
  const std::vector<SeqRun> runs = {{1, 0, 0, 3}, {2, 0, 3, 4}};
  std::vector<float> st_plain = st, st_ro = st, o_plain(size_t(T * Hv * dv)), o_ro(o_plain.size());
  Tensor tq = test::f32(q, {T, Hk, dk}), tk = test::f32(k, {T, Hk, dk}), tv = test::f32(v, {T, Hv, dv});
  Tensor tg = test::f32(g, {T, Hv}), tb = test::f32(beta, {T, Hv});
  Tensor sp = test::f32(st_plain, {slots, Hv, dk, dv}), sr = test::f32(st_ro, {slots, Hv, dk, dv});
  Tensor op = test::f32(o_plain, {T, Hv, dv}), orr = test::f32(o_ro, {T, Hv, dv});
  be->gated_delta_rule(tq, tk, tv, tg, tb, sp, runs, op, DeltaRuleMode::Recurrent);
  be->gated_delta_rule_readonly(tq, tk, tv, tg, tb, sr, runs, orr);
  EXPECT_EQ(0, std::memcmp(o_plain.data(), o_ro.data(), o_plain.size() * sizeof(float)));
  EXPECT_EQ(st_ro, st);
  EXPECT_NE(st_plain, st);
}

// All DeltaNet conv + recurrent state of one slot, flattened.
std::vector<float> deltanet_state(const Model& m, ModelState& s, int32_t slot) {
  std::vector<float> out;
  for (int64_t i = 0; i < m.config().n_layers; ++i) {
    if (m.config().layer_kinds[size_t(i)] == LayerKind::FullAttention) continue;
    for (Tensor* t : {&s.conv_state(i), &s.recurrent_state(i)}) {
      const int64_t per = t->numel() / t->dim(0);
      const float* p = t->as<const float>() + slot * per;
      out.insert(out.end(), p, p + per);
    }
  }
  return out;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float w = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) w = std::max(w, std::abs(a[i] - b[i]));
  return w;
}

// Slot 0 decodes 5 tokens one at a time; slots 1..6 verify the same 5 tokens in one batch and
// commit keep = 0..5. Each commit must land on the reference state after `keep` steps.
TEST(VerifyCommit, CommitEqualsDecodingTheAcceptedPrefix) {
  for (bool moe : {false, true}) {
    auto be = make_cpu_backend(1);
    auto model = test::random_model(*be, 256, moe ? 5 : 4, moe);
    const int64_t V = model->config().vocab_size;
    const int32_t n = 5, S = n + 2;
    ModelState st(*be, model->config(), S, 64, false);
    st.enable_speculation(n);
    const std::vector<int32_t> prompt = {3, 17, 99, 4, 250, 17, 8};
    const std::vector<int32_t> toks = {42, 7, 7, 200, 1};
    for (int32_t s = 0; s < S; ++s) model->forward(ForwardBatch::single(prompt, 0, s), st, nullptr);
    const int32_t P = int32_t(prompt.size());

    ForwardBatch verify;
    for (int32_t s = 1; s < S; ++s) {
      verify.verify_runs.push_back(int32_t(verify.runs.size()));
      verify.runs.push_back({s, P, int32_t(verify.tokens.size()), n});
      verify.tokens.insert(verify.tokens.end(), toks.begin(), toks.end());
    }
    for (int32_t i = 0; i < int32_t(verify.tokens.size()); ++i) verify.output_rows.push_back(i);
    std::vector<float> vlogits(verify.tokens.size() * size_t(V));
    const std::vector<float> before = deltanet_state(*model, st, 1);
    model->forward(verify, st, vlogits.data());
    EXPECT_EQ(deltanet_state(*model, st, 1), before) << "verify must not advance the DeltaNet state";
    std::vector<SpecCommit> commits;
    for (int32_t s = 1; s < S; ++s) commits.push_back({s, s - 1});
    model->commit_speculative(st, commits);
    EXPECT_EQ(deltanet_state(*model, st, 1), before) << "keep = 0 leaves the state alone";

    std::vector<float> dlogits(static_cast<size_t>(V));
    for (int32_t t = 0; t < n; ++t) {
      model->forward(ForwardBatch::single(std::span(&toks[size_t(t)], 1), P + t, 0), st, dlogits.data());
      for (int32_t s = 1; s < S; ++s) {  // every verify run saw the same tokens
        const std::vector<float> row(vlogits.begin() + (size_t(s - 1) * n + size_t(t)) * size_t(V),
                                     vlogits.begin() + (size_t(s - 1) * n + size_t(t) + 1) * size_t(V));
        EXPECT_LE(max_diff(row, dlogits), 1e-4f) << "verify logits, slot " << s << " token " << t;
      }
      // Matmul rounding differs between a 1-token and a 5-token batch (4-row x 3-token tiles),
      // so the replayed inputs can differ from decode's in the last bits.
      EXPECT_LE(max_diff(deltanet_state(*model, st, t + 2), deltanet_state(*model, st, 0)), 1e-5f)
          << (moe ? "moe" : "dense") << ": commit of " << t + 1 << " tokens";
    }
  }
}

TEST(VerifyCommit, RejectsVerifyRunsWithoutSpeculationBuffers) {
  auto be = make_cpu_backend(1);
  auto model = test::random_model(*be, 64, 1);
  ModelState st(*be, model->config(), 1, 32, false);
  ForwardBatch b = ForwardBatch::single(std::vector<int32_t>{1, 2, 3}, 0, 0);
  b.verify_runs = {0};
  EXPECT_THROW(model->forward(b, st, nullptr), Error);
  st.enable_speculation(2);
  EXPECT_THROW(model->forward(b, st, nullptr), Error);  // 3 tokens > 2
  st.enable_speculation(3);
  std::vector<float> logits(64);
  EXPECT_NO_THROW(model->forward(b, st, logits.data()));
}

// Every number of leading matching drafts (0..m), with and without an accept override (the
// benchmarks' simulated decisions): the same accepted count and next token from the rows'
// argmax ids as from the rows themselves.
TEST(VerifyGreedy, SameVerdictAsVerifyRoundOnTheRows) {
  const int64_t V = 37;
  const int32_t m = 4;
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> rows(size_t((m + 1) * V));
    for (float& x : rows) x = u(gen);
    std::vector<int32_t> argmax(size_t(m + 1));
    for (int32_t i = 0; i <= m; ++i) {
      const float* r = rows.data() + size_t(i) * size_t(V);
      argmax[size_t(i)] = int32_t(std::max_element(r, r + V) - r);
    }
    for (int32_t match = 0; match <= m; ++match) {
      DraftRequest d;
      for (int32_t i = 0; i < m; ++i)
        d.tokens.push_back(i < match ? argmax[size_t(i)] : (argmax[size_t(i)] + 1 + trial) % int32_t(V));
      const std::vector<int32_t> history = {1, 2, 3};
      for (const bool override_accept : {false, true}) {
        std::function<bool(int32_t)> accept;
        if (override_accept) accept = [&](int32_t i) { return i < m - match; };
        std::vector<float> copy = rows;
        Sampler sampler(SamplingParams::greedy());
        std::mt19937_64 rng(1);
        const SpecVerdict want = verify_round(copy, V, d, sampler, rng, history, true, accept);
        const SpecVerdict got = verify_greedy(argmax, d.tokens, accept);
        EXPECT_EQ(got.accepted, want.accepted) << "trial " << trial << " match " << match << " override " << override_accept;
        EXPECT_EQ(got.next, want.next) << "trial " << trial << " match " << match << " override " << override_accept;
      }
    }
  }
}

TEST(Ngram, ProposesTheContinuationOfTheLatestLongestMatch) {
  const NgramOptions o{1, 3};
  // suffix [2 3] matched at 1..2 and 5..6; the latest (5..6) is followed by 9
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{1, 2, 3, 4, 8, 2, 3, 9, 5, 2, 3}, 3, o), (std::vector<int32_t>{9, 5, 2}));
  // the longest match wins: [7 2 3] occurs once, followed by 4, though [3] alone recurs later
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{7, 2, 3, 4, 3, 6, 7, 2, 3}, 2, o), (std::vector<int32_t>{4, 3}));
  // past the end of the history the continuation reads its own drafts: a repeating pattern
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{5, 6, 5}, 4, o), (std::vector<int32_t>{6, 5, 6, 5}));
  EXPECT_EQ(ngram_lookup(std::vector<int32_t>{9, 3, 3, 3}, 3, o), (std::vector<int32_t>{3, 3, 3}));
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1, 2, 3, 4}, 3, o).empty());
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1, 2, 1}, 0, o).empty());
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1, 2, 1}, 2, NgramOptions{2, 3}).empty());
}

}  // namespace
}  // namespace qwen36
