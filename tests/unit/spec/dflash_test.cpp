// DFlash drafting: config schemas and their errors, the checkpoint fixture
// (tests/data/dflash, made by tools/make_dflash_fixture.py for the dense-mtp target), the
// drafter's forward pass against a naive host transcription of the z-lab reference (both
// block causalities, context past the sliding window), and lossless greedy generation with
// --spec dflash (block 4 and 16, batch 1 and 3 sequences; garbage and near-oracle drafts
// through the real capture/observe path). The drafter is random: acceptance says nothing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "core/error.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/spec/dflash_drafter.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/spec_generate.h"
#include "format/dflash_loader.h"
#include "format/model_loader.h"
#include "format/weight_convert.h"
#include "model/qwen36.h"
#include "spec_test_util.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kTarget = (fs::path(QWEN36_TEST_DATA) / "golden" / "dense-mtp").string();
const std::string kDrafter = (fs::path(QWEN36_TEST_DATA) / "dflash" / "dense-mtp-b16").string();

json new_schema() {
  return json::parse(R"({"architectures":["DFlashDraftModel"],"model_type":"qwen3","hidden_size":5120,
    "num_hidden_layers":5,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"intermediate_size":17408,
    "vocab_size":248320,"rms_norm_eps":1e-6,"rope_parameters":{"rope_theta":10000000.0,"rope_type":"default"},
    "layer_types":["sliding_attention","sliding_attention","sliding_attention","sliding_attention","full_attention"],
    "sliding_window":2048,"num_target_layers":64,
    "dflash_config":{"block_size":16,"mask_token_id":248070,"target_layer_ids":[1,16,31,46,61]}})");
}

