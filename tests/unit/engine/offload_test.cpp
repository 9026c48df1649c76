// Expert offload on the CPU: a model whose routed experts of the first N layers run on a
// second CPU backend (the Model's host backend) must reproduce the single-backend model
// BITWISE — prefill logits of every row, decode steps, a two-sequence batch, greedy
// generation — on a random tiny MoE and the golden MoE fixtures, for N = 0, 1 and all. Bitwise
// because the host path runs the same cpu::moe_experts on the same f32 inputs (copied, not
// recomputed) and adds its output at the same point. The same with the experts streamed to the
// main backend (QWEN36_MOE_STREAM=always; on the CPU an upload is a memcpy), and the cost model
// that chooses streaming. Also: the placement flags (--n-cpu-moe,
// --cpu-moe, -ot forms and their one-line errors), --gpu-mem sizes, and the planner's
// choice of N for a synthetic 35B-A3B (arithmetic only), and the CLI end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>

#include "common/scoped_env.h"
#include "core/error.h"
#include "engine/generate.h"
#include "format/model_loader.h"
#include "model/expert_placement.h"
#include "model/memory_plan.h"
#include "model/presets.h"
#include "model/random_weights.h"

namespace qwen36 {
namespace {

constexpr size_t kGiB = size_t(1) << 30;

// tiny-moe with 4 layers and a 1024-token vocabulary: the preset's 152k vocabulary would
// make every logits row cost more than the whole rest of the model.
ModelConfig tiny_moe() {
  ModelConfig c = model_preset("tiny-moe", 4);
  c.vocab_size = 1024;
  c.validate();
  return c;
}

ModelWeights weights_of(const std::string& name) {
  if (name == "random-moe") return make_random_weights(tiny_moe(), DType::BF16, 5);
  return load_model_weights((std::filesystem::path(QWEN36_TEST_DATA) / "golden" / name).string());
}

struct Trace {
  std::vector<float> prefill, decode, batch;
  std::vector<int32_t> greedy;
};

int32_t argmax(const float* p, int64_t n) { return int32_t(std::max_element(p, p + n) - p); }

Trace trace(Model& m, Backend& be, int32_t prompt_len = 11) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size;
  Trace t;
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
  for (int32_t& x : prompt) x = int32_t(rng() % uint32_t(V));
  ModelState st(be, c, 2, std::max(48, prompt_len + 16), false);
  const int32_t P = int32_t(prompt.size());
  t.prefill.resize(size_t(P * V));
  m.forward(ForwardBatch::single(prompt, 0, 0, true), st, t.prefill.data());
  int32_t tok = argmax(&t.prefill[size_t((P - 1) * V)], V);
  std::vector<float> logits(size_t(2 * V));
  for (int32_t i = 0; i < 3; ++i) {
    const int32_t one[1] = {tok};
    m.forward(ForwardBatch::single(one, P + i, 0), st, logits.data());
    t.decode.insert(t.decode.end(), logits.begin(), logits.begin() + V);
    tok = argmax(logits.data(), V);
  }
  // Slot 1 prefills 5 tokens while slot 0 decodes one: a mixed batch.
  ForwardBatch b;
  b.tokens = {tok, prompt[0], prompt[1], prompt[2], prompt[3], prompt[4]};
  b.runs = {{0, P + 3, 0, 1}, {1, 0, 1, 5}};
  b.output_rows = {0, 5};
  m.forward(b, st, logits.data());
  t.batch = logits;
  GenerateOptions g;
  g.max_tokens = 6;
  t.greedy = generate(m, st, prompt, g, {}, 1).tokens;
  return t;
}

TEST(ExpertOffload, HostExpertsMatchTheSingleBackendBitwise) {
  for (const std::string name : {"random-moe", "moe-shared", "moe-mtp", "moe-top4-tied"}) {
    // One thread each, so that both runs split the work the same way whatever the machine.
    std::unique_ptr<Backend> be = make_cpu_backend(1);
    Model ref(weights_of(name), *be);
    const Trace want = trace(ref, *be);
    const int32_t L = ref.config().n_layers;
    for (const int32_t n : {0, 1, L}) {
      SCOPED_TRACE(name + " --n-cpu-moe " + std::to_string(n));
      PlacementOptions o;
      o.n_cpu_moe = n;
      const ExpertPlacement p = resolve_expert_placement(ref.config(), o);
      EXPECT_EQ(p.count(), n);
      std::unique_ptr<Backend> be2 = make_cpu_backend(1);
      Model m(weights_of(name), *be2, p, /*host_threads=*/1);
      EXPECT_EQ(m.expert_placement().count(), n);
      const Trace got = trace(m, *be2);
      EXPECT_TRUE(got.prefill == want.prefill);
      EXPECT_TRUE(got.decode == want.decode);
      EXPECT_TRUE(got.batch == want.batch);
      EXPECT_EQ(got.greedy, want.greedy);
    }
  }
}

void expect_one_line_error(const std::function<void()>& f, const std::string& has);

// The CPU backend with its uploads counted: every op forwarded, so that results are the CPU
// backend's bit for bit. (An op added to Backend with a default that the CPU backend overrides
// must be forwarded here too.)
class CountingBackend final : public Backend {
 public:
  CountingBackend() : b_(make_cpu_backend(1)) {}
  int64_t uploads = 0, pins = 0;
  size_t upload_bytes = 0, largest_upload = 0;
  // Non-zero: free_memory() says so, as a device backend's would (the Model then copies the
  // host experts into memory it page-locks through this backend).
  size_t device_free = 0;
  // moe_experts calls of one-token passes, by the number of routed experts per token they got.
  std::map<int64_t, int64_t> one_token_moe;

