// Expert offload on the CPU: a model whose routed experts of the first N layers run on a
// second CPU backend (the Model's host backend) must reproduce the single-backend model
// BITWISE — prefill logits of every row, decode steps, a two-sequence batch, greedy
// generation — on a random tiny MoE and the golden MoE fixtures, for N = 0, 1 and all. Bitwise
// because the host path runs the same cpu::moe_experts on the same f32 inputs (copied, not
// recomputed) and adds its output at the same point. Also: the placement flags (--n-cpu-moe,
// --cpu-moe, -ot forms and their one-line errors), --gpu-mem sizes, and the planner's
// choice of N for a synthetic 35B-A3B (arithmetic only), and the CLI end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

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

Trace trace(Model& m, Backend& be) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size;
  Trace t;
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(11);
  for (int32_t& x : prompt) x = int32_t(rng() % uint32_t(V));
  ModelState st(be, c, 2, 48, false);
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
  auto expected = [&](size_t budget) {  // independent closed form: layers are equal-sized
    if (total + plan <= budget) return int32_t(0);
    const size_t over = total + plan - budget;
    const size_t n = (over + experts[0] - 1) / experts[0];
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
