// qwen36 bench-serve: serving throughput and latency of the continuous-batching engine
// (engine/scheduler.h) in-process, with no HTTP in the way.
//
//   qwen36 bench-serve --synthetic qwen3.6-27b --type q4_k_m --backend cuda --streams 1,4,16,64
//
// For each stream count S: one Scheduler with S slots, S requests submitted at once (random
// prompts, exactly --gen-tokens each: no stop ids, so no end-of-sequence token ends one
// early), run to completion; --rounds times, the first a warm-up. This thread drives
// Scheduler::step() itself — it is the engine thread — and reads every request's events after
// each step, so a token's time is the end of the engine step that produced it and the most
// tokens one step produced is the peak batch. The prefix cache stays on, as in `serve`; it
// cannot shortcut anything here, because every prompt is random and distinct and a cached slot
// is only reused by a prompt that extends its whole history (prompt + answer, longer than any
// prompt of this run) — the run checks that no prompt token came from the cache.
//
// --spec mtp|ngram|dflash: every stream speculates as in `serve --spec` (the drafts verified in
// the step's one batch). --simulate-acceptance p1,p2,... (or --simulate-accept-length L) replaces
// only the accept decision (SpecOptions::accept_override, fixed seed), as `bench` does: drafting,
// the verify rows and the commits run as in a real round, so the figures show what that
// acceptance would buy on these weights; every row then says SIMULATED. Without an MTP head (a
// checkpoint without one) the drafts come from a stand-in (the last token repeated); --spec
// dflash without --draft-model drafts with a random drafter of the published shape.
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "cli/bench_model.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/tp_cli.h"
#include "core/error.h"
#include "engine/scheduler.h"
#include "engine/spec/draft_tree.h"
#include "engine/spec/spec_bench.h"
#include "model/memory_plan.h"

