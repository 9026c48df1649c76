// load_hf_checkpoint on rewritten copies of the golden fixtures (in a temp dir; tests/data is
// never modified): corrupted config.json, missing and mis-shaped tensors, each rejected with
// qwen36::Error or loaded consistently (then a short forward pass must run); and layout
// rewrites that must give bit-identical logits: the multimodal wrapper, fused 3-D experts,
// sharding, and f32 storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include "backend/backend.h"
#include "core/error.h"
#include "format/hf_loader.h"
#include "format_test_util.h"
#include "model/qwen36.h"
#include "model/state.h"

namespace qwen36 {
namespace {

using json = nlohmann::json;
using test::Bytes;
using test::StTensor;
using test::TempDir;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::vector<int32_t> fixture_tokens(const std::string& name) {
  const Bytes b = test::read_bytes(test::golden_dir(name) + "/tokens.i32");
  std::vector<int32_t> t(b.size() / 4);
  std::memcpy(t.data(), b.data(), t.size() * 4);
  return t;
}

// All-position logits of one forward pass from an empty cache (as `qwen36 logits` does).
std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& tokens) {
  auto be = make_cpu_backend(1);  // tiny models; one thread avoids OpenMP spin-waits when ctest runs tests in parallel
  Model m(load_hf_checkpoint(dir), *be);
  ModelState st(*be, m.config(), 1, int64_t(tokens.size()), false);
  std::vector<float> out(tokens.size() * size_t(m.config().vocab_size));
  m.forward(ForwardBatch::single(tokens, 0, 0, /*all_logits=*/true), st, out.data());
  return out;
}

enum class Outcome { Rejected, Loaded, Crashed };

// Loads dir; if it loads, runs 5 tokens through it (ids inside the loaded vocabulary) to
// show that what was accepted is usable.
Outcome try_checkpoint(const std::string& dir, const std::string& what, std::string* message = nullptr) {
  try {
    ModelWeights w = load_hf_checkpoint(dir);
    auto be = make_cpu_backend(1);  // tiny models; one thread avoids OpenMP spin-waits when ctest runs tests in parallel
    Model m(std::move(w), *be);
    std::vector<int32_t> toks;
    for (int i = 0; i < 5; ++i) toks.push_back(int32_t((i * 37) % m.config().vocab_size));
    ModelState st(*be, m.config(), 1, int64_t(toks.size()), false);
    std::vector<float> out(size_t(m.config().vocab_size));
    m.forward(ForwardBatch::single(toks, 0), st, out.data());
    return Outcome::Loaded;
  } catch (const Error& e) {
    if (message) *message = e.what();
    return Outcome::Rejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": escaped as a non-qwen36 exception: " << e.what();
    return Outcome::Crashed;
  }
}

// A copy of a fixture whose config.json / model.safetensors the test rewrites.
class FixtureCopy {
 public:
  explicit FixtureCopy(const std::string& name) : config_(read_json(test::golden_dir(name) + "/config.json")) {
    test::copy_dir(test::golden_dir(name), dir_.path());
    tensors_ = test::st_read(test::golden_dir(name) + "/model.safetensors");
  }
  std::string dir() const { return dir_.path().string(); }
  const json& config() const { return config_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }
  void write_config(const json& j) const { test::write_text(dir_ / "config.json", j.dump(1)); }
  void write_config_text(const std::string& s) const { test::write_text(dir_ / "config.json", s); }
  void restore_config() const { write_config(config_); }
  void write_tensors(const std::vector<StTensor>& ts) const {
    test::write_bytes(dir_ / "model.safetensors", test::st_build(ts, {{"format", "pt"}}));
  }

 private:
  TempDir dir_;
  json config_;
  std::vector<StTensor> tensors_;
};

TEST(FormatHfCheckpoint, CopiedFixtureLoadsAndMatchesGoldenLogits) {
  // The baseline all other cases perturb: an untouched copy loads, and its logits are the
  // fixture's (to the golden tolerance) — so "identical to the original" below means something.
  FixtureCopy fx("dense-gqa");
  const auto toks = fixture_tokens("dense-gqa");
  const auto got = logits_of(fx.dir(), toks);
  const Bytes ref = test::read_bytes(test::golden_dir("dense-gqa") + "/logits.f32");
  ASSERT_EQ(ref.size(), got.size() * 4);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    float r;
    std::memcpy(&r, ref.data() + 4 * i, 4);
    worst = std::max(worst, std::fabs(double(got[i]) - r));
  }
  EXPECT_LE(worst, 2e-3);
}

