// GGUF files written by llama.cpp's own converter and quantizer (tests/data/llamacpp-gguf,
// see its README) load and compute the right function:
//  - bf16 files match transformers' logits within the HF-path tolerance (we compute in f32);
//  - Q8_0 / Q6_K / Q4_K_M files match llama.cpp's logits of the same file much more closely
//    than the quantization error itself: mean |qwen36 − llama.cpp| ≤ 0.25 × mean |llama.cpp −
//    transformers|. Exact equality is not the goal: llama.cpp's CPU path rounds activations
//    differently (bf16 for bf16 weights; its own Q8 kernels' summation order).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/test_files.h"
#include "engine/generate.h"
#include "format/model_loader.h"
#include "model/qwen36.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

using test::read_raw;

double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(double(a[i]) - double(b[i]));
  return s / double(a.size());
}

struct Case {
  std::string name, type;
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " " << c.type; }
};

class LlamaCppGguf : public ::testing::TestWithParam<Case> {
 protected:
  fs::path dir() const { return fs::path(QWEN36_TEST_DATA) / "llamacpp-gguf" / GetParam().name; }
  std::vector<float> run(Model& model, const std::vector<int32_t>& tokens) {
    ModelState state(model.backend(), model.config(), 1, int64_t(tokens.size()), false);
    std::vector<float> logits(tokens.size() * size_t(model.config().vocab_size));
    model.forward(ForwardBatch::single(tokens, 0, 0, true), state, logits.data());
    return logits;
  }
};

TEST_P(LlamaCppGguf, LogitsMatch) {
  const auto& [name, type] = GetParam();
  auto backend = make_cpu_backend();
  Model model(load_model_weights((dir() / ("model-" + type + ".gguf")).string()), *backend);
  const auto tokens = read_raw<int32_t>(dir() / "tokens.i32");
  const auto hf = read_raw<float>(dir() / "logits.f32");
  const auto got = run(model, tokens);
  ASSERT_EQ(got.size(), hf.size());
  if (type == "bf16") {
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - hf[i]));
    std::printf("[ %s %s ] max |qwen36 - transformers| = %.3g\n", name.c_str(), type.c_str(), worst);
    EXPECT_LE(worst, 2e-3f);
  } else {
    const auto lc = read_raw<float>(dir() / ("logits-llamacpp-" + type + ".f32"));
    const double ours = mean_abs_diff(got, lc), quant_err = mean_abs_diff(lc, hf);
    std::printf("[ %s %s ] mean |qwen36 - llama.cpp| = %.4g, mean |llama.cpp - transformers| = %.4g, ratio %.3f\n",
                name.c_str(), type.c_str(), ours, quant_err, ours / quant_err);
    EXPECT_LE(ours, 0.25 * quant_err);
  }
}

// Greedy equality is only expected of unquantized weights: these run on the bf16 files.
using LlamaCppBf16 = LlamaCppGguf;

TEST_P(LlamaCppBf16, GreedyContinuationMatchesTransformers) {
  auto backend = make_cpu_backend();
  Model model(load_model_weights((dir() / "model-bf16.gguf").string()), *backend);
  std::ifstream in(dir() / "case.json");
  const auto c = nlohmann::json::parse(in);
  ModelState state(*backend, model.config(), 1, 128, false);
  GenerateOptions opts;
  opts.sampling = SamplingParams::greedy();
  const auto want = c["greedy_out"].get<std::vector<int32_t>>();
  opts.max_tokens = int32_t(want.size());
  EXPECT_EQ(generate(model, state, c["greedy_prompt"].get<std::vector<int32_t>>(), opts).tokens, want);
}

// The GGUF bf16 and the HF safetensors of the same checkpoint are the same model.
TEST_P(LlamaCppBf16, Bf16EqualsSafetensorsPath) {
  auto backend = make_cpu_backend();
  Model gguf(load_model_weights((dir() / "model-bf16.gguf").string()), *backend);
  Model hf(load_model_weights(dir().string()), *backend);
  const auto tokens = read_raw<int32_t>(dir() / "tokens.i32");
  const auto a = run(gguf, tokens), b = run(hf, tokens);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, 1e-5f);
}

std::vector<Case> cases(std::initializer_list<const char*> types) {
  std::vector<Case> v;
  for (const char* n : {"dense-a", "moe-a"})
    for (const char* t : types) v.push_back({n, t});
  return v;
}

std::string test_name(const ::testing::TestParamInfo<Case>& param_info) {
  std::string s = param_info.param.name + "_" + param_info.param.type;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

INSTANTIATE_TEST_SUITE_P(Files, LlamaCppGguf, ::testing::ValuesIn(cases({"bf16", "q8_0", "q6_k", "q4_k_m"})),
                         test_name);
INSTANTIATE_TEST_SUITE_P(Files, LlamaCppBf16, ::testing::ValuesIn(cases({"bf16"})), test_name);

}  // namespace
}  // namespace qwen36
