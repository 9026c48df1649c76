// Greedy MTP drafting chained on the backend (Model::mtp_draft_greedy, MtpDrafter's rounds of
// greedy chains) gives mtp_forward's drafts and MTP caches exactly, on the CPU backend: the
// golden fixtures with real MTP weights and random tiny models (tests/common/mtp_draft_check.h;
// tests/gpu/test_cuda_spec.cpp runs the same on CUDA). And cpu::argmax_rows, the reference of
// Backend::argmax_rows, on rows whose answer is known: ties, NaN, −inf.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "format/model_loader.h"
#include "common/mtp_draft_check.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

TEST(MtpDraft, DeviceChainEqualsMtpForwardOnFixtures) {
  auto backend = make_cpu_backend(1);
  for (const char* f : {"dense-mtp", "moe-mtp"}) {
    Model model(load_model_weights((fs::path(QWEN36_TEST_DATA) / "golden" / f).string()), *backend);
    test::expect_device_chain_drafts_equal(model, *backend, f);
  }
}

TEST(MtpDraft, DeviceChainEqualsMtpForwardOnRandomModels) {
  auto backend = make_cpu_backend(1);
  for (bool moe : {false, true}) {
    auto model = test::random_model(*backend, 512, 41, moe);
    test::expect_device_chain_drafts_equal(*model, *backend, moe ? "random-moe" : "random-dense");
  }
}

TEST(MtpDraft, GreedyChainsOfDifferentLengthsOnTheBackend) {
  // The backend runs the longest chain's steps for every chain; each keeps its first k drafts,
  // which are the per-step path's (its rows run beside the same chains at every step it drafts).
  auto backend = make_cpu_backend(1);
  auto model = test::random_model(*backend, 512, 47);
  test::expect_device_chain_drafts_equal(*model, *backend, "random-dense k 2/5/1", {2, 5, 1});
  Model fixture(load_model_weights((fs::path(QWEN36_TEST_DATA) / "golden" / "moe-mtp").string()), *backend);
  test::expect_device_chain_drafts_equal(fixture, *backend, "moe-mtp k 4/1/2", {4, 1, 2});
}

TEST(MtpDraft, MixedRoundsFallBackToMtpForward) {
  // A sampled chain takes the round through the per-step path: still k drafts each.
  auto backend = make_cpu_backend(1);
  auto model = test::random_model(*backend, 512, 43);
  ModelState st(*backend, model->config(), 2, 64, true);
  MtpDrafter drafter(*model, st);
  const int64_t H = model->config().hidden_size;
  const std::vector<float> hidden(size_t(2 * H), 0.5f);
  const std::vector<int32_t> next = {3, 4};
  for (int32_t s = 0; s < 2; ++s) drafter.observe(s, 0, hidden, next);
  SamplingParams greedy = SamplingParams::greedy(), sampled;
  std::vector<DraftRequest> reqs(2);
  reqs[0].slot = 0, reqs[0].k = 2, reqs[0].sampling = &greedy;
  reqs[1].slot = 1, reqs[1].k = 4, reqs[1].sampling = &sampled;
  drafter.propose(reqs);
  EXPECT_EQ(reqs[0].tokens.size(), 2u);
  EXPECT_EQ(reqs[1].tokens.size(), 4u);
  EXPECT_EQ(reqs[1].q.size(), 4u);  // sampled drafts carry their distributions
  EXPECT_EQ(drafter.device_rounds(), 0);
}

TEST(ArgmaxRows, Reference) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  std::vector<float> l = {1, 3, 3, 2,           // tie: the lower id
                          nan, -1, nan, -1,      // NaN never wins
                          -inf, -inf, -inf, -inf,  // all −inf: the first
                          nan, nan, nan, nan,    // nothing but NaN: 0
                          -0.0f, 0.0f, -2, -3};  // −0 == +0: the lower id
  Tensor logits(l.data(), DType::F32, {5, 4});
  std::vector<int32_t> ids(5, -7);
  Tensor out(ids.data(), DType::I32, {5});
  cpu::argmax_rows(logits, out);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 1, 0, 0, 0}));
}

}  // namespace
}  // namespace qwen36
