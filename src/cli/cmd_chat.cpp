// qwen36 chat: a conversation with one model in the terminal (llama-cli's conversation mode,
// `ollama run`). Each line read is a user turn (a line ending in '\' goes on to the next); the
// answer streams as it is drawn, the model's reasoning on stderr (dimmed on a terminal).
// The engine's prefix cache keeps the conversation's state between turns, so a turn reads only
// its new tokens — up to where the template rewrites the history (Qwen's drops the reasoning of
// earlier answers, so from there the turn is read again).
// Commands: /help, /clear (a new conversation), /system TEXT (a new one with that system
// message), /think on|off, /save FILE (the conversation as chat-completions messages JSON),
// /exit. Ctrl-C stops an answer; at the prompt it, or the end of input (Ctrl-D), ends the session.
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "engine/scheduler.h"
#include "engine/spec/spec_generate.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace qwen36::cli {

namespace {

struct ChatOptions {
  std::string model, tokenizer, backend = "cpu", system, chat_template_file;
  int64_t ctx = 4096;
  int32_t n_predict = -1;  // per answer; -1: until the context is full
  int32_t reasoning_budget = -1;  // tokens of reasoning before </think> is forced
  int threads = 0;
  bool no_think = false;
  std::string spec = "none";
  int32_t spec_draft_n = 3;
  SamplingParams sampling;
  CacheTypes cache;
  OffloadOptions offload;
  LoraOptions lora;
};

#ifdef QWEN36_HAVE_PCRE2
std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted.store(true); }

