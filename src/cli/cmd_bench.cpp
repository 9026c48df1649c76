// qwen36 bench: llama-bench-like speed measurement with a ceiling ratio on every line.
//
//   qwen36 bench --synthetic qwen3.6-27b --type bf16 --backend cuda -p 512,4096 -n 128 -b 1,8
//
// Tests: ppN = one forward over N prompt tokens (after -d tokens of context); tgN = N decode
// steps; with -b B, B sequences decode together (one ForwardBatch of B one-token runs), and
// the aggregate tok/s is reported. Ceilings, measured in the same run:
//  - decode: bytes read per step (weights actually touched + KV cache + DeltaNet state read
//    and written) × steps/s = GB/s, against the device-to-device copy bandwidth (CUDA) or the
//    host memory read bandwidth (CPU);
//  - prefill: matmul + attention FLOPs / s, against a cuBLAS 8192³ bf16 GEMM (CUDA).
#include <nlohmann/json.hpp>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "format/model_loader.h"
#include "model/presets.h"
#include "model/random_quant_weights.h"
#include "model/random_weights.h"
#include "quant/mix_rules.h"
#ifdef QWEN36_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "model/memory_plan.h"
#endif

namespace qwen36::cli {

namespace {

struct BenchOptions {
  std::string model, synthetic, type = "bf16", backend = "cpu", output = "md", prompts = "512", gens = "128",
                                batches = "1";
  int64_t depth = 0, layers = 0;
  int repeats = 3, threads = 0;
  CacheTypes cache;
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoll(item));
  return v;
}

// What one token (or one decode step) of this model touches.
struct ModelCost {
  double layer_bytes_dense = 0;  // every non-expert layer weight
  double expert_bytes = 0;       // one routed expert (gate + up + down), per layer
  double head_bytes = 0;         // lm_head
  double matmul_params_dense = 0, expert_params = 0, head_params = 0;
  double total_bytes = 0;
};

ModelCost model_cost(const ModelWeights& w) {
  ModelCost c;
  auto add = [&](const Tensor& t, double& bytes, double& params) {
    if (t.empty()) return;
    bytes += double(t.nbytes());
    if (t.ndim == 2) params += double(t.numel());
  };
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.input_norm, &l.post_attention_norm, &l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj,
                            &l.attn.o_proj, &l.attn.q_norm, &l.attn.k_norm, &l.deltanet.in_proj_qkv,
                            &l.deltanet.in_proj_z, &l.deltanet.in_proj_b, &l.deltanet.in_proj_a, &l.deltanet.conv1d,
                            &l.deltanet.dt_bias, &l.deltanet.a_neg_exp, &l.deltanet.norm, &l.deltanet.out_proj,
                            &l.moe.router, &l.moe.shared_gate, &l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj,
                            &l.moe.shared.gate_proj, &l.moe.shared.up_proj, &l.moe.shared.down_proj})
      add(*t, c.layer_bytes_dense, c.matmul_params_dense);
  }
  if (!w.layers.empty() && !w.layers[0].moe.experts.empty()) {
    const MlpWeights& e = w.layers[0].moe.experts[0];
    for (const Tensor* t : {&e.gate_proj, &e.up_proj, &e.down_proj}) add(*t, c.expert_bytes, c.expert_params);
  }
  add(w.lm_head, c.head_bytes, c.head_params);
  c.total_bytes = double(w.total_bytes());
  return c;
}

// Host memory read bandwidth with all threads: the decode ceiling of the CPU backend.
// Sums in f32 with 16 independent accumulators per thread so the loop is bound by memory,
// not by the add latency.
double host_read_bandwidth_gbs() {
  const size_t n = size_t(1) << 28;  // 1 GiB of floats
  std::vector<float> a(n, 1.0f);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      float acc[16] = {};
#pragma omp for schedule(static)
      for (int64_t i = 0; i < int64_t(n / 16); ++i)
        for (int j = 0; j < 16; ++j) acc[j] += a[size_t(i) * 16 + size_t(j)];
      for (float x : acc) total += x;
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (total < 0) std::printf("?");  // keeps the sum alive
    best = std::min(best, t);
  }
  return double(n) * 4 / best / 1e9;
}

