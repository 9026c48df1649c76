// Sampling from a backend's candidates: the CPU reference of Backend::sample_candidates
// against a direct computation, and Sampler::sample_from_candidates against Sampler::sample
// on the full row — the same token, step after step from the same seed, over many random rows
// and parameter sets (falling back to the full row where the candidates say they do not
// decide). Then the same through the model: generate() and the scheduler (both sample on the
// backend) against a loop over full logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/presets.h"
#include "model/random_weights.h"

namespace qwen36 {
namespace {

enum class Shape { Peaked, Flat, Ties };

// Tokens 0..19 (the histories' tokens) get a boost, so the penalties reorder the top.
std::vector<float> random_row(std::mt19937& rng, int64_t V, Shape s) {
  std::normal_distribution<float> n(0, 1);
  std::vector<float> l(static_cast<size_t>(V));
  for (size_t i = 0; i < l.size(); ++i) {
    const float z = n(rng);
    l[i] = s == Shape::Peaked ? 4.0f * z             // the top tokens carry most of the mass
           : s == Shape::Flat ? 0.3f * z             // mass spread over thousands of tokens
                              : std::round(2 * z) * 0.5f;  // few distinct values: ties everywhere
    if (i < 20) l[i] += 3.0f;
  }
  return l;
}

// One row's op outputs on the host.
struct RowCandidates {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  float stats[3] = {};
  SampleCandidates view(int64_t V) const {
    SampleCandidates c;
    c.ids = ids, c.logits = vals, c.max = stats[0], c.sum_exp = stats[1], c.next = stats[2], c.vocab = V;
    return c;
  }
};

// cpu::sample_candidates on `row` (penalised in place) for the sampler's parameters.
RowCandidates run_op(const Sampler& s, std::vector<float>& row, std::span<const int32_t> history, int32_t k) {
  const int64_t V = int64_t(row.size());
  std::vector<SampleRowParams> rows;
  std::vector<PenaltyEntry> pens;
  s.add_candidate_row(history, V, rows, pens);
  RowCandidates c;
  c.ids.resize(size_t(k));
  c.vals.resize(size_t(k));
  Tensor t(row.data(), DType::F32, {1, V});
  cpu::sample_candidates(t, rows, pens, k, c.ids.data(), c.vals.data(), c.stats);
  return c;
}

struct Outcome {
  int decided = 0, total = 0;
};

// Steps a full-row sampler and a candidate sampler (same parameters and seed) over `steps`
// random rows; every token must agree. sum_scale multiplies the op's Σexp (a device's f32
// error, within the 1e-5 the op promises).
Outcome compare(const SamplingParams& p, int64_t V, Shape shape, int32_t k, int steps, uint32_t seed,
                float sum_scale = 1.0f) {
  std::mt19937 rng(seed);
  Sampler full(p), cand(p);
  std::vector<int32_t> history;
  for (int i = 0; i < 30; ++i) history.push_back(int32_t(rng() % 20));  // repeats: counts > 1
  Outcome o;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> a = random_row(rng, V, shape), b = a;
    const int32_t want = full.sample(a, history);
    const RowCandidates c = run_op(cand, b, history, k);
    SampleCandidates v = c.view(V);
    v.sum_exp *= sum_scale;
    const std::optional<int32_t> got = cand.sample_from_candidates(v);
    o.decided += got.has_value();
    ++o.total;
    const int32_t tok = got ? *got : cand.sample_penalised(b);
    EXPECT_EQ(tok, want) << "step " << step << " seed " << seed << " T " << p.temperature << " top_k " << p.top_k
                         << " top_p " << p.top_p << " min_p " << p.min_p << " k " << k
                         << (got ? " (from candidates)" : " (fallback)");
    if (tok != want) break;  // the generators have diverged: later steps say nothing new
    history.push_back(want);
  }
  return o;
}

SamplingParams params(float t, int32_t top_k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = t, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = seed;
  return p;
}
SamplingParams penalised(SamplingParams p) {
  p.repetition_penalty = 1.3f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.3f;
  p.penalty_last_n = -1;
  return p;
}

TEST(SampleCandidates, CpuOpMatchesDirectComputation) {
  std::mt19937 rng(5);
  for (int64_t V : {7, 64, 65, 300, 2000})
    for (int32_t k : {1, 8, 64})
      for (Shape shape : {Shape::Peaked, Shape::Ties}) {
        if (k > V) continue;
        const int64_t R = 3;
        std::vector<float> logits, orig;
        for (int64_t r = 0; r < R; ++r) {
          const auto row = random_row(rng, V, shape);
          logits.insert(logits.end(), row.begin(), row.end());
        }
        orig = logits;
        std::vector<SampleRowParams> rows(static_cast<size_t>(R));
        std::vector<PenaltyEntry> pens;
        rows[0].temperature = 0.7f;  // row 0: penalties
        rows[0].repetition_penalty = 1.5f, rows[0].presence_penalty = 0.25f, rows[0].frequency_penalty = -0.5f;
        rows[0].penalty_begin = 0;
        for (int32_t t : {0, 3, 5, int32_t(V) + 2}) pens.push_back({t, t % 3 + 1});  // one outside the vocabulary
        rows[0].penalty_count = int32_t(pens.size());
        rows[1].temperature = 0;     // row 1: greedy (stats of the logits themselves)
        rows[2].temperature = 2.5f;  // row 2: no penalties
        std::vector<int32_t> ids(size_t(R * k));
        std::vector<float> vals(size_t(R * k)), stats(size_t(R * 3));
        Tensor t(logits.data(), DType::F32, {R, V});
        cpu::sample_candidates(t, rows, pens, k, ids.data(), vals.data(), stats.data());
        for (int64_t r = 0; r < R; ++r) {
          std::vector<float> want(orig.begin() + r * V, orig.begin() + (r + 1) * V);
          const SampleRowParams& p = rows[size_t(r)];
          for (const PenaltyEntry& e : std::span(pens).subspan(size_t(p.penalty_begin), size_t(p.penalty_count))) {
            if (e.token >= V) continue;
            float& l = want[size_t(e.token)];
            if (l > 0) l /= p.repetition_penalty; else l *= p.repetition_penalty;
            l -= std::fma(p.frequency_penalty, float(e.count), p.presence_penalty);
          }
          for (int64_t i = 0; i < V; ++i)  // penalised in place, bit for bit
            ASSERT_EQ(logits[size_t(r * V + i)], want[size_t(i)]) << "V " << V << " row " << r << " id " << i;
          std::vector<int32_t> order(static_cast<size_t>(V));
          for (int64_t i = 0; i < V; ++i) order[size_t(i)] = int32_t(i);
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return want[size_t(a)] > want[size_t(b)]; });
          for (int32_t j = 0; j < k; ++j) {
            ASSERT_EQ(ids[size_t(r * k + j)], order[size_t(j)]) << "V " << V << " k " << k << " row " << r << " rank " << j;
            ASSERT_EQ(vals[size_t(r * k + j)], want[size_t(order[size_t(j)])]);
          }
          const float T = p.temperature > 0 ? p.temperature : 1.0f;
          float mx = -std::numeric_limits<float>::infinity();
          for (float l : want) mx = std::max(mx, l / T);
          double sum = 0;
          for (float l : want) sum += std::exp(double(l / T) - double(mx));
          EXPECT_EQ(stats[size_t(r * 3)], mx);
          EXPECT_NEAR(stats[size_t(r * 3 + 1)], sum, 1e-6 * sum);
          EXPECT_EQ(stats[size_t(r * 3 + 2)], k < V ? want[size_t(order[size_t(k)])] : -std::numeric_limits<float>::infinity());
        }
      }
}

