// The shipped default model (models/qwen36-small-code-q8_0.gguf, trained by tools/train):
// its greedy continuation of the check prompt equals transformers' generation for the
// training checkpoint (models/qwen36-small-code.check.json, written by tools/train/export.py),
// and the tokenizer it carries encodes the prompt to the same ids.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "engine/generate.h"
#include "format/model_loader.h"
#include "model/qwen36.h"
#ifdef QWEN36_HAVE_PCRE2
#include "text/tokenizer.h"
#endif

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

const fs::path kModels = fs::path(QWEN36_TEST_DATA).parent_path().parent_path() / "models";

nlohmann::json check_case() {
  std::ifstream in(kModels / "qwen36-small-code.check.json");
  return nlohmann::json::parse(in);
}

TEST(SmallModel, GreedyMatchesTransformers) {
  const auto c = check_case();
  auto backend = make_cpu_backend();
  Model model(load_model_weights((kModels / "qwen36-small-code-q8_0.gguf").string()), *backend);
  const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
  ModelState state(*backend, model.config(), 1, 256, false);
  GenerateOptions opts;
  opts.sampling = SamplingParams::greedy();
  opts.max_tokens = int32_t(want.size());
  opts.stop_ids = model.config().eos_token_ids;
  EXPECT_EQ(generate(model, state, c["prompt_ids"].get<std::vector<int32_t>>(), opts).tokens, want);
}

#ifdef QWEN36_HAVE_PCRE2
TEST(SmallModel, CarriedTokenizerEncodesThePrompt) {
  const auto c = check_case();
  const text::Tokenizer tok = text::Tokenizer::from_file((kModels / "qwen36-small-code-q8_0.gguf").string());
  EXPECT_EQ(tok.encode(c["prompt"].get<std::string>()), c["prompt_ids"].get<std::vector<int32_t>>());
}
#endif

}  // namespace
}  // namespace qwen36
