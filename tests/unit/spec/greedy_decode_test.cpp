// Greedy decoding with the tokens chained on the backend (Model::decode_greedy) on the CPU
// backend: the step-by-step loop's tokens and states (tests/common/greedy_chain_check.h; the
// same check runs on CUDA in tests/gpu/test_cuda_spec.cpp), and generate()'s greedy path, which
// takes it, against the per-step sampler path with the same argmax (top_k = 1): tokens and stop
// reasons for an end token, max_tokens and a full context.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "backend/cpu/cpu_ops.h"
#include "common/greedy_chain_check.h"
#include "core/error.h"
#include "engine/generate.h"
#include "format/model_loader.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

TEST(GreedyDecode, ChainEqualsStepwiseOnFixtures) {
  auto backend = make_cpu_backend(1);
  for (const char* f : {"dense-mtp", "moe-mtp"}) {
    Model model(load_model_weights((fs::path(QWEN36_TEST_DATA) / "golden" / f).string()), *backend);
    test::expect_greedy_chain_equals_stepwise(model, *backend, f);
  }
}

TEST(GreedyDecode, ChainEqualsStepwiseOnRandomModels) {
  auto backend = make_cpu_backend(1);
  for (bool moe : {false, true}) {
    auto model = test::random_model(*backend, 512, 43, moe);
    test::expect_greedy_chain_equals_stepwise(*model, *backend, moe ? "random-moe" : "random-dense");
  }
}

TEST(GreedyDecode, RefusesBadRuns) {
  auto backend = make_cpu_backend(1);
  auto model = test::random_model(*backend, 512, 43);
  ModelState state(*backend, model->config(), 2, 16, false);
  auto never = [](int64_t, std::span<const int32_t>) { return true; };
  const std::vector<int32_t> two = {1, 2};
  const std::vector<SeqRun> ok = {{0, 0, 0, 1}, {1, 0, 1, 1}};
  EXPECT_THROW(model->decode_greedy(std::vector<int32_t>{1}, ok, state, 2, never), Error);  // a token a run
  EXPECT_THROW(model->decode_greedy(two, std::vector<SeqRun>{{0, 0, 0, 2}}, state, 2, never), Error);
  EXPECT_THROW(model->decode_greedy(std::vector<int32_t>{1, 512}, ok, state, 2, never), Error);  // vocabulary
  EXPECT_THROW(model->decode_greedy(two, ok, state, 17, never), Error);  // past the context of 16
  EXPECT_THROW(model->decode_greedy(two, ok, state, int64_t(1) << 33, never), Error);
}

// generate() with temperature 0 (the chain) and with top_k = 1 at temperature 1 (the sampler's
// per-step path, the same argmax): equal tokens and stop reasons.
TEST(GreedyDecode, GenerateChainEqualsPerStepSampling) {
  auto backend = make_cpu_backend(1);
  auto model = test::random_model(*backend, 512, 47);
  const std::vector<int32_t> prompt = {3, 141, 59, 26, 5};
  GenerateOptions chain, per_step;
  chain.sampling = SamplingParams::greedy();
  per_step.sampling.temperature = 1;
  per_step.sampling.top_k = 1;
  auto run = [&](GenerateOptions o, int32_t capacity) {
    ModelState state(*backend, model->config(), 1, capacity, false);
    return generate(*model, state, prompt, o);
  };
  for (GenerateOptions* o : {&chain, &per_step}) o->max_tokens = 12;
  const GenerateResult a = run(chain, 64), b = run(per_step, 64);
  ASSERT_EQ(a.tokens.size(), 12u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.stop_reason, "length");
  EXPECT_EQ(b.stop_reason, "length");

  // An end token: the first occurrence of the 6th token ends both, before it.
  const int32_t end = a.tokens[5];
  const size_t cut = size_t(std::find(a.tokens.begin(), a.tokens.end(), end) - a.tokens.begin());
  for (GenerateOptions* o : {&chain, &per_step}) o->stop_ids = {end};
  const GenerateResult c = run(chain, 64), d = run(per_step, 64);
  EXPECT_EQ(c.tokens, std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + std::ptrdiff_t(cut)));
  EXPECT_EQ(c.tokens, d.tokens);
  EXPECT_EQ(c.stop_reason, "eos");
  EXPECT_EQ(d.stop_reason, "eos");

  // A context of 9: the prompt's 5 positions and 3 decode steps, 4 tokens in all.
  for (GenerateOptions* o : {&chain, &per_step}) o->stop_ids.clear();
  const GenerateResult e = run(chain, 9), f = run(per_step, 9);
  EXPECT_EQ(e.tokens, std::vector<int32_t>(a.tokens.begin(), a.tokens.begin() + 4));
  EXPECT_EQ(e.tokens, f.tokens);
  EXPECT_EQ(e.stop_reason, "context");
  EXPECT_EQ(f.stop_reason, "context");
}

}  // namespace
}  // namespace qwen36
