// qwen36 bench: llama-bench-like speed measurement with a ceiling ratio on every line.
//
//   qwen36 bench --synthetic qwen3.6-27b --type bf16 --backend cuda -p 512,4096 -n 128 -b 1,8
//
// Tests: ppN = one forward over N prompt tokens (after -d tokens of context); tgN = N greedy
// decode steps as `qwen36 run` takes them (Model::decode_greedy); with -b B, B sequences decode
// together (B one-token runs a step), and the aggregate tok/s is reported. Ceilings, measured in the same run:
//  - decode: bytes read per step (weights actually touched + KV cache + DeltaNet state read
//    and written) × steps/s = GB/s, against the device-to-device copy bandwidth (CUDA) or the
//    host memory read bandwidth (CPU);
//  - prefill: matmul + attention FLOPs / s, against a cuBLAS 8192³ bf16 GEMM (CUDA).
//
// Speculative decoding (--spec mtp|ngram --spec-draft-n K,...): every tgN × batch also runs
// spec_generate_batch greedily, first without drafts (the baseline: same loop, same sampler
// work) and then once per K; lines report tok/s, the speed-up over that baseline and the mean
// accepted length, and the ceiling uses the bytes of one target verify pass × passes/s.
// --simulate-acceptance p1,p2,... replaces only the accept decision (SpecOptions::
// accept_override, fixed seed): drafting, the verify forward and the commit of the accepted
// prefix run as in a real round, so its figures show what a given acceptance would buy; every
// such line says "simulated".
//
// --spec dflash: a DFlash block drafter (--draft-model DIR, or by default a random drafter of
// the published shape for the target, model/dflash.h synthetic_dflash_config: 5 layers,
// 1.73 B parameters for qwen3.6-27b) drafts min(k, B − 1) tokens a round from one block pass
// (--block-size B, default 16), conditioned on the target's captured layer outputs as in a
// real run. --simulate-accept-length L picks, for each k, the one per-position probability p
// with 1 + p + p² + … + p^k = L (the mean accepted length: tokens per verify pass), e.g.
//   qwen36 bench --synthetic qwen3.6-27b --type q4_k_m --backend cuda -p '' -n 128 -b 1
//     --spec dflash --spec-draft-n 15 --simulate-accept-length 6
// (at k = 15, p = 0.8445; `--simulate-acceptance 1,1,1,1,1,0` gives exactly 6 every round).
// With --tree-budget N (DDTree) and simulated acceptance the tree is built from the drafter's
// top-K tokens with probabilities calibrated to the simulated rates (engine/spec/draft_tree.h
// calibrated_positions; its lines say "confidence simulated"): the random drafter's own, near
// flat, would spend the budget on siblings the simulated walk never takes.
#include <nlohmann/json.hpp>
#include <omp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "cli/bench_model.h"
#include "cli/tp_cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/spec_bench.h"
#include "model/memory_plan.h"
#ifdef QWEN36_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace qwen36::cli {

