// qwen36 run: generate from a prompt with one model on one backend.
#include <cstdio>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/generate.h"

namespace qwen36::cli {

namespace {

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    QWEN36_CHECK(used > 0 && item.find_first_not_of(" \t", used) == std::string::npos,
                 "--tokens: \"{}\" is not an integer token id", item);
    QWEN36_CHECK(v >= 0 && v <= INT32_MAX, "--tokens: {} is out of range", v);
    ids.push_back(int32_t(v));
  }
  return ids;
}

}  // namespace

void add_sampling_options(CLI::App* cmd, SamplingParams& s) {
  cmd->add_option("--temp", s.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Top-p / nucleus (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Min-p relative to the most likely token (0 = off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repetition_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "Presence penalty")->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty")->capture_default_str();
  cmd->add_option("--repeat-last-n", s.penalty_last_n, "Tokens the penalties look back over (-1 = all)")
      ->capture_default_str();
  cmd->add_option("-s,--seed", s.seed, "Random seed")->capture_default_str();
}

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate tokens from a prompt");
  struct Opts {
    std::string model, tokens, backend = "cpu";
    int32_t n_predict = 64;
    int64_t ctx = 4096;
    int threads = 0;
    bool ignore_eos = false;
    SamplingParams sampling;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("-m,--model", o->model,
                  "Model: Hugging Face directory or .gguf file (default: the built-in small model)");
  cmd->add_option("--tokens", o->tokens, "Prompt as comma-separated token ids, e.g. 1,2,3")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context size (prompt + generated)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  add_sampling_options(cmd, o->sampling);
  cmd->callback([o] {
    o->sampling.validate();
    QWEN36_CHECK(o->n_predict >= 0, "--n-predict {} must be >= 0", o->n_predict);
    QWEN36_CHECK(o->ctx > 0 && o->ctx <= (1 << 24), "--ctx-size {} is out of range", o->ctx);
    const std::vector<int32_t> prompt = parse_token_list(o->tokens);
    QWEN36_CHECK(!prompt.empty(), "--tokens: the prompt is empty");
    LoadedModel lm = o->model.empty() ? load_default_model(o->backend, o->threads)
                                      : load_model(o->model, o->backend, o->threads);
    const ModelConfig& c = lm.model->config();
    ModelState state(*lm.backend, c, 1, std::min<int64_t>(o->ctx, c.max_position_embeddings), false);
    GenerateOptions g;
    g.max_tokens = o->n_predict;
    g.sampling = o->sampling;
    if (!o->ignore_eos) g.stop_ids = c.eos_token_ids;
    GenerateResult r = generate(*lm.model, state, prompt, g, [](int32_t tok) {
      std::printf("%d ", tok);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    std::fprintf(stderr, "prompt: %d tokens, %.1f tok/s | generated: %zu tokens, %.2f tok/s | stop: %s\n", r.n_prompt,
                 r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(), r.stop_reason.c_str());
  });
}

}  // namespace qwen36::cli
