// Quantized Hugging Face checkpoints (format/hf_quant.h) against their exact f32 twins made by
// tools/make_quant_fixtures.py (tests/data/quant/<format>/ and <format>/f32/):
//  - every quantized Linear becomes the expected internal type and dequantizes to the twin's
//    f32 weight bit for bit; every other tensor is byte-identical;
//  - logits of a prefill (T > 2: weight rows widened exactly, the f32 tile) and of a 2-token
//    batch (T <= 2: the AVX2 row dots of cpu_dot_hf.cpp) match the twin's logits;
//  - unsupported formats and options, and a missing companion tensor, fail with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "backend/backend.h"
#include "core/error.h"
#include "format/model_loader.h"
#include "format_test_util.h"
#include "model/qwen36.h"
#include "quant/quant.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path quant_dir(const std::string& f) { return fs::path(QWEN36_TEST_DATA) / "quant" / f; }

// Every matrix of the model, named, in a fixed order (the same walk on both models).
std::vector<std::pair<std::string, const Tensor*>> matrices(const ModelWeights& w) {
  std::vector<std::pair<std::string, const Tensor*>> v{{"embed_tokens", &w.embed_tokens}, {"lm_head", &w.lm_head}};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    const std::pair<const char*, const Tensor*> all[] = {
        {"q_proj", &l.attn.q_proj},         {"k_proj", &l.attn.k_proj},
        {"v_proj", &l.attn.v_proj},         {"o_proj", &l.attn.o_proj},
        {"in_proj_qkv", &l.deltanet.in_proj_qkv}, {"in_proj_z", &l.deltanet.in_proj_z},
        {"in_proj_a", &l.deltanet.in_proj_a}, {"in_proj_b", &l.deltanet.in_proj_b},
        {"out_proj", &l.deltanet.out_proj}, {"gate_proj", &l.mlp.gate_proj},
        {"up_proj", &l.mlp.up_proj},        {"down_proj", &l.mlp.down_proj}};
    for (const auto& [n, t] : all)
      if (!t->empty()) v.emplace_back(p + n, t);
  }
  return v;
}

struct Case {
  const char* format;
  std::set<DType> types;  // internal types the quantized Linears must have
};

const Case kCases[] = {
    {"awq", {DType::W4_G32}},                          // group 64
    {"gptq-actorder", {DType::F32}},                   // v1, asymmetric, shuffled g_idx
    {"gptq-sym", {DType::W4_G32, DType::W4_G128}},     // v2, symmetric, per-channel
    {"ct-int4", {DType::W4_G32}},                      // asymmetric, group 32, bf16 scales
    {"ct-int4-sym-g128", {DType::W4_G128}},            // symmetric, group 128
    {"fp8", {DType::F8_B128}},                         // 128x128 blocks
    {"nvfp4", {DType::NVFP4_B64}},                     // modelopt, hf_quant_config.json
    {"ct-nvfp4", {DType::NVFP4_B64}},                  // compressed-tensors, reciprocal global scale
};

class HfQuantFixture : public ::testing::TestWithParam<Case> {};

TEST_P(HfQuantFixture, DequantizesToTheTwinBitForBit) {
  const Case& c = GetParam();
  const ModelWeights q = load_model_weights(quant_dir(c.format).string());
  const ModelWeights t = load_model_weights((quant_dir(c.format) / "f32").string());
  const auto qm = matrices(q), tm = matrices(t);
  ASSERT_EQ(qm.size(), tm.size());
  int quantized = 0;
  for (size_t i = 0; i < qm.size(); ++i) {
    const Tensor& a = *qm[i].second;
    const Tensor& b = *tm[i].second;
    SCOPED_TRACE(qm[i].first + " " + a.shape_str());
    ASSERT_EQ(a.rows(), b.rows());
    ASSERT_EQ(a.cols(), b.cols());
    if (a.dtype == b.dtype && a.dtype != DType::F32) {  // left unquantized: the same bytes
      EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0);
      continue;
    }
    ASSERT_EQ(b.dtype, DType::F32);
    EXPECT_TRUE(c.types.count(a.dtype)) << "internal type " << dtype_name(a.dtype);
    ++quantized;
    std::vector<float> row(size_t(a.cols()));
    for (int64_t r = 0; r < a.rows(); ++r) {
      dequantize_row(a.dtype, a.row(r), row.data(), a.cols());
      ASSERT_EQ(std::memcmp(row.data(), b.row(r), size_t(a.cols()) * 4), 0) << "row " << r;
    }
  }
  EXPECT_GE(quantized, 2);
}

// Logits of the quantized model against its twin. Both multiply the same f32 weights by the
// same f32 activations; only the summation order of the matmuls differs (the T <= 2 row dots
// accumulate in another order than the f32 GEMV), which moves logits of magnitude ~10 by a few
// f32 ulps per layer: 1e-4 absolute bounds that with a wide margin and would catch any wrong
// weight (one flipped code moves logits by > 1e-3).
TEST_P(HfQuantFixture, LogitsMatchTheTwin) {
  const Case& c = GetParam();
  auto be = make_cpu_backend(1);
  Model mq(load_model_weights(quant_dir(c.format).string()), *be);
  Model mt(load_model_weights((quant_dir(c.format) / "f32").string()), *be);
  const int64_t V = mq.config().vocab_size;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 37; ++i) tokens.push_back(int32_t((i * 53 + 7) % V));
  for (size_t n : {size_t(2), tokens.size()}) {
    const std::span<const int32_t> tk(tokens.data(), n);
    std::vector<float> lq(n * size_t(V)), lt(n * size_t(V));
    ModelState sq(*be, mq.config(), 1, int64_t(n), false), st(*be, mt.config(), 1, int64_t(n), false);
    mq.forward(ForwardBatch::single(tk, 0, 0, true), sq, lq.data());
    mt.forward(ForwardBatch::single(tk, 0, 0, true), st, lt.data());
    float worst = 0, big = 0;
    for (size_t i = 0; i < lq.size(); ++i) {
      worst = std::max(worst, std::abs(lq[i] - lt[i]));
      big = std::max(big, std::abs(lt[i]));
    }
    std::printf("[ %s ] %zu tokens: max |logit - twin| = %.3g (max |logit| %.3g)\n", c.format, n, double(worst),
                double(big));
    EXPECT_LE(worst, 1e-4f) << n << " tokens";
    EXPECT_GT(big, 0.5f) << "logits are flat: the fixture would not catch a wrong weight";
  }
}