  std::string name() const override { return b_->name(); }
  std::unique_ptr<DeviceBuffer> alloc(size_t n) override { return b_->alloc(n); }
  void copy_to_host(const Tensor& s, void* d) override { b_->copy_to_host(s, d); }
  void copy_from_host(const void* s, Tensor& d) override { b_->copy_from_host(s, d); }
  void fill_zero(Tensor& t) override { b_->fill_zero(t); }
  void copy(const Tensor& s, Tensor& d) override { b_->copy(s, d); }
  void copy_cols(const Tensor& s, int64_t s0, Tensor& d, int64_t d0, int64_t w) override {
    b_->copy_cols(s, s0, d, d0, w);
  }
  void get_rows(const Tensor& s, std::span<const int32_t> r, Tensor& d) override { b_->get_rows(s, r, d); }
  void prepare_weights(ModelWeights& w) override { b_->prepare_weights(w); }
  void prepare_weights_except(ModelWeights& w, const std::set<const Tensor*>& k) override {
    b_->prepare_weights_except(w, k);
  }
  size_t free_memory() override { return device_free ? device_free : b_->free_memory(); }
  // Bytes of the weights this backend says it holds already (resident_bytes).
  size_t resident = 0;
  size_t resident_bytes(ModelWeights&) override { return resident; }
  bool pin_host_memory(const void* p, size_t n, bool device_writes) override {
    ++pins;
    return b_->pin_host_memory(p, n, device_writes);
  }
  void unpin_host_memory(const void* p, size_t n) override { b_->unpin_host_memory(p, n); }
  void upload(const void* s, void* d, size_t n) override {
    ++uploads;
    upload_bytes += n;
    largest_upload = std::max(largest_upload, n);
    b_->upload(s, d, n);
  }
  void embed(const Tensor& t, std::span<const int32_t> ids, Tensor& o) override { b_->embed(t, ids, o); }
  void rms_norm(const Tensor& x, const Tensor& w, float e, Tensor& o) override { b_->rms_norm(x, w, e, o); }
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float e, Tensor& o) override {
    b_->gated_rms_norm(x, z, w, e, o);
  }
  void add(Tensor& y, const Tensor& x) override { b_->add(y, x); }
  void swiglu(const Tensor& g, const Tensor& u, Tensor& o) override { b_->swiglu(g, u, o); }
  void sigmoid_mul(Tensor& x, const Tensor& g) override { b_->sigmoid_mul(x, g); }
  void add_sigmoid_scaled(Tensor& y, const Tensor& x, const Tensor& s) override { b_->add_sigmoid_scaled(y, x, s); }
  void matmul(const Tensor& x, const Tensor& w, Tensor& o) override { b_->matmul(x, w, o); }
  void matmul_multi(const Tensor& x, std::span<const Tensor* const> ws, std::span<Tensor* const> os) override {
    b_->matmul_multi(x, ws, os);
  }
  void matmul_swiglu(const Tensor& x, const Tensor& g, const Tensor& u, Tensor& go, Tensor& uo) override {
    b_->matmul_swiglu(x, g, u, go, uo);
  }
  void mlp(const Tensor& x, const MlpWeights& m, Tensor& g, Tensor& u, Tensor& o) override { b_->mlp(x, m, g, u, o); }
  void add_rms_norm(Tensor& y, const Tensor& d, const Tensor& w, float e, Tensor& o) override {
    b_->add_rms_norm(y, d, w, e, o);
  }
  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& g) override { b_->split_q_gate(qg, q, g); }
  void rope(Tensor& x, std::span<const SeqRun> r, int64_t d, float th) override { b_->rope(x, r, d, th); }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& kc, Tensor& vc, std::span<const SeqRun> r,
                 float sc, Tensor& o) override {
    b_->attention(q, k, v, kc, vc, r, sc, o);
  }
  void causal_conv1d_silu(Tensor& x, const Tensor& w, Tensor& cs, std::span<const SeqRun> r) override {
    b_->causal_conv1d_silu(x, w, cs, r);
  }
  void deltanet_gates(const Tensor& a, const Tensor& b, const Tensor& an, const Tensor& dt, Tensor& g,
                      Tensor& beta) override {
    b_->deltanet_gates(a, b, an, dt, g, beta);
  }
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        Tensor& st, std::span<const SeqRun> r, Tensor& o, DeltaRuleMode m) override {
    b_->gated_delta_rule(q, k, v, g, beta, st, r, o, m);
  }
  void deltanet_decode(Tensor& mx, const Tensor& z, const Tensor& a, const Tensor& b, const DeltaNetWeights& w, float e,
                       Tensor& cs, Tensor& ss, std::span<const SeqRun> r, Tensor& o) override {
    b_->deltanet_decode(mx, z, a, b, w, e, cs, ss, r, o);
  }
  void causal_conv1d_silu_readonly(Tensor& x, const Tensor& w, const Tensor& cs, std::span<const SeqRun> r) override {
    b_->causal_conv1d_silu_readonly(x, w, cs, r);
  }
  void gated_delta_rule_readonly(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                 const Tensor& st, std::span<const SeqRun> r, Tensor& o) override {
    b_->gated_delta_rule_readonly(q, k, v, g, beta, st, r, o);
  }
  void set_batch(std::span<const int32_t> t, std::span<const SeqRun> r, std::span<const int32_t> o) override {
    b_->set_batch(t, r, o);
  }
  void moe_route(const Tensor& l, int64_t k, bool rn, Tensor& w, Tensor& ids) override { b_->moe_route(l, k, rn, w, ids); }
  void moe_local_ids(Tensor& ids, int64_t e0, int64_t n) override { b_->moe_local_ids(ids, e0, n); }
  bool moe_expert_rows(const Tensor& x, const Tensor& ids, std::span<const MlpWeights> e, Tensor& rows) override {
    return b_->moe_expert_rows(x, ids, e, rows);
  }
  void moe_combine_rows(const Tensor& rows, const Tensor& w, const Tensor& ids, int64_t E, const Tensor* sh_row,
                        const Tensor* s, Tensor& o) override {
    b_->moe_combine_rows(rows, w, ids, E, sh_row, s, o);
  }
  int64_t moe_row_pairs() const override { return b_->moe_row_pairs(); }
  void moe_experts(const Tensor& x, const Tensor& w, const Tensor& ids, std::span<const MlpWeights> e,
                   Tensor& o) override {
    if (x.rows() == 1) ++one_token_moe[ids.cols()];
    b_->moe_experts(x, w, ids, e, o);
  }
  void sample_candidates(Tensor& l, std::span<const SampleRowParams> r, std::span<const PenaltyEntry> p, int32_t k,
                         int32_t* ids, float* vals, float* stats) override {
    b_->sample_candidates(l, r, p, k, ids, vals, stats);
  }

 private:
  std::unique_ptr<Backend> b_;
};

