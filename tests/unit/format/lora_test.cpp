// PEFT LoRA adapters merged at load (format/lora.h): adapters written here in PEFT's layout
// (adapter_config.json + adapter_model.safetensors) over the golden HF fixtures; every merged
// element against W + s·B·A computed in double; a zero B (PEFT's initialisation) leaves the
// model's logits on the fixture's tokens as they were; a GGUF-tiled out_proj takes the adapter in
// its own column order; what cannot be merged is refused before anything changes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "format/lora.h"
#include "format/model_loader.h"
#include "format_test_util.h"
#include "model/qwen36.h"
#include "model/state.h"

namespace qwen36 {
namespace {

using test::StTensor;
using Json = nlohmann::json;

StTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, uint32_t seed, float scale) {
  StTensor t{name, "F32", shape, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  t.data.resize(size_t(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    std::memcpy(t.data.data() + i * 4, &v, 4);
  }
  return t;
}

struct Module {
  std::string name;
  int64_t out, in;
};

// An adapter of rank r over `modules` in `dir`; b_scale 0 is PEFT's initial (identity) adapter.
void write_adapter(const test::TempDir& dir, const std::vector<Module>& modules, int64_t r, float alpha,
                   float b_scale, Json extra = Json::object()) {
  Json cfg = {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", alpha}, {"bias", "none"}, {"use_dora", false},
              {"fan_in_fan_out", false}, {"modules_to_save", nullptr}};
  cfg.update(extra);
  test::write_text(dir / "adapter_config.json", cfg.dump());
  std::vector<StTensor> ts;
  uint32_t seed = 1;
  for (const Module& m : modules) {
    ts.push_back(f32_tensor("base_model.model." + m.name + ".lora_A.weight", {r, m.in}, seed++, 0.5f));
    ts.push_back(f32_tensor("base_model.model." + m.name + ".lora_B.weight", {m.out, r}, seed++, b_scale));
  }
  test::write_bytes(dir / "adapter_model.safetensors", test::st_build(ts));
}

const std::vector<Module> kDenseMtp = {{"model.layers.0.linear_attn.in_proj_qkv", 80, 48},
                                       {"model.layers.0.linear_attn.out_proj", 48, 48},
                                       {"model.layers.1.self_attn.q_proj", 128, 48},
                                       {"model.layers.1.mlp.down_proj", 48, 64},
                                       {"mtp.layers.0.self_attn.v_proj", 32, 48}};

double element(const Tensor& t, int64_t i) {
  return t.dtype == DType::BF16 ? bf16_to_f32(t.as<const uint16_t>()[i]) : t.as<const float>()[i];
}

TEST(Lora, MergesScaledProductIntoEveryTarget) {
  test::TempDir dir;
  write_adapter(dir, kDenseMtp, 4, 8.0f, 0.3f);
  const LoraAdapter a = load_lora_adapter(dir.path().string());
  ASSERT_EQ(a.pairs.size(), kDenseMtp.size());
  EXPECT_FLOAT_EQ(a.scaling(4), 2.0f);
  const ModelWeights before = load_model_weights(test::golden_dir("dense-mtp"));
  ModelWeights w = load_model_weights(test::golden_dir("dense-mtp"));
  EXPECT_EQ(merge_lora(w, a, 0.5f), int(kDenseMtp.size()));
  const double s = 0.5 * 2.0;
  auto check = [&](const Tensor& old, const Tensor& now, const LoraAdapter::Pair& p) {
    ASSERT_NE(old.data, now.data) << p.module << ": merged into new storage";
    const int64_t rows = old.rows(), cols = old.cols(), r = p.a.dim(0);
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t j = 0; j < cols; ++j) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(p.b.as<const float>()[o * r + k]) * p.a.as<const float>()[k * cols + j];
        const double want = element(old, o * cols + j) + s * d, got = element(now, o * cols + j);
        // bf16 storage: one rounding of the f32 sum (≤ 2^-8 relative), plus the f32 sum's own error.
        ASSERT_NEAR(got, want, std::abs(want) * 0.0079 + 1e-6) << p.module << " [" << o << ", " << j << "]";
      }
  };
  auto pair = [&](size_t i) -> const LoraAdapter::Pair& {  // the adapter lists its modules sorted
    for (const LoraAdapter::Pair& p : a.pairs)
      if (p.module == kDenseMtp[i].name) return p;
    throw Error("no pair for " + kDenseMtp[i].name);
  };
  check(before.layers[0].deltanet.in_proj_qkv, w.layers[0].deltanet.in_proj_qkv, pair(0));
  check(before.layers[0].deltanet.out_proj, w.layers[0].deltanet.out_proj, pair(1));
  check(before.layers[1].attn.q_proj, w.layers[1].attn.q_proj, pair(2));
  check(before.layers[1].mlp.down_proj, w.layers[1].mlp.down_proj, pair(3));
  check(before.mtp->layer.attn.v_proj, w.mtp->layer.attn.v_proj, pair(4));
  // Everything else is the checkpoint's own.
  EXPECT_EQ(std::memcmp(before.layers[1].attn.k_proj.data, w.layers[1].attn.k_proj.data,
                        w.layers[1].attn.k_proj.nbytes()), 0);
  EXPECT_EQ(std::memcmp(before.layers[0].mlp.up_proj.data, w.layers[0].mlp.up_proj.data, w.layers[0].mlp.up_proj.nbytes()),
            0);
}

// The logits after four tokens through the CPU model.
std::vector<float> last_logits(ModelWeights w) {
  auto backend = make_cpu_backend(1);
  Model m(std::move(w), *backend);
  ModelState st(*backend, m.config(), 1, 64, m.has_mtp());
  const std::vector<int32_t> tok = {1, 2, 3, 4};
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.forward(ForwardBatch::single(tok, 0), st, logits.data());
  return logits;
}

TEST(Lora, IdentityAdapterLeavesTheModelAndOthersChangeIt) {
  test::TempDir zero, some;
  write_adapter(zero, kDenseMtp, 2, 16.0f, 0.0f);
  write_adapter(some, kDenseMtp, 2, 16.0f, 0.5f);
  const std::vector<float> base = last_logits(load_model_weights(test::golden_dir("dense-mtp")));
  ModelWeights w0 = load_model_weights(test::golden_dir("dense-mtp"));
  merge_lora(w0, load_lora_adapter(zero.path().string()), 1.0f);
  EXPECT_EQ(last_logits(std::move(w0)), base);  // B = 0: every merged weight rounds back to itself
  ModelWeights w1 = load_model_weights(test::golden_dir("dense-mtp"));
  merge_lora(w1, load_lora_adapter(some.path().string()), 1.0f);
  const std::vector<float> changed = last_logits(std::move(w1));
  double diff = 0;
  for (size_t i = 0; i < base.size(); ++i) diff = std::max(diff, double(std::abs(changed[i] - base[i])));
  EXPECT_GT(diff, 1e-3);
}

// A GGUF keeps a DeltaNet out_proj's column blocks in its tiled head order (out_proj_heads);
// the adapter's A is in the checkpoint's order: the tiled merge equals the merge, tiled.
TEST(Lora, TiledOutProjTakesTheAdapterInItsOwnOrder) {
  test::TempDir dir;
  write_adapter(dir, {{"model.layers.0.linear_attn.out_proj", 48, 48}}, 4, 4.0f, 0.4f);
  const LoraAdapter a = load_lora_adapter(dir.path().string());
  ModelWeights plain = load_model_weights(test::golden_dir("dense-mtp"));
  ModelWeights tiled = load_model_weights(test::golden_dir("dense-mtp"));
  Tensor& t = tiled.layers[0].deltanet.out_proj;
  const int64_t rows = t.rows(), cols = t.cols(), dv = 24;
  const std::vector<int32_t> heads = {1, 0};
  auto buf = std::make_shared<HostBuffer>(t.nbytes());
  auto* dst = reinterpret_cast<uint16_t*>(buf->data());
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t c = 0; c < cols; ++c)
      dst[o * cols + c] = t.as<const uint16_t>()[o * cols + heads[size_t(c / dv)] * dv + c % dv];
  t.data = buf->data();
  tiled.storage.push_back(buf);
  tiled.layers[0].deltanet.out_proj_heads = heads;
  merge_lora(plain, a, 1.0f);
  merge_lora(tiled, a, 1.0f);
  const Tensor& p = plain.layers[0].deltanet.out_proj;
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(tiled.layers[0].deltanet.out_proj.as<const uint16_t>()[o * cols + c],
                p.as<const uint16_t>()[o * cols + heads[size_t(c / dv)] * dv + c % dv])
          << o << ", " << c;
}