// Token-by-token decode (T = 1 matmuls: the row-dot path) against the prefill's logits of the
// same model: the two paths read the same exact weights, so they agree to f32 summation order.
TEST_P(HfQuantFixture, DecodeMatchesPrefill) {
  const Case& c = GetParam();
  auto be = make_cpu_backend(1);
  Model m(load_model_weights(quant_dir(c.format).string()), *be);
  const int64_t V = m.config().vocab_size, n = 12;
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) tokens.push_back(int32_t((i * 53 + 7) % V));
  std::vector<float> pre(size_t(n * V)), step(static_cast<size_t>(V));
  ModelState sp(*be, m.config(), 1, n, false), sd(*be, m.config(), 1, n, false);
  m.forward(ForwardBatch::single(tokens, 0, 0, true), sp, pre.data());
  float worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    m.forward(ForwardBatch::single(std::span<const int32_t>(tokens).subspan(size_t(i), 1), int32_t(i), 0), sd,
              step.data());
    for (int64_t k = 0; k < V; ++k) worst = std::max(worst, std::abs(step[size_t(k)] - pre[size_t(i * V + k)]));
  }
  std::printf("[ %s ] decode vs prefill, %lld steps: max |dlogit| = %.3g\n", c.format, (long long)n, double(worst));
  EXPECT_LE(worst, 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Formats, HfQuantFixture, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string s = p.param.format;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// ---- rejections: one line naming the format and the option ----

void expect_one_line_error(const std::string& dir, const std::string& needle) {
  try {
    (void)load_model_weights(dir);
    ADD_FAILURE() << "loaded; expected an error mentioning " << needle;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

class HfQuantReject : public ::testing::Test {
 protected:
  void SetUp() override { test::copy_dir(quant_dir("awq"), dir_.path()); }
  json config() {
    std::ifstream in(dir_ / "config.json");
    return json::parse(in);
  }
  void edit(const std::function<void(json&)>& f) {
    json c = config();
    f(c["quantization_config"]);
    test::write_text(dir_ / "config.json", c.dump(1));
  }
  test::TempDir dir_;
};

TEST_F(HfQuantReject, UnknownMethod) {
  edit([](json& q) { q["quant_method"] = "bitsandbytes"; });
  expect_one_line_error(dir_.path().string(), "quantization method \"bitsandbytes\" is not supported");
}

TEST_F(HfQuantReject, AwqOptions) {
  edit([](json& q) { q["bits"] = 8; });
  expect_one_line_error(dir_.path().string(), "awq checkpoint: bits=8");
  edit([](json& q) {
    q["bits"] = 4;
    q["version"] = "gemv";
  });
  expect_one_line_error(dir_.path().string(), "awq checkpoint: version \"gemv\"");
  edit([](json& q) {
    q["version"] = "gemm";
    q["group_size"] = 48;
  });
  expect_one_line_error(dir_.path().string(), "group_size=48");
}

TEST_F(HfQuantReject, OtherFormatsOptions) {
  edit([](json& q) { q = {{"quant_method", "gptq"}, {"bits", 3}, {"group_size", 128}}; });
  expect_one_line_error(dir_.path().string(), "gptq checkpoint: bits=3");
  edit([](json& q) { q = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}}; });
  expect_one_line_error(dir_.path().string(), "fp8 checkpoint: per-tensor scaling");
  edit([](json& q) { q = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"}}; });
  expect_one_line_error(dir_.path().string(), "modelopt checkpoint: quant_algo \"FP8\"");
  edit([](json& q) {
    q = {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
         {"config_groups", {{"g", {{"weights", {{"num_bits", 8}, {"type", "float"}}}}}}}};
  });
  expect_one_line_error(dir_.path().string(), "compressed-tensors checkpoint: bits=8");
}

TEST_F(HfQuantReject, MissingQzeros) {
  auto tensors = test::st_read(dir_ / "model.safetensors");
  const std::string gone = "model.layers.0.mlp.up_proj.qzeros";
  const size_t before = tensors.size();
  std::erase_if(tensors, [&](const test::StTensor& t) { return t.name == gone; });
  ASSERT_EQ(tensors.size() + 1, before);
  test::write_bytes(dir_ / "model.safetensors", test::st_build(tensors));
  expect_one_line_error(dir_.path().string(), "awq checkpoint: missing tensor " + gone);
}

TEST_F(HfQuantReject, GptqDescActWithoutGIdx) {
  test::TempDir d;
  test::copy_dir(quant_dir("gptq-actorder"), d.path());
  auto tensors = test::st_read(d / "model.safetensors");
  std::erase_if(tensors, [&](const test::StTensor& t) { return t.name.ends_with(".g_idx"); });
  test::write_bytes(d / "model.safetensors", test::st_build(tensors));
  expect_one_line_error(d.path().string(), "desc_act=true but");
}

}  // namespace
}  // namespace qwen36