TEST(SampleCandidates, GreedyAndTopKAlwaysDecide) {
  for (uint32_t seed : {1u, 2u, 3u})
    for (Shape shape : {Shape::Peaked, Shape::Flat}) {
      const Outcome g = compare(params(0, 40, 0.95f, 0.05f, seed), 2000, shape, 64, 60, seed);
      EXPECT_EQ(g.decided, g.total);
      const Outcome g2 = compare(penalised(params(0, 0, 1, 0, seed)), 2000, shape, 1, 60, seed);
      EXPECT_EQ(g2.decided, g2.total);
      // top_k ≤ the candidates with distinct values: the softmax set is known
      const Outcome d = compare(params(0.8f, 40, 0.95f, 0.05f, seed), 2000, shape, 64, 60, seed);
      EXPECT_EQ(d.decided, d.total);
      const Outcome pk = compare(penalised(params(1.1f, 64, 1, 0, seed)), 2000, shape, 64, 60, seed);
      EXPECT_EQ(pk.decided, pk.total);
    }
}

SamplingParams last(SamplingParams p) {
  p.temperature_last = true;
  return p;
}

TEST(SampleCandidates, SameTokensAsTheFullRow) {
  const std::vector<SamplingParams> sets = {
      params(0, 40, 0.95f, 0.05f, 0),                // greedy
      params(0.8f, 40, 0.95f, 0.05f, 0),             // the defaults
      penalised(params(0.8f, 40, 0.95f, 0.05f, 0)),  // with penalties over a repeated history
      params(0.7f, 0, 0.9f, 0, 0),                   // top-p alone over the whole row
      params(1.0f, 0, 1, 0.1f, 0),                   // min-p alone
      params(0.6f, 0, 0.8f, 0.02f, 0),               // both
      params(1.0f, 0, 1, 0, 0),                      // nothing to cut: always the full row
      params(1.3f, 100, 0.7f, 0, 0),                 // top_k beyond the candidates
      penalised(params(1.0f, 200, 0.95f, 0.05f, 0)),
      params(30.0f, 40, 0.95f, 0, 0),                // a temperature that merges neighbouring values
      params(0.8f, 10, 1, 0, 0),
      last(params(0.8f, 40, 0.95f, 0.05f, 0)),       // llama.cpp's chain: the temperature after the filters
      last(params(1.6f, 0, 0.9f, 0.02f, 0)),
      last(penalised(params(0.5f, 100, 0.95f, 0.05f, 0))),
  };
  int decided = 0, total = 0;
  for (const SamplingParams& base : sets)
    for (Shape shape : {Shape::Peaked, Shape::Flat, Shape::Ties})
      for (uint32_t seed : {11u, 12u})
        for (int32_t k : {64, 8}) {
          SamplingParams p = base;
          p.seed = seed * 7 + 1;
          const Outcome o = compare(p, 1500, shape, k, 40, seed);
          decided += o.decided, total += o.total;
        }
  // Both paths ran (flat rows, tie-heavy rows and k = 8 fall back by design).
  EXPECT_GT(decided, total / 4);
  EXPECT_LT(decided, total);
  std::printf("[ candidates ] %d of %d draws decided by the candidates\n", decided, total);
}

