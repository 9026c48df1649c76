// CUDA Backend::sample_candidates against the CPU reference (cpu::sample_candidates) on random
// logits with penalties, several temperatures and many ties (duplicate values, −0 / +0).
// Tolerances: the penalised logits, candidate ids and logits, max and next must match exactly
// (they are the same IEEE operations and copies; the order is a total one); Σexp within 1e-5
// relative: the GPU sums ≤ 248320 f32 terms in [0, 1] with expf (≤ 2 ulp) in registers, a
// 512-thread tree and ≤ 63 chunks (~log2(n)·2^-24 ≈ 1e-6), the CPU in double. Then the time of
// one call (kernels + the copy of the candidates) for R = 1, 16, 64 at V = 248320. Also
// argmax_rows (exact against cpu::argmax_rows) and embed_ids over the ids it leaves.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "gpu_test_util.h"

namespace qwen36::gputest {
namespace {

class CudaSample : public CudaTest {};

enum class Values { Normal, Ties, Zeros };

struct Case {
  int64_t R, V;
  int32_t k;
  Values values;
};

struct Inputs {
  std::vector<float> logits;
  std::vector<SampleRowParams> rows;
  std::vector<PenaltyEntry> pens;
};

Inputs make_inputs(std::mt19937& rng, const Case& c) {
  Inputs in;
  std::normal_distribution<float> n(0, 3);
  in.logits.resize(size_t(c.R * c.V));
  for (float& x : in.logits) {
    const float z = n(rng);
    x = c.values == Values::Normal ? z
        : c.values == Values::Ties ? std::round(z * 4) / 4  // steps of 0.25: the top holds runs of equal values
                                   : -std::abs(z) - 1;      // Zeros: negatives, then ±0 planted below
  }
  if (c.values == Values::Zeros)  // ~1/8 of each row ±0: the top-k is all zeros, ordered by id only
    for (int64_t i = 0; i < c.R * c.V; ++i)
      if (rng() % 8 == 0) in.logits[size_t(i)] = rng() % 2 ? 0.0f : -0.0f;
  const float temps[] = {0.0f, 0.7f, 1.5f, 1.0f};
  for (int64_t r = 0; r < c.R; ++r) {
    SampleRowParams p;
    p.temperature = temps[r % 4];
    if (r % 2 == 0) {  // every other row: penalties on 24 distinct tokens (one outside the vocabulary)
      p.repetition_penalty = 1.3f, p.presence_penalty = 0.4f, p.frequency_penalty = 0.15f;
      p.penalty_begin = int32_t(in.pens.size());
      std::vector<int32_t> toks;
      while (toks.size() < 23) {
        const int32_t t = int32_t(rng() % uint32_t(c.V));
        if (std::find(toks.begin(), toks.end(), t) == toks.end()) toks.push_back(t);
      }
      toks.push_back(int32_t(c.V) + 5);
      for (int32_t t : toks) in.pens.push_back({t, int32_t(rng() % 4) + 1});
      p.penalty_count = int32_t(toks.size());
    }
    in.rows.push_back(p);
  }
  return in;
}

void check(Backend& gpu, std::mt19937& rng, const Case& c) {
  const std::string what = "R=" + std::to_string(c.R) + " V=" + std::to_string(c.V) + " k=" + std::to_string(c.k) +
                           " values=" + std::to_string(int(c.values));
  Inputs in = make_inputs(rng, c);
  HostT h(DType::F32, {c.R, c.V});
  std::memcpy(h.f(), in.logits.data(), in.logits.size() * sizeof(float));
  DevT d = upload(gpu, h);

  const size_t nk = size_t(c.R * c.k);
  std::vector<int32_t> want_ids(nk), got_ids(nk);
  std::vector<float> want_vals(nk), got_vals(nk), want_stats(size_t(c.R * 3)), got_stats(size_t(c.R * 3));
  cpu::sample_candidates(h.t, in.rows, in.pens, c.k, want_ids.data(), want_vals.data(), want_stats.data());
  gpu.sample_candidates(d.t, in.rows, in.pens, c.k, got_ids.data(), got_vals.data(), got_stats.data());

  const std::vector<float> got_logits = download(gpu, d.t);
  int64_t bad = 0;
  for (size_t i = 0; i < got_logits.size(); ++i)
    if (std::memcmp(&got_logits[i], h.f() + i, sizeof(float)) != 0 && bad++ < 5)
      ADD_FAILURE() << what << ": penalised logit row " << int64_t(i) / c.V << " id " << int64_t(i) % c.V << ": gpu "
                    << got_logits[i] << " cpu " << h.f()[i];
  for (int64_t r = 0; r < c.R; ++r) {
    for (int32_t j = 0; j < c.k; ++j) {
      const size_t at = size_t(r * c.k + j);
      if (got_ids[at] != want_ids[at] || std::memcmp(&got_vals[at], &want_vals[at], sizeof(float)) != 0) {
        ADD_FAILURE() << what << ": row " << r << " rank " << j << ": gpu id " << got_ids[at] << " (" << got_vals[at]
                      << ") cpu id " << want_ids[at] << " (" << want_vals[at] << ")"
                      << (j > 0 ? " after cpu id " + std::to_string(want_ids[at - 1]) : std::string());
        break;  // one line per row
      }
    }
    const float* g = &got_stats[size_t(r * 3)];
    const float* w = &want_stats[size_t(r * 3)];
    EXPECT_EQ(g[0], w[0]) << what << ": max of row " << r;
    EXPECT_LE(std::abs(double(g[1]) - w[1]), 1e-5 * w[1]) << what << ": sum_exp of row " << r << ": gpu " << g[1]
                                                           << " cpu " << w[1];
    EXPECT_EQ(g[2], w[2]) << what << ": next of row " << r;
  }
}

TEST_F(CudaSample, MatchesCpu) {
  for (int64_t V : {1000, 248320})
    for (int64_t R : {1, 3, 16, 64})
      for (Values v : {Values::Normal, Values::Ties, Values::Zeros})
        for (int32_t k : {1, 64, 256}) {
          if (V > 1000 && R == 64 && k != 64) continue;  // the CPU reference is the slow part
          check(*gpu_, rng_, {R, V, k, v});
        }
  check(*gpu_, rng_, {3, 200, 200, Values::Ties});  // k = V: the whole row, next = −inf
  check(*gpu_, rng_, {2, 257, 256, Values::Zeros});
}

// Backend::argmax_rows against cpu::argmax_rows (exact: a selection, no arithmetic) on the
// sampling test's rows (normal values, runs of equal values, ±0), with NaN and −inf planted,
// rows of NaN only, and vocabularies that leave slices empty or ragged; then embed_ids of the
// chosen ids against embed of the same ids on the host (a table row copy: exact).
TEST_F(CudaSample, ArgmaxRowsMatchesCpu) {
  for (int64_t V : {1, 31, 1000, 248320})
    for (int64_t R : {1, 3, 64})
      for (Values v : {Values::Normal, Values::Ties, Values::Zeros}) {
        const std::string what = "R=" + std::to_string(R) + " V=" + std::to_string(V) + " values=" +
                                 std::to_string(int(v));
        std::normal_distribution<float> n(0, 3);
        HostT h(DType::F32, {R, V});
        for (int64_t i = 0; i < R * V; ++i) {  // as make_inputs, with NaN and −inf planted, row 1 all NaN
          const float z = n(rng_);
          float& x = h.f()[i];
          x = v == Values::Normal ? z : v == Values::Ties ? std::round(z * 4) / 4 : -std::abs(z) - 1;
          if (v == Values::Zeros && rng_() % 8 == 0) x = rng_() % 2 ? 0.0f : -0.0f;
          if (rng_() % 89 == 0) x = -std::numeric_limits<float>::infinity();
          if (rng_() % 97 == 0 || i / V == 1) x = std::nanf("");
        }
        DevT d = upload(*gpu_, h);
        HostT want(DType::I32, {R});
        cpu::argmax_rows(h.t, want.t);
        DevT ids = upload(*gpu_, want);
        gpu_->fill_zero(ids.t);
        gpu_->argmax_rows(d.t, ids.t);
        std::vector<int32_t> got(static_cast<size_t>(R));
        gpu_->copy_to_host(ids.t, got.data());
        const int32_t* w = want.t.as<int32_t>();
        EXPECT_EQ(got, std::vector<int32_t>(w, w + R)) << what;

        if (V != 1000) continue;  // embed_ids: the chosen ids as rows of a [V, 64] table
        HostT table = random_t(rng_, DType::BF16, {V, 64});
        DevT dt = upload(*gpu_, table);
        HostT e(DType::F32, {R, 64});
        DevT de = upload(*gpu_, e);
        gpu_->embed_ids(dt.t, ids.t, de.t);
        cpu::embed(table.t, std::span<const int32_t>(w, size_t(R)), e.t);
        EXPECT_EQ(download(*gpu_, de.t), e.floats()) << what << ": embed_ids";
      }
}

TEST_F(CudaSample, Timing) {
  const int64_t V = 248320;
  for (int64_t R : {1, 16, 64}) {
    Inputs in = make_inputs(rng_, {R, V, kSampleCandidates, Values::Normal});
    for (SampleRowParams& p : in.rows) p.penalty_begin = p.penalty_count = 0;  // no penalty pass
    HostT h(DType::F32, {R, V});
    std::memcpy(h.f(), in.logits.data(), in.logits.size() * sizeof(float));
    DevT d = upload(*gpu_, h);
    std::vector<int32_t> ids(size_t(R * kSampleCandidates));
    std::vector<float> vals(ids.size()), stats(size_t(R * 3));
    gpu_->sample_candidates(d.t, in.rows, {}, kSampleCandidates, ids.data(), vals.data(), stats.data());  // warm-up
    const int reps = 50;
    cuda_synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i)
      gpu_->sample_candidates(d.t, in.rows, {}, kSampleCandidates, ids.data(), vals.data(), stats.data());
    const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps * 1e6;
    std::printf("[ sample ] R=%lld V=%lld k=%d: %.1f us per call (kernels + copy of the candidates; the full "
                "logits would be %.1f MB)\n",
                (long long)R, (long long)V, kSampleCandidates, us, double(R * V * 4) / 1e6);
  }
}

}  // namespace
}  // namespace qwen36::gputest