// ---------------------------------------------------------------- config.json corruptions

TEST(FormatHfCheckpoint, ConfigFieldMutations) {
  FixtureCopy fx("dense-gqa");
  const json base = fx.config();
  int cases = 0, loaded = 0;
  const std::vector<json> values = {json("x"), json(1.5), json(-1), json(0), json(int64_t(1) << 40),
                                    json(std::numeric_limits<uint64_t>::max()), json(nullptr), json::array(),
                                    json::object(), json(true), json(3)};
  for (const auto& [key, orig] : base.items()) {
    auto check = [&](const json& cfg, const std::string& what) {
      fx.write_config(cfg);
      ++cases;
      const Outcome o = try_checkpoint(fx.dir(), what);
      EXPECT_NE(o, Outcome::Crashed) << what;
      loaded += o == Outcome::Loaded;
    };
    json removed = base;
    removed.erase(key);
    check(removed, "without " + key);
    for (const json& v : values) {
      json c = base;
      c[key] = v;
      check(c, key + " = " + v.dump());
    }
  }
  fx.restore_config();
  EXPECT_GE(cases, 300);
  EXPECT_GT(loaded, 0) << "no mutation was harmless: the harness is rejecting everything";
  EXPECT_LT(loaded, cases / 2);
}

TEST(FormatHfCheckpoint, ConfigSemanticErrorsAreRejected) {
  FixtureCopy fx("dense-gqa");
  const json base = fx.config();
  auto expect_reject = [&](const std::string& what, auto&& edit) {
    json c = base;
    edit(c);
    fx.write_config(c);
    std::string msg;
    EXPECT_EQ(try_checkpoint(fx.dir(), what, &msg), Outcome::Rejected) << what << " was accepted";
  };
  for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "model_type",
                        "num_attention_heads", "linear_num_key_heads", "linear_num_value_heads",
                        "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"})
    expect_reject(std::string("missing ") + k, [&](json& c) { c.erase(k); });
  for (const char* mt : {"llama", "", "qwen3_next", "qwen3_5_moe_text", "Qwen3_5_text"})
    expect_reject(std::string("model_type ") + mt, [&](json& c) { c["model_type"] = mt; });
  for (const char* k : {"vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "head_dim",
                        "num_attention_heads", "num_key_value_heads", "linear_key_head_dim",
                        "linear_value_head_dim", "linear_conv_kernel_dim"})
    for (int64_t v : {int64_t(-1), int64_t(0), int64_t(1) << 21, int64_t(1) << 40, int64_t(7)})
      expect_reject(std::string(k) + " = " + std::to_string(v), [&](json& c) { c[k] = v; });
  // Head counts that do not divide, or disagree with the tensors.
  expect_reject("kv heads 3 of 4", [](json& c) { c["num_key_value_heads"] = 3; });
  expect_reject("kv heads 2 (tensors have 1)", [](json& c) { c["num_key_value_heads"] = 2; });
  expect_reject("heads 8", [](json& c) { c["num_attention_heads"] = 8; });
  expect_reject("value heads 5 of 2", [](json& c) { c["linear_num_value_heads"] = 5; });
  expect_reject("value heads 4", [](json& c) { c["linear_num_value_heads"] = 4; });
  expect_reject("key heads 3", [](json& c) { c["linear_num_key_heads"] = 3; });
  // layer_types: wrong length, unknown kind, wrong kinds for the tensors, wrong types.
  expect_reject("layer_types short", [](json& c) { c["layer_types"].erase(3); });
  expect_reject("layer_types long", [](json& c) { c["layer_types"].push_back("full_attention"); });
  expect_reject("layer_types unknown", [](json& c) { c["layer_types"][0] = "sliding_attention"; });
  expect_reject("layer_types swapped", [](json& c) {
    c["layer_types"][0] = "full_attention";
    c["layer_types"][3] = "linear_attention";
  });
  expect_reject("layer_types all full", [](json& c) { c["layer_types"] = json::array({"full_attention", "full_attention", "full_attention", "full_attention"}); });
  expect_reject("layer_types entry 1", [](json& c) { c["layer_types"][1] = 1; });
  expect_reject("layer_types string", [](json& c) { c["layer_types"] = "linear_attention"; });
  expect_reject("layers 5", [](json& c) { c["num_hidden_layers"] = 5; });
  // Unsupported features.
  expect_reject("hidden_act gelu", [](json& c) { c["hidden_act"] = "gelu"; });
  expect_reject("attention_bias", [](json& c) { c["attention_bias"] = true; });
  expect_reject("rope yarn", [](json& c) { c["rope_parameters"]["rope_type"] = "yarn"; });
  expect_reject("partial rotary 0", [](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0; });
  expect_reject("partial rotary 2", [](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 2; });
  expect_reject("odd rotary dim", [](json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.15625; });
  expect_reject("rope_theta 0", [](json& c) { c["rope_parameters"]["rope_theta"] = 0; });
  expect_reject("rms eps 0", [](json& c) { c["rms_norm_eps"] = 0; });
  expect_reject("rms eps 2", [](json& c) { c["rms_norm_eps"] = 2; });
  expect_reject("quantized", [](json& c) { c["quantization_config"] = {{"quant_method", "fp8"}}; });
  expect_reject("text_config not an object", [](json& c) { c["text_config"] = 5; });
  expect_reject("eos id out of vocabulary", [](json& c) { c["eos_token_id"] = 256; });
  expect_reject("eos id negative", [](json& c) { c["eos_token_id"] = json::array({1, -2}); });
  expect_reject("eos id past int32", [](json& c) { c["eos_token_id"] = (int64_t(1) << 32) + 5; });
  expect_reject("eos id string", [](json& c) { c["eos_token_id"] = "1"; });
  expect_reject("mtp layers 99", [](json& c) { c["mtp_num_hidden_layers"] = 99; });
  expect_reject("tied embeddings as string", [](json& c) { c["tie_word_embeddings"] = "no"; });
  fx.restore_config();
}