TEST(SampleCandidates, CutsInsideTheCandidatesDecide) {
  // Peaked rows: the kept set ends inside the candidates although the softmax set does not
  // (top_k 0, or beyond the k candidates): the bounds on the row's Σexp decide most draws.
  for (uint32_t seed : {31u, 32u}) {
    const Outcome p = compare(params(0.7f, 0, 0.9f, 0, seed), 1500, Shape::Peaked, 64, 40, seed);
    const Outcome m = compare(params(1.0f, 0, 1, 0.1f, seed), 1500, Shape::Peaked, 64, 40, seed);
    const Outcome k = compare(params(0.8f, 40, 0.9f, 0.05f, seed), 1500, Shape::Peaked, 8, 40, seed);
    std::printf("[ candidates ] decided: top-p %d/%d, min-p %d/%d, top_k 40 > k = 8: %d/%d\n", p.decided, p.total,
                m.decided, m.total, k.decided, k.total);
    EXPECT_GT(p.decided, p.total / 2);
    EXPECT_GT(m.decided, m.total / 2);
    EXPECT_GT(k.decided, k.total / 4);
  }
}

TEST(SampleCandidates, FallbackIsSignalled) {
  // Nothing cuts the row: the candidates never decide (V > k).
  EXPECT_EQ(compare(params(1.0f, 0, 1, 0, 3), 1500, Shape::Peaked, 64, 30, 3).decided, 0);
  // Flat rows: top-p 0.95 of the whole row reaches far past 64 tokens.
  EXPECT_EQ(compare(params(1.0f, 0, 0.95f, 0, 3), 1500, Shape::Flat, 64, 30, 3).decided, 0);
  // Ties at the boundary: top_k 64 = k with few distinct values is never known.
  EXPECT_EQ(compare(params(1.0f, 64, 1, 0, 3), 1500, Shape::Ties, 64, 30, 3).decided, 0);
  // The whole row as candidates: always decided.
  const Outcome w = compare(params(1.0f, 0, 1, 0, 3), 50, Shape::Flat, 50, 30, 3);
  EXPECT_EQ(w.decided, w.total);
  // Typical-p and top-n-sigma read the whole row: never decided from candidates.
  SamplingParams typ = params(1.0f, 40, 1, 0, 3);
  typ.typical_p = 0.9f;
  EXPECT_EQ(compare(typ, 1500, Shape::Peaked, 64, 30, 3).decided, 0);
  SamplingParams sigma = params(1.0f, 40, 1, 0, 3);
  sigma.top_n_sigma = 1.0f;
  EXPECT_EQ(compare(sigma, 1500, Shape::Peaked, 64, 30, 3).decided, 0);
}

