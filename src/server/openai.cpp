// /v1/chat/completions and /v1/completions: the endpoints' own fields (messages, tools,
// prompts), then the engine's events as OpenAI's answer or SSE stream (server/reply.h).
#include <algorithm>

#include "server/chat.h"
#include "server/reply.h"

namespace qwen36::server {

namespace {

// vLLM's prompt_logprobs: null for the first prompt token, then per token a map of token ids
// (the prompt's own and the `top` most likely) to {logprob, rank, decoded_token}.
struct PromptLogprobs {
  const text::Tokenizer* tok = nullptr;
  int top = -1;  // -1: not asked
  Json list = Json::array({nullptr});

  void add(const TokenLogprob& lp) {
    if (top < 0) return;
    Json entry = Json::object();
    auto put = [&](int32_t id, float logprob, int32_t rank) {
      entry[std::to_string(id)] = {{"logprob", logprob}, {"rank", rank}, {"decoded_token", tok->piece(id)}};
    };
    put(lp.token, lp.logprob, lp.rank);
    for (size_t i = 0; i < lp.top.size() && int(i) < top; ++i) put(lp.top[i].first, lp.top[i].second, int32_t(i) + 1);
    list.push_back(std::move(entry));
  }
  Json json() const { return top < 0 ? Json(nullptr) : list; }
};

// One token's entry of a chat "logprobs.content" list.
Json chat_logprob(const text::Tokenizer& tok, const TokenLogprob& lp) {
  auto entry = [&](int32_t id, float v) {
    const std::string piece = tok.piece(id);
    return Json{{"token", piece}, {"logprob", v}, {"bytes", bytes_json(piece)}};
  };
  Json e = entry(lp.token, lp.logprob);
  e["top_logprobs"] = Json::array();
  for (const auto& [id, v] : lp.top) e["top_logprobs"].push_back(entry(id, v));
  return e;
}

// ---- /v1/chat/completions ----

struct ChatJob : Job {
  const text::Tokenizer* tok = nullptr;
  OutputParser parser;
  std::string id = random_id("chatcmpl-"), model;
  int64_t created = unix_time();
  bool want_logprobs = false, sent_role = false;
  Json logprobs = Json::array();
  PromptLogprobs prompt_logprobs;

  explicit ChatJob(OutputParserOptions o) : parser(std::move(o)) {}
  void on_prompt_logprob(const TokenLogprob& lp) override { prompt_logprobs.add(lp); }