TEST(FormatHfCheckpoint, ConfigTextCorruptions) {
  FixtureCopy fx("dense-gqa");
  const std::string text = fx.config().dump(1);
  int cases = 0;
  // Truncated at every 4th byte; not a JSON object; binary noise.
  for (size_t n = 0; n < text.size(); n += 4) {
    fx.write_config_text(text.substr(0, n));
    ++cases;
    EXPECT_EQ(try_checkpoint(fx.dir(), "config cut at " + std::to_string(n)), Outcome::Rejected) << n;
  }
  for (const char* s : {"", "[]", "null", "1", "\"qwen\"", "{\"model_type\": \"qwen3_5_text\"", "\x00\x01\x02",
                        "{\"text_config\": []}", "{\"text_config\": {}}"}) {
    fx.write_config_text(s);
    ++cases;
    EXPECT_EQ(try_checkpoint(fx.dir(), s), Outcome::Rejected) << s;
  }
  fx.restore_config();
  // generation_config.json: a directory is ignored, an out-of-range eos id is an error.
  std::filesystem::remove(fx.dir() + "/generation_config.json");
  std::filesystem::create_directory(fx.dir() + "/generation_config.json");
  EXPECT_EQ(try_checkpoint(fx.dir(), "generation_config.json is a directory"), Outcome::Loaded);
  std::filesystem::remove(fx.dir() + "/generation_config.json");
  for (const char* g : {R"({"eos_token_id": 4294967301})", R"({"eos_token_id": [1, 300]})",
                        R"({"eos_token_id": "2"})"}) {
    test::write_text(fx.dir() + "/generation_config.json", g);
    EXPECT_EQ(try_checkpoint(fx.dir(), g), Outcome::Rejected) << g;
  }
  std::filesystem::remove(fx.dir() + "/generation_config.json");
  // model.safetensors.index.json as a directory.
  std::filesystem::create_directory(fx.dir() + "/model.safetensors.index.json");
  EXPECT_EQ(try_checkpoint(fx.dir(), "index is a directory"), Outcome::Rejected);
  std::filesystem::remove(fx.dir() + "/model.safetensors.index.json");
  EXPECT_EQ(try_checkpoint(fx.dir(), "restored"), Outcome::Loaded);
  std::filesystem::remove(fx.dir() + "/config.json");
  EXPECT_EQ(try_checkpoint(fx.dir(), "no config.json"), Outcome::Rejected);
  std::filesystem::create_directory(fx.dir() + "/config.json");
  EXPECT_EQ(try_checkpoint(fx.dir(), "config.json is a directory"), Outcome::Rejected);
  EXPECT_GE(cases, 200);
}

// ---------------------------------------------------------------- tensor corruptions