namespace qwen36::cli {

namespace {

struct ServeBenchOptions {
  std::string model, synthetic, type = "bf16", backend = "cpu", output = "md", streams = "1,4,16,64";
  int64_t prompt_tokens = 512, gen_tokens = 128, ctx = 0, layers = 0;
  int64_t rounds = 3;
  ServeStep step;  // as serve's (0: the backend's)
  int threads = 0;
  uint64_t seed = 42;
  CacheTypes cache;
  OffloadOptions offload;  // expert offload
  TpCliOptions tp;         // -tp N: each rank generates or loads its own shard (cli/tp_cli.h)
  SpecCliOptions spec;     // --spec, --spec-draft-n, --draft-model, --block-size, --tree-budget
  std::string simulate;    // --simulate-acceptance p1,p2,...
  double simulate_len = 0; // --simulate-accept-length L
};

// Speculative decoding as bench-serve runs it: the options, the simulated per-position
// acceptance (empty: real verification) and the label every row carries.
struct ServeSpec {
  SpecOptions opts = no_speculation();
  std::vector<double> simulated;
  int32_t block = 0;  // dflash
  std::string label;  // "" without speculation
};

ServeSpec serve_spec(const ServeBenchOptions& o) {
  ServeSpec r;
  r.opts = spec_cli_options(o.spec);
  const bool on = r.opts.method != SpecMethod::None, dflash = r.opts.method == SpecMethod::Dflash;
  const bool simulated = !o.simulate.empty() || o.simulate_len > 0;
  QWEN36_CHECK(!simulated || on, "--simulate-acceptance / --simulate-accept-length need --spec mtp, ngram or dflash");
  QWEN36_CHECK(o.simulate.empty() || o.simulate_len <= 0,
               "give --simulate-acceptance or --simulate-accept-length, not both");
  QWEN36_CHECK(dflash || (o.spec.draft_model.empty() && !o.spec.block_size && !o.spec.tree_budget),
               "--draft-model, --block-size and --tree-budget apply to --spec dflash only");
  if (!on) return r;
  if (dflash) {
    r.block = o.spec.block_size ? o.spec.block_size : 16;
    r.opts.draft_n = r.block - 1;  // a round drafts the whole block
  }
  const int32_t k = r.opts.draft_n;
  if (simulated)
    r.simulated = o.simulate.empty() ? std::vector<double>{accept_prob_for_length(o.simulate_len, k)}
                                     : parse_accept_probs(o.simulate);
  r.label = fmt::format("{} k={}", spec_method_name(r.opts.method), k);
  if (r.opts.tree_budget) r.label += fmt::format(" tree {}", r.opts.tree_budget);
  if (simulated)
    r.label += o.simulate.empty() ? fmt::format(" SIMULATED accept length {:g}", o.simulate_len)
                                  : fmt::format(" SIMULATED acceptance {}", fmt::join(r.simulated, ","));
  return r;
}

constexpr const char* kColumns = R"(Columns (one row per stream count S; figures over the counted rounds, the warm-up excluded):
  requests       S x counted rounds
  output tokens  tokens generated in the counted rounds (always S x --gen-tokens per round)
  wall s         mean time of one round: all S requests submitted -> the last token
  output t/s     aggregate output tokens / wall time
  prompt t/s     prompt tokens / time from submission to the last stream's first token
                 (every prompt read, decode steps of early streams interleaved)
  decode t/s     tokens generated after the last stream's first token / time from then to the
                 end: the decode phase; comparable to llama-batched-bench's S_TG when every
                 prompt is read in the first step (--prefill-chunk >= --prompt-tokens and
                 -b >= S x --prompt-tokens), so all S streams then decode together
  TTFT p50/p99   submission -> a stream's first token, ms (nearest-rank percentiles over all
                 streams of all counted rounds)
  ITL p50/p99    gaps between consecutive tokens of one stream after its first, ms (speculating,
                 the tokens one step commits for a stream arrive together: gaps of 0 among them)
  peak batch     the most streams that got a token from one engine step
  spec, accept len  with --spec: the method (SIMULATED where the accept decisions are) and the
                 tokens a verify pass with drafts committed, on average
A token's time is the end of the engine step that produced it. Prompts are random token ids
from --seed, distinct per stream and round; no stop ids, so every request generates exactly
--gen-tokens. Prefix cache on (as in serve); it cannot hit these prompts, and the run checks so.)";

std::vector<int64_t> parse_streams(const std::string& s) {
  const std::vector<int64_t> v = parse_int_list(s, "--streams");
  QWEN36_CHECK(!v.empty(), "--streams: give stream counts, e.g. 1,4,16,64");
  for (int64_t n : v) QWEN36_CHECK(n >= 1 && n <= 1024, "--streams: {} is not a stream count in 1..1024", n);
  return v;
}

// Nearest rank: the smallest sample with at least p of all samples at or below it.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(p * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// One round of S streams: token arrival times (seconds since submission) per stream.
struct RoundTrace {
  std::vector<std::vector<double>> times;
  int64_t peak_batch = 0;
  uint64_t steps = 0, cached_prompt_tokens = 0;
  uint64_t spec_rounds = 0, spec_drafted = 0, spec_accepted = 0;  // verify passes with drafts, their drafts
  double wall() const {
    double t = 0;
    for (const auto& s : times) t = std::max(t, s.back());
    return t;
  }
  double last_first() const {
    double t = 0;
    for (const auto& s : times) t = std::max(t, s.front());
    return t;
  }
  int64_t tokens_after(double t0) const {
    int64_t n = 0;
    for (const auto& s : times) n += std::count_if(s.begin(), s.end(), [&](double t) { return t > t0; });
    return n;
  }
};