TEST(SampleCandidates, DeviceSumErrorDoesNotChangeTokens) {
  for (float scale : {1.0f - 1e-5f, 1.0f + 1e-5f})
    for (uint32_t seed : {21u, 22u}) {
      compare(params(0.7f, 0, 0.9f, 0, seed), 1500, Shape::Peaked, 64, 50, seed, scale);
      compare(params(0.6f, 0, 0.8f, 0.02f, seed), 1500, Shape::Peaked, 64, 50, seed, scale);
      compare(params(1.3f, 100, 0.7f, 0, seed), 1500, Shape::Peaked, 64, 50, seed, scale);
    }
}

// ---- through the model ----

ModelConfig tiny() {
  ModelConfig c = model_preset("tiny-dense", 4);
  c.vocab_size = 512;
  c.validate();
  return c;
}

// The reference: every row's full logits to the host, Sampler::sample.
std::vector<int32_t> full_logits_run(Model& m, Backend& be, const std::vector<int32_t>& prompt,
                                     const SamplingParams& p, int n) {
  ModelState st(be, m.config(), 1, 128, false);
  Sampler s(p);
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.forward(ForwardBatch::single(prompt, 0, 0), st, logits.data());
  std::vector<int32_t> history = prompt, out;
  int32_t pos = int32_t(prompt.size());
  for (int i = 0; i < n; ++i) {
    const int32_t tok = s.sample(logits, history);
    out.push_back(tok);
    history.push_back(tok);
    const int32_t one[1] = {tok};
    m.forward(ForwardBatch::single(one, pos++, 0), st, logits.data());
  }
  return out;
}

TEST(SampleCandidates, GenerateAndSchedulerMatchFullLogits) {
  auto be = make_cpu_backend(1);
  Model m(make_random_weights(tiny(), DType::F32, 3), *be);
  std::vector<SamplingParams> sets = {params(0, 40, 0.95f, 0.05f, 0), params(0.9f, 40, 0.95f, 0.05f, 5),
                                      penalised(params(0.8f, 40, 0.9f, 0.05f, 6)), params(1.0f, 0, 0.9f, 0, 7)};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 9; ++i) prompt.push_back((i * 37 + 5) % 512);
  const int n = 24;
  std::vector<std::vector<int32_t>> want;
  for (const SamplingParams& p : sets) {
    want.push_back(full_logits_run(m, *be, prompt, p, n));
    ModelState st(*be, m.config(), 1, 128, false);
    GenerateOptions g;
    g.max_tokens = n;
    g.sampling = p;
    EXPECT_EQ(generate(m, st, prompt, g).tokens, want.back()) << "T " << p.temperature << " top_k " << p.top_k;
  }
  // All at once in the scheduler; one of them asks for logprobs (the raw-row path).
  SchedulerOptions o;
  o.slots = 4;
  o.context = 128;
  Scheduler s(m, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (size_t i = 0; i < sets.size(); ++i) {
    RequestParams rp;
    rp.prompt = prompt;
    rp.sampling = sets[i];
    rp.max_tokens = n;
    rp.top_logprobs = i == 2 ? 2 : -1;
    reqs.push_back(s.submit(rp));
  }
  for (int i = 0; i < 1000 && !std::all_of(reqs.begin(), reqs.end(), [](auto& r) { return r->finished(); }); ++i)
    s.step();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult r = wait_for_result(*reqs[i], std::chrono::milliseconds(1000));
    EXPECT_EQ(r.tokens, want[i]) << "request " << i;
    if (i == 2) {
      EXPECT_EQ(r.logprobs.size(), r.tokens.size());
    }
  }
}

}  // namespace
}  // namespace qwen36