// Same element count, another shape (always a wrong shape for a fixture tensor).
std::vector<int64_t> reshaped(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  if (s.size() == 1) return n % 2 == 0 ? std::vector<int64_t>{2, n / 2} : std::vector<int64_t>{n, 1};
  if (s.size() == 3) return {s[0], s[2], s[1]};  // conv [C, 1, K] → [C, K, 1]
  if (s[0] != s[1]) return {s[1], s[0]};
  return {s[0] / 2, s[1] * 2};
}

TEST(FormatHfCheckpoint, MissingOrMisshapedTensorsAreNamed) {
  FixtureCopy fx("dense-gqa");
  const auto& base = fx.tensors();
  int cases = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const std::string& name = base[i].name;
    // Missing: every fixture tensor is used, so each absence is an error naming it.
    {
      std::vector<StTensor> ts = base;
      ts.erase(ts.begin() + std::ptrdiff_t(i));
      fx.write_tensors(ts);
      std::string msg;
      ++cases;
      EXPECT_EQ(try_checkpoint(fx.dir(), "without " + name, &msg), Outcome::Rejected) << "without " << name;
      EXPECT_NE(msg.find(name), std::string::npos) << "error does not name " << name << ": " << msg;
    }
    // Renamed (a typo'd name is the same as missing, and the stray name must not matter).
    {
      std::vector<StTensor> ts = base;
      ts[i].name += "_x";
      fx.write_tensors(ts);
      ++cases;
      EXPECT_EQ(try_checkpoint(fx.dir(), "renamed " + name), Outcome::Rejected) << "renamed " << name;
    }
    // Reshaped with the same byte count.
    {
      std::vector<StTensor> ts = base;
      ts[i].shape = reshaped(ts[i].shape);
      fx.write_tensors(ts);
      std::string msg;
      ++cases;
      EXPECT_EQ(try_checkpoint(fx.dir(), "reshaped " + name, &msg), Outcome::Rejected) << "reshaped " << name;
    }
    // An integer tensor where a float one belongs (same shape, twice the bytes).
    {
      std::vector<StTensor> ts = base;
      ts[i].dtype = "I32";
      ts[i].data.resize(ts[i].data.size() * 2);
      fx.write_tensors(ts);
      ++cases;
      EXPECT_EQ(try_checkpoint(fx.dir(), "i32 " + name), Outcome::Rejected) << "i32 " << name;
    }
  }
  EXPECT_GE(cases, 200);
}

// ---------------------------------------------------------------- layout rewrites

void expect_identical(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " logits differ";
}

TEST(FormatHfCheckpoint, MultimodalWrapperGivesIdenticalLogits) {
  FixtureCopy fx("dense-gqa");
  const auto toks = fixture_tokens("dense-gqa");
  const auto original = logits_of(fx.dir(), toks);

  json text = fx.config();
  text["model_type"] = "qwen3_5_text";
  json wrapper = {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
                  {"model_type", "qwen3_5"},
                  {"text_config", text},
                  {"vision_config", {{"depth", 2}, {"hidden_size", 16}}},
                  {"tie_word_embeddings", false}};
  std::vector<StTensor> ts;
  for (StTensor t : fx.tensors()) {
    if (t.name.rfind("model.", 0) == 0) t.name = "model.language_model." + t.name.substr(6);
    ts.push_back(std::move(t));
  }
  ts.push_back({"model.visual.x", "F32", {2, 3}, Bytes(24, 0x3f)});
  fx.write_config(wrapper);
  fx.write_tensors(ts);
  expect_identical(logits_of(fx.dir(), toks), original, "multimodal wrapper");

  // The wrapper's own model_type may also sit only on the outer config.
  wrapper["text_config"].erase("model_type");
  fx.write_config(wrapper);
  expect_identical(logits_of(fx.dir(), toks), original, "wrapper, model_type outside only");
}