RoundTrace run_round(Scheduler& sch, int64_t S, const ServeBenchOptions& o, std::mt19937_64& rng, int64_t vocab) {
  using Clock = std::chrono::steady_clock;
  std::vector<RequestParams> params(static_cast<size_t>(S));
  for (RequestParams& p : params) {
    p.prompt.resize(size_t(o.prompt_tokens));
    for (int32_t& t : p.prompt) t = int32_t(rng() % uint64_t(vocab));
    p.max_tokens = int32_t(o.gen_tokens);  // stop_ids and stop_strings stay empty: ignore EOS
  }
  const SchedulerStats before = sch.stats();
  RoundTrace tr;
  tr.times.resize(size_t(S));
  std::vector<std::shared_ptr<Request>> reqs;
  const auto t0 = Clock::now();
  for (RequestParams& p : params) reqs.push_back(sch.submit(std::move(p)));
  int64_t finished = 0;
  std::vector<bool> done(size_t(S), false);
  while (finished < S) {
    const bool worked = sch.step();
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    int64_t got = 0;  // streams with a token from this step (speculative decoding can give several)
    for (size_t i = 0; i < size_t(S); ++i) {
      RequestEvent ev;
      const size_t had = tr.times[i].size();
      while (!done[i] && reqs[i]->next(ev, std::chrono::milliseconds(0))) {
        if (ev.kind == RequestEvent::Kind::Token) {
          tr.times[i].push_back(t);
          got += tr.times[i].size() == had + 1;
          continue;
        }
        const RequestUsage u = reqs[i]->usage();
        QWEN36_CHECK(ev.finish_reason == "length" && u.completion_tokens == o.gen_tokens &&
                         int64_t(tr.times[i].size()) == o.gen_tokens,
                     "bench-serve: stream {} of {} ended \"{}\" after {} of {} tokens{}{}", i, S, ev.finish_reason,
                     tr.times[i].size(), o.gen_tokens, ev.error.empty() ? "" : ": ", ev.error);
        done[i] = true;
        ++finished;
      }
    }
    tr.peak_batch = std::max(tr.peak_batch, got);
    QWEN36_CHECK(worked || finished == S, "bench-serve: the engine stopped with {} of {} requests unfinished",
                 S - finished, S);
  }
  const SchedulerStats after = sch.stats();
  tr.steps = after.steps - before.steps;
  tr.spec_rounds = after.spec.rounds - before.spec.rounds;
  tr.spec_drafted = after.spec.drafted - before.spec.drafted;
  tr.spec_accepted = after.spec.accepted - before.spec.accepted;
  tr.cached_prompt_tokens = after.prompt_tokens_cached - before.prompt_tokens_cached;
  QWEN36_CHECK(tr.cached_prompt_tokens == 0, "bench-serve: {} prompt tokens came from the prefix cache",
               tr.cached_prompt_tokens);
  return tr;
}