std::string error_of(const json& j) {
  try {
    parse_dflash_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DFlashConfig, BothSchemasParse) {
  const DFlashConfig a = parse_dflash_config(new_schema());
  EXPECT_EQ(a.block_size, 16);
  EXPECT_EQ(a.mask_token_id, 248070);
  EXPECT_EQ(a.target_layer_ids, (std::vector<int32_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(a.sliding, (std::vector<bool>{true, true, true, true, false}));
  EXPECT_EQ(a.sliding_window, 2048);
  EXPECT_FLOAT_EQ(a.rope_theta, 1e7f);
  // Older schema: block_size and rope_theta at the top level; no target_layer_ids, so the
  // reference default (5 ids over 1 .. 61 of 64 layers) — the published 27B ids.
  json old = new_schema();
  old.erase("rope_parameters");
  old["rope_theta"] = 1e7;
  old["block_size"] = 16;
  old["dflash_config"] = {{"mask_token_id", 248070}};
  const DFlashConfig b = parse_dflash_config(old);
  EXPECT_EQ(b.block_size, 16);
  EXPECT_EQ(b.target_layer_ids, a.target_layer_ids);
  EXPECT_FLOAT_EQ(b.rope_theta, 1e7f);
  std::printf("%s\n", a.summary().c_str());
}

TEST(DFlashConfig, BadConfigsGiveOneLineErrors) {
  struct Bad {
    std::function<void(json&)> edit;
    const char* names;
  };
  const std::vector<Bad> bad = {
      {[](json& j) { j["dflash_config"].erase("mask_token_id"); }, "mask_token_id"},
      {[](json& j) { j["dflash_config"].erase("block_size"); }, "block_size"},
      {[](json& j) { j["block_size"] = 8; }, "block_size"},  // the two schemas disagree
      {[](json& j) { j["dflash_config"]["block_size"] = 32; }, "block_size"},
      {[](json& j) { j["architectures"] = {"DFlash2DraftModel"}; }, "DFlash2DraftModel"},
      {[](json& j) { j["architectures"] = {"Qwen3ForCausalLM"}; }, "architectures"},
      {[](json& j) { j["layer_types"][0] = "linear_attention"; }, "layer type"},
      {[](json& j) { j["layer_types"].erase(0); }, "layer_types"},
      {[](json& j) { j.erase("sliding_window"); }, "sliding_window"},
      {[](json& j) { j["dflash_config"]["target_layer_ids"] = {16, 1}; }, "target_layer_ids"},
      {[](json& j) {
         j["dflash_config"].erase("target_layer_ids");
         j.erase("num_target_layers");
       },
       "num_target_layers"},
      {[](json& j) { j["num_attention_heads"] = 30; }, "num_key_value_heads"},
      {[](json& j) { j.erase("hidden_size"); }, "hidden_size"},
      {[](json& j) { j["attention_bias"] = true; }, "attention_bias"},
  };
  for (const Bad& b : bad) {
    json j = new_schema();
    b.edit(j);
    const std::string e = error_of(j);
    EXPECT_NE(e.find(b.names), std::string::npos) << "error \"" << e << "\" should name " << b.names;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(DFlashConfig, SpeculativeConfigJson) {
  const SpecOptions o = parse_speculative_config(R"({"method":"dflash","model":"/x/drafter","num_speculative_tokens":15})");
  EXPECT_EQ(o.method, SpecMethod::Dflash);
  EXPECT_EQ(o.draft_model, "/x/drafter");
  EXPECT_EQ(o.dflash.block_size, 16);
  EXPECT_THROW(parse_speculative_config(R"({"method":"mtp","model":"/x/drafter"})"), Error);
  EXPECT_EQ(parse_spec_method("dflash"), SpecMethod::Dflash);
}

TEST(DFlashConfig, LoaderRefusesGgufAndStrangers) {
  try {
    load_dflash_checkpoint("/tmp/drafter.gguf");
    FAIL() << "a GGUF drafter loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_dflash_checkpoint(kTarget), Error);  // a target checkpoint is no drafter
  const DFlashWeights w = load_dflash_checkpoint(kDrafter);
  EXPECT_EQ(w.config.n_layers, 2);
  EXPECT_EQ(w.config.sliding, (std::vector<bool>{true, false}));
}

// ---- the forward pass against a naive transcription of dflash/model.py ----

using Mat = std::vector<float>;  // row-major

Mat f32(const Tensor& t) {
  Mat m(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) m[size_t(i)] = tensor_get_f32(t, i);
  return m;
}
// y[n, out] = x[n, in] · W[out, in]ᵀ
Mat linear(const Mat& x, const Mat& w, int64_t in) {
  const int64_t n = int64_t(x.size()) / in, out = int64_t(w.size()) / in;
  Mat y(size_t(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(x[size_t(r * in + i)]) * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = float(s);
    }
  return y;
}
void rmsnorm(Mat& x, const Mat& w, float eps) {  // rows of w.size()
  const size_t D = w.size();
  for (size_t r = 0; r < x.size() / D; ++r) {
    double ss = 0;
    for (size_t i = 0; i < D; ++i) ss += double(x[r * D + i]) * x[r * D + i];
    const float inv = float(1.0 / std::sqrt(ss / double(D) + eps));
    for (size_t i = 0; i < D; ++i) x[r * D + i] = x[r * D + i] * inv * w[i];
  }
}
void rope_rows(Mat& x, int64_t heads, int64_t hd, const std::vector<int64_t>& pos, float theta) {
  for (size_t r = 0; r < pos.size(); ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double f = double(pos[r]) / std::pow(double(theta), double(2 * i) / double(hd));
        float* v = x.data() + (int64_t(r) * heads + h) * hd;
        const float a = v[i], b = v[i + hd / 2];
        v[i] = float(a * std::cos(f) - b * std::sin(f));
        v[i + hd / 2] = float(b * std::cos(f) + a * std::sin(f));
      }
}

// Logits [B − 1, V] of one block [anchor, MASK…] at position n after context rows feats [n, F].
Mat reference_draft(const DFlashWeights& w, const Model& target, const Mat& feats, int32_t anchor, int32_t B,
                    bool sliding_causal) {
  const DFlashConfig& c = w.config;
  const int64_t H = c.hidden_size, nh = c.n_heads, nkv = c.n_kv_heads, hd = c.head_dim, F = H * int64_t(c.target_layer_ids.size());
  const int64_t n = int64_t(feats.size()) / F, V = target.config().vocab_size;
  Mat th = linear(feats, f32(w.fc), F);
  rmsnorm(th, f32(w.hidden_norm), c.rms_norm_eps);
  const Mat emb = f32(target.weights().embed_tokens);
  Mat x(size_t(B * H));
  for (int32_t j = 0; j < B; ++j) {
    const int32_t tok = j == 0 ? anchor : c.mask_token_id;
    std::copy(emb.begin() + tok * H, emb.begin() + (tok + 1) * H, x.begin() + j * H);
  }
  std::vector<int64_t> pos_ctx, pos_blk;
  for (int64_t p = 0; p < n; ++p) pos_ctx.push_back(p);
  for (int32_t j = 0; j < B; ++j) pos_blk.push_back(n + j);
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const DFlashLayer& l = w.layers[li];
    Mat xn = x;
    rmsnorm(xn, f32(l.input_norm), c.rms_norm_eps);
    Mat q = linear(xn, f32(l.q_proj), H), kb = linear(xn, f32(l.k_proj), H), vb = linear(xn, f32(l.v_proj), H);
    Mat kc = linear(th, f32(l.k_proj), H), vc = linear(th, f32(l.v_proj), H);
    rmsnorm(q, f32(l.q_norm), c.rms_norm_eps);
    rmsnorm(kb, f32(l.k_norm), c.rms_norm_eps);
    rmsnorm(kc, f32(l.k_norm), c.rms_norm_eps);
    rope_rows(q, nh, hd, pos_blk, c.rope_theta);
    rope_rows(kb, nkv, hd, pos_blk, c.rope_theta);
    rope_rows(kc, nkv, hd, pos_ctx, c.rope_theta);
    Mat k = kc, v = vc;  // positions 0 .. n + B − 1
    k.insert(k.end(), kb.begin(), kb.end());
    v.insert(v.end(), vb.begin(), vb.end());
    const bool sliding = c.sliding[li];
    const int64_t lo = sliding ? std::clamp<int64_t>(n + B - c.sliding_window, 0, n) : 0;
    Mat o(size_t(B * nh * hd), 0.0f);
    for (int32_t j = 0; j < B; ++j)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t hi = sliding && sliding_causal ? n + j : n + B - 1, kh = h / (nh / nkv);
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t p = lo; p <= hi; ++p) {
          double d = 0;
          for (int64_t i = 0; i < hd; ++i) d += double(q[size_t((j * nh + h) * hd + i)]) * k[size_t((p * nkv + kh) * hd + i)];
          s.push_back(d / std::sqrt(double(hd)));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double& e : s) sum += e = std::exp(e - mx);
        for (int64_t p = lo; p <= hi; ++p)
          for (int64_t i = 0; i < hd; ++i)
            o[size_t((j * nh + h) * hd + i)] += float(s[size_t(p - lo)] / sum * v[size_t((p * nkv + kh) * hd + i)]);
      }
    const Mat y = linear(o, f32(l.o_proj), nh * hd);
    for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    xn = x;
    rmsnorm(xn, f32(l.post_attention_norm), c.rms_norm_eps);
    Mat g = linear(xn, f32(l.mlp.gate_proj), H), u = linear(xn, f32(l.mlp.up_proj), H);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    const Mat d = linear(g, f32(l.mlp.down_proj), c.intermediate_size);
    for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
  }
  Mat out(x.begin() + H, x.end());
  rmsnorm(out, f32(w.norm), c.rms_norm_eps);
  Mat logits = linear(out, f32(target.weights().lm_head), H);
  EXPECT_EQ(int64_t(logits.size()), (B - 1) * V);
  return logits;
}

constexpr int64_t kCtx = 96;   // the lossless tests' context
constexpr int32_t kMax = 40;   // and tokens generated

class DFlashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend(1);
    model_ = std::make_unique<Model>(load_model_weights(kTarget), *backend_);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

// Context lengths inside and past the 12-token window of the fixture's sliding layer, added
// in uneven pieces (as prefill chunks and verify commits add them), two slots at once.
TEST_F(DFlashTest, ForwardMatchesReference) {
  const DFlashWeights w = load_dflash_checkpoint(kDrafter);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (bool causal : {false, true}) {
    for (int32_t B : {4, 16}) {
      DFlashOptions o;
      o.block_size = B;
      o.sliding_causal = causal;
      DFlashModel m(load_dflash_checkpoint(kDrafter), *model_, *backend_, 2, 64, o);
      const int64_t F = m.feature_width(), V = model_->config().vocab_size;
      const int32_t lens[2] = {5, 23};
      std::vector<Mat> feats(2);
      for (int32_t s = 0; s < 2; ++s) {
        feats[size_t(s)].resize(size_t(lens[s] * F));
        for (float& x : feats[size_t(s)]) x = nd(rng);
        for (int32_t p0 = 0; p0 < lens[s];) {  // pieces of 1, 2, 3 ... rows
          const int32_t n = std::min(lens[s] - p0, 1 + p0 % 4);
          m.add_context(s, p0, std::span(feats[size_t(s)]).subspan(size_t(p0 * F), size_t(n * F)));
          p0 += n;
        }
      }
      const DFlashBlock blocks[2] = {{0, lens[0], 11}, {1, lens[1], 42}};
      Mat got(size_t(2 * (B - 1) * V));
      m.draft(blocks, got.data());
      // The chain drafter's form keeps only each row's argmax (ties to the lower id, as
      // std::max_element's first maximum): the same tokens as the logits give.
      std::vector<int32_t> best(size_t(2 * (B - 1)));
      m.draft_argmax(blocks, best.data());
      for (size_t r = 0; r < best.size(); ++r) {
        const float* row = got.data() + r * size_t(V);
        EXPECT_EQ(best[r], int32_t(std::max_element(row, row + V) - row)) << "row " << r << " B " << B;
      }
      for (int32_t s = 0; s < 2; ++s) {
        const Mat want = reference_draft(w, *model_, feats[size_t(s)], blocks[s].anchor, B, causal);
        double max_err = 0, max_ref = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          max_err = std::max(max_err, double(std::abs(want[i] - got[size_t(s) * want.size() + i])));
          max_ref = std::max(max_ref, double(std::abs(want[i])));
        }
        // f32 backend vs double reference over a 2-layer model: rounding only (~1e-6 relative)
        EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_ref)) << "slot " << s << " B " << B << " causal " << causal;
      }
    }
  }
}

GenerateOptions greedy(int32_t max_tokens) {
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling = SamplingParams::greedy();
  return g;
}

std::vector<std::vector<int32_t>> prompts(int64_t vocab) {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> p;
  for (int n : {4, 17, 30}) {  // inside and past the drafter's sliding window
    std::vector<int32_t> t;
    for (int j = 0; j < n; ++j) t.push_back(int32_t(rng() % uint32_t(vocab)));
    p.push_back(t);
  }
  return p;
}

// Plain greedy generation of each prompt: what speculative runs must reproduce.
std::vector<std::vector<int32_t>> plain_outputs(Model& model, Backend& backend,
                                                const std::vector<std::vector<int32_t>>& ps) {
  std::vector<std::vector<int32_t>> refs;
  for (const auto& p : ps) {
    ModelState st(backend, model.config(), 1, kCtx, false);
    refs.push_back(generate(model, st, p, greedy(kMax)).tokens);
  }
  return refs;
}

// Runs the real DFlash drafter (capture, observe, propose), then replaces its drafts: with
// garbage, or with the known greedy continuation corrupted at a varying depth (so long
// accepted runs commit many captured rows at once).
class Rewrite final : public Drafter {
 public:
  enum class Mode { Keep, Garbage, NearOracle };
  Rewrite(DFlashDrafter& d, Mode mode, const std::vector<std::vector<int32_t>>* refs = nullptr,
          const std::vector<std::vector<int32_t>>* ps = nullptr)
      : d_(d), mode_(mode), refs_(refs), ps_(ps) {}
  const char* name() const override { return "dflash-rewrite"; }
  std::vector<int32_t> capture_layers() const override { return d_.capture_layers(); }
  void reset(int32_t slot) override { d_.reset(slot); }
  void observe(int32_t slot, int32_t pos0, std::span<const float> f, std::span<const int32_t> n) override {
    d_.observe(slot, pos0, f, n);
  }
  void propose(std::span<DraftRequest> reqs) override {
    d_.propose(reqs);
    for (DraftRequest& r : reqs) {
      drafted_blocks += !r.tokens.empty();
      EXPECT_EQ(d_.context_len(r.slot), int32_t(r.history.size()) - 1) << "the drafter's context lags";
      if (mode_ == Mode::Garbage)
        for (int32_t& t : r.tokens) t = (t * 7 + 3) % 128;
      if (mode_ == Mode::NearOracle) {
        const auto& ref = (*refs_)[size_t(r.slot)];
        const size_t done = r.history.size() - (*ps_)[size_t(r.slot)].size();
        for (size_t i = 0; i < r.tokens.size(); ++i)
          r.tokens[i] = done + i < ref.size() ? ref[done + i] : 0;
        if (!r.tokens.empty()) {
          const size_t at = ++round_ % (r.tokens.size() + 2);
          if (at < r.tokens.size()) r.tokens[at] = (r.tokens[at] + 1) % 128;
        }
      }
    }
  }
  int drafted_blocks = 0;

 private:
  DFlashDrafter& d_;
  Mode mode_;
  const std::vector<std::vector<int32_t>>* refs_;
  const std::vector<std::vector<int32_t>>* ps_;
  size_t round_ = 0;
};

TEST_F(DFlashTest, GreedyOutputEqualsPlainGeneration) {
  const auto ps = prompts(model_->config().vocab_size);
  const std::vector<std::vector<int32_t>> refs = plain_outputs(*model_, *backend_, ps);
  for (int32_t B : {4, 16}) {
    // Batch 1 through spec_generate (the drafter loaded from its checkpoint, as run does).
    for (size_t i = 0; i < ps.size(); ++i) {
      ModelState st(*backend_, model_->config(), 1, kCtx, false);
      SpecOptions spec;
      spec.method = SpecMethod::Dflash;
      spec.draft_model = kDrafter;
      spec.dflash.block_size = B;
      spec.dflash.sliding_causal = i == 1;
      const SpecResult r = spec_generate(*model_, st, ps[i], greedy(kMax), spec);
      EXPECT_EQ(r.gen.tokens, refs[i]) << "B " << B << " prompt " << i;
      EXPECT_GT(r.metrics.drafted, 0u);
      std::printf("[ dflash B=%d batch 1 prompt %zu ] %s\n", B, i, r.metrics.summary().c_str());
    }
    // Three sequences of different prompt lengths in one batch; the drafter's own drafts,
    // garbage, and near-oracle drafts.
    for (auto mode : {Rewrite::Mode::Keep, Rewrite::Mode::Garbage, Rewrite::Mode::NearOracle}) {
      ModelState st(*backend_, model_->config(), 3, kCtx, false);
      DFlashOptions o;
      o.block_size = B;
      DFlashDrafter d(*model_, load_dflash_checkpoint(kDrafter), *backend_, 3, kCtx, o);
      Rewrite drafter(d, mode, &refs, &ps);
      std::vector<SpecSequence> seqs;
      for (int32_t i = 0; i < 3; ++i) seqs.push_back({ps[size_t(i)], greedy(kMax), i, true, {}});
      SpecOptions spec;
      spec.method = SpecMethod::Dflash;
      spec.draft_n = B - 1;
      const auto res = spec_generate_batch(*model_, st, seqs, spec, &drafter);
      SpecMetrics total;
      for (size_t i = 0; i < res.size(); ++i) {
        EXPECT_EQ(res[i].gen.tokens, refs[i]) << "B " << B << " mode " << int(mode) << " sequence " << i;
        total.merge(res[i].metrics);
      }
      EXPECT_GT(drafter.drafted_blocks, 0);
      if (mode == Rewrite::Mode::NearOracle) {
        EXPECT_GT(total.accepted, total.drafted / 3);
      }
      std::printf("[ dflash B=%d batch 3 mode %d ] %s\n", B, int(mode), total.summary().c_str());
    }
  }
}

// DDTree: each round verifies a tree of the block's most probable drafts (tree_budget) in one
// target pass; greedy output must still be plain generation's, token for token — one sequence
// through spec_generate (the drafter loaded with its top-K, as run does) and three sharing
// every verify pass.
TEST_F(DFlashTest, TreeDraftingOutputEqualsPlainGeneration) {
  const auto ps = prompts(model_->config().vocab_size);
  const std::vector<std::vector<int32_t>> refs = plain_outputs(*model_, *backend_, ps);
  for (int32_t budget : {3, 12, 40}) {
    SpecOptions spec;
    spec.method = SpecMethod::Dflash;
    spec.draft_model = kDrafter;
    spec.dflash.block_size = 16;
    spec.tree_budget = budget;
    for (size_t i = 0; i < ps.size(); ++i) {
      ModelState st(*backend_, model_->config(), 1, kCtx, false);
      const SpecResult r = spec_generate(*model_, st, ps[i], greedy(kMax), spec);
      EXPECT_EQ(r.gen.tokens, refs[i]) << "budget " << budget << " prompt " << i;
      EXPECT_GT(r.metrics.rounds, 0u);
      std::printf("[ dflash tree budget %d batch 1 prompt %zu ] %s\n", budget, i, r.metrics.summary().c_str());
    }
    ModelState st(*backend_, model_->config(), 3, kCtx, false);
    DFlashDrafter drafter(*model_, load_dflash_checkpoint(kDrafter), *backend_, 3, kCtx, spec.dflash, kTreeTopK);
    std::vector<SpecSequence> seqs;
    for (int32_t i = 0; i < 3; ++i) seqs.push_back({ps[size_t(i)], greedy(kMax), i, true, {}});
    spec.draft_n = spec.dflash.block_size - 1;
    const auto res = spec_generate_batch(*model_, st, seqs, spec, &drafter);
    for (size_t i = 0; i < res.size(); ++i) EXPECT_EQ(res[i].gen.tokens, refs[i]) << "budget " << budget << " sequence " << i;
  }
}

// Sampled tree rounds are lossless: every node's token is drawn from the target's distribution
// given that node's path (the sampler's filters and penalties with the path in the history),
// and the walk goes down while the draw names a child — so each emitted token is a draw from
// the target given the tokens before it, whatever the drafter proposed. The first three tokens
// (t1 from the prefill, t2 and t3 from tree rounds: t3 from an accepted child's row when t2 was
// a child) against their exact joint under the sampler (top-4 at temperature 2: 64 cells),
// chi-square at the 0.1 % level (a correct sampler fails 1 run in 1000; fixed seeds).
TEST_F(DFlashTest, SampledTreeRoundsFollowTheTargetJointDistribution) {
  SamplingParams sp;
  sp.temperature = 2.0f, sp.top_k = 4, sp.top_p = 1.0f, sp.min_p = 0.0f;
  const std::vector<int32_t> prompt = prompts(model_->config().vocab_size)[0];
  const int64_t V = model_->config().vocab_size;
  // The sampler's distribution of the token after ctx (the exact target).
  auto dist = [&](const std::vector<int32_t>& ctx) {
    ModelState st(*backend_, model_->config(), 1, kCtx, false);
    std::vector<float> logits(static_cast<size_t>(V));
    model_->forward(ForwardBatch::single(ctx, 0, 0), st, logits.data());
    Sampler sampler(sp);
    return sampler.distribution(logits, ctx);
  };
  std::map<std::array<int32_t, 3>, double> joint;
  for (const auto& [a, pa] : dist(prompt)) {
    auto c1 = prompt;
    c1.push_back(a);
    for (const auto& [b, pb] : dist(c1)) {
      auto c2 = c1;
      c2.push_back(b);
      for (const auto& [c, pc] : dist(c2)) joint[{a, b, c}] = double(pa) * pb * pc;
    }
  }
  SpecOptions spec;
  spec.method = SpecMethod::Dflash;
  spec.draft_model = kDrafter;
  spec.dflash.block_size = 16;
  spec.tree_budget = 22;
  GenerateOptions g;
  g.max_tokens = 3;
  g.sampling = sp;
  const uint64_t N = 4000;
  std::map<std::array<int32_t, 3>, uint64_t> seen;
  SpecMetrics metrics;
  ModelState st(*backend_, model_->config(), 1, kCtx, false);
  for (uint64_t i = 0; i < N; ++i) {
    g.sampling.seed = 5000 + i;
    const SpecResult r = spec_generate(*model_, st, prompt, g, spec);
    ASSERT_EQ(r.gen.tokens.size(), 3u);
    ++seen[{r.gen.tokens[0], r.gen.tokens[1], r.gen.tokens[2]}];
    metrics.merge(r.metrics);
  }
  std::vector<double> probs;
  std::vector<uint64_t> counts;
  uint64_t outside = 0;
  for (const auto& [k, n] : seen) outside += joint.count(k) ? 0 : n;
  for (const auto& [k, p] : joint) {
    probs.push_back(p);
    counts.push_back(seen.count(k) ? seen[k] : 0);
  }
  int dof = 0;
  const double chi = test::chi_square(probs, counts, N, &dof);
  std::printf("[ dflash tree budget 22, sampled ] chi-square %.1f (dof %d, 0.1%% critical %.1f); %s\n", chi, dof,
              test::chi_square_critical_001(dof), metrics.summary().c_str());
  EXPECT_EQ(outside, 0u) << "sequences the target's top-4 never allows were emitted";
  EXPECT_GT(metrics.accepted, N / 20) << "tree nodes must actually be accepted for this test to mean anything";
  EXPECT_LT(chi, test::chi_square_critical_001(dof));
}

// draft_topk (DDTree's per-position top-K: the backend's candidates, the logits left there)
// against the full logits of draft() for the same blocks: the same ids (probability
// descending, ties to the lower id) and the full softmax's probabilities (1e-5 relative: the
// backend may sum the exponentials in f32).
TEST_F(DFlashTest, TopKIsTheFullSoftmaxTopK) {
  DFlashModel m(load_dflash_checkpoint(kDrafter), *model_, *backend_, 2, 64, DFlashOptions{});
  const int64_t F = m.feature_width(), V = model_->config().vocab_size, B = m.block_size();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int32_t lens[2] = {5, 9};
  for (int32_t s = 0; s < 2; ++s) {
    std::vector<float> feats(size_t(lens[s] * F));
    for (float& x : feats) x = nd(rng);
    m.add_context(s, 0, feats);
  }
  const std::vector<DFlashBlock> blocks = {{0, lens[0], 17}, {1, lens[1], 3}};
  const size_t rows = blocks.size() * size_t(B - 1), K = 8;
  std::vector<float> logits(rows * size_t(V)), probs(rows * K);
  std::vector<int32_t> ids(rows * K);
  m.draft(blocks, logits.data());
  m.draft_topk(blocks, int32_t(K), ids.data(), probs.data());
  for (size_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * size_t(V);
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const double mx = row[order[0]];
    double sum = 0;
    for (int64_t t = 0; t < V; ++t) sum += std::exp(double(row[t]) - mx);
    for (size_t j = 0; j < K; ++j) {
      EXPECT_EQ(ids[r * K + j], order[j]) << "row " << r << " candidate " << j;
      const double want = std::exp(double(row[order[j]]) - mx) / sum;
      EXPECT_NEAR(probs[r * K + j], want, 1e-5 * want + 1e-9) << "row " << r << " candidate " << j;
    }
  }
}

}  // namespace
}  // namespace qwen36