// Streaming forced on (QWEN36_MOE_STREAM=always): every pass of a host layer, decode steps
// too, uploads the routed experts into the main backend's staging area and runs moe_experts
// there. With a CPU main backend the upload is a memcpy and moe_experts the same cpu:: op on
// the same bytes, so the logits must equal the single-backend model's BITWISE: prefill of 44
// rows, decode, the mixed batch and greedy generation; and something must have been uploaded,
// each copy no larger than a layer's experts (contiguous experts merge into one copy).
// The main backend says it is a device, so the host experts are first copied into memory it
// page-locks (HostExpertCopy: the same bytes, so still bitwise); then once more with
// QWEN36_MOE_PIN=0 (left in the weights' storage): the same logits, no expert page-locked.
TEST(ExpertOffload, StreamedExpertsMatchTheSingleBackendBitwise) {
  ScopedEnv env("QWEN36_MOE_STREAM", "always");
  ScopedEnv pin_on("QWEN36_MOE_PIN", nullptr);
  for (const std::string name : {"random-moe", "moe-shared", "moe-mtp", "moe-top4-tied"}) {
    std::unique_ptr<Backend> be = make_cpu_backend(1);
    Model ref(weights_of(name), *be);
    const Trace want = trace(ref, *be, 44);
    const int32_t L = ref.config().n_layers;
    const std::vector<size_t> layer_bytes = expert_bytes_per_layer(ref.weights());
    for (const int32_t n : {1, L}) {
      SCOPED_TRACE(name + " streamed, --n-cpu-moe " + std::to_string(n));
      PlacementOptions o;
      o.n_cpu_moe = n;
      CountingBackend be2;
      be2.device_free = 64 * kGiB;
      Model m(weights_of(name), be2, resolve_expert_placement(ref.config(), o), /*host_threads=*/1);
      const Trace got = trace(m, be2, 44);
      EXPECT_TRUE(got.prefill == want.prefill);
      EXPECT_TRUE(got.decode == want.decode);
      EXPECT_TRUE(got.batch == want.batch);
      EXPECT_EQ(got.greedy, want.greedy);
      EXPECT_GT(be2.uploads, 0);
      EXPECT_GT(be2.pins, 0);
      EXPECT_LE(be2.largest_upload, *std::max_element(layer_bytes.begin(), layer_bytes.end()));
    }
  }
  ScopedEnv pin_off("QWEN36_MOE_PIN", "0");
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  Model ref(weights_of("random-moe"), *be);
  const Trace want = trace(ref, *be, 44);
  PlacementOptions o;
  o.n_cpu_moe = ref.config().n_layers;
  CountingBackend be2;
  be2.device_free = 64 * kGiB;
  Model m(weights_of("random-moe"), be2, resolve_expert_placement(ref.config(), o), /*host_threads=*/1);
  const Trace got = trace(m, be2, 44);
  EXPECT_TRUE(got.prefill == want.prefill && got.decode == want.decode && got.batch == want.batch);
  EXPECT_EQ(got.greedy, want.greedy);
  EXPECT_GT(be2.uploads, 0);
  // One range page-locked all the same: the decode passes' routing / sum staging (Model::HostStaging).
  EXPECT_EQ(be2.pins, 1) << "page-locked host experts with QWEN36_MOE_PIN=0";
}