  Json chunk(Json delta, Json finish_reason = nullptr, Json lp = nullptr) const {
    Json choice = {{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)},
                   {"finish_reason", std::move(finish_reason)}};
    return {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
            {"choices", Json::array({std::move(choice)})}};
  }
  static Json delta_json(const OutputDelta& d) {
    switch (d.kind) {
      case OutputDelta::Kind::Content: return {{"content", d.text}};
      case OutputDelta::Kind::Reasoning: return {{"reasoning_content", d.text}};
      case OutputDelta::Kind::ToolCall: break;
    }
    Json call = {{"index", d.index},
                 {"id", d.tool_call.id},
                 {"type", "function"},
                 {"function", {{"name", d.tool_call.name}, {"arguments", d.tool_call.arguments}}}};
    return {{"tool_calls", Json::array({std::move(call)})}};
  }
  std::vector<Json> deltas(const std::vector<OutputDelta>& ds, Json lp) {
    std::vector<Json> out;
    if (!sent_role) {
      out.push_back(chunk({{"role", "assistant"}, {"content", ""}}));
      sent_role = true;
    }
    for (const OutputDelta& d : ds) out.push_back(chunk(delta_json(d)));
    if (!lp.is_null()) {  // logprobs ride on the token's last chunk (an empty delta if it had none)
      if (ds.empty()) out.push_back(chunk(Json::object()));
      out.back()["choices"][0]["logprobs"] = {{"content", Json::array({std::move(lp)})}};
    }
    return out;
  }
  std::vector<Json> on_text(const std::string& text, const TokenLogprob* lp) override {
    Json lpj = want_logprobs && lp ? chat_logprob(*tok, *lp) : Json(nullptr);
    if (!stream) {
      parser.feed(text);
      if (!lpj.is_null()) logprobs.push_back(std::move(lpj));
      return {};
    }
    return deltas(parser.feed(text), std::move(lpj));
  }
  std::string finish_reason(const std::string& reason) const {
    return reason == "stop" && !parser.result().tool_calls.empty() ? "tool_calls" : reason;
  }
  std::vector<Json> on_finish(const std::string& text, const std::string& reason, const RequestUsage& usage) override {
    std::vector<OutputDelta> ds = parser.feed(text);
    for (OutputDelta& d : parser.finish()) ds.push_back(std::move(d));
    std::vector<Json> out = deltas(ds, nullptr);
    Json last = chunk(Json::object(), finish_reason(reason));
    last["usage"] = usage_json(usage);  // llama-server style: a choice's last chunk reports its usage
    last["timings"] = timings_json(usage);
    out.push_back(std::move(last));
    return out;
  }
  Json usage_chunk(const RequestUsage& usage) override {
    Json u = chunk(Json::object());
    u["choices"] = Json::array();
    u["usage"] = usage_json(usage);
    return u;
  }
  Json response(const std::string& reason, const RequestUsage& usage) override {
    Json choice = {{"index", index},
                   {"message", to_openai_message(parser.result())},
                   {"logprobs", want_logprobs ? Json{{"content", logprobs}} : Json(nullptr)},
                   {"finish_reason", finish_reason(reason)}};
    Json r = {{"id", id},     {"object", "chat.completion"}, {"created", created},
              {"model", model}, {"choices", Json::array({std::move(choice)})}, {"usage", usage_json(usage)},
              {"timings", timings_json(usage)}};
    if (prompt_logprobs.top >= 0) r["prompt_logprobs"] = prompt_logprobs.json();
    return r;
  }
};

}  // namespace

void handle_chat_completions(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                        "reasoning_effort", "logprobs", "top_logprobs", "stop", "seed", "max_tokens",
                        "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "n", "stream", "stream_options", "user",
                        "response_format", "ignore_eos", "metadata", "store", "logit_bias", "add_generation_prompt",
                        "continue_final_message", "thinking_token_budget", "reasoning_format"},
                 {kStructuredOutputFields, kVllmSamplingFields});
  const ChatRequest c = prepare_chat(api, body);
  respond(submit_choices<ChatJob>(api, c.g,
                                   [&](const ChatJob* first) {
                                     auto job = std::make_shared<ChatJob>(c.parser);
                                     job->tok = api.ctx.tokenizer;
                                     job->model = api.ctx.model_name;
                                     job->want_logprobs = c.want_logprobs;
                                     job->prompt_logprobs = {api.ctx.tokenizer, c.g.params.prompt_logprobs};
                                     if (first) job->id = first->id, job->created = first->created;
                                     return job;
                                   }),
          res);
}

// ---- /v1/completions ----

namespace {

struct CompletionJob : Job {
  const text::Tokenizer* tok = nullptr;
  std::string id = random_id("cmpl-"), model, text;
  int64_t created = unix_time();
  bool want_logprobs = false;
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array();
  // echo: the prompt's text leads the answer, its tokens the logprobs (the first one's null);
  // streamed, as a chunk of its own before the first of the answer.
  std::string echo;
  bool echoing = false, echo_pending = false;
  PromptLogprobs prompt_logprobs;  // vLLM's form, when asked