TEST(Lora, RefusesWhatItCannotMerge) {
  auto refused = [](const std::string& golden, const std::vector<Module>& modules, const char* says,
                    Json extra = Json::object()) {
    test::TempDir dir;
    write_adapter(dir, modules, 2, 4.0f, 0.1f, extra);
    ModelWeights w = load_model_weights(test::golden_dir(golden));
    const void* before = w.layers[0].deltanet.in_proj_qkv.data;
    try {
      merge_lora(w, load_lora_adapter(dir.path().string()), 1.0f);
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    EXPECT_EQ(w.layers[0].deltanet.in_proj_qkv.data, before) << "nothing merged before the refusal";
  };
  const Module ok = {"model.layers.0.linear_attn.in_proj_qkv", 80, 48};
  refused("dense-mtp", {ok, {"model.layers.7.self_attn.q_proj", 128, 48}}, "no such layer");
  refused("dense-mtp", {ok, {"model.layers.0.self_attn.q_proj", 128, 48}}, "is not a linear layer");
  refused("dense-mtp", {ok, {"model.layers.1.mlp.up_proj", 64, 40}}, "does not make the weight's shape");
  refused("moe-shared", {{"model.layers.0.mlp.experts.0.gate_proj", 32, 96}}, "routed experts");
  refused("dense-tied", {{"lm_head", 256, 96}}, "tied");
  refused("dense-mtp", {ok}, "use_dora", {{"use_dora", true}});
  refused("dense-mtp", {ok}, "modules_to_save", {{"modules_to_save", {"lm_head"}}});
  refused("dense-mtp", {ok}, "peft_type", {{"peft_type", "IA3"}});
  // A half pair, and a directory without the safetensors file.
  test::TempDir half;
  write_adapter(half, {ok}, 2, 4.0f, 0.1f);
  std::vector<StTensor> only_a = {f32_tensor("base_model.model." + ok.name + ".lora_A.weight", {2, 48}, 1, 0.5f)};
  test::write_bytes(half / "adapter_model.safetensors", test::st_build(only_a));
  EXPECT_THROW(load_lora_adapter(half.path().string()), Error);
  test::TempDir bin;
  write_adapter(bin, {ok}, 2, 4.0f, 0.1f);
  std::filesystem::remove(bin / "adapter_model.safetensors");
  EXPECT_THROW(load_lora_adapter(bin.path().string()), Error);
}

}  // namespace
}  // namespace qwen36