// A share of each decode pass's routed experts on the main backend (QWEN36_MOE_DEVICE_SHARE):
// one-token passes of host layers upload the token's first `share` experts into the staging
// area and run them on the main backend, the host the rest, and the two sums are added — the
// same terms in another order, so the
// logits agree with the single backend's to f32 rounding (not bitwise) and greedy generation
// is the same; passes of more tokens (prefill, the mixed batch) are not split, so bitwise.
TEST(ExpertOffload, DeviceShareOfDecodePassesMatchesTheSingleBackend) {
  for (const std::string name : {"random-moe", "moe-shared", "moe-top4-tied"}) {
    std::unique_ptr<Backend> be = make_cpu_backend(1);
    Model ref(weights_of(name), *be);
    const Trace want = trace(ref, *be, 11);
    const int64_t K = ref.config().n_experts_per_tok;
    for (const int64_t share : {int64_t(1), K - 1}) {
      SCOPED_TRACE(name + ", device share " + std::to_string(share));
      ScopedEnv env("QWEN36_MOE_DEVICE_SHARE", std::to_string(share).c_str());
      PlacementOptions o;
      o.cpu_moe = true;
      CountingBackend be2;
      be2.device_free = 64 * kGiB;  // a device-like main backend: the staging area exists
      Model m(weights_of(name), be2, resolve_expert_placement(ref.config(), o), /*host_threads=*/1);
      const Trace got = trace(m, be2, 11);
      EXPECT_TRUE(got.prefill == want.prefill);
      ASSERT_EQ(got.decode.size(), want.decode.size());
      float scale = 0, worst = 0;
      for (size_t i = 0; i < want.decode.size(); ++i) {
        scale = std::max(scale, std::abs(want.decode[i]));
        worst = std::max(worst, std::abs(want.decode[i] - got.decode[i]));
      }
      EXPECT_LE(worst, 1e-4f * scale) << "decode logits differ by " << worst << " of " << scale;
      EXPECT_EQ(got.greedy, want.greedy);
      // Every one-token pass of a host layer split: `share` experts on the main backend (its
      // weights uploaded), the rest on the host backend (not counted here).
      EXPECT_GT(be2.one_token_moe[share], 0);
      EXPECT_EQ(be2.one_token_moe.size(), size_t(1));
      EXPECT_GT(be2.uploads, 0);
    }
  }
  ScopedEnv bad("QWEN36_MOE_DEVICE_SHARE", "two");
  expect_one_line_error([] { expert_stream_cost(); }, "QWEN36_MOE_DEVICE_SHARE");
}