  void start_echo(std::string prompt_text, int32_t first_token) {
    text = echo = std::move(prompt_text);
    echoing = true;
    echo_pending = stream;
    if (!want_logprobs) return;
    tokens.push_back(tok->piece(first_token));
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
  }
  void on_prompt_logprob(const TokenLogprob& lp) override {
    prompt_logprobs.add(lp);
    if (!echoing || !want_logprobs) return;
    Json l = legacy_logprob(lp);
    tokens.push_back(l["tokens"][0]);
    token_logprobs.push_back(l["token_logprobs"][0]);
    top_logprobs.push_back(l["top_logprobs"][0]);
  }
  // Streaming: the echo chunk, once, ahead of `next`.
  std::vector<Json> after_echo(Json next) {
    std::vector<Json> out;
    if (echo_pending) {
      echo_pending = false;
      Json lp = want_logprobs ? Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}}
                              : Json(nullptr);
      out.push_back(chunk(echo, nullptr, std::move(lp)));
    }
    out.push_back(std::move(next));
    return out;
  }

  Json chunk(const std::string& t, Json finish_reason, Json lp = nullptr) const {
    Json choice = {{"index", index}, {"text", t}, {"logprobs", std::move(lp)}, {"finish_reason", std::move(finish_reason)}};
    return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", Json::array({std::move(choice)})}};
  }
  int top_n = 0;  // logprobs' alternatives (a prompt token's may come with more)
  Json legacy_logprob(const TokenLogprob& lp) const {
    Json top = Json::object();
    for (size_t i = 0; i < lp.top.size() && int(i) < top_n; ++i) top[tok->piece(lp.top[i].first)] = lp.top[i].second;
    return {{"tokens", {tok->piece(lp.token)}}, {"token_logprobs", {lp.logprob}}, {"top_logprobs", {top}}};
  }
  std::vector<Json> on_text(const std::string& t, const TokenLogprob* lp) override {
    if (!stream) {
      text += t;
      if (want_logprobs && lp) {
        Json l = legacy_logprob(*lp);
        tokens.push_back(l["tokens"][0]);
        token_logprobs.push_back(l["token_logprobs"][0]);
        top_logprobs.push_back(l["top_logprobs"][0]);
      }
      return {};
    }
    return after_echo(chunk(t, nullptr, want_logprobs && lp ? legacy_logprob(*lp) : Json(nullptr)));
  }
  std::vector<Json> on_finish(const std::string& t, const std::string& reason, const RequestUsage& usage) override {
    text += t;
    Json last = chunk(t, reason);
    last["usage"] = usage_json(usage);
    last["timings"] = timings_json(usage);
    return after_echo(std::move(last));
  }
  Json usage_chunk(const RequestUsage& usage) override {
    Json u = chunk("", nullptr);
    u["choices"] = Json::array();
    u["usage"] = usage_json(usage);
    return u;
  }
  Json response(const std::string& reason, const RequestUsage& usage) override {
    Json lp = want_logprobs ? Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}}
                            : Json(nullptr);
    Json j = chunk(text, reason, std::move(lp));
    if (prompt_logprobs.top >= 0) j["choices"][0]["prompt_logprobs"] = prompt_logprobs.json();
    j["usage"] = usage_json(usage);
    j["timings"] = timings_json(usage);
    return j;
  }
};

}  // namespace

