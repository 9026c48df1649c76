// qwen36 run: generate from a prompt (text, chat, or raw token ids) with one model.
#include <cstdio>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/tp_cli.h"
#include "core/error.h"
#include "core/file_text.h"
#include "engine/generate.h"
#include "engine/spec/spec_generate.h"
#include "engine/tp_runner.h"

#ifdef QWEN36_HAVE_PCRE2
#include <nlohmann/json.hpp>

#include <filesystem>

#include "text/chat_template.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"
#include "model/memory_plan.h"
#endif

namespace qwen36::cli {

namespace {

struct RunOptions {
  std::string model, tokens, prompt, prompt_file, system, tokenizer, backend = "cpu";
  int32_t n_predict = 128;
  int64_t ctx = 4096;
  int threads = 0;
  bool ignore_eos = false, chat = false, no_think = false;
  std::string chat_template_file;  // --chat: instead of the model's own template
  SpecCliOptions spec;  // --spec, --spec-draft-n, --speculative-config, DFlash flags
  bool json = false;               // structured output: any JSON object
  std::string json_schema, json_schema_file;
  std::string json_whitespace = "limited";
  std::string regex;                  // structured output: the answer matches it in full
  std::string grammar, grammar_file;  // structured output: a sentence of this GBNF grammar
  OutputConstraint output;            // compiled from the six above
  SamplingParams sampling;
  CacheTypes cache;
  TpCliOptions tp;
  OffloadOptions offload;
  LoraOptions lora;
};

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  for (int64_t v : parse_int_list(s, "--tokens")) {
    QWEN36_CHECK(v >= 0 && v <= INT32_MAX, "--tokens: {} is out of range", v);
    ids.push_back(int32_t(v));
  }
  return ids;
}

void print_stats(const GenerateResult& r) {
  std::fprintf(stderr, "\nprompt: %d tokens, %.1f tok/s | generated: %zu tokens, %.2f tok/s | stop: %s\n", r.n_prompt,
               r.prefill_tok_s(), r.tokens.size(), r.decode_tok_s(), r.stop_reason.c_str());
}

GenerateOptions generate_options(const RunOptions& o, const ModelConfig& c) {
  GenerateOptions g;
  g.max_tokens = o.n_predict;
  g.sampling = o.sampling;
  if (!o.ignore_eos) g.stop_ids = c.eos_token_ids;
  return g;
}

// generate(), or spec_generate() with --spec (then the acceptance figures go to stderr).
GenerateResult run_generation(const RunOptions& o, LoadedModel& lm, const std::vector<int32_t>& prompt,
                              const GenerateOptions& g, const std::function<bool(int32_t)>& on_token) {
  const ModelConfig& c = lm.model->config();
  SpecOptions spec = spec_cli_options(o.spec);
  const SpecMethod method = spec.method;
  const int64_t ctx = std::min<int64_t>(o.ctx, c.max_position_embeddings);
  MemoryRequest mem;
  mem.ctx = ctx;
  mem.batch_tokens = g.prefill_chunk;
  mem.mtp = method == SpecMethod::Mtp;
  mem.kv_type = resolve_cache_type(o.cache, *lm.backend);
  mem.state_type = resolve_state_type(o.cache);
  check_memory_plan(*lm.backend, c, mem);
  ModelState state(*lm.backend, c, 1, ctx, /*with_mtp=*/mem.mtp, mem.kv_type, mem.state_type);
  if (method == SpecMethod::None) return generate(*lm.model, state, prompt, g, on_token);
  SpecResult r = spec_generate(*lm.model, state, prompt, g, spec, on_token);
  if (method == SpecMethod::Dflash)
    std::fprintf(stderr, "\nspeculative dflash, block %s%s: %s\n",
                 spec.dflash.block_size ? std::to_string(spec.dflash.block_size).c_str() : "of the drafter",
                 spec.tree_budget ? (", tree budget " + std::to_string(spec.tree_budget)).c_str() : "",
                 r.metrics.summary().c_str());
  else
    std::fprintf(stderr, "\nspeculative %s, k = %d%s: %s\n", spec_method_name(method), spec.draft_n,
                 spec.adaptive ? " (adaptive)" : "", r.metrics.summary().c_str());
  return r.gen;
}

// --json / --json-schema(-file) / --regex / --grammar(-file), compiled (empty: none).
OutputConstraint run_output_constraint(const RunOptions& o) {
  OutputConstraint c;
  const bool json = o.json || !o.json_schema.empty() || !o.json_schema_file.empty();
  if (!json && o.regex.empty() && o.grammar.empty() && o.grammar_file.empty()) return c;
  QWEN36_CHECK(o.tokens.empty(), "--json / --json-schema / --regex / --grammar constrain text: give the prompt as "
               "text (-p or -f)");
  if (!o.grammar.empty() || !o.grammar_file.empty()) {
    const std::string src = o.grammar_file.empty() ? o.grammar : read_file(o.grammar_file);
    c.grammar = with_context(o.grammar_file.empty() ? "--grammar" : o.grammar_file, [&] { return text::Grammar::parse(src); });
  } else if (!o.regex.empty()) {
    c.schema = with_context("--regex", [&] { return text::JsonSchema::text_matching(o.regex); });
  } else if (o.json) {
    c.schema = with_context("--json-whitespace", [&] {
      return text::JsonSchema::any_object(text::whitespace_named(o.json_whitespace));
    });
  } else {
    const std::string src = o.json_schema_file.empty() ? o.json_schema : read_file(o.json_schema_file);
    const auto j = nlohmann::ordered_json::parse(src, nullptr, false);
    QWEN36_CHECK(!j.is_discarded(), "--json-schema: not valid JSON");
    c.schema = text::JsonSchema::compile(j, text::whitespace_named(o.json_whitespace));
  }
  return c;
}

// Token ids in, token ids out.
void run_tokens(const RunOptions& o, LoadedModel& lm, const std::vector<int32_t>& prompt) {
  const ModelConfig& c = lm.model->config();
  GenerateResult r = run_generation(o, lm, prompt, generate_options(o, c), [](int32_t tok) {
    std::printf("%d ", tok);
    std::fflush(stdout);
    return true;
  });
  print_stats(r);
}

#ifdef QWEN36_HAVE_PCRE2
// Text in, text out; with --chat the prompt goes through the chat template and the output
// through the reasoning / tool-call parser (reasoning is shown on stderr).
void run_text(const RunOptions& o, LoadedModel& lm) {
  const std::string tok_path = resolve_tokenizer(o.tokenizer, o.model);
  QWEN36_CHECK(!tok_path.empty(),
               "no tokenizer found for this model: pass --tokenizer PATH (tokenizer.json or its directory){}",
               o.model.empty() ? ", or run scripts/fetch-tokenizer.sh for the default model" : "");
  const text::Tokenizer tok = text::Tokenizer::from_file(tok_path);
  const ModelConfig& c = lm.model->config();
  QWEN36_CHECK(tok.vocab_size() <= c.vocab_size, "tokenizer has {} tokens but the model only {}", tok.vocab_size(),
               c.vocab_size);

  std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
  GenerateOptions g = generate_options(o, c);
  OutputParserOptions popts;
  if (o.chat) {
    const std::unique_ptr<ChatTemplate> tmpl = load_chat_template(tok_path, o.chat_template_file);
    QWEN36_CHECK(tmpl, "--chat needs a chat template: {} carries none (tokenizer_config.json, chat_template.jinja "
                 "or GGUF metadata); --chat-template-file gives one", tok_path);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", text}});
    nlohmann::ordered_json kwargs = {{"enable_thinking", !o.no_think}};
    text = tmpl->render(messages, nullptr, true, kwargs);
    popts.thinking_enabled = true;
    popts.prompt_opened_thinking = prompt_opens_thinking(text);
  }
  // Qwen tokenizers end documents with <|endoftext|> and turns with <|im_end|>; a checkpoint's
  // eos list (or a GGUF's single eos id) may name only one of them.
  for (const char* stop : {"<|im_end|>", "<|endoftext|>"})
    if (int32_t id = tok.token_id(stop); id >= 0 && !o.ignore_eos) g.stop_ids.push_back(id);
  const std::vector<int32_t> prompt = tok.encode(text);
  QWEN36_CHECK(!prompt.empty(), "the prompt is empty");
  std::optional<TokenConstraint> constraint;
  if (!o.output.empty()) {  // after a chat's reasoning, the answer is the document
    OutputConstraint oc = o.output;
    if (popts.prompt_opened_thinking) oc.start_after = {tok.token_id("</think>")};
    constraint.emplace(std::make_shared<const TokenTrie>(tok.document_bytes(c.vocab_size)), oc, g.stop_ids);
    g.constraint = &*constraint;
  }

  text::StreamDecoder decoder(tok);
  OutputParser parser(popts);
  auto show = [&](const std::vector<OutputDelta>& deltas) {
    for (const auto& d : deltas) {
      if (d.kind == OutputDelta::Kind::Content) std::fputs(d.text.c_str(), stdout);
      if (d.kind == OutputDelta::Kind::Reasoning) std::fputs(d.text.c_str(), stderr);
      if (d.kind == OutputDelta::Kind::ToolCall)
        std::printf("\n[tool call] %s(%s)\n", d.tool_call.name.c_str(), d.tool_call.arguments.c_str());
    }
  };
  if (!o.chat) std::fputs(text.c_str(), stdout);
  GenerateResult r = run_generation(o, lm, prompt, g, [&](int32_t id) {
    if (id >= tok.vocab_size()) return true;  // padded embedding rows have no text
    const std::string piece = decoder.push(id);
    if (o.chat)
      show(parser.feed(piece));
    else
      std::fputs(piece.c_str(), stdout);
    std::fflush(stdout);
    return true;
  });
  const std::string rest = decoder.flush();
  if (o.chat) {
    show(parser.feed(rest));
    show(parser.finish());
  } else {
    std::fputs(rest.c_str(), stdout);
  }
  print_stats(r);
}
#endif

}  // namespace

