// qwen36 serve: the OpenAI-compatible HTTP server (src/server/) over the continuous-batching
// engine (src/engine/scheduler.h). Flags follow llama-server; each has a QWEN36_* variable.
#include <csignal>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/tp_cli.h"
#include "core/error.h"
#include "engine/spec/spec_generate.h"

#if QWEN36_HAVE_SERVER
#include <pthread.h>

#include "engine/scheduler.h"
#include "engine/tp_remote.h"
#include "server/server.h"
#include "text/json_schema.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "model/memory_plan.h"
#endif

namespace qwen36::cli {

namespace {

struct ServeOptions {
  std::string model, tokenizer, backend = "cpu", alias;
  std::string host = "127.0.0.1", api_key;
  int port = 8080, threads = 0, parallel = 4, max_queue = 64, http_threads = 0;
  int64_t ctx = 4096;
  ServeStep step;  // -b/--batch-size, --prefill-chunk (0: the backend's)
  double shutdown_timeout = 5;
  bool no_prefix_cache = false;
  std::string json_whitespace = "limited";  // structured output's default (text::whitespace_named)
  std::string chat_template_file;           // overrides the checkpoint's template
  std::string chat_template_kwargs;         // JSON object: defaults of every chat request
  std::vector<std::string> allowed_origins = {"*"};  // CORS
  size_t stored_responses = 1024;                    // Responses API, for previous_response_id
  bool no_access_log = false;
  int64_t reasoning_budget = -1;  // default thinking_token_budget
  std::string reasoning_format = "auto";
  int64_t snapshot_interval = 512;  // prefix-cache checkpoints: positions between them
  int64_t snapshot_mem_mib = 2048;  // their budget in device memory
  int64_t cache_ram_mib = 0;        // and in host RAM (second tier)
  std::string prefix_cache_file;     // checkpoints kept across restarts
  CacheTypes cache;
  OffloadOptions offload;
  LoraOptions lora;
  TpCliOptions tp;
  SpecCliOptions spec;  // --spec, --spec-draft-n, --speculative-config, DFlash flags
};

// spec_cli_options, checked for serving (a DFlash drafter given, its flags with DFlash only).
SpecOptions spec_options(const ServeOptions& o) {
  SpecOptions spec = spec_cli_options(o.spec);
  if (spec.method == SpecMethod::Dflash) {
    QWEN36_CHECK(!spec.draft_model.empty(), "--spec dflash needs a drafter checkpoint (--draft-model DIR)");
    // A round drafts the whole block (SpecStepper sets draft_n = B − 1 once the drafter is
    // loaded); the memory plan takes the largest block when the drafter's is not known yet.
    spec.draft_n = spec.dflash.block_size ? spec.dflash.block_size - 1 : 16;
  } else {
    QWEN36_CHECK(o.spec.draft_model.empty() && !o.spec.block_size && !o.spec.tree_budget,
                 "--draft-model, --block-size and --tree-budget apply to --spec dflash only");
  }
  return spec;
}

#if QWEN36_HAVE_SERVER
void serve(const ServeOptions& o) {
  QWEN36_CHECK(o.parallel >= 1 && o.parallel <= 1024, "--parallel {} must be in 1..1024", o.parallel);
  QWEN36_CHECK(o.ctx >= 16 && o.ctx <= (1 << 24), "--ctx-size {} is out of range", o.ctx);
  QWEN36_CHECK(o.max_queue >= 0, "--max-queue {} must be >= 0", o.max_queue);
  QWEN36_CHECK(o.shutdown_timeout >= 0, "--shutdown-timeout must be >= 0");
  const ServeStep& step = o.step;  // resolved by the command's callback (no zeros left)

  // SIGTERM / SIGINT are taken by sigwait below, so block them before any thread starts
  // (threads inherit the mask) and no handler ever runs inside a worker.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // A follower process of a multi-process tensor-parallel launch (RANK > 0) serves no HTTP (it
  // would take process 0's port on the same host): it runs process 0's passes on its ranks and
  // exits when process 0 shuts the group down (load_tp_model).
  if (o.tp.ranks > 1 && tp_process_env().rank > 0) {
    load_tp_command_model(o.tp, o.model, o.backend, o.threads, o.offload);
    return;
  }

  with_context("--json-whitespace", [&] { return text::JsonSchema::any_value(text::whitespace_named(o.json_whitespace)); });
  nlohmann::ordered_json default_kwargs = nlohmann::ordered_json::object();
  if (!o.chat_template_kwargs.empty()) {
    default_kwargs = nlohmann::ordered_json::parse(o.chat_template_kwargs, nullptr, false);
    QWEN36_CHECK(default_kwargs.is_object(), "--default-chat-template-kwargs: not a JSON object: {}",
                 o.chat_template_kwargs);
  }
  server::ServerConfig sc;
  sc.host = o.host;
  sc.port = o.port;
  sc.api_key = o.api_key;
  sc.allowed_origins = o.allowed_origins;
  sc.stored_responses = o.stored_responses;
  sc.access_log = !o.no_access_log;
  if (sc.allowed_origins.size() == 1 && sc.allowed_origins[0].empty()) sc.allowed_origins.clear();
  sc.http_threads = o.http_threads > 0 ? o.http_threads : std::min(4096, o.parallel + o.max_queue + 8);
  server::HttpServer http(sc);
  const int port = http.bind();
  http.start();  // /health answers 503 "loading" while the model loads
  spdlog::info("listening on http://{}:{} (loading the model)", o.host, port);

  OffloadOptions offload = o.offload;  // --fit leaves room for the caches this server will ask for
  offload.plan.slots = o.parallel;
  offload.plan.ctx = o.ctx;
  offload.plan.batch_tokens = step.batch_tokens;
  offload.plan.output_rows = o.parallel;
  offload.plan.kv_type = o.backend == "cuda" ? DType::BF16 : DType::F32;
  offload.plan.state_type = resolve_state_type(o.cache);
  const SpecOptions spec = spec_options(o);
  // Tensor parallel: rank 0 here, the others on threads of their own; the scheduler drives the
  // model as one (its prefix cache off: the other ranks cannot restore a snapshot).
  QWEN36_CHECK(o.tp.ranks <= 1 || spec.method != SpecMethod::Dflash,
               "--spec dflash does not run with tensor parallelism yet");
  QWEN36_CHECK(o.tp.ranks <= 1 || o.lora.empty(), "--lora does not combine with --tensor-parallel yet");
  LoadedModel lm = o.tp.ranks > 1 ? load_tp_command_model(o.tp, o.model, o.backend, o.threads, o.offload)
                   : o.model.empty() ? load_default_model(o.backend, o.threads, offload, o.lora)
                                     : load_model(o.model, o.backend, o.threads, offload, o.lora);
  const ModelConfig& c = lm.model->config();
  QWEN36_CHECK(spec.method != SpecMethod::Mtp || lm.model->has_mtp(),
               "--spec mtp: this checkpoint has no MTP head (no mtp.* tensors / GGUF nextn block); use --spec ngram or "
               "--spec none");
  const std::string tok_path = resolve_tokenizer(o.tokenizer, o.model);
  QWEN36_CHECK(!tok_path.empty(), "no tokenizer found for this model: pass --tokenizer PATH{}",
               o.model.empty() ? " (or run scripts/fetch-tokenizer.sh for the default model)" : "");
  const text::Tokenizer tok = text::Tokenizer::from_file(tok_path);
  QWEN36_CHECK(tok.vocab_size() <= c.vocab_size, "the tokenizer has {} tokens but the model only {}",
               tok.vocab_size(), c.vocab_size);
  const std::unique_ptr<ChatTemplate> tmpl = load_chat_template(tok_path, o.chat_template_file);
  if (!tmpl)
    spdlog::warn("{} carries no chat template (tokenizer_config.json, chat_template.jinja or GGUF metadata): "
                 "/v1/chat/completions is unavailable; --chat-template-file gives one", tok_path);

  SchedulerOptions so;
  so.spec = spec;
  so.slots = o.parallel;
  so.context = std::min<int64_t>(o.ctx, c.max_position_embeddings);
  so.prefill_chunk = int32_t(step.prefill_chunk);
  so.max_batch_tokens = int32_t(step.batch_tokens);
  so.max_queue = o.max_queue;
  so.prefix_cache = !o.no_prefix_cache;
  so.snapshots = {.interval = o.snapshot_interval,
                  .device_bytes = size_t(o.snapshot_mem_mib) << 20,
                  .host_bytes = size_t(o.cache_ram_mib) << 20};
  so.kv_type = resolve_cache_type(o.cache, *lm.backend);
  so.state_type = resolve_state_type(o.cache);
  so.token_text = token_text_of(tok);
  so.vocab = std::make_shared<const TokenTrie>(tok.document_bytes(c.vocab_size));  // for response_format
  // A prompt_logprobs (echo) request's rows come beside the others, speculating or not.
  check_memory_plan(*lm.backend, c, scheduler_memory(so, Scheduler::kPromptLogprobRows));
  Scheduler engine(*lm.model, so);
  const std::string weights_id = o.prefix_cache_file.empty() ? "" : model_identity(o.model, o.lora);
  if (!o.prefix_cache_file.empty() && std::filesystem::exists(o.prefix_cache_file))
    engine.load_checkpoints(o.prefix_cache_file, weights_id);
  engine.start();

  server::ServeContext ctx;
  ctx.engine = &engine;
  ctx.tokenizer = &tok;
  ctx.chat_template = tmpl.get();
  ctx.stop_ids = chat_stop_ids(c, tok);
  ctx.json_whitespace = o.json_whitespace;
  ctx.chat_template_kwargs = default_kwargs;
  ctx.reasoning_budget = o.reasoning_budget;
  ctx.reasoning_format = o.reasoning_format;
  ctx.model_path = o.model;
  ctx.model_name = !o.alias.empty()  ? o.alias
                   : o.model.empty() ? "qwen36-default"
                                     : std::filesystem::path(o.model).filename().string();
  http.attach(ctx);
  spdlog::info("ready: model \"{}\" on {}, {} slots x {} tokens, steps of {} tokens (prompt chunks of {}), "
               "http://{}:{}/",
               ctx.model_name, lm.backend->name(), so.slots, so.context, so.max_batch_tokens, so.prefill_chunk, o.host,
               port);
  if (so.spec.method != SpecMethod::None)
    spdlog::info("speculative decoding: {}, up to {} drafts per sequence and step{}", spec_method_name(so.spec.method),
                 so.spec.method == SpecMethod::Dflash && !so.spec.dflash.block_size ? std::string("block - 1 of the drafter")
                                                                                    : std::to_string(so.spec.draft_n),
                 so.spec.adaptive ? " (adaptive)"
                 : so.spec.tree_budget ? fmt::format(" (a tree of up to {} drafts)", so.spec.tree_budget)
                                       : std::string());

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("{}: finishing requests (up to {} s), then shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               o.shutdown_timeout);
  http.stop_accepting();
  engine.stop(std::chrono::milliseconds(int64_t(o.shutdown_timeout * 1000)));  // cancels what is left
  http.stop();
  if (!o.prefix_cache_file.empty()) {
    try {
      const size_t n = engine.save_checkpoints(o.prefix_cache_file, weights_id);
      spdlog::info("{}: {} prefix-cache checkpoints written", o.prefix_cache_file, n);
    } catch (const Error& e) {
      spdlog::error("prefix-cache checkpoints not written: {}", e.what());
    }
  }
  spdlog::info("stopped");
}
#endif

}  // namespace

void register_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  auto o = std::make_shared<ServeOptions>();
  cmd->add_option("-m,--model", o->model, "Model: Hugging Face directory or .gguf (default: the built-in small model)")
      ->envname("QWEN36_MODEL");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json or its directory (default: next to the model)");
  cmd->add_option("--host", o->host, "Address to listen on")->envname("QWEN36_HOST")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on")->envname("QWEN36_PORT")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context per sequence (prompt + answer)")
      ->envname("QWEN36_CTX_SIZE")->capture_default_str();
  cmd->add_option("--parallel", o->parallel, "Sequences decoded at once (state slots)")
      ->envname("QWEN36_PARALLEL")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require \"Authorization: Bearer KEY\" (not for /health)")
      ->envname("QWEN36_API_KEY");
  cmd->add_option("--alias", o->alias, "Model name reported by the API")->envname("QWEN36_ALIAS");
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0 = all cores)")->envname("QWEN36_THREADS")
      ->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->envname("QWEN36_BACKEND")->capture_default_str();
  add_cache_type_options(cmd, o->cache);
  add_offload_options(cmd, o->offload);
  add_lora_options(cmd, o->lora);
  add_tp_options(cmd, o->tp);
  cmd->get_option("--cache-type-k")->envname("QWEN36_CACHE_TYPE_K");
  cmd->get_option("--cache-type-v")->envname("QWEN36_CACHE_TYPE_V");
  cmd->get_option("--state-type")->envname("QWEN36_STATE_TYPE");
  add_serve_step_options(cmd, o->step);
  cmd->get_option("--batch-size")->envname("QWEN36_BATCH_SIZE");
  cmd->get_option("--prefill-chunk")->envname("QWEN36_PREFILL_CHUNK");
  cmd->add_option("--max-queue", o->max_queue, "Waiting requests before new ones get 503")
      ->envname("QWEN36_MAX_QUEUE")->capture_default_str();
  cmd->add_option("--http-threads", o->http_threads, "HTTP worker threads (0 = parallel + max-queue + 8)")
      ->envname("QWEN36_HTTP_THREADS")->capture_default_str();
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "Origins whose web pages may call the API from a browser (CORS): '*' any, or exact origins "
                  "such as https://app.example:3000 (comma-separated or repeated); '' none")
      ->delimiter(',')
      ->envname("QWEN36_ALLOWED_ORIGINS")
      ->capture_default_str();
  cmd->add_option("--stored-responses", o->stored_responses,
                  "Responses API: responses kept in memory for previous_response_id and GET /v1/responses/{id} "
                  "(the least recently used are forgotten; 0: none)")
      ->envname("QWEN36_STORED_RESPONSES")
      ->capture_default_str();
  cmd->add_option("--default-chat-template-kwargs,--chat-template-kwargs", o->chat_template_kwargs,
                  "Chat template variables for every request, under its own chat_template_kwargs: a JSON "
                  "object, e.g. '{\"enable_thinking\": false}' to answer without reasoning by default")
      ->envname("QWEN36_CHAT_TEMPLATE_KWARGS");
  cmd->add_option("--reasoning-budget", o->reasoning_budget,
                  "Most tokens a chat answer may reason before its </think> is forced (a request's "
                  "thinking_token_budget overrides; -1: no cap)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 30))
      ->envname("QWEN36_REASONING_BUDGET")
      ->capture_default_str();
  cmd->add_option("--reasoning-format", o->reasoning_format,
                  "Where a chat answer's reasoning goes: auto or deepseek (apart: reasoning_content, the Messages "
                  "API's thinking blocks, the Responses API's reasoning items), none (left in the text with its "
                  "<think> tags); a chat request's reasoning_format overrides")
      ->check(CLI::IsMember({"auto", "deepseek", "none"}))
      ->envname("QWEN36_REASONING_FORMAT")
      ->capture_default_str();
  cmd->add_option("--chat-template-file", o->chat_template_file,
                  "Jinja chat template to use instead of the model's own (tokenizer_config.json, "
                  "chat_template.jinja or the GGUF's tokenizer.chat_template)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--json-whitespace", o->json_whitespace,
                  "Default whitespace of JSON output between tokens (a request may set its own): limited (one "
                  "space, or a newline and up to 20 spaces / tabs), compact (at most one space), any (up to 64 "
                  "whitespace bytes), or a regular expression that also matches the empty text")
      ->envname("QWEN36_JSON_WHITESPACE")->capture_default_str();
  cmd->add_flag("--no-access-log", o->no_access_log,
                "No log line a request (client, method, path, status, seconds until the answer ended)")
      ->envname("QWEN36_NO_ACCESS_LOG");
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache, "Do not keep finished sequences for prefix reuse")
      ->envname("QWEN36_NO_PREFIX_CACHE");
  cmd->add_option("--snapshot-interval", o->snapshot_interval,
                  "Prefix cache: save a prompt's state every N positions while it is read, so prompts sharing a "
                  "beginning (system prompt, tools) resume from the longest saved one (0 = off; off with --spec mtp/dflash)")
      ->envname("QWEN36_SNAPSHOT_INTERVAL")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--snapshot-mem", o->snapshot_mem_mib,
                  "Prefix cache: MiB of device memory for saved states (least recently used evicted first)")
      ->envname("QWEN36_SNAPSHOT_MEM")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--cache-ram", o->cache_ram_mib,
                  "Prefix cache: MiB of host RAM for saved states that do not fit --snapshot-mem (0 = none)")
      ->envname("QWEN36_CACHE_RAM")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--prefix-cache-file", o->prefix_cache_file,
                  "Prefix cache: read the saved checkpoints from FILE at start (when it was written for this "
                  "model, adapters and cache types) and write them back at shutdown, so a restarted server "
                  "resumes shared prompt beginnings at once")
      ->envname("QWEN36_PREFIX_CACHE_FILE");
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout, "Seconds running requests may finish after SIGTERM")
      ->envname("QWEN36_SHUTDOWN_TIMEOUT")->capture_default_str();
  auto* spec = cmd->add_option("--spec", o->spec.method,
                               "Speculative decoding of every sequence: mtp (the checkpoint's MTP head drafts), ngram "
                               "(prompt lookup), dflash (block drafter, --draft-model) or none. Each step verifies every sequence's drafts in the one batch "
                               "it shares with other sequences' decode tokens and prompt chunks; the output is "
                               "unchanged (greedy: token for token; sampling: the same distribution)")
                    ->check(CLI::IsMember({"mtp", "ngram", "dflash", "none"}))
                    ->envname("QWEN36_SPEC")
                    ->capture_default_str();
  auto* spec_n = cmd->add_option("--spec-draft-n", o->spec.draft_n, "Draft tokens per sequence and step, at most (1..16)")
                     ->check(CLI::Range(1, 16))
                     ->envname("QWEN36_SPEC_DRAFT_N")
                     ->capture_default_str();
  cmd->add_flag("--spec-adaptive", o->spec.adaptive,
                "Per sequence, draft one more after a fully accepted round, else (accepted + 1)")
      ->envname("QWEN36_SPEC_ADAPTIVE");
  cmd->add_option("--draft-model", o->spec.draft_model,
                  "DFlash drafter checkpoint (z-lab DFlashDraftModel directory) for --spec dflash; each slot keeps its "
                  "own drafter context, prefix-cache checkpoints are off (same-slot prefix reuse stays)")
      ->envname("QWEN36_DRAFT_MODEL");
  cmd->add_option("--block-size", o->spec.block_size,
                  "DFlash block size: the pending token + B-1 drafts per step (2..17; default: the drafter's)")
      ->envname("QWEN36_BLOCK_SIZE")
      ->check(CLI::Range(2, 17));
  cmd->add_option("--tree-budget", o->spec.tree_budget,
                  "DFlash: each step verifies a DDTree of up to N drafts per sequence (the most probable paths through "
                  "the drafter's top-8 per block position) instead of the block's chain; the step's token budget counts "
                  "the nodes (CUDA: composed of chain ops, slow, until tree kernels exist)")
      ->envname("QWEN36_TREE_BUDGET")
      ->check(CLI::Range(1, 63));
  cmd->add_flag("--dflash-sliding-causal", o->spec.dflash_sliding_causal,
                "DFlash: causal attention within the block in sliding-window layers (vLLM); default non-causal as "
                "the reference");
  cmd->add_option("--speculative-config", o->spec.speculative_config,
                  "Speculative decoding as vLLM JSON, in place of --spec/--spec-draft-n: "
                  "{\"method\":\"mtp\",\"num_speculative_tokens\":3}; ngram also takes \"prompt_lookup_max\" / "
                  "\"prompt_lookup_min\"")
      ->envname("QWEN36_SPECULATIVE_CONFIG")
      ->excludes(spec)
      ->excludes(spec_n);
  cmd->callback([o] {
    spec_options(*o);  // a bad --speculative-config, -b or --prefill-chunk fails before the model loads
    o->step = resolve_serve_step(o->step, o->backend);
#if QWEN36_HAVE_SERVER
    serve(*o);
#else
    fail("this build has no HTTP server: it needs cpp-httplib (Debian libcpp-httplib-dev) and PCRE2 at build time");
#endif
  });
}

}  // namespace qwen36::cli
