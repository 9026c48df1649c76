// qwen36 perplexity: llama-perplexity semantics (chunks of -c tokens, each from an empty state,
// the second half of each chunk scored) and KL divergence against a saved reference run.
//
//   qwen36 perplexity -m ref.gguf -f wiki.txt -c 512 --kl-divergence-base ref.kld   # saves
//   qwen36 perplexity -m q4.gguf --kl-divergence --kl-divergence-base ref.kld        # compares
//
// The math and the base-file format live in engine/perplexity.h.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/perplexity.h"
#include "model/qwen36.h"
#ifdef QWEN36_HAVE_PCRE2
#include "text/tokenizer.h"
#endif

namespace qwen36::cli {

namespace {

struct PplOptions {
  std::string model, text_file, tokens_file, tokenizer, kld_base, backend = "cpu";
  int64_t n_ctx = 512, chunks = 0, ubatch = 0;
  int32_t top_k = 1024;
  int threads = 0;
  bool kld = false;
  CacheTypes cache;
};

std::vector<int32_t> read_tokens(const PplOptions& o) {
  if (!o.tokens_file.empty()) return read_i32_file(o.tokens_file);
#ifdef QWEN36_HAVE_PCRE2
  const std::string tok_path = resolve_tokenizer(o.tokenizer, o.model);
  QWEN36_CHECK(!tok_path.empty(), "no tokenizer found for this model: pass --tokenizer PATH");
  const text::Tokenizer tok = text::Tokenizer::from_file(tok_path);
  std::ifstream in(o.text_file, std::ios::binary);
  QWEN36_CHECK(in.good(), "cannot open {}", o.text_file);
  std::ostringstream ss;
  ss << in.rdbuf();
  return tok.encode(ss.str(), /*parse_special=*/false);
#else
  fail("this build has no tokenizer (PCRE2 missing): pass --tokens-file IDS.i32");
#endif
}

void print_summary(const PerplexityResult& r) {
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f  (%lld chunks of %lld, %lld scored tokens)\n", r.ppl(),
              r.ppl_error(), static_cast<long long>(r.plan.n_chunks), static_cast<long long>(r.plan.n_ctx),
              static_cast<long long>(r.nll.count()));
  if (!r.kld) return;
  const KldStats::Summary s = r.kld->summary();
  std::printf("\n====== KL divergence vs the base ======\n");
  std::printf("Mean PPL(Q)        : %10.6f +/- %.6f\n", s.ppl_current, s.ppl_current_err);
  std::printf("Mean PPL(base)     : %10.6f +/- %.6f\n", s.ppl_base, s.ppl_base_err);
  std::printf("Mean ln(PPL(Q)/PPL(base)) : %.6f +/- %.6f\n", s.ln_ppl_ratio, s.ln_ppl_ratio_err);
  std::printf("Mean KLD           : %10.6f +/- %.6f\n", s.kld_mean, s.kld_err);
  std::printf("KLD max            : %10.6f\n", s.kld_max);
  std::printf("KLD 99%%            : %10.6f\n", s.kld_p99);
  std::printf("KLD 95%%            : %10.6f\n", s.kld_p95);
  std::printf("KLD 90%%            : %10.6f\n", s.kld_p90);
  std::printf("KLD median         : %10.6f\n", s.kld_median);
  std::printf("KLD min            : %10.6f\n", s.kld_min);
  std::printf("Mean Δp            : %9.4f %% +/- %.4f %%\n", 100.0 * s.dp_mean, 100.0 * s.dp_err);
  std::printf("RMS Δp             : %9.4f %%\n", 100.0 * s.dp_rms);
  std::printf("Same top p         : %9.4f %% +/- %.4f %%\n", s.top1_pct, s.top1_err_pct);
}

void run(const PplOptions& o) {
  QWEN36_CHECK(!o.kld || !o.kld_base.empty(), "--kl-divergence needs --kl-divergence-base FILE (saved by a run "
                                              "without --kl-divergence)");
  const DType state_type = resolve_state_type(o.cache);  // a bad --state-type fails before the model loads
  std::optional<KldBase> base;
  std::vector<int32_t> tokens;
  if (o.kld) {
    base = KldBase::load(o.kld_base);
    if (!o.text_file.empty() || !o.tokens_file.empty())
      spdlog::info("--kl-divergence: using the {} tokens stored in {}, not the text", base->tokens.size(), o.kld_base);
    spdlog::info("base: {} chunks of {} tokens, top-{} log-probabilities per scored token", base->plan.n_chunks,
                 base->plan.n_ctx, base->top_k);
  } else {
    QWEN36_CHECK(!o.text_file.empty() || !o.tokens_file.empty(), "pass -f TEXT or --tokens-file IDS.i32");
    QWEN36_CHECK(o.text_file.empty() || o.tokens_file.empty(), "pass only one of -f and --tokens-file");
    tokens = read_tokens(o);
  }

  LoadedModel lm = load_model(o.model, o.backend, o.threads);
  const auto vocab = int32_t(lm.model->config().vocab_size);
  PerplexityJob job;
  job.vocab = vocab;
  job.tokens = tokens;
  KldBase saved;
  if (base) {
    job.compare = &*base;
  } else {
    job.plan = plan_chunks(int64_t(tokens.size()), o.n_ctx, o.chunks);
    spdlog::info("{} tokens: {} chunks of {}, scoring rows {}..{} of each", tokens.size(), job.plan.n_chunks,
                 job.plan.n_ctx, job.plan.first, job.plan.n_ctx - 2);
    if (!o.kld_base.empty()) {
      job.save = &saved;
      job.save_top_k = o.top_k;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  job.on_chunk = [&](const PerplexityResult& r, int64_t c) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[%lld/%lld] chunk PPL %.4f   running PPL %.4f +/- %.5f   (%.1f s)\n", static_cast<long long>(c + 1),
                static_cast<long long>(r.plan.n_chunks), r.chunk_ppl.back(), r.ppl(), r.ppl_error(), secs);
    std::fflush(stdout);
  };
  const PerplexityResult r =
      run_perplexity(model_chunk_logits(*lm.model, resolve_cache_type(o.cache, *lm.backend), state_type, o.ubatch),
                     job);
  print_summary(r);
  if (job.save) {
    saved.save(o.kld_base);
    spdlog::info("saved the base ({} tokens, {} scored rows, top-{}) to {}", saved.tokens.size(),
                 saved.records.size(), saved.top_k, o.kld_base);
  }
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto* cmd = app.add_subcommand("perplexity", "Perplexity over a text (llama-perplexity semantics) and KL divergence");
  auto o = std::make_shared<PplOptions>();
  cmd->add_option("-m,--model", o->model, "Model: Hugging Face directory or .gguf file")->required();
  cmd->add_option("-f,--file", o->text_file, "Text file to evaluate");
  cmd->add_option("--tokens-file", o->tokens_file, "Token ids to evaluate instead of -f (raw int32 little-endian)");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json (or its directory, or a .gguf) for -f");
  cmd->add_option("-c,--ctx-size", o->n_ctx, "Tokens per chunk; the second half of each chunk is scored")
      ->check(CLI::Range(int64_t(4), int64_t(1) << 20));
  cmd->add_option("--chunks", o->chunks, "Evaluate at most N chunks (default: all)");
  cmd->add_option("--ubatch-size", o->ubatch,
                  "Tokens per forward pass inside a chunk (alias -ub), the state carried between them (default: the whole "
                  "chunk; 1: every token a decode step, which measures what generation sees of -ctk/-ctv and "
                  "--state-type)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--kl-divergence-base", o->kld_base,
                  "Without --kl-divergence: save this model's log-probabilities here; with it: compare against them");
  add_cache_type_options(cmd, o->cache);
  cmd->add_flag("--kl-divergence", o->kld, "Compare against --kl-divergence-base (uses the tokens stored there)");
  cmd->add_option("--kl-top-k", o->top_k, "Log-probabilities kept per scored token in a saved base")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("-t,--threads", o->threads, "CPU threads (default: all)");
  cmd->callback([o] { run(*o); });
}

}  // namespace qwen36::cli