void run_bench_serve(const ServeBenchOptions& o) {
  // Every check of the arguments comes before the model loads (which can take minutes).
  QWEN36_CHECK(o.model.empty() != o.synthetic.empty(), "bench-serve: give exactly one of -m MODEL or --synthetic PRESET");
  const std::vector<int64_t> streams = parse_streams(o.streams);
  QWEN36_CHECK(o.prompt_tokens >= 1 && o.prompt_tokens <= (1 << 24), "--prompt-tokens {} must be in 1..{}",
               o.prompt_tokens, 1 << 24);
  QWEN36_CHECK(o.gen_tokens >= 1 && o.gen_tokens <= (1 << 24), "--gen-tokens {} must be in 1..{}", o.gen_tokens,
               1 << 24);
  QWEN36_CHECK(o.rounds >= 1 && o.rounds <= 1000, "--rounds {} must be in 1..1000", o.rounds);
  const ServeStep step = resolve_serve_step(o.step, o.backend);
  QWEN36_CHECK(o.ctx >= 0, "-c/--ctx-size {} must be >= 0 (0: prompt + generated tokens, rounded up)", o.ctx);
  const int64_t need = o.prompt_tokens + o.gen_tokens;
  QWEN36_CHECK(o.ctx == 0 || need <= o.ctx,
               "--prompt-tokens {} + --gen-tokens {} = {} tokens per stream do not fit -c/--ctx-size {}",
               o.prompt_tokens, o.gen_tokens, need, o.ctx);
  // The scheduler ends a sequence when its next token would not fit: prompt + gen positions do.
  const int64_t ctx = o.ctx > 0 ? o.ctx : (need + 127) / 128 * 128;
  const DType state_type = resolve_state_type(o.cache);
  const ServeSpec spec = serve_spec(o);
  QWEN36_CHECK(o.tp.ranks <= 1 || spec.opts.method != SpecMethod::Dflash,
               "bench-serve --spec dflash does not run with tensor parallelism yet");

  BenchDevice dev = make_bench_device(o.backend, o.threads, "bench-serve");
  // Expert offload needs host weights: synthetic ones are then made on the host and uploaded.
  const bool offload = !o.offload.placement.empty() || o.offload.fit || !o.offload.gpu_mem.empty();
  QWEN36_CHECK(!offload || o.tp.ranks <= 1, "bench-serve: expert offload does not run with -tp yet");
  std::unique_ptr<Model> model_ptr;
  BenchWeights bw;
  if (o.tp.ranks > 1) {
    const TpWeightsSource src{o.model, o.synthetic, o.type, o.layers, /*per_rank_random=*/true};
    model_ptr = load_tp_bench_model(o.tp, src, dev.backend, o.backend, o.threads, &bw.name);
    bw.bytes = model_ptr->weights().total_bytes();  // rank 0's shard
  } else {
    bw = load_bench_weights({o.model, o.synthetic, o.type, o.layers, spec.opts.method == SpecMethod::Mtp},
                            dev.cuda && !offload, "bench-serve");
    OffloadOptions off = o.offload;  // --fit leaves room for the most streams' caches
    for (int64_t S : streams) off.plan.slots = std::max<int32_t>(off.plan.slots, int32_t(S));
    off.plan.ctx = ctx;
    off.plan.batch_tokens = std::max<int64_t>(step.batch_tokens, off.plan.slots + step.prefill_chunk);
    off.plan.output_rows = off.plan.slots;
    if (spec.opts.method != SpecMethod::None) {  // as scheduler_memory: every verify row an output row
      off.plan.output_rows *= std::max(spec.opts.draft_n, spec.opts.tree_budget) + 1;
      off.plan.mtp = spec.opts.method == SpecMethod::Mtp;
    }
    off.plan.kv_type = resolve_cache_type(o.cache, *dev.backend);
    off.plan.state_type = state_type;
    model_ptr = make_model(std::move(bw.weights), *dev.backend, off, o.threads);
  }
  Model& model = *model_ptr;
  const ModelConfig& c = model.config();
  QWEN36_CHECK(c.max_position_embeddings <= 0 || ctx <= c.max_position_embeddings,
               "bench-serve: a context of {} positions is more than the model's {}", ctx, c.max_position_embeddings);
  const DType kv_type = resolve_cache_type(o.cache, *dev.backend);
  const bool stand_in = spec.opts.method == SpecMethod::Mtp && !model.has_mtp();
  QWEN36_CHECK(!stand_in || !spec.simulated.empty(),
               "bench-serve --spec mtp: {} has no MTP head to draft with (--simulate-acceptance times the verify path "
               "with a stand-in drafter instead)",
               o.synthetic.empty() ? o.model : "this synthetic model");
  const int warmup = o.rounds > 1 ? 1 : 0;
  std::mt19937_64 rng(o.seed);

  nlohmann::json rows = nlohmann::json::array();
  for (int64_t S : streams) {
    SchedulerOptions so;
    so.slots = int32_t(S);
    so.context = ctx;
    so.prefill_chunk = int32_t(step.prefill_chunk);
    so.max_batch_tokens = int32_t(step.batch_tokens);
    so.max_queue = int32_t(S);
    so.prefix_cache = true;
    so.kv_type = kv_type;
    so.state_type = state_type;
    so.spec = spec.opts;
    // Simulated acceptance: one fixed-seed stream of decisions per stream count (it must
    // outlive the scheduler, which holds its callback).
    std::unique_ptr<SimulatedAcceptance> sim;
    if (!spec.simulated.empty()) {
      sim = std::make_unique<SimulatedAcceptance>(spec.simulated);
      so.spec.accept_override = sim->callback();
      if (so.spec.tree_budget > 0) so.spec.simulated_confidence = spec.simulated;
    }
    if (stand_in) so.spec_drafter = [](Model&, ModelState&) { return std::make_unique<RepeatDrafter>(); };
    if (spec.opts.method == SpecMethod::Dflash)
      so.spec_drafter = [&, S](Model& m, ModelState&) -> std::unique_ptr<Drafter> {
        BenchDFlash d = load_bench_dflash(o.spec.draft_model, m, *dev.backend, int32_t(S),
                                          ctx + spec.block + so.spec.tree_budget, spec.block,
                                          so.spec.tree_budget > 0 ? kTreeTopK : 0);
        std::fprintf(stderr, "bench-serve: drafts from %s\n", d.label.c_str());
        return std::move(d.drafter);
      };
    // The largest pass: the step budget, or every decode token plus the one prefill chunk
    // that a step always takes, whichever is more; speculating, every verify row an output row.
    MemoryRequest mem = scheduler_memory(so);
    mem.batch_tokens = std::max<int64_t>(step.batch_tokens, S + step.prefill_chunk);
    check_memory_plan(*dev.backend, c, mem,
                      {"-c/--ctx-size (or --prompt-tokens + --gen-tokens)", "--streams", "-b/--batch-size and --prefill-chunk",
                       "-ctk/-ctv"});
    std::fprintf(stderr, "bench-serve: %lld streams: %lld slots x %lld positions, %s\n", (long long)S, (long long)S,
                 (long long)ctx, plan_memory(c, mem).describe().c_str());
    Scheduler sch(model, so);

    std::vector<double> ttft, itl;
    nlohmann::json per_round = nlohmann::json::array();
    int64_t out_tokens = 0, decode_tokens = 0, peak = 0;
    uint64_t steps = 0, spec_rounds = 0, spec_drafted = 0, spec_accepted = 0;
    double wall = 0, prefill_time = 0, decode_time = 0;
    for (int64_t r = 0; r < o.rounds; ++r) {
      const RoundTrace tr = run_round(sch, S, o, rng, c.vocab_size);
      const bool counted = r >= warmup;
      int64_t tokens = 0;
      for (const auto& s : tr.times) tokens += int64_t(s.size());
      const double w = tr.wall(), lf = tr.last_first();
      std::fprintf(stderr,
                   "bench-serve: %lld streams, round %lld/%lld%s: %lld tokens in %.2f s (%.1f tok/s), last first "
                   "token at %.2f s, %llu steps\n",
                   (long long)S, (long long)r + 1, (long long)o.rounds, counted ? "" : " (warm-up)", (long long)tokens,
                   w, double(tokens) / w, lf, (unsigned long long)tr.steps);
      per_round.push_back({{"round", r + 1},
                           {"warmup", !counted},
                           {"output_tokens", tokens},
                           {"wall_s", w},
                           {"last_first_token_s", lf},
                           {"steps", tr.steps},
                           {"peak_batch", tr.peak_batch}});
      if (!counted) continue;
      for (const auto& s : tr.times) {
        ttft.push_back(1e3 * s.front());
        for (size_t i = 1; i < s.size(); ++i) itl.push_back(1e3 * (s[i] - s[i - 1]));
      }
      out_tokens += tokens;
      wall += w;
      prefill_time += lf;
      decode_tokens += tr.tokens_after(lf);
      decode_time += w - lf;
      peak = std::max(peak, tr.peak_batch);
      steps += tr.steps;
      spec_rounds += tr.spec_rounds, spec_drafted += tr.spec_drafted, spec_accepted += tr.spec_accepted;
    }
    const int64_t counted_rounds = o.rounds - warmup;
    rows.push_back({{"model", bw.name},
                    {"backend", o.backend},
                    {"device", dev.name},
                    {"streams", S},
                    {"prompt_tokens", o.prompt_tokens},
                    {"gen_tokens", o.gen_tokens},
                    {"context", ctx},
                    {"kv_type", std::string(dtype_name(kv_type))},
                    {"state_type", std::string(dtype_name(state_type))},
                    {"prefill_chunk", step.prefill_chunk},
                    {"batch_tokens", step.batch_tokens},
                    {"rounds_counted", counted_rounds},
                    {"requests", S * counted_rounds},
                    {"output_tokens", out_tokens},
                    {"wall_s", wall / double(counted_rounds)},
                    {"output_tok_s", wall > 0 ? double(out_tokens) / wall : 0},
                    {"prompt_tok_s", prefill_time > 0 ? double(S * counted_rounds * o.prompt_tokens) / prefill_time : 0},
                    {"decode_tok_s", decode_time > 0 ? double(decode_tokens) / decode_time : 0},
                    {"ttft_p50_ms", percentile(ttft, 0.5)},
                    {"ttft_p99_ms", percentile(ttft, 0.99)},
                    {"itl_p50_ms", percentile(itl, 0.5)},
                    {"itl_p99_ms", percentile(itl, 0.99)},
                    {"peak_batch", peak},
                    {"steps", steps},
                    {"spec", spec.label.empty() ? "none" : spec.label},
                    {"simulated", !spec.simulated.empty()},
                    {"spec_rounds", spec_rounds},
                    // tokens a verify pass with drafts committed (accepted drafts + the target's own)
                    {"mean_accepted_length", spec_rounds ? double(spec_accepted + spec_rounds) / double(spec_rounds) : 0},
                    {"acceptance_rate", spec_drafted ? double(spec_accepted) / double(spec_drafted) : 0},
                    {"per_round", per_round}});
  }

  if (o.output == "json") {
    std::printf("%s\n", rows.dump(2).c_str());
    return;
  }
  std::printf("device: %s | model %.2f GiB | %lld-token prompts, %lld generated per stream | context %lld | KV %s%s | "
              "prefill chunk %lld, step budget %lld tokens | %lld counted round(s)%s\n\n",
              dev.name.c_str(), double(bw.bytes) / double(1 << 30), (long long)o.prompt_tokens,
              (long long)o.gen_tokens, (long long)ctx, std::string(dtype_name(kv_type)).c_str(),
              state_type == DType::F32 ? "" : fmt::format(", DeltaNet state {}", dtype_name(state_type)).c_str(),
              (long long)step.prefill_chunk, (long long)step.batch_tokens, (long long)(o.rounds - warmup),
              warmup ? " after 1 warm-up" : "");
  if (!spec.label.empty())
    std::printf("speculative decoding: %s%s\n\n", spec.label.c_str(),
                spec.simulated.empty() ? ""
                                       : " — the accept decisions are SIMULATED (drafting, verify rows and commits real): "
                                         "every figure below follows from that acceptance, not from these weights");
  // Speculating: two more columns, the method (SIMULATED where it is) and the mean accepted length.
  const bool speculating = !spec.label.empty();
  std::printf("| model | backend | streams | requests | output tokens | wall s | output t/s | prompt t/s | decode t/s "
              "| TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | peak batch |%s\n",
              speculating ? " spec | accept len |" : "");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |%s\n",
              speculating ? " --- | ---: |" : "");
  for (const auto& r : rows)
    std::printf("| %s | %s | %lld | %lld | %lld | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %lld |%s\n",
                r["model"].get<std::string>().c_str(), r["backend"].get<std::string>().c_str(),
                (long long)r["streams"].get<int64_t>(), (long long)r["requests"].get<int64_t>(),
                (long long)r["output_tokens"].get<int64_t>(), r["wall_s"].get<double>(),
                r["output_tok_s"].get<double>(), r["prompt_tok_s"].get<double>(), r["decode_tok_s"].get<double>(),
                r["ttft_p50_ms"].get<double>(), r["ttft_p99_ms"].get<double>(), r["itl_p50_ms"].get<double>(),
                r["itl_p99_ms"].get<double>(), (long long)r["peak_batch"].get<int64_t>(),
                speculating ? fmt::format(" {} | {:.2f} |", spec.label, r["mean_accepted_length"].get<double>()).c_str()
                            : "");
}

}  // namespace