struct Stat {
  double mean = 0, sd = 0;
};
Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / double(v.size() - 1)) : 0;
  return s;
}

void run_bench(const BenchOptions& o) {
  QWEN36_CHECK(o.model.empty() != o.synthetic.empty(), "bench: give exactly one of -m MODEL or --synthetic PRESET");
  const bool cuda = o.backend == "cuda";
  std::unique_ptr<Backend> backend;
  double bw_gbs = 0, peak_tflops = 0;
  std::string device;
#ifdef QWEN36_HAVE_CUDA
  if (cuda) {
    backend = make_cuda_backend();
    device = cuda_device_name();
    bw_gbs = cuda_copy_bandwidth_gbs(size_t(1) << 30, 10);
    peak_tflops = cuda_bf16_gemm_tflops(8192, 10);
  }
#else
  QWEN36_CHECK(!cuda, "bench: this build has no CUDA backend");
#endif
  if (!cuda) {
    backend = make_cpu_backend(o.threads);
    device = fmt::format("CPU, {} threads", omp_get_max_threads());
    bw_gbs = host_read_bandwidth_gbs();
  }
  ModelWeights w;
  std::string model_name;
  if (!o.synthetic.empty()) {
    const DType dt = o.type == "bf16" ? DType::BF16 : o.type == "f16" ? DType::F16 : o.type == "f32" ? DType::F32
                                                                                                     : DType::I32;
    const ModelConfig cfg = model_preset(o.synthetic, o.layers);
    if (dt == DType::I32) {  // block-quantized: a mix (CPU, CUDA) or one block type (CUDA)
#ifdef QWEN36_HAVE_CUDA
      if (cuda) w = make_random_quant_weights_cuda(cfg, o.type, 42);
#endif
      if (!cuda) {
        const auto mix = parse_quant_mix(o.type);
        QWEN36_CHECK(mix, "bench: --type {} is not bf16, f16, f32 or a quantization mix (q8_0, q6_k, q5_k_m, q4_k_m, ...)",
                     o.type);
        w = make_random_quant_weights(cfg, *mix, 42);
      }
    } else {
#ifdef QWEN36_HAVE_CUDA
      w = cuda ? make_random_weights_cuda(cfg, dt, 42) : make_random_weights(cfg, dt, 42, false);
#else
      w = make_random_weights(cfg, dt, 42, false);
#endif
    }
    model_name = fmt::format("{} {} (synthetic, random)", o.synthetic, o.type);
  } else {
    w = load_model_weights(o.model);
    model_name = o.model;
  }
  const ModelCost cost = model_cost(w);
  Model model(std::move(w), *backend);
  const ModelConfig& c = model.config();
  const DType kv_type = resolve_cache_type(o.cache, *backend);
  const int64_t n_attn = std::count(c.layer_kinds.begin(), c.layer_kinds.end(), LayerKind::FullAttention);
  const int64_t n_delta = c.n_layers - n_attn;
  const std::vector<int64_t> prompts = parse_list(o.prompts), gens = parse_list(o.gens), batches = parse_list(o.batches);
  // A state per test, sized for it (a 32-slot state of the longest prompt would not fit).
  std::unique_ptr<ModelState> state_ptr;
  auto new_state = [&](int64_t slots, int64_t len) {
    state_ptr.reset();
    MemoryRequest mem;
    mem.slots = int32_t(slots);
    mem.ctx = len;
    mem.batch_tokens = std::max<int64_t>(slots, std::min<int64_t>(len, 4096));
    mem.output_rows = slots;
    mem.kv_type = kv_type;
    check_memory_plan(*backend, c, mem, {"-p/-n/-d", "-b/--batch", "-p", "-ctk/-ctv"});
    state_ptr = std::make_unique<ModelState>(*backend, c, int32_t(slots), len, false, kv_type);
  };
  int64_t max_b = 1;
  for (int64_t b : batches) max_b = std::max(max_b, b);
  std::mt19937 rng(7);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % uint32_t(c.vocab_size));
    return t;
  };
  std::vector<float> logits(size_t(max_b * c.vocab_size));
  auto fill_depth = [&](int32_t slot) {
    state_ptr->reset_slot(slot);
    if (o.depth > 0) model.forward(ForwardBatch::single(random_tokens(o.depth), 0, slot), *state_ptr, logits.data());
  };
  auto sync = [&] {
#ifdef QWEN36_HAVE_CUDA
    if (cuda) cuda_synchronize();
#endif
  };

  nlohmann::json rows = nlohmann::json::array();
  auto report = [&](const std::string& test, int64_t B, const std::vector<double>& tok_s, double ratio_value,
                    const std::string& ratio_unit, double ratio_pct) {
    const Stat s = stat(tok_s);
    rows.push_back({{"model", model_name},
                    {"backend", o.backend},
                    {"device", device},
                    {"test", test},
                    {"batch", B},
                    {"depth", o.depth},
                    {"tok_s_mean", s.mean},
                    {"tok_s_sd", s.sd},
                    {"ceiling_value", ratio_value},
                    {"ceiling_unit", ratio_unit},
                    {"ceiling_pct", ratio_pct},
                    {"hbm_copy_gbs", bw_gbs},
                    {"bf16_peak_tflops", peak_tflops}});
  };

  for (int64_t p : prompts) {
    new_state(1, o.depth + p);
    std::vector<double> v;
    for (int r = 0; r <= o.repeats; ++r) {  // the first run warms up
      fill_depth(0);
      const auto toks = random_tokens(p);
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(ForwardBatch::single(toks, int32_t(o.depth), 0), *state_ptr, logits.data());
      sync();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) v.push_back(double(p) / t);
    }
    // matmul FLOPs per token + causal attention (QKᵀ and PV over the average context) + head once
    const double ctx = double(o.depth) + double(p + 1) / 2;
    const double per_tok = 2 * (cost.matmul_params_dense + double(c.n_experts_per_tok) * cost.expert_params) +
                           double(n_attn) * 4 * ctx * double(c.n_heads * c.head_dim);
    const double flops = per_tok * double(p) + 2 * cost.head_params;
    const double tflops = flops / (double(p) / stat(v).mean) / 1e12;
    report(fmt::format("pp{}", p), 1, v, tflops, "TFLOP/s", peak_tflops > 0 ? 100 * tflops / peak_tflops : 0);
  }
  for (int64_t n : gens)
    for (int64_t B : batches) {
      new_state(B, o.depth + n);
      std::vector<double> v;
      for (int r = 0; r <= o.repeats; ++r) {
        for (int32_t s = 0; s < int32_t(B); ++s) fill_depth(s);
        ForwardBatch fb;
        fb.tokens = random_tokens(B);
        for (int32_t s = 0; s < int32_t(B); ++s) {
          fb.runs.push_back({s, int32_t(o.depth), s, 1});
          fb.output_rows.push_back(s);
        }
        sync();
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < n; ++i) {
          for (auto& run : fb.runs) run.pos0 = int32_t(o.depth + i);
          model.forward(fb, *state_ptr, logits.data());
          for (int32_t s = 0; s < int32_t(B); ++s)  // greedy, on the host
            fb.tokens[size_t(s)] = int32_t(std::max_element(logits.begin() + s * c.vocab_size,
                                                            logits.begin() + (s + 1) * c.vocab_size) -
                                           (logits.begin() + s * c.vocab_size));
        }
        sync();
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) v.push_back(double(n * B) / t);
      }
      // Bytes per step: dense weights + distinct experts (expected, uniform routing) + head,
      // KV of every sequence over its average context, DeltaNet state read and written.
      double experts = 0;
      if (c.moe) {
        const double E = double(c.n_experts), k = double(c.n_experts_per_tok);
        experts = double(c.n_layers) * E * (1 - std::pow(1 - k / E, double(B))) * cost.expert_bytes;
      }
      const double ctx = double(o.depth) + double(n + 1) / 2;
      const double kv = double(B) * double(n_attn) * ctx * double(ModelState::kv_bytes_per_position(c, kv_type));
      const double st = double(B) * double(n_delta) * 2 *
                        double(c.linear_v_heads * c.linear_k_dim * c.linear_v_dim + c.conv_dim() * (c.conv_kernel - 1)) * 4;
      const double bytes = cost.layer_bytes_dense + experts + cost.head_bytes + kv + st;
      const double steps_s = stat(v).mean / double(B);
      const double gbs = bytes * steps_s / 1e9;
      report(fmt::format("tg{}", n), B, v, gbs, "GB/s", 100 * gbs / bw_gbs);
    }

  if (o.output == "json") {
    std::printf("%s\n", rows.dump(2).c_str());
    return;
  }
  if (cuda)
    std::printf("device: %s | copy bandwidth %.0f GB/s | bf16 GEMM peak %.0f TFLOP/s | model %.2f GiB\n\n",
                device.c_str(), bw_gbs, peak_tflops, cost.total_bytes / double(1 << 30));
  else  // no matmul peak is measured on the CPU: prefill lines report TFLOP/s without a ratio
    std::printf("device: %s | memory read bandwidth %.1f GB/s | model %.2f GiB\n\n", device.c_str(), bw_gbs,
                cost.total_bytes / double(1 << 30));
  std::printf("| model | backend | test | batch | depth | t/s | ceiling | %% of ceiling |\n");
  std::printf("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& r : rows) {
    const double pct = r["ceiling_pct"].get<double>();
    const std::string pct_str = pct > 0 ? fmt::format("{:.1f}%", pct) : "n/a";
    std::printf("| %s | %s | %s | %lld | %lld | %.2f ± %.2f | %.1f %s | %s |\n",
                r["model"].get<std::string>().c_str(), r["backend"].get<std::string>().c_str(),
                r["test"].get<std::string>().c_str(), (long long)r["batch"].get<int64_t>(),
                (long long)r["depth"].get<int64_t>(), r["tok_s_mean"].get<double>(), r["tok_s_sd"].get<double>(),
                r["ceiling_value"].get<double>(), r["ceiling_unit"].get<std::string>().c_str(), pct_str.c_str());
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Measure prefill and decode speed (llama-bench-like) with ceiling ratios");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("-m,--model", o->model, "Model: Hugging Face directory or .gguf file");
  cmd->add_option("--synthetic", o->synthetic, "Random weights of a preset: qwen3.6-27b, qwen3.6-35b-a3b, cpu-0.5b, ...");
  cmd->add_option("--type", o->type,
                  "Matrix dtype of synthetic weights: bf16, f16, f32, a quantization mix (q8_0, q6_k, q5_k_m, q4_k_m, "
                  "...; per-tensor types as `quantize` gives them), or with --backend cuda a block type for every "
                  "matrix (q4_k, q5_k, iq4_xs, ...)")
      ->capture_default_str();
  add_cache_type_options(cmd, o->cache);
  cmd->add_option("--layers", o->layers, "Override the synthetic preset's layer count");
  cmd->add_option("-p,--n-prompt", o->prompts, "Prompt lengths, comma-separated (empty: none)")->capture_default_str();
  cmd->add_option("-n,--n-gen", o->gens, "Decode lengths, comma-separated (empty: none)")->capture_default_str();
  cmd->add_option("-b,--batch", o->batches, "Sequences decoding together, comma-separated")->capture_default_str();
  cmd->add_option("-d,--depth", o->depth, "Context tokens before each test")->capture_default_str();
  cmd->add_option("-r,--repeats", o->repeats, "Timed repeats (after one warm-up)")->capture_default_str();
  cmd->add_option("-o,--output", o->output, "md or json")->check(CLI::IsMember({"md", "json"}))->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: all)");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace qwen36::cli