namespace {

constexpr size_t kMaxPrompts = 64;  // a list's prompts, each `n` requests

// The completions route's prompts: a string, token ids, or a list of either (OpenAI's batch form;
// each prompt gets `n` choices).
std::vector<Json> prompt_list(const Json& p) {
  auto is_ids = [](const Json& x) {
    return x.is_array() && !x.empty() && std::all_of(x.begin(), x.end(), [](const Json& t) { return t.is_number_integer(); });
  };
  if (p.is_string() || is_ids(p)) return {p};
  if (p.is_array() && !p.empty() && p.size() <= kMaxPrompts &&
      std::all_of(p.begin(), p.end(), [&](const Json& x) { return x.is_string() || is_ids(x); }))
    return std::vector<Json>(p.begin(), p.end());
  throw HttpError(400, fmt::format("'prompt' must be a string, an array of token ids, or a list of up to {} of "
                                   "either", kMaxPrompts), "prompt");
}

std::vector<int32_t> prompt_ids(const HttpServer::Api& api, const Json& p, const char* where) {
  std::vector<int32_t> ids;
  if (p.is_string()) {
    ids = api.ctx.tokenizer->encode(p.get<std::string>());
  } else {
    const int64_t vocab = api.ctx.engine->model().config().vocab_size;
    for (const Json& x : p) {
      const int64_t t = x.get<int64_t>();
      if (t < 0 || t >= vocab) throw HttpError(400, fmt::format("{}: token {} is outside the vocabulary", where, t), "prompt");
      ids.push_back(int32_t(t));
    }
  }
  if (ids.empty()) throw HttpError(400, fmt::format("{} is empty", where), "prompt");
  return ids;
}

}  // namespace

void handle_completions(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"model", "prompt", "logprobs", "stop", "seed", "max_tokens", "temperature", "top_p", "top_k",
                        "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "stream",
                        "stream_options", "user", "ignore_eos", "echo", "best_of", "suffix", "response_format",
                        "logit_bias"}, {kStructuredOutputFields, kVllmSamplingFields});
  const bool echo = boolean(body, "echo", false);
  if (has(body, "suffix")) throw HttpError(400, "'suffix' is not supported", "suffix");
  if (has(body, "best_of") && integer(body, "best_of", 1, 1, 1) != 1)
    throw HttpError(400, "only best_of = 1 is supported", "best_of");
  const std::vector<Json> prompts = prompt_list(body.value("prompt", Json()));
  const int64_t n_logprobs = integer(body, "logprobs", 0, 20, -1);
  const OutputConstraint constraint = output_constraint(body, text::whitespace_named(api.ctx.json_whitespace));
  const int vllm_prompt_logprobs = int(integer(body, "prompt_logprobs", 0, 20, -1));
  std::vector<Generation> gens;
  std::vector<std::string> echoes;  // each prompt's text, for echo
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Json& p = prompts[i];
    const char* where = prompts.size() == 1 ? "prompt" : "prompt (a list entry)";
    std::vector<int32_t> ids = prompt_ids(api, p, where);
    echoes.push_back(!echo ? "" : p.is_string() ? p.get<std::string>() : api.ctx.tokenizer->decode(ids));
    // A raw completion stops at end-of-text only, not at the chat's end of turn.
    Generation g = parse_generation(body, api, std::move(ids), /*end_of_turn=*/false);
    g.params.constraint = constraint;  // as vLLM: structured output for raw completions too
    g.params.top_logprobs = int32_t(n_logprobs);
    // echo + logprobs (lm-evaluation-harness scores prompts this way) and vLLM's prompt_logprobs
    // read the same prompt rows: the larger alternative count serves both.
    if (echo && n_logprobs >= 0) g.params.prompt_logprobs = std::max(g.params.prompt_logprobs, int32_t(n_logprobs));
    gens.push_back(std::move(g));
  }
  respond(submit_prompts<CompletionJob>(api, gens,
                                        [&](const CompletionJob* first, size_t prompt) {
                                          auto job = std::make_shared<CompletionJob>();
                                          job->tok = api.ctx.tokenizer;
                                          job->model = api.ctx.model_name;
                                          job->want_logprobs = n_logprobs >= 0;
                                          job->top_n = int(n_logprobs);
                                          job->stream = gens[prompt].stream;
                                          job->prompt_logprobs = {api.ctx.tokenizer, vllm_prompt_logprobs};
                                          if (echo) job->start_echo(echoes[prompt], gens[prompt].params.prompt.front());
                                          if (first) job->id = first->id, job->created = first->created;
                                          return job;
                                        }),
          res);
}

}  // namespace qwen36::server
