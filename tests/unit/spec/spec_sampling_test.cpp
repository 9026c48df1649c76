// Rejection sampling keeps the target distribution:
// - one decision (accept_or_recover) with a draft distribution q deliberately unlike p
//   (including tokens p forbids and tokens q never proposes), and with one-hot q;
// - whole generations: three tokens from spec_generate with MTP drafts (sampled from the
//   random MTP head, which has nothing to do with the target) and with n-gram drafts, on an
//   8-token-vocabulary model, against the exact joint distribution of the target.
// Each is a chi-square test at the 0.1 % level (a correct sampler fails 1 run in 1000; the
// seeds are fixed, so a run is reproducible).
#include <gtest/gtest.h>

#include <random>

#include "engine/spec/rejection.h"
#include "engine/spec/spec_generate.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

TEST(RejectionSampling, OneStepFollowsTheTargetWithASampledDraft) {
  const Dist p = {{0, 0.30f}, {1, 0.05f}, {2, 0.25f}, {3, 0.0f}, {4, 0.15f}, {5, 0.25f}};
  const Dist q = {{0, 0.05f}, {1, 0.40f}, {3, 0.30f}, {4, 0.15f}, {5, 0.10f}};  // never drafts 2
  std::mt19937_64 rng(1);
  const uint64_t N = 200000;
  std::vector<uint64_t> counts(6);
  uint64_t accepted = 0;
  for (uint64_t i = 0; i < N; ++i) {
    const int32_t d = draw(q, rng);
    int32_t out = -1;
    if (accept_or_recover(p, q, d, rng, &out)) {
      out = d;
      ++accepted;
    }
    ++counts[size_t(out)];
  }
  std::vector<double> probs;
  for (const auto& e : p) probs.push_back(e.second);
  int dof = 0;
  const double chi = test::chi_square(probs, counts, N, &dof);
  EXPECT_EQ(counts[3], 0u) << "a token the target forbids was emitted";
  EXPECT_LT(chi, test::chi_square_critical_001(dof)) << "dof " << dof;
  // Acceptance rate is Σ min(p, q) = 0.05 + 0.05 + 0 + 0 + 0.15 + 0.10 = 0.35.
  EXPECT_NEAR(double(accepted) / double(N), 0.35, 0.005);
}

TEST(RejectionSampling, OneStepFollowsTheTargetWithAOneHotDraft) {
  const Dist p = {{0, 0.5f}, {1, 0.3f}, {2, 0.2f}};
  std::mt19937_64 rng(2);
  const uint64_t N = 100000;
  std::vector<uint64_t> counts(3);
  for (uint64_t i = 0; i < N; ++i) {
    int32_t out = -1;
    if (accept_or_recover(p, {}, /*draft=*/1, rng, &out)) out = 1;
    ++counts[size_t(out)];
  }
  int dof = 0;
  const double chi = test::chi_square({0.5, 0.3, 0.2}, counts, N, &dof);
  EXPECT_LT(chi, test::chi_square_critical_001(dof));
}

TEST(RejectionSampling, GenerationsFollowTheTargetJointDistribution) {
  auto be = make_cpu_backend(1);
  auto model = test::random_model(*be, 8, 21, /*moe=*/false, /*intermediate=*/128);
  const int64_t V = 8;
  // A repetitive prompt so that n-gram lookup has something to propose.
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  // The random model's logits span ~150; a high temperature spreads the joint over many cells.
  const float temp = 80.0f;
  const auto joint = test::exact_joint(*model, *be, prompt, temp);
  for (SpecMethod method : {SpecMethod::Mtp, SpecMethod::Ngram}) {
    ModelState st(*be, model->config(), 1, 32, true);
    SpecOptions spec;
    spec.method = method;
    spec.draft_n = 2;
    GenerateOptions g;
    g.max_tokens = 4;  // the first round then verifies 2 drafts (t2, t3); t4 is not counted
    g.sampling.temperature = temp, g.sampling.top_k = 0, g.sampling.top_p = 1.0f, g.sampling.min_p = 0.0f;
    const uint64_t N = 4000;
    std::vector<uint64_t> counts(joint.size());
    SpecMetrics metrics;
    for (uint64_t i = 0; i < N; ++i) {
      g.sampling.seed = 1000 + i;
      const SpecResult r = spec_generate(*model, st, prompt, g, spec);
      ASSERT_EQ(r.gen.tokens.size(), 4u);
      ++counts[size_t((r.gen.tokens[0] * V + r.gen.tokens[1]) * V + r.gen.tokens[2])];
      metrics.merge(r.metrics);
    }
    int dof = 0;
    const double chi = test::chi_square(joint, counts, N, &dof);
    std::printf("[ %s ] chi-square %.1f (dof %d, 0.1%% critical %.1f); %s\n", spec_method_name(method), chi, dof,
                test::chi_square_critical_001(dof), metrics.summary().c_str());
    EXPECT_GT(metrics.drafted, N / 2) << "drafts must actually be verified for this test to mean anything";
    EXPECT_GT(metrics.accepted, 0u);
    EXPECT_LT(metrics.accepted, metrics.drafted);
    EXPECT_LT(chi, test::chi_square_critical_001(dof)) << spec_method_name(method);
  }
}

}  // namespace
}  // namespace qwen36