// QWEN36_MOE_STREAM unset (auto) with a host main backend: nothing streams (an upload would
// copy host memory to host memory), and the logits are the single backend's as before.
TEST(ExpertOffload, AutoNeverStreamsToAHostBackend) {
  ScopedEnv env("QWEN36_MOE_STREAM", "auto");
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  Model ref(weights_of("random-moe"), *be);
  const Trace want = trace(ref, *be, 44);
  PlacementOptions o;
  o.cpu_moe = true;
  CountingBackend be2;
  Model m(weights_of("random-moe"), be2, resolve_expert_placement(ref.config(), o), 1);
  const Trace got = trace(m, be2, 44);
  EXPECT_TRUE(got.prefill == want.prefill);
  EXPECT_EQ(got.greedy, want.greedy);
  EXPECT_EQ(be2.uploads, 0);
}

// The auto choice for 35B-A3B Q4_K_M (~0.45 GiB of experts a layer, top-8 of 256, I = 512,
// H = 2048) with the default rates: decode and small batches stay on the host, a prefill chunk
// of 512 or 4096 tokens streams; pageable copies move the break-even up; min_tokens is a floor.
TEST(ExpertOffload, StreamCostPicksHostForDecodeAndStreamForPrefill) {
  const ModelConfig c = model_preset("qwen3.6-35b-a3b");
  const size_t layer = estimate_expert_bytes(c, 4.85)[0];
  const ExpertStreamCost cost;
  auto work = [&](int64_t T, bool pinned = true) {
    ExpertPassWork w;
    w.tokens = T;
    w.k = c.n_experts_per_tok;
    w.intermediate = c.moe_intermediate_size;
    w.hidden = c.hidden_size;
    w.upload_bytes = expected_touched_bytes(layer, T, c.n_experts_per_tok, c.n_experts);
    w.pinned = pinned;
    return w;
  };
  EXPECT_EQ(expected_touched_bytes(layer, 1, 8, 256), layer / 32);
  EXPECT_GT(expected_touched_bytes(layer, 4096, 8, 256), layer - layer / 1000);
  for (const int64_t T : {1, 2, 8, 16, 31}) EXPECT_FALSE(stream_experts_faster(work(T), cost)) << T;
  for (const int64_t T : {512, 1024, 4096}) EXPECT_TRUE(stream_experts_faster(work(T), cost)) << T;
  // The break-even: the first T that streams, pinned and pageable.
  auto first = [&](bool pinned) {
    int64_t T = 1;
    while (T < 100000 && !stream_experts_faster(work(T, pinned), cost)) ++T;
    return T;
  };
  const int64_t pinned = first(true), pageable = first(false);
  EXPECT_GE(pinned, cost.min_tokens);
  EXPECT_LT(pinned, 512);
  EXPECT_GT(pageable, pinned);
  // Below min_tokens nothing streams, however slow the host.
  ExpertStreamCost slow_host = cost;
  slow_host.host_flops = 1e6;
  EXPECT_FALSE(stream_experts_faster(work(cost.min_tokens - 1), slow_host));
  EXPECT_TRUE(stream_experts_faster(work(cost.min_tokens), slow_host));
  // The environment's mode and rate overrides.
  {
    ScopedEnv env("QWEN36_MOE_STREAM", "never");
    EXPECT_EQ(expert_stream_mode(), ExpertStreamMode::Never);
  }
  {
    ScopedEnv env("QWEN36_MOE_STREAM", "always");
    EXPECT_EQ(expert_stream_mode(), ExpertStreamMode::Always);
  }
  {
    ScopedEnv env("QWEN36_MOE_STREAM", "sometimes");
    expect_one_line_error([] { expert_stream_mode(); }, "QWEN36_MOE_STREAM");
  }
  {
    ScopedEnv env("QWEN36_MOE_HOST_GFLOPS", "2000");
    EXPECT_EQ(expert_stream_cost().host_flops, 2e12);
  }
}

