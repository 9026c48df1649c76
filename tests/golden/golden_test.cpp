// Whole-model checks: the CPU engine against transformers' logits and greedy continuations
// for every fixture in tests/data/golden (tools/make_golden.py), plus consistency of the
// prefill/decode paths (chunked prefill and token-by-token decode give the same logits).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/test_files.h"
#include "engine/generate.h"
#include "format/model_loader.h"
#include "model/qwen36.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

using test::read_raw;

// Fixture directories holding `file` (case.json: every fixture; mtp_logits.f32: MTP ones).
std::vector<std::string> fixture_names(const char* file = "case.json") {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(QWEN36_TEST_DATA) / "golden"))
    if (fs::exists(e.path() / file)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::path(QWEN36_TEST_DATA) / "golden" / GetParam();
    std::ifstream in(dir_ / "case.json");
    case_ = nlohmann::json::parse(in);
    backend_ = make_cpu_backend();
    model_ = std::make_unique<Model>(load_model_weights(dir_.string()), *backend_);
  }
  fs::path dir_;
  nlohmann::json case_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

// Acceptance bar of the foundation: max |Δ| ≤ 2e-3 against transformers (f32 reference).
constexpr float kLogitTolerance = 2e-3f;

TEST_P(Golden, LogitsMatchTransformers) {
  const auto tokens = read_raw<int32_t>(dir_ / "tokens.i32");
  const auto want = read_raw<float>(dir_ / "logits.f32");
  const int64_t V = model_->config().vocab_size;
  ASSERT_EQ(want.size(), tokens.size() * size_t(V));
  ModelState state(*backend_, model_->config(), 1, int64_t(tokens.size()), false);
  std::vector<float> got(want.size());
  model_->forward(ForwardBatch::single(tokens, 0, 0, true), state, got.data());
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  std::printf("[ %s ] %zu tokens x %lld vocab: max |logit - transformers| = %.3g\n", GetParam().c_str(),
              tokens.size(), (long long)V, worst);
  EXPECT_LE(worst, kLogitTolerance);
}

TEST_P(Golden, GreedyContinuationMatchesTransformers) {
  const auto prompt = case_["greedy_prompt"].get<std::vector<int32_t>>();
  const auto want = case_["greedy_out"].get<std::vector<int32_t>>();
  ModelState state(*backend_, model_->config(), 1, 256, false);
  GenerateOptions opts;
  opts.max_tokens = int32_t(want.size());
  opts.sampling = SamplingParams::greedy();
  const GenerateResult r = generate(*model_, state, prompt, opts);
  EXPECT_EQ(r.tokens, want);
}

// Prefill in random chunk sizes (chunked DeltaNet with carried state, several KV appends)
// and pure token-by-token decode (recurrent DeltaNet) both reproduce one-shot logits.
TEST_P(Golden, ChunkedAndIncrementalMatchOneShot) {
  const auto tokens = read_raw<int32_t>(dir_ / "tokens.i32");
  const int64_t V = model_->config().vocab_size, n = int64_t(tokens.size());
  ModelState s0(*backend_, model_->config(), 3, n, false);
  std::vector<float> ref(size_t(n * V));
  model_->forward(ForwardBatch::single(tokens, 0, 0, true), s0, ref.data());

  std::mt19937 rng(7);
  for (int mode = 0; mode < 2; ++mode) {  // 0: random chunks, 1: one token at a time
    const int32_t slot = 1 + mode;        // other slots must not disturb each other
    std::vector<float> got(size_t(n * V));
    for (int64_t b = 0; b < n;) {
      const int64_t len = mode == 1 ? 1 : std::min<int64_t>(n - b, 1 + int64_t(rng() % 40));
      model_->forward(ForwardBatch::single(std::span(tokens).subspan(size_t(b), size_t(len)), int32_t(b), slot, true),
                      s0, got.data() + b * V);
      b += len;
    }
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
    EXPECT_LE(worst, 1e-4f) << (mode ? "token-by-token" : "random chunks");
  }
}

// The MTP head (mtp.*) against a reference assembled from transformers' own modules
// (tools/make_golden.py: transformers itself has no MTP). Row t sees the post-norm hidden
// state of position t and token t+1, and predicts token t+2.
class GoldenMtp : public Golden {};

TEST_P(GoldenMtp, MtpLogitsMatchReference) {
  ASSERT_TRUE(model_->has_mtp());
  const auto tokens = read_raw<int32_t>(dir_ / "tokens.i32");
  const auto want = read_raw<float>(dir_ / "mtp_logits.f32");
  const int64_t V = model_->config().vocab_size, H = model_->config().hidden_size, n = int64_t(tokens.size());
  ASSERT_EQ(want.size(), size_t((n - 1) * V));
  ModelState state(*backend_, model_->config(), 1, n, /*with_mtp=*/true);
  std::vector<float> hidden(size_t(n * H));
  model_->forward(ForwardBatch::single(tokens, 0, 0, true), state, nullptr, hidden.data());
  hidden.resize(size_t((n - 1) * H));  // the last position has no next token
  const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
  const SeqRun run{0, 0, 0, int32_t(n - 1)};
  std::vector<float> got(want.size());
  model_->mtp_forward(hidden, next, std::span(&run, 1), state, got.data());
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  std::printf("[ %s ] MTP: max |logit - reference| = %.3g\n", GetParam().c_str(), worst);
  EXPECT_LE(worst, kLogitTolerance);
}

// Two sequences in one batch give the same logits as each alone.
TEST_P(Golden, BatchedSequencesAreIndependent) {
  const auto tokens = read_raw<int32_t>(dir_ / "tokens.i32");
  const int64_t V = model_->config().vocab_size;
  const std::vector<int32_t> a(tokens.begin(), tokens.begin() + 30), b(tokens.begin() + 30, tokens.begin() + 75);
  ModelState st(*backend_, model_->config(), 4, 128, false);
  std::vector<float> la(a.size() * size_t(V)), lb(b.size() * size_t(V));
  model_->forward(ForwardBatch::single(a, 0, 0, true), st, la.data());
  model_->forward(ForwardBatch::single(b, 0, 1, true), st, lb.data());

  ForwardBatch both;
  both.tokens = a;
  both.tokens.insert(both.tokens.end(), b.begin(), b.end());
  both.runs = {{2, 0, 0, int32_t(a.size())}, {3, 0, int32_t(a.size()), int32_t(b.size())}};
  for (int32_t i = 0; i < int32_t(both.tokens.size()); ++i) both.output_rows.push_back(i);
  std::vector<float> lab(both.tokens.size() * size_t(V));
  model_->forward(both, st, lab.data());
  float worst = 0;
  for (size_t i = 0; i < la.size(); ++i) worst = std::max(worst, std::abs(lab[i] - la[i]));
  for (size_t i = 0; i < lb.size(); ++i) worst = std::max(worst, std::abs(lab[la.size() + i] - lb[i]));
  EXPECT_LE(worst, 1e-4f);
}

std::string test_name(const ::testing::TestParamInfo<std::string>& param_info) {
  std::string s = param_info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(fixture_names()), test_name);
INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenMtp, ::testing::ValuesIn(fixture_names("mtp_logits.f32")), test_name);

}  // namespace
}  // namespace qwen36
