// Speculative decoding on the GPU (issues 8, 9): greedy output with MTP and n-gram drafts, and
// with DFlash tree drafting, equals plain greedy decoding on the same backend, token for token,
// on the golden fixtures that carry real MTP weights. The verify pass runs the DeltaNet read-only ops and the commit
// replays the accepted tokens through the recurrent ones; every row's GEMV and attention sums
// are in the same order as a one-token step's, so the logits agree and so must the argmax.
// Greedy MTP drafting chained on the device drafts what the per-step path drafts.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cuda/cuda_backend.h"
#include "common/greedy_chain_check.h"
#include "common/mtp_draft_check.h"
#include "engine/generate.h"
#include "engine/spec/spec_generate.h"
#include "format/model_loader.h"
#include "model/qwen36.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

class CudaSpec : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no CUDA device, CUDA tests skipped: " << why;
    backend_ = make_cuda_backend();
    model_ = std::make_unique<Model>(load_model_weights((fs::path(QWEN36_TEST_DATA) / "golden" / GetParam()).string()),
                                     *backend_);
    ASSERT_TRUE(model_->has_mtp());
  }
  // Prompt i of the lossless tests, and plain greedy decoding's tokens after it.
  std::vector<int32_t> prompt(int i) const {
    std::vector<int32_t> p;
    for (int j = 0; j < 5 + 7 * i; ++j) p.push_back(int32_t((j * 37 + i * 11) % model_->config().vocab_size));
    return p;
  }
  std::vector<int32_t> plain(const std::vector<int32_t>& p, const GenerateOptions& g) {
    ModelState st(*backend_, model_->config(), 1, 128, false);
    return generate(*model_, st, p, g).tokens;
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_P(CudaSpec, GreedyWithDraftsEqualsPlainGreedy) {
  GenerateOptions g;
  g.max_tokens = 48;
  g.sampling = SamplingParams::greedy();
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> p = prompt(i), want = plain(p, g);
    for (SpecMethod method : {SpecMethod::Mtp, SpecMethod::Ngram})
      for (int32_t k : {1, 3, 5}) {
        ModelState st(*backend_, model_->config(), 1, 128, true);
        SpecOptions spec;
        spec.method = method;
        spec.draft_n = k;
        const SpecResult r = spec_generate(*model_, st, p, g, spec);
        EXPECT_EQ(r.gen.tokens, want) << GetParam() << " " << spec_method_name(method) << " k=" << k << " prompt " << i;
        if (i == 0)
          std::printf("[ spec ] %s %s k=%d on cuda: %s\n", GetParam().c_str(), spec_method_name(method), k,
                      r.metrics.summary().c_str());
      }
  }
}

// Greedy MTP rounds chained on the device (Model::mtp_draft_greedy: embed_ids, argmax_rows, each
// step recorded and replayed) draft exactly what mtp_forward and the host's argmax draft, and
// leave the same MTP caches (tests/common/mtp_draft_check.h); chains of different lengths too.
TEST_P(CudaSpec, DeviceChainDraftsEqualMtpForward) {
  test::expect_device_chain_drafts_equal(*model_, *backend_, GetParam());
  test::expect_device_chain_drafts_equal(*model_, *backend_, GetParam() + " k 2/5/1", {2, 5, 1});
}

// DDTree rounds (DFlash drafts, tree verify through CUDA's ancestor-mask attention and the
// composed DeltaNet tree ops, the path commit moving bf16 K/V rows): greedy output equals plain
// greedy decoding, as on the CPU. The DFlash fixture drafts for dense-mtp only.
// Greedy decoding chained on the device (Model::decode_greedy: the step's recording embeds the
// tokens the last step's argmax left, the host reads them one step behind) against the
// step-by-step loop's tokens and states (tests/common/greedy_chain_check.h).
TEST_P(CudaSpec, GreedyChainEqualsStepwise) { test::expect_greedy_chain_equals_stepwise(*model_, *backend_, GetParam()); }

// DFlash chains (budget 0: 16-token verify passes, the flash attention kernel's runs, recorded
// from the third round) and trees equal plain greedy decoding token for token.
TEST_P(CudaSpec, DflashChainAndTreeEqualPlainGreedy) {
  if (GetParam() != "dense-mtp") GTEST_SKIP() << "the DFlash fixture drafts for dense-mtp";
  GenerateOptions g;
  g.max_tokens = 40;
  g.sampling = SamplingParams::greedy();
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> p = prompt(i), want = plain(p, g);
    for (int32_t budget : {0, 3, 12}) {
      ModelState st(*backend_, model_->config(), 1, 128, false);
      SpecOptions spec;
      spec.method = SpecMethod::Dflash;
      spec.draft_model = (fs::path(QWEN36_TEST_DATA) / "dflash" / "dense-mtp-b16").string();
      spec.tree_budget = budget;
      const SpecResult r = spec_generate(*model_, st, p, g, spec);
      EXPECT_EQ(r.gen.tokens, want) << "tree budget " << budget << " prompt " << i;
      if (i == 0) std::printf("[ spec ] dflash %s %d on cuda: %s\n", budget ? "tree budget" : "chain, budget", budget,
                              r.metrics.summary().c_str());
    }
  }
}

std::string fixture_name(const ::testing::TestParamInfo<std::string>& p) {
  return p.param == "dense-mtp" ? "dense_mtp" : "moe_mtp";
}
INSTANTIATE_TEST_SUITE_P(Fixtures, CudaSpec, ::testing::Values("dense-mtp", "moe-mtp"), fixture_name);

}  // namespace
}  // namespace qwen36