void register_bench_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-serve", "Serving throughput and latency: S concurrent streams through the continuous-batching engine");
  auto o = std::make_shared<ServeBenchOptions>();
  cmd->add_option("-m,--model", o->model, "Model: Hugging Face directory or .gguf file");
  cmd->add_option("--synthetic", o->synthetic, "Random weights of a preset: qwen3.6-27b, qwen3.6-35b-a3b, cpu-0.5b, ...");
  cmd->add_option("--type", o->type,
                  "Matrix dtype of synthetic weights: bf16, f16, f32, a quantization mix (q8_0, q6_k, q5_k_m, q4_k_m, "
                  "...), or with --backend cuda a block type for every matrix (q4_k, q5_k, iq4_xs, ...)")
      ->capture_default_str();
  cmd->add_option("--layers", o->layers, "Override the synthetic preset's layer count");
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: all)");
  cmd->add_option("--streams", o->streams, "Concurrent streams (requests at once, = slots), comma-separated")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt tokens per request (random ids)")->capture_default_str();
  cmd->add_option("--gen-tokens", o->gen_tokens, "Tokens generated per request (end-of-sequence ignored)")
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "Rounds per stream count; the first is a warm-up unless there is only one")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Positions per slot (0: prompt + generated, rounded up to 128)")
      ->capture_default_str();
  add_cache_type_options(cmd, o->cache);
  add_offload_options(cmd, o->offload);
  add_tp_options(cmd, o->tp);
  add_serve_step_options(cmd, o->step);  // as serve's
  cmd->add_option("--spec", o->spec.method,
                  "Speculative decoding of every stream, as serve --spec: mtp (the MTP head; synthetic weights get a "
                  "random one), ngram, dflash (--draft-model, or a random drafter of the published shape) or none")
      ->check(CLI::IsMember({"mtp", "ngram", "dflash", "none"}))
      ->capture_default_str();
  cmd->add_option("--spec-draft-n", o->spec.draft_n, "Draft tokens per stream and step, at most (1..16; dflash: the block - 1)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  cmd->add_option("--draft-model", o->spec.draft_model, "DFlash drafter checkpoint (default: random, the published shape)");
  cmd->add_option("--block-size", o->spec.block_size, "DFlash block size: the pending token + B-1 drafts (2..17; default 16)")
      ->check(CLI::Range(2, 17));
  cmd->add_option("--tree-budget", o->spec.tree_budget, "DFlash: a DDTree of up to N drafts per stream and step")
      ->check(CLI::Range(1, 63));
  cmd->add_option("--simulate-acceptance", o->simulate,
                  "p1,p2,...: accept draft i with probability p_i (the last beyond the list), given the drafts before "
                  "it, instead of checking it against the target (fixed seed; the rows say SIMULATED)");
  cmd->add_option("--simulate-accept-length", o->simulate_len,
                  "L: one probability p at every position such that 1 + p + ... + p^k = L tokens a verify pass "
                  "(rows say SIMULATED)");
  cmd->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  cmd->add_option("-o,--output", o->output, "md or json")->check(CLI::IsMember({"md", "json"}))->capture_default_str();
  cmd->footer(kColumns);
  cmd->callback([o] { run_bench_serve(*o); });
}

}  // namespace qwen36::cli