namespace {

struct BenchOptions {
  std::string model, synthetic, type = "bf16", backend = "cpu", output = "md", prompts = "512", gens = "128",
                                batches = "1";
  int64_t depth = 0, layers = 0;
  int repeats = 3, threads = 0;
  CacheTypes cache;
  std::string spec = "none", spec_draft_n = "3", simulate;  // speculative decoding
  double simulate_len = 0;                                   // --simulate-accept-length
  std::string draft_model;                                   // dflash: a checkpoint (empty: random)
  int32_t block_size = 16;                                   // dflash
  int32_t tree_budget = 0;                                   // dflash: DDTree drafts per round
  TpCliOptions tp;
  OffloadOptions offload;                                    // expert offload
};

// -p / -n: lengths ≥ 0, where 0 runs no test (llama-bench's `-n 0`).
std::vector<int64_t> parse_lengths(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  for (int64_t n : parse_int_list(s, flag)) {
    QWEN36_CHECK(n >= 0, "bench: {} takes lengths ≥ 0 (0: no such test), got {}", flag, n);
    if (n > 0) v.push_back(n);
  }
  return v;
}

std::string join(const std::string& list) {  // "0.9, 0.8" -> "0.9,0.8" for labels
  std::string r;
  for (char ch : list)
    if (ch != ' ') r += ch;
  return r;
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
  const SpecMethod spec_method = parse_spec_method(o.spec);
  const bool sim_len = o.simulate_len > 0;
  const bool simulated = !o.simulate.empty() || sim_len;
  QWEN36_CHECK(!simulated || spec_method != SpecMethod::None,
               "--simulate-acceptance / --simulate-accept-length need --spec mtp, ngram or dflash");
  const std::vector<double> sim_probs = !o.simulate.empty() ? parse_accept_probs(o.simulate) : std::vector<double>{};
  const std::vector<int64_t> spec_ks = parse_int_list(o.spec_draft_n, "--spec-draft-n");
  // The tests' lists, checked before anything loads.
  const std::vector<int64_t> prompts = parse_lengths(o.prompts, "-p"), gens = parse_lengths(o.gens, "-n"),
                             batches = parse_int_list(o.batches, "-b");
  QWEN36_CHECK(!batches.empty(), "bench: -b takes batch sizes, e.g. 1,4,16");
  for (int64_t b : batches) QWEN36_CHECK(b >= 1 && b <= 4096, "bench: -b {} is outside 1..4096 sequences", b);
  for (int64_t k : spec_ks) QWEN36_CHECK(k >= 1 && k <= 16, "--spec-draft-n {} is out of range (1..16)", k);
  const bool dflash_spec = spec_method == SpecMethod::Dflash;
  QWEN36_CHECK(!dflash_spec || (o.block_size >= 2 && o.block_size <= 17), "--block-size {} is outside 2..17",
               o.block_size);
  for (int64_t k : spec_ks)
    QWEN36_CHECK(!dflash_spec || k < o.block_size, "--spec-draft-n {}: a DFlash block of {} drafts at most {}", k,
                 o.block_size, o.block_size - 1);
  for (int64_t k : spec_ks)
    if (sim_len) accept_prob_for_length(o.simulate_len, k);  // an impossible length fails before the model loads
  QWEN36_CHECK(o.tree_budget == 0 || dflash_spec, "--tree-budget needs --spec dflash");
  const DType state_type = resolve_state_type(o.cache);
  BenchDevice dev = make_bench_device(o.backend, o.threads, "bench");
  const bool cuda = dev.cuda;
  std::unique_ptr<Backend> backend = std::move(dev.backend);
  const std::string device = dev.name;
  double bw_gbs = 0, peak_tflops = 0;
#ifdef QWEN36_HAVE_CUDA
  if (cuda) {
    bw_gbs = cuda_copy_bandwidth_gbs(size_t(1) << 30, 10);
    peak_tflops = cuda_bf16_gemm_tflops(8192, 10);
  }
#endif
  if (!cuda) bw_gbs = host_read_bandwidth_gbs();
  std::string model_name;
  std::unique_ptr<Model> model_ptr;
  if (o.tp.ranks > 1) {
    const TpWeightsSource src{o.model, o.synthetic, o.type, o.layers, /*per_rank_random=*/true};
    model_ptr = load_tp_bench_model(o.tp, src, backend, o.backend, o.threads, &model_name);
  } else {
    // Expert offload needs host weights to leave on the host: synthetic ones are then made on
    // the host (slower to generate) and uploaded, rather than generated on the device.
    const bool offload = !o.offload.placement.empty() || o.offload.fit || !o.offload.gpu_mem.empty();
    BenchWeights bw = load_bench_weights({o.model, o.synthetic, o.type, o.layers, spec_method == SpecMethod::Mtp},
                                        cuda && !offload, "bench");
    model_name = bw.name;
    // --fit leaves room for the largest test's state, as new_state below sizes it: a prompt
    // test is one sequence of depth + p, a decode test b sequences of depth + n (+ drafts).
    OffloadOptions off = o.offload;
    MemoryRequest pre, dec;
    for (int64_t p : prompts) pre.ctx = std::max(pre.ctx, std::max<int64_t>(1, o.depth) + p);
    pre.batch_tokens = std::min<int64_t>(std::max<int64_t>(pre.ctx, 1), 4096);
    for (int64_t n : gens) dec.ctx = std::max(dec.ctx, std::max<int64_t>(1, o.depth) + n + 24);
    for (int64_t b : batches) dec.slots = std::max<int32_t>(dec.slots, int32_t(b));
    const int64_t rows = spec_method == SpecMethod::None ? 1 : 17;  // a verify pass: up to 16 drafts + 1
    dec.batch_tokens = std::max<int64_t>(dec.slots * rows, std::min<int64_t>(dec.ctx, 4096));
    dec.output_rows = dec.slots * rows;
    pre.kv_type = dec.kv_type = resolve_cache_type(o.cache, *backend);
    pre.state_type = dec.state_type = state_type;
    pre.mtp = dec.mtp = spec_method == SpecMethod::Mtp;
    off.plan = plan_memory(bw.weights.config, pre).total() >= plan_memory(bw.weights.config, dec).total() ? pre : dec;
    model_ptr = make_model(std::move(bw.weights), *backend, off, o.threads);
  }
  Model& model = *model_ptr;
  const ModelCost cost = model_cost(model.weights());  // with -tp: rank 0's shard, what one GPU reads
  const ModelConfig& c = model.config();
  QWEN36_CHECK(!dflash_spec || o.tp.ranks <= 1, "bench --spec dflash does not run with tensor parallelism yet");
  QWEN36_CHECK(spec_method != SpecMethod::Mtp || simulated || model.has_mtp(),
               "bench --spec mtp: {} has no MTP head to draft with (--simulate-acceptance times the verify path with a "
               "stand-in drafter instead)",
               o.synthetic.empty() ? o.model : "this synthetic model");
  const DType kv_type = resolve_cache_type(o.cache, *backend);
  const int64_t n_attn = std::count(c.layer_kinds.begin(), c.layer_kinds.end(), LayerKind::FullAttention);
  // A state per test, sized for it (a 32-slot state of the longest prompt would not fit).
  std::unique_ptr<ModelState> state_ptr;
  // rows: tokens of the widest decode pass per slot (k + 1 when verifying k drafts).
  auto new_state = [&](int64_t slots, int64_t len, bool mtp = false, int64_t rows = 1) {
    state_ptr.reset();
    MemoryRequest mem;
    mem.slots = int32_t(slots);
    mem.ctx = len;
    mem.batch_tokens = std::max<int64_t>(slots * rows, std::min<int64_t>(len, 4096));
    mem.output_rows = slots * rows;
    mem.kv_type = kv_type;
    mem.state_type = state_type;
    mem.mtp = mtp;
    check_memory_plan(*backend, c, mem, {"-p/-n/-d", "-b/--batch", "-p", "-ctk/-ctv"});
    state_ptr = std::make_unique<ModelState>(*backend, c, int32_t(slots), len, mtp, kv_type, state_type);
  };
  int64_t max_b = 1, max_n = 0;
  for (int64_t b : batches) max_b = std::max(max_b, b);
  for (int64_t n : gens) max_n = std::max(max_n, n);
  // One DFlash drafter for every spec test (its weights are made or loaded once): caches for
  // the widest batch and the longest test (prompt + decode + a round's drafts).
  BenchDFlash dflash;
  if (dflash_spec && !gens.empty())
    dflash = load_bench_dflash(o.draft_model, model, *backend, int32_t(max_b),
                               std::max<int64_t>(1, o.depth) + max_n + 24 + o.tree_budget, o.block_size,
                               o.tree_budget > 0 ? kTreeTopK : 0);
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
                    const std::string& ratio_unit, double ratio_pct) -> nlohmann::json& {
    const Stat s = stat(tok_s);
    return rows.emplace_back(nlohmann::json{{"model", model_name},
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
                    {"bf16_peak_tflops", peak_tflops},
                    {"simulated", false}});  // spec lines of --simulate-acceptance set it
  };
  // Bytes one decode pass reads and writes: dense weights + distinct experts (expected,
  // uniform routing over `tokens` rows) + head, KV of every sequence over its average
  // context, DeltaNet state read and written.
  auto step_bytes = [&](int64_t B, int64_t tokens, int64_t n) {
    double experts = 0;
    if (c.moe) {
      const double E = double(c.n_experts), k = double(c.n_experts_per_tok);
      experts = double(c.n_layers) * E * (1 - std::pow(1 - k / E, double(tokens))) * cost.expert_bytes;
    }
    const double ctx = double(o.depth) + double(n + 1) / 2;
    const double kv = double(B) * double(n_attn) * ctx * double(ModelState::kv_bytes_per_position(c, kv_type));
    const double st = double(B) * 2 * double(ModelState::state_bytes_per_slot(c, state_type));
    return cost.layer_bytes_dense + experts + cost.head_bytes + kv + st;
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
        const std::vector<int32_t> first = random_tokens(B);
        std::vector<SeqRun> runs;
        for (int32_t s = 0; s < int32_t(B); ++s) runs.push_back({s, int32_t(o.depth), s, 1});
        // Greedy as `qwen36 run` decodes (Model::decode_greedy): each step's argmax stays on the
        // backend for the next step, and the host reads it one step behind.
        int64_t steps_seen = 0;
        sync();
        const auto t0 = std::chrono::steady_clock::now();
        model.decode_greedy(first, runs, *state_ptr, n, [&](int64_t, std::span<const int32_t>) {
          ++steps_seen;
          return true;
        });
        sync();
        QWEN36_CHECK(steps_seen == n, "bench: {} of {} decode steps reported", steps_seen, n);
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) v.push_back(double(n * B) / t);
      }
      const double bytes = step_bytes(B, B, n);
      const double steps_s = stat(v).mean / double(B);
      const double gbs = bytes * steps_s / 1e9;
      report(fmt::format("tg{}", n), B, v, gbs, "GB/s", 100 * gbs / bw_gbs);
    }

  // Speculative decoding: per tgN × batch, the baseline (no drafts), then each k.
  if (spec_method != SpecMethod::None)
    for (int64_t n : gens)
      for (int64_t B : batches) {
        const int64_t P = std::max<int64_t>(1, o.depth);  // the prompt stands in for -d context
        // One timed configuration (k = 0: the baseline); returns its row.
        auto time_spec = [&](int64_t k) -> nlohmann::json& {
          const int64_t tree = k > 0 ? o.tree_budget : 0;
          new_state(B, P + n + std::max(k, tree) + 4, k > 0 && spec_method == SpecMethod::Mtp && model.has_mtp(),
                    std::max(k, tree) + 1);
          SpecOptions so;
          so.method = spec_method;
          so.draft_n = int32_t(std::max<int64_t>(k, 1));
          so.tree_budget = int32_t(tree);
          std::unique_ptr<Drafter> owned;
          Drafter* drafter = nullptr;
          if (k > 0 && dflash_spec) {
            drafter = dflash.drafter.get();
          } else if (k > 0) {
            owned = simulated && !model.has_mtp() && spec_method == SpecMethod::Mtp
                        ? std::make_unique<RepeatDrafter>()
                        : make_drafter(spec_method, model, *state_ptr, so.ngram);
            drafter = owned.get();
          }
          // --simulate-accept-length: one probability per position, solved for this k.
          const std::vector<double> probs = sim_len && k > 0 ? std::vector<double>{accept_prob_for_length(o.simulate_len, k)}
                                                             : sim_probs;
          SimulatedAcceptance sim(probs.empty() ? std::vector<double>{0} : probs);
          if (k > 0 && simulated) so.accept_override = sim.callback();
          // A tree's shape comes from the drafter's confidence: simulated as calibrated to the
          // simulated rates (calibrated_positions), not the random drafter's flat top-K.
          so.simulated_confidence = k > 0 && simulated && tree > 0 ? probs : std::vector<double>{};
          std::vector<double> v;
          SpecMetrics metrics;
          SpecPhases phases;
          double passes_s = 0;
          for (int r = 0; r <= o.repeats; ++r) {
            std::vector<std::vector<int32_t>> texts;
            for (int64_t b = 0; b < B; ++b) texts.push_back(random_tokens(P));
            sync();
            const SpecBenchRun run = spec_bench_run(model, *state_ptr, texts, int32_t(n + 1), so, drafter);
            if (r == 0) continue;  // warm-up
            v.push_back(run.tok_s());
            metrics.merge(run.metrics);
            phases.add(run.phases);
            if (run.decode_seconds > 0) passes_s += double(run.target_passes) / run.decode_seconds / o.repeats;
          }
          const int64_t rows_per_pass = B * (k + 1);
          const double gbs = step_bytes(B, rows_per_pass, n) * passes_s / 1e9;
          std::string test = fmt::format("tg{} spec {}", n, k > 0 ? fmt::format("{} k={}", o.spec, k) : "none (baseline)");
          const std::string drafts = dflash_spec ? fmt::format("{}, block {}{}", dflash.label, o.block_size,
                                                               tree ? fmt::format(", tree budget {}{}", tree,
                                                                                  simulated ? ", confidence simulated" : "")
                                                                    : "")
                                     : drafter && drafter->name() == std::string("mtp") ? "mtp head"
                                     : drafter                                          ? drafter->name()
                                                                                        : "";
          if (k > 0 && simulated && sim_len)
            test += fmt::format(" (simulated accept length {} = acceptance {:.4f} per position; drafts: {})",
                                o.simulate_len, probs.front(), drafts);
          else if (k > 0 && simulated)
            test += fmt::format(" (simulated acceptance {}; drafts: {})", join(o.simulate), drafts);
          else if (k > 0 && dflash_spec)
            test += fmt::format(" (drafts: {})", drafts);
          nlohmann::json& row = report(test, B, v, gbs, "GB/s", 100 * gbs / bw_gbs);
          row["spec_method"] = k > 0 ? o.spec : "none";
          row["spec_k"] = k;
          row["simulated"] = k > 0 && simulated;
          if (k > 0) {
            row["drafter"] = drafter->name();
            row["mean_accepted_length"] = metrics.mean_accepted_length();
            row["acceptance_rate"] = metrics.acceptance_rate();
            // Conditional (P(accept i | 0..i-1 accepted)) where simulated; else per depth.
            row["acceptance_per_position"] = simulated ? sim.rates() : metrics.acceptance_per_position();
            if (simulated) row["simulated_acceptance"] = probs;
            if (sim_len) row["simulated_accept_length"] = o.simulate_len;
          }
          // Where a round's time goes (every config, the baseline's rounds too): in the JSON row,
          // and for the table on stderr (a JSON reader may take both streams as one).
          const double per = 1e3 / double(std::max<int64_t>(phases.rounds, 1));
          row["round_ms"] = {{"draft", phases.draft * per},   {"tree", phases.tree * per},
                             {"verify", phases.verify * per}, {"accept", phases.accept * per},
                             {"commit", phases.commit * per}};
          if (o.output != "json") spdlog::info("{}: {}", test, phases.summary());
          return row;
        };
        const double base = time_spec(0)["tok_s_mean"].get<double>();
        for (int64_t k : spec_ks) {
          nlohmann::json& row = time_spec(k);
          row["baseline_tok_s"] = base;
          row["speedup"] = base > 0 ? row["tok_s_mean"].get<double>() / base : 0;
        }
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
  if (spec_method == SpecMethod::None) return;
  std::printf("\nspeculative decoding (greedy; speed-up over the baseline line of the same tgN and batch)%s\n\n",
              simulated ? "; SIMULATED acceptance: accept decisions drawn at the given conditional per-position "
                          "rates, not the model's"
                        : "");
  std::printf("| test | batch | k | t/s | speed-up | mean accepted length | acceptance by position |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
  for (const auto& r : rows) {
    if (!r.contains("speedup")) continue;
    std::string per;
    for (double a : r["acceptance_per_position"]) per += fmt::format("{}{:.2f}", per.empty() ? "" : " ", a);
    std::printf("| %s | %lld | %lld | %.2f | %.2fx | %.2f | %s%s |\n", r["test"].get<std::string>().c_str(),
                (long long)r["batch"].get<int64_t>(), (long long)r["spec_k"].get<int64_t>(),
                r["tok_s_mean"].get<double>(), r["speedup"].get<double>(), r["mean_accepted_length"].get<double>(),
                per.c_str(), r["simulated"].get<bool>() ? " (simulated, conditional)" : "");
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
  add_offload_options(cmd, o->offload);
  cmd->add_option("--layers", o->layers, "Override the synthetic preset's layer count");
  cmd->add_option("-p,--n-prompt", o->prompts, "Prompt lengths, comma-separated (empty or 0: none)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->gens, "Decode lengths, comma-separated (empty or 0: none)")->capture_default_str();
  cmd->add_option("-b,--batch", o->batches, "Sequences decoding together, comma-separated")->capture_default_str();
  cmd->add_option("-d,--depth", o->depth, "Context tokens before each test")->capture_default_str();
  cmd->add_option("-r,--repeats", o->repeats, "Timed repeats (after one warm-up)")->capture_default_str();
  cmd->add_option("-o,--output", o->output, "md or json")->check(CLI::IsMember({"md", "json"}))->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: all)");
  cmd->add_option("--spec", o->spec, "Also time speculative decoding of every tgN: mtp, ngram, dflash or none")
      ->check(CLI::IsMember({"mtp", "ngram", "dflash", "none"}))
      ->capture_default_str();
  cmd->add_option("--spec-draft-n", o->spec_draft_n, "Draft tokens per verify pass, comma-separated (1..16)")
      ->capture_default_str();
  auto* sim = cmd->add_option("--simulate-acceptance", o->simulate,
                  "Per-position accept probabilities p1,p2,... (each conditional on the previous draft accepted; "
                  "the last repeats): real drafting, verify and commit, simulated accept decisions (fixed seed)");
  cmd->add_option("--simulate-accept-length", o->simulate_len,
                  "Simulated acceptance with mean accepted length L (tokens per verify pass): for each k the one "
                  "per-position probability p with 1 + p + ... + p^k = L")
      ->excludes(sim);
  cmd->add_option("--draft-model", o->draft_model,
                  "--spec dflash: a DFlash drafter checkpoint (default: random weights of the published drafter shape "
                  "for the target)");
  cmd->add_option("--block-size", o->block_size, "--spec dflash: block size B (the pending token + B-1 drafts)")
      ->capture_default_str();
  cmd->add_option("--tree-budget", o->tree_budget,
                  "--spec dflash: verify a DDTree of up to N drafts per round (the drafter's top-8 per block position) "
                  "instead of the block's chain; simulated acceptance then decides, per depth, whether the walk goes on "
                  "to the node's most probable child")
      ->check(CLI::Range(1, 63));
  add_tp_options(cmd, o->tp);
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace qwen36::cli