ExpertPlacement place(const PlacementOptions& o) { return resolve_expert_placement(model_preset("qwen3.6-35b-a3b"), o); }

TEST(ExpertOffload, PlacementFlags) {
  PlacementOptions o;
  EXPECT_FALSE(place(o).any());
  o.n_cpu_moe = 20;
  ExpertPlacement p = place(o);
  EXPECT_EQ(p.count(), 20);
  EXPECT_TRUE(p.host[0] && p.host[19] && !p.host[20]);
  EXPECT_NE(p.describe().find("layers 0-19"), std::string::npos) << p.describe();
  o.n_cpu_moe = 99;  // more than the layers: all
  EXPECT_EQ(place(o).count(), 40);
  o = {};
  o.cpu_moe = true;
  EXPECT_EQ(place(o).count(), 40);
  for (const char* spec : {"exps=CPU", "ffn_.*_exps=cpu", "mlp.experts=cpu", "\\.experts\\.=Cpu"}) {
    o = {};
    o.override_tensor = {spec};
    EXPECT_EQ(place(o).count(), 40) << spec;
  }
  o = {};
  o.override_tensor = {"blk\\.(1|3)\\.ffn_down_exps=cpu"};  // any of a layer's expert tensors moves the layer
  p = place(o);
  EXPECT_EQ(p.count(), 2);
  EXPECT_TRUE(p.host[1] && p.host[3]);
  // Rules come first, in order; unmatched layers follow --cpu-moe / --n-cpu-moe.
  o = {};
  o.cpu_moe = true;
  o.override_tensor = {"blk\\.0\\.=cuda,blk\\.[0-9]\\.=cpu"};
  p = place(o);
  EXPECT_FALSE(p.host[0]);
  EXPECT_EQ(p.count(), 39);
  o = {};
  o.override_tensor = {"shexp=cpu", "attn=cpu"};  // shared experts and other tensors never move
  EXPECT_FALSE(place(o).any());
}

