// Speculative decoding on the GPU (issues 8, 9): greedy output with MTP and n-gram drafts, and
// with DFlash tree drafting, equals plain greedy decoding on the same backend, token for token,
// on the golden fixtures that carry real MTP weights. The verify pass runs the DeltaNet read-only ops and the commit
// replays the accepted tokens through the recurrent ones; every row's GEMV and attention sums
// are in the same order as a one-token step's, so the logits agree and so must the argmax.
// Greedy MTP drafting chained on the device drafts what the per-step path drafts.
#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <cstring>
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
// Tree verify passes of one size and five shapes at one place of a sequence, in turn: the first
// runs eagerly, the second is recorded and the later ones replay that recording, each reading its
// tree's shape (positions, ancestor masks, parents, leaf paths) from set_batch_trees' tables.
// Their logits equal bit for bit those of the same passes run eagerly on another state (asking
// for the hidden rows keeps a pass out of the recorded step), and the debug log shows the
// recording kept (a graph's shape logged, no op that needed the host while recording).
TEST_P(CudaSpec, TreeVerifyRecordedEqualsEager) {
  const ModelConfig& c = model_->config();
  const int64_t V = c.vocab_size;
  constexpr int32_t n = 9;
  const std::vector<std::vector<int32_t>> trees = {{-1, 0, 1, 2, 3, 4, 5, 6, 7},  // a chain
                                                   {-1, 0, 0, 0, 0, 0, 0, 0, 0},  // a star
                                                   {-1, 0, 1, 1, 0, 4, 2, 6, 3},
                                                   {-1, 0, 0, 1, 2, 3, 4, 5, 6},
                                                   {-1, 0, 1, 0, 3, 1, 5, 2, 7}};
  const std::vector<int32_t> p = prompt(1);
  const int32_t P = int32_t(p.size());
  ModelState recorded(*backend_, c, 1, 128, false), eager(*backend_, c, 1, 128, false);
  for (ModelState* st : {&recorded, &eager}) {
    st->enable_speculation(n);
    model_->forward(ForwardBatch::single(p, 0, 0), *st, nullptr);
  }
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(log);
  const spdlog::level::level_enum level = logger->level();
  logger->set_level(spdlog::level::debug);
  for (size_t k = 0; k < 2 * trees.size(); ++k) {  // every shape twice: replays of each after the recording
    const std::vector<int32_t>& parent = trees[k % trees.size()];
    ForwardBatch b;
    for (int32_t j = 0; j < n; ++j) b.tokens.push_back(int32_t((int64_t(k) * 131 + j * 17 + 3) % V));
    b.runs = {{0, P, 0, n}};
    b.verify_runs = {0};
    b.verify_trees = {parent};
    for (int32_t j = 0; j < n; ++j) b.output_rows.push_back(j);
    std::vector<float> got(size_t(n * V)), want(size_t(n * V)), hidden(size_t(n * c.hidden_size));
    model_->forward(b, recorded, got.data());
    b.hidden_rows = b.output_rows;
    model_->forward(b, eager, want.data(), hidden.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "pass " << k;
  }
  logger->set_level(level);
  logger->sinks().pop_back();
  int shapes = 0, dropped = 0;
  for (const std::string& m : log->last_formatted()) {
    shapes += m.find("graph: ") != std::string::npos;
    dropped += m.find("needed the host while recording") != std::string::npos;
  }
  EXPECT_EQ(dropped, 0);
  EXPECT_GE(shapes, 1) << "no pass was recorded";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaSpec, ::testing::Values("dense-mtp", "moe-mtp"), fixture_name);

}  // namespace
}  // namespace qwen36