// SIGINT sets a flag instead of ending the process; without SA_RESTART a read waiting at the
// prompt returns, so Ctrl-C there ends the session.
void catch_sigint() {
  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

// One user turn: lines joined while they end in '\'. False at the end of input or on Ctrl-C.
bool read_turn(bool tty, std::string& turn) {
  turn.clear();
  std::string line;
  for (bool first = true;; first = false) {
    if (tty) std::fputs(first ? "> " : ". ", stdout), std::fflush(stdout);
    if (!std::getline(std::cin, line) || g_interrupted.load()) return false;
    if (!line.empty() && line.back() == '\\') {
      turn += line.substr(0, line.size() - 1) + "\n";
      continue;
    }
    turn += line;
    return true;
  }
}

class Session {
 public:
  Session(const ChatOptions& o, Scheduler& engine, const text::Tokenizer& tok, const ChatTemplate& tmpl,
          std::vector<int32_t> stop_ids)
      : o_(o), engine_(engine), tok_(tok), tmpl_(tmpl), stop_ids_(std::move(stop_ids)),
        dim_(::isatty(STDERR_FILENO) != 0), system_(o.system), think_(!o.no_think) {
    clear();
  }

  void clear() {
    messages_ = nlohmann::ordered_json::array();
    if (!system_.empty()) messages_.push_back({{"role", "system"}, {"content", system_}});
  }
  void set_system(std::string system) {
    system_ = std::move(system);
    clear();
  }
  void set_thinking(bool on) { think_ = on; }
  void save(const std::string& path) const {
    std::ofstream out(path, std::ios::binary);
    QWEN36_CHECK(out.good(), "{}: cannot write", path);
    out << messages_.dump(2) << "\n";
    QWEN36_CHECK(out.good(), "{}: write error", path);
  }

  // Renders the conversation with `user` appended and streams the answer; the turn and the
  // answer (whole, or as far as it got when stopped) join the history.
  void turn(const std::string& user) {
    messages_.push_back({{"role", "user"}, {"content", user}});
    const nlohmann::ordered_json kwargs = {{"enable_thinking", think_}};
    const std::string prompt = tmpl_.render(messages_, nullptr, true, kwargs);
    RequestParams p;
    p.prompt = tok_.encode(prompt);
    const int64_t room = engine_.options().context - int64_t(p.prompt.size());
    if (room < 2) {
      messages_.erase(messages_.end() - 1);
      std::fprintf(stderr, "the conversation (%zu tokens) no longer fits the context (%lld): /clear starts a new one\n",
                   p.prompt.size(), static_cast<long long>(engine_.options().context));
      return;
    }
    p.sampling = o_.sampling;
    p.max_tokens = int32_t(o_.n_predict < 0 ? room : std::min<int64_t>(o_.n_predict, room));
    p.stop_ids = stop_ids_;
    OutputParserOptions popts;
    popts.thinking_enabled = true;
    popts.prompt_opened_thinking = prompt_opens_thinking(prompt);
    cap_reasoning(p, o_.reasoning_budget, popts.prompt_opened_thinking, tok_.token_id("<think>"),
                  tok_.token_id("</think>"));
    OutputParser parser(popts);
    std::string content;
    auto show = [&](const std::vector<OutputDelta>& deltas) {
      for (const OutputDelta& d : deltas) {
        if (d.kind == OutputDelta::Kind::Content) {
          content += d.text;
          std::fputs(d.text.c_str(), stdout);
        } else if (d.kind == OutputDelta::Kind::Reasoning) {
          std::fprintf(stderr, dim_ ? "\033[2m%s\033[0m" : "%s", d.text.c_str());
        } else if (d.kind == OutputDelta::Kind::ToolCall) {  // no tools are offered, but a model may try
          std::printf("\n[tool call] %s(%s)\n", d.tool_call.name.c_str(), d.tool_call.arguments.c_str());
        }
      }
      std::fflush(stdout);
      std::fflush(stderr);
    };
    g_interrupted.store(false);
    const auto req = engine_.submit(std::move(p));
    RequestEvent ev;
    std::string finish;
    while (finish.empty()) {
      if (g_interrupted.exchange(false)) req->cancel();
      if (!req->next(ev, std::chrono::milliseconds(50))) continue;
      if (ev.kind == RequestEvent::Kind::Token) show(parser.feed(ev.text));
      else finish = ev.finish_reason, show(parser.feed(ev.text));
      if (finish == "error") std::fprintf(stderr, "\nerror: %s\n", ev.error.c_str());
    }
    show(parser.finish());
    std::fputs("\n", stdout);
    messages_.push_back({{"role", "assistant"}, {"content", content}});
    stats(req->usage(), finish);
  }

 private:
  // One line on stderr: the answer's tokens and speed, how much of the prompt the cache held.
  void stats(const RequestUsage& u, const std::string& finish) const {
    const double decode_s = u.total_seconds - u.ttft_seconds;
    const std::string speed =
        u.completion_tokens > 1 && decode_s > 0 ? fmt::format(", {:.1f} tok/s", (u.completion_tokens - 1) / decode_s) : "";
    const std::string line = fmt::format("[{} tokens{}{}; prompt {} tokens, {} from the cache]", u.completion_tokens,
                                         speed, finish == "stop" ? "" : ", " + finish, u.prompt_tokens, u.cached_tokens);
    std::fprintf(stderr, dim_ ? "\033[2m%s\033[0m\n" : "%s\n", line.c_str());
  }

  const ChatOptions& o_;
  Scheduler& engine_;
  const text::Tokenizer& tok_;
  const ChatTemplate& tmpl_;
  const std::vector<int32_t> stop_ids_;
  const bool dim_;
  std::string system_;
  bool think_;
  nlohmann::ordered_json messages_;
};

constexpr const char* kHelp =
    "  /clear          start a new conversation\n"
    "  /system TEXT    start a new conversation with this system message ('/system' alone: none)\n"
    "  /think on|off   let the model reason before answering, or not\n"
    "  /save FILE      write the conversation as JSON messages\n"
    "  /exit           end the session (also Ctrl-D, or Ctrl-C at the prompt)\n"
    "  Ctrl-C while the model writes stops the answer; a line ending in '\\' continues on the next.\n";

void chat(const ChatOptions& o) {
  const std::string tok_path = resolve_tokenizer(o.tokenizer, o.model);
  QWEN36_CHECK(!tok_path.empty(), "no tokenizer found for this model: pass --tokenizer PATH");
  const text::Tokenizer tok = text::Tokenizer::from_file(tok_path);
  const std::unique_ptr<ChatTemplate> tmpl = load_chat_template(tok_path, o.chat_template_file);
  QWEN36_CHECK(tmpl, "{} carries no chat template (tokenizer_config.json, chat_template.jinja or GGUF metadata): "
               "--chat-template-file gives one", tok_path);
  OffloadOptions offload = o.offload;
  offload.plan.ctx = o.ctx;
  offload.plan.kv_type = o.backend == "cuda" ? DType::BF16 : DType::F32;
  offload.plan.state_type = resolve_state_type(o.cache);
  LoadedModel lm = o.model.empty() ? load_default_model(o.backend, o.threads, offload, o.lora)
                                   : load_model(o.model, o.backend, o.threads, offload, o.lora);
  const ModelConfig& c = lm.model->config();
  QWEN36_CHECK(tok.vocab_size() <= c.vocab_size, "the tokenizer has {} tokens but the model only {}",
               tok.vocab_size(), c.vocab_size);

  SchedulerOptions so;
  so.slots = 1;
  so.context = std::min<int64_t>(o.ctx, c.max_position_embeddings);
  so.kv_type = resolve_cache_type(o.cache, *lm.backend);
  so.state_type = resolve_state_type(o.cache);
  so.token_text = token_text_of(tok);
  if (o.spec != "none") {
    so.spec.method = parse_spec_method(o.spec);
    so.spec.draft_n = o.spec_draft_n;
    QWEN36_CHECK(so.spec.method != SpecMethod::Mtp || lm.model->has_mtp(),
                 "--spec mtp: this checkpoint has no MTP head; use --spec ngram or none");
  }
  check_memory_plan(*lm.backend, c, scheduler_memory(so));
  Scheduler engine(*lm.model, so);
  engine.start();
  Session session(o, engine, tok, *tmpl, chat_stop_ids(c, tok));
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  if (tty)
    std::fprintf(stderr, "qwen36 chat: %s, context %lld tokens. /help lists the commands.\n",
                 o.model.empty() ? "the built-in small model" : o.model.c_str(), static_cast<long long>(so.context));
  catch_sigint();
  std::string line;
  while (read_turn(tty, line)) {
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      std::fputs(kHelp, stderr);
    } else if (line == "/clear") {
      session.clear();
      std::fputs("(a new conversation)\n", stderr);
    } else if (line == "/system" || line.starts_with("/system ")) {
      session.set_system(line.size() > 8 ? line.substr(8) : "");
      std::fputs("(a new conversation with that system message)\n", stderr);
    } else if (line == "/think on" || line == "/think off") {
      session.set_thinking(line == "/think on");
      std::fprintf(stderr, "(reasoning %s)\n", line == "/think on" ? "on" : "off");
    } else if (line.starts_with("/save ")) {
      try {
        session.save(line.substr(6));
        std::fprintf(stderr, "(saved to %s)\n", line.substr(6).c_str());
      } catch (const Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
      }
    } else if (line.starts_with("/")) {
      std::fprintf(stderr, "unknown command %s; /help lists them\n", line.c_str());
    } else if (!line.empty()) {
      session.turn(line);
    }
  }
  engine.stop();
}
#endif

}  // namespace