void expect_one_line_error(const std::function<void()>& f, const std::string& has) {
  try {
    f();
    ADD_FAILURE() << "no error; wanted one mentioning " << has;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(has), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(ExpertOffload, FlagErrorsAreOneLine) {
  expect_one_line_error([] { parse_override_tensor("exps"); }, "REGEX=DEVICE");
  expect_one_line_error([] { parse_override_tensor("[exps=cpu"); }, "bad regular expression");
  expect_one_line_error([] { parse_override_tensor("exps=tpu"); }, "unknown device \"tpu\"");
  expect_one_line_error(
      [] {
        PlacementOptions o;
        o.cpu_moe = true;
        resolve_expert_placement(model_preset("qwen3.6-27b"), o);
      },
      "dense");
  expect_one_line_error([] { parse_byte_size("lots", "--gpu-mem"); }, "--gpu-mem");
  expect_one_line_error([] { parse_byte_size("24XB", "--gpu-mem"); }, "--gpu-mem");
  EXPECT_EQ(parse_byte_size("24GiB", "--gpu-mem"), 24 * kGiB);
  EXPECT_EQ(parse_byte_size("16G", "--gpu-mem"), 16 * kGiB);
  EXPECT_EQ(parse_byte_size("512mib", "--gpu-mem"), 512u << 20);
  EXPECT_EQ(parse_byte_size("1.5GiB", "--gpu-mem"), 3 * kGiB / 2);
}

// 35B-A3B at ~4.85 bits per expert weight (Q4_K gate/up, some Q6_K down): 3 × 256 × 512 ×
// 2048 weights a layer ≈ 0.455 GiB, 40 layers ≈ 18.2 GiB; plus 2 GiB of other weights.
TEST(ExpertOffload, PlannerChoosesTheSmallestN) {
  const ModelConfig c = model_preset("qwen3.6-35b-a3b");
  const std::vector<size_t> experts = estimate_expert_bytes(c, 4.85);
  ASSERT_EQ(experts.size(), 40u);
  EXPECT_EQ(experts[0], size_t(3.0 * 256 * 512 * 2048 * 4.85 / 8));
  size_t all = 0;
  for (size_t b : experts) all += b;
  const size_t total = all + 2 * kGiB;
  MemoryRequest r;
  r.ctx = 32768;
  r.kv_type = DType::BF16;
  const size_t plan = plan_memory(c, r).total();
  // Independent closed form: layers are equal-sized, and any host layer adds the staging area
  // that streaming uploads one layer's experts into (a layer plus the alignment slack).
  const size_t staging = experts[0] + kExpertStagingSlack;
  auto expected = [&](size_t budget) {
    if (total + plan <= budget) return int32_t(0);
    const size_t over = total + plan - budget;
    const size_t n = (over + staging + experts[0] - 1) / experts[0];
    return n <= experts.size() ? int32_t(n) : int32_t(-1);
  };
  for (const size_t budget : {80 * kGiB, 24 * kGiB, 16 * kGiB, 12 * kGiB, 8 * kGiB, 3 * kGiB}) {
    const int32_t n = fit_n_cpu_moe(budget, total, experts, plan);
    EXPECT_EQ(n, expected(budget)) << budget / kGiB << " GiB";
    if (n > 0) {  // N fits, N - 1 does not
      std::vector<bool> host(40, false);
      for (int32_t i = 0; i < n; ++i) host[size_t(i)] = true;
      EXPECT_LE(split_weights(total, experts, host).device + plan, budget);
      host[size_t(n - 1)] = false;
      EXPECT_GT(split_weights(total, experts, host).device + plan, budget);
    }
  }
  EXPECT_EQ(fit_n_cpu_moe(24 * kGiB, total, experts, plan), 0);  // 20.2 GiB + caches fit a 24 GiB card
  const int32_t n16 = fit_n_cpu_moe(16 * kGiB, total, experts, plan);
  EXPECT_GT(n16, 5);
  EXPECT_LT(n16, 20);
  EXPECT_EQ(fit_n_cpu_moe(2 * kGiB, total, experts, plan), -1);  // the other weights alone do not fit
  std::vector<bool> host(40, false);
  EXPECT_EQ(split_weights(total, experts, host).staging, 0u);
  host[3] = true;
  EXPECT_EQ(split_weights(total, experts, host).staging, staging);
  EXPECT_EQ(split_weights(total, experts, host).device, total - experts[3] + staging);
  ScopedEnv never("QWEN36_MOE_STREAM", "never");  // no streaming: no staging area
  EXPECT_EQ(split_weights(total, experts, host).staging, 0u);
}

// The CLI: `run` prints the same tokens with --cpu-moe and with -ot as without; --fit under a
// large --gpu-mem keeps every expert on the device; a budget nothing fits and a bad -ot are
// one-line errors.
std::string sh(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  *rc = p ? pclose(p) : -1;
  return out;
}

// The memory the load-time fit check (cli::make_model) offers a model: the backend's free memory
// plus the bytes of the model it holds already (random weights made on a device, which free
// memory no longer counts); nothing on a backend that reports no free memory (host).
TEST(ExpertOffload, MemoryForWeightsCountsResidentWeights) {
  CountingBackend b;
  ModelWeights w = make_random_weights(model_preset("tiny-moe"), DType::F32, 7);
  EXPECT_EQ(memory_for_weights(b, w), 0u);  // a host backend: not tracked
  b.resident = w.total_bytes();
  EXPECT_EQ(memory_for_weights(b, w), 0u);
  b.device_free = size_t(3) << 20;
  EXPECT_EQ(memory_for_weights(b, w), (size_t(3) << 20) + w.total_bytes());
  b.resident = 0;
  EXPECT_EQ(memory_for_weights(b, w), size_t(3) << 20);
}

TEST(ExpertOffload, CommandLine) {
  if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
  const std::string model = (std::filesystem::path(QWEN36_TEST_DATA) / "golden" / "moe-shared").string();
  const std::string base =
      std::string(QWEN36_BIN) + " run -m " + model + " --tokens 5,6,7,8 -n 6 --ignore-eos -t 1 --temp 0 -c 64";
  int rc = 0;
  const std::string ref = sh(base + " 2>/dev/null", &rc);  // stdout: the generated ids
  ASSERT_EQ(rc, 0) << ref;
  ASSERT_FALSE(ref.empty());
  const std::string log = sh(base + " --cpu-moe 2>&1 >/dev/null", &rc);
  EXPECT_NE(log.find("expert offload: routed experts of"), std::string::npos) << log;
  EXPECT_EQ(sh(base + " --cpu-moe 2>/dev/null", &rc), ref);
  EXPECT_EQ(sh(base + " -ncmoe 1 2>/dev/null", &rc), ref);
  EXPECT_EQ(sh(base + " -ot 'blk\\.1\\.=cpu' 2>/dev/null", &rc), ref);
  const std::string fit = sh(base + " --gpu-mem 64GiB --fit 2>&1", &rc);
  EXPECT_EQ(rc, 0) << fit;
  EXPECT_NE(fit.find("--fit: --n-cpu-moe 0"), std::string::npos) << fit;
  const std::string tiny = sh(base + " --gpu-mem 1KiB --fit 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(tiny.find("even with every routed expert on the host"), std::string::npos) << tiny;
  const std::string bad = sh(base + " -ot exps=tpu 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("error: --override-tensor \"exps=tpu\": unknown device \"tpu\""), std::string::npos) << bad;
}

}  // namespace
}  // namespace qwen36