void add_sampling_options(CLI::App* cmd, SamplingParams& s) {
  cmd->add_option("--temp", s.temperature, "Temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Top-k (0 = off)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Top-p / nucleus (1 = off)")->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "Min-p relative to the most likely token (0 = off)")->capture_default_str();
  cmd->add_option("--typical-p", s.typical_p, "Locally typical sampling (1 = off)")->capture_default_str();
  cmd->add_option("--top-n-sigma", s.top_n_sigma,
                  "Keep tokens within N standard deviations of the largest logit (0 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repetition_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "Presence penalty")->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty")->capture_default_str();
  cmd->add_option("--repeat-last-n", s.penalty_last_n, "Tokens the penalties look back over (-1 = all)")
      ->capture_default_str();
  cmd->add_option("-s,--seed", s.seed, "Random seed")->capture_default_str();
}

void register_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Generate text (or token ids) from a prompt");
  auto o = std::make_shared<RunOptions>();
  cmd->add_option("-m,--model", o->model,
                  "Model: Hugging Face directory or .gguf file (default: the built-in small model)");
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  auto* f = cmd->add_option("-f,--file", o->prompt_file, "Read the prompt text from a file");
  auto* t = cmd->add_option("--tokens", o->tokens, "Prompt as comma-separated token ids (prints ids)");
  p->excludes(f)->excludes(t);
  f->excludes(t);
  cmd->add_flag("--chat", o->chat, "Apply the chat template and split reasoning / tool calls from the answer");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  cmd->add_option("--chat-template-file", o->chat_template_file,
                  "Jinja chat template for --chat instead of the model's own")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-think", o->no_think, "Chat with thinking disabled (enable_thinking=false)");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json or its directory (default: beside the model)");
  cmd->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context size (prompt + generated)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence tokens");
  auto* json = cmd->add_flag("--json", o->json, "Structured output: the answer is a JSON object (OpenAI json_object)");
  auto* js = cmd->add_option("-j,--json-schema", o->json_schema,
                             "Structured output: the answer follows this JSON schema (inline JSON; keys in the schema's "
                             "order, as OpenAI strict mode)");
  auto* jsf = cmd->add_option("--json-schema-file", o->json_schema_file, "The same, read from a file");
  cmd->add_option("--json-whitespace", o->json_whitespace,
                  "Whitespace JSON output may hold between tokens: limited (one space, or a newline and up to 20 "
                  "spaces / tabs), compact (at most one space), any (up to 64 whitespace bytes), or a regular "
                  "expression of your own (e.g. '(\\n  )?'; it must also match the empty text)")
      ->capture_default_str();
  auto* re = cmd->add_option("--regex", o->regex,
                             "Structured output: the answer is text this regular expression matches in full "
                             "(ECMAScript / Python subset; e.g. '(yes|no)' or '\\d{3}-\\d{4}')");
  auto* gr = cmd->add_option("--grammar", o->grammar,
                             "Structured output: the answer is a sentence of this GBNF grammar (llama.cpp's syntax; "
                             "rule 'root' starts it)");
  auto* grf = cmd->add_option("--grammar-file", o->grammar_file, "The same, read from a file (e.g. a .gbnf)");
  const std::vector<CLI::Option*> constraints = {json, js, jsf, re, gr, grf};
  for (CLI::Option* a : constraints)
    for (CLI::Option* b : constraints)
      if (a != b) a->excludes(b);
  auto* spec = cmd->add_option("--spec", o->spec.method,
                               "Speculative decoding: mtp (the checkpoint's MTP head), ngram (prompt lookup), dflash "
                               "(block drafter, --draft-model) or none")
                    ->check(CLI::IsMember({"mtp", "ngram", "dflash", "none"}))
                    ->capture_default_str();
  auto* spec_n = cmd->add_option("--spec-draft-n", o->spec.draft_n, "Draft tokens per verify pass (1..16)")
                     ->check(CLI::Range(1, 16))
                     ->capture_default_str();
  cmd->add_option("--speculative-config", o->spec.speculative_config,
                  "Speculative decoding as vLLM JSON: {\"method\":\"mtp\",\"num_speculative_tokens\":3}; ngram also "
                  "takes \"prompt_lookup_max\" / \"prompt_lookup_min\"")
      ->excludes(spec)
      ->excludes(spec_n);
  cmd->add_flag("--spec-adaptive", o->spec.adaptive, "Adapt the draft count to recent acceptance");
  cmd->add_option("--draft-model", o->spec.draft_model, "DFlash drafter checkpoint (Hugging Face directory) for --spec dflash");
  cmd->add_option("--block-size", o->spec.block_size, "DFlash block size: the pending token + B-1 drafts (2..17; default: the "
                  "drafter's)")->check(CLI::Range(2, 17));
  cmd->add_option("--tree-budget", o->spec.tree_budget,
                  "DFlash: verify a DDTree of up to N drafts per round (the most probable paths through the drafter's "
                  "top-8 per block position) instead of the block's chain; greedy or sampled (CUDA: composed of chain ops, "
                  "slow, until tree kernels exist)")
      ->check(CLI::Range(1, 63));
  cmd->add_flag("--dflash-sliding-causal", o->spec.dflash_sliding_causal,
                "DFlash: causal attention within the block in sliding-window layers (vLLM); default non-causal as the "
                "reference");
  add_sampling_options(cmd, o->sampling);
  add_cache_type_options(cmd, o->cache);
  add_tp_options(cmd, o->tp);
  add_offload_options(cmd, o->offload);
  add_lora_options(cmd, o->lora);
  cmd->callback([o] {
    if (!o->spec.speculative_config.empty()) parse_speculative_config(o->spec.speculative_config);  // fail before loading
    o->sampling.validate();
    QWEN36_CHECK(o->n_predict >= 0, "--n-predict {} must be >= 0", o->n_predict);
    QWEN36_CHECK(o->ctx > 0 && o->ctx <= (1 << 24), "--ctx-size {} is out of range", o->ctx);
    QWEN36_CHECK(!o->prompt.empty() || !o->prompt_file.empty() || !o->tokens.empty(),
                 "give a prompt: -p TEXT, -f FILE or --tokens IDS");
    o->offload.plan.state_type = resolve_state_type(o->cache);  // a bad --state-type fails before loading
    o->output = run_output_constraint(*o);                      // and a bad schema or grammar
    const std::vector<int32_t> prompt = parse_token_list(o->tokens);  // and a bad --tokens list
    QWEN36_CHECK(o->tokens.empty() || !prompt.empty(), "--tokens: the prompt is empty");
    LoadedModel lm;
    if (o->tp.ranks > 1) {  // tensor parallel: rank 0 here, the other ranks on threads of their own
      QWEN36_CHECK(o->lora.empty(), "--lora does not combine with --tensor-parallel yet");
      lm = load_tp_command_model(o->tp, o->model, o->backend, o->threads, o->offload);
    } else {
      o->offload.plan.ctx = o->ctx;  // what run_generation's memory plan will ask (--fit leaves room for it)
      o->offload.plan.kv_type = o->backend == "cuda" ? DType::BF16 : DType::F32;
      lm = o->model.empty() ? load_default_model(o->backend, o->threads, o->offload, o->lora)
                            : load_model(o->model, o->backend, o->threads, o->offload, o->lora);
    }
    if (!o->tokens.empty()) return run_tokens(*o, lm, prompt);
#ifdef QWEN36_HAVE_PCRE2
    run_text(*o, lm);
#else
    fail("text prompts need the tokenizer, which this build lacks (PCRE2 was not found); use --tokens");
#endif
  });
}

}  // namespace qwen36::cli