void register_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Talk with a model in the terminal (a conversation, one line a turn)");
  auto o = std::make_shared<ChatOptions>();
  cmd->add_option("-m,--model", o->model,
                  "Model: Hugging Face directory or .gguf file (default: the built-in small model)");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json or its directory (default: beside the model)");
  cmd->add_option("--system", o->system, "System message of every conversation");
  cmd->add_flag("--no-think", o->no_think, "Answer without reasoning first (enable_thinking false)");
  cmd->add_option("--reasoning-budget", o->reasoning_budget,
                  "Most tokens of reasoning before </think> is forced (-1: no cap)")
      ->check(CLI::Range(-1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--chat-template-file", o->chat_template_file, "Jinja chat template instead of the model's own")
      ->check(CLI::ExistingFile);
  cmd->add_option("-n,--n-predict", o->n_predict, "Most tokens an answer may have (-1: until the context is full)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx, "Context of the whole conversation")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--spec", o->spec, "Speculative decoding: mtp (the checkpoint's MTP head), ngram or none")
      ->check(CLI::IsMember({"mtp", "ngram", "none"}))
      ->capture_default_str();
  cmd->add_option("--spec-draft-n", o->spec_draft_n, "Draft tokens per verify pass (1..16)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  add_sampling_options(cmd, o->sampling);
  add_cache_type_options(cmd, o->cache);
  add_offload_options(cmd, o->offload);
  add_lora_options(cmd, o->lora);
  cmd->callback([o] {
    o->sampling.validate();
    QWEN36_CHECK(o->ctx > 0 && o->ctx <= (1 << 24), "--ctx-size {} is out of range", o->ctx);
    QWEN36_CHECK(o->n_predict >= -1, "--n-predict {} must be -1 or more", o->n_predict);
#ifdef QWEN36_HAVE_PCRE2
    chat(*o);
#else
    fail("chat needs the tokenizer, which this build lacks (PCRE2 was not found)");
#endif
  });
}

}  // namespace qwen36::cli