TEST(FormatHfCheckpoint, FusedExpertsGiveIdenticalLogits) {
  FixtureCopy fx("moe-shared");
  const auto toks = fixture_tokens("moe-shared");
  const auto original = logits_of(fx.dir(), toks);
  const json& c = fx.config();
  const int64_t E = c["num_experts"], I = c["moe_intermediate_size"], H = c["hidden_size"];
  const int64_t L = c["num_hidden_layers"];

  std::map<std::string, const StTensor*> by_name;
  for (const auto& t : fx.tensors()) by_name[t.name] = &t;
  std::vector<StTensor> ts;
  for (const auto& t : fx.tensors())
    if (t.name.find(".mlp.experts.") == std::string::npos) ts.push_back(t);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    StTensor gu{p + "gate_up_proj", "BF16", {E, 2 * I, H}, {}}, down{p + "down_proj", "BF16", {E, H, I}, {}};
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = p + std::to_string(e) + ".";
      for (const char* part : {"gate_proj", "up_proj"}) {  // gate rows first, then up
        const StTensor* t = by_name.at(q + part + ".weight");
        ASSERT_EQ(t->dtype, "BF16");
        gu.data.insert(gu.data.end(), t->data.begin(), t->data.end());
      }
      const StTensor* d = by_name.at(q + "down_proj.weight");
      down.data.insert(down.data.end(), d->data.begin(), d->data.end());
    }
    ts.push_back(std::move(gu));
    ts.push_back(std::move(down));
  }
  fx.write_tensors(ts);
  expect_identical(logits_of(fx.dir(), toks), original, "fused experts");

  // A fused tensor with the wrong shape, or without its partner, is an error naming it.
  for (auto [what, edit] : std::vector<std::pair<std::string, std::function<void(std::vector<StTensor>&)>>>{
           {"gate_up [E, H, 2I]", [&](std::vector<StTensor>& v) {
              for (auto& t : v) if (t.name == "model.layers.0.mlp.experts.gate_up_proj") t.shape = {E, H, 2 * I};
            }},
           {"down 2-D", [&](std::vector<StTensor>& v) {
              for (auto& t : v) if (t.name == "model.layers.1.mlp.experts.down_proj") t.shape = {E * H, I};
            }},
           {"no down", [&](std::vector<StTensor>& v) {
              std::erase_if(v, [](const StTensor& t) { return t.name == "model.layers.2.mlp.experts.down_proj"; });
            }}}) {
    std::vector<StTensor> bad = ts;
    edit(bad);
    fx.write_tensors(bad);
    std::string msg;
    EXPECT_EQ(try_checkpoint(fx.dir(), what, &msg), Outcome::Rejected) << what;
    EXPECT_NE(msg.find("experts"), std::string::npos) << what << ": " << msg;
  }
}

TEST(FormatHfCheckpoint, ShardedCheckpointGivesIdenticalLogits) {
  FixtureCopy fx("dense-tied");
  const auto toks = fixture_tokens("dense-tied");
  const auto original = logits_of(fx.dir(), toks);
  std::filesystem::remove(fx.dir() + "/model.safetensors");
  std::vector<std::vector<StTensor>> shards(3);
  json wm = json::object();
  for (size_t i = 0; i < fx.tensors().size(); ++i) {
    shards[i % 3].push_back(fx.tensors()[i]);
    wm[fx.tensors()[i].name] = "model-0000" + std::to_string(i % 3 + 1) + "-of-00003.safetensors";
  }
  for (size_t s = 0; s < 3; ++s)
    test::write_bytes(fx.dir() + "/model-0000" + std::to_string(s + 1) + "-of-00003.safetensors",
                      test::st_build(shards[s]));
  test::write_text(fx.dir() + "/model.safetensors.index.json", json{{"weight_map", wm}}.dump());
  expect_identical(logits_of(fx.dir(), toks), original, "sharded");
  // A shard gone missing is an error.
  std::filesystem::remove(fx.dir() + "/model-00002-of-00003.safetensors");
  EXPECT_EQ(try_checkpoint(fx.dir(), "missing shard"), Outcome::Rejected);
}

TEST(FormatHfCheckpoint, F32StorageGivesSameLogits) {
  // bf16 → f32 widening is exact, so only the summation order of the matmul kernels differs.
  FixtureCopy fx("dense-gqa");
  const auto toks = fixture_tokens("dense-gqa");
  const auto original = logits_of(fx.dir(), toks);
  std::vector<StTensor> ts = fx.tensors();
  for (auto& t : ts) {
    ASSERT_EQ(t.dtype, "BF16");
    Bytes wide(t.data.size() * 2);
    for (size_t i = 0; i < t.data.size() / 2; ++i) {
      wide[4 * i + 2] = t.data[2 * i];
      wide[4 * i + 3] = t.data[2 * i + 1];
    }
    t.dtype = "F32";
    t.data = std::move(wide);
  }
  fx.write_tensors(ts);
  const auto got = logits_of(fx.dir(), toks);
  ASSERT_EQ(got.size(), original.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], original[i], 1e-4) << "logit " << i;
}

}  // namespace
}  // namespace qwen36
