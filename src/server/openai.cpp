// /v1/chat/completions and /v1/completions: OpenAI request parsing and validation, then the
// engine's events turned into a JSON answer or an SSE stream.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <random>

#include "server/api.h"
#include "text/output_parser.h"

namespace qwen36::server {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- parameter validation: every bad value is a 400 naming the parameter ----

void reject_unknown(const Json& body, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : body.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) throw HttpError(400, fmt::format("Unrecognized request argument supplied: {}", key), key);
  }
}

bool has(const Json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

double number(const Json& body, const char* key, double lo, double hi, double def) {
  if (!has(body, key)) return def;
  const Json& v = body[key];
  if (!v.is_number()) throw HttpError(400, fmt::format("'{}' must be a number", key), key);
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi))
    throw HttpError(400, fmt::format("'{}' is {}, which is outside [{}, {}]", key, d, lo, hi), key);
  return d;
}

int64_t integer(const Json& body, const char* key, int64_t lo, int64_t hi, int64_t def) {
  if (!has(body, key)) return def;
  const Json& v = body[key];
  if (!v.is_number_integer()) throw HttpError(400, fmt::format("'{}' must be an integer", key), key);
  const int64_t i = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (i < lo || i > hi) throw HttpError(400, fmt::format("'{}' is {}, which is outside [{}, {}]", key, i, lo, hi), key);
  return i;
}

bool boolean(const Json& body, const char* key, bool def) {
  if (!has(body, key)) return def;
  if (!body[key].is_boolean()) throw HttpError(400, fmt::format("'{}' must be a boolean", key), key);
  return body[key].get<bool>();
}

struct Generation {
  RequestParams params;
  int n = 1;  // choices: requests of the same prompt
  bool stream = false, include_usage = false;
  bool logprobs = false;
};

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, added to the logits before each draw.
std::vector<std::pair<int32_t, float>> logit_bias(const Json& lb, int64_t vocab) {
  if (!lb.is_object()) throw HttpError(400, "'logit_bias' must be an object mapping token ids to biases", "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, v] : lb.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= vocab)
      throw HttpError(400, fmt::format("logit_bias: '{}' is not a token id of this model (0..{})", key, vocab - 1),
                      "logit_bias");
    if (!v.is_number() || !(std::abs(v.get<double>()) <= 100))
      throw HttpError(400, fmt::format("logit_bias: the bias of token {} must be a number in [-100, 100]", id),
                      "logit_bias");
    out.emplace_back(int32_t(id), v.get<float>());
  }
  return out;
}

// Sampling, limits, stop and streaming fields shared by both endpoints. Defaults are OpenAI's
// (temperature 1, no top-k / top-p / min-p filtering).
constexpr int64_t kMaxChoices = 16;  // `n`: each choice is a request of its own

Generation parse_generation(const Json& body, const HttpServer::Api& api, std::vector<int32_t> prompt) {
  const int64_t context = api.ctx.engine->options().context;
  if (int64_t(prompt.size()) >= context)
    throw HttpError(400,
                    fmt::format("This model's maximum context length is {} tokens, but the prompt has {} tokens "
                                "(at least one must remain for the answer)",
                                context, prompt.size()),
                    "messages", "context_length_exceeded");
  Generation g;
  RequestParams& p = g.params;
  p.prompt = std::move(prompt);
  SamplingParams& s = p.sampling;
  s.temperature = float(number(body, "temperature", 0, 2, 1));
  s.top_p = float(number(body, "top_p", 1e-6, 1, 1));
  s.top_k = int32_t(integer(body, "top_k", -1, 1 << 20, 0));
  if (s.top_k < 0) s.top_k = 0;  // -1 means off, as in vLLM
  s.min_p = float(number(body, "min_p", 0, 1, 0));
  s.presence_penalty = float(number(body, "presence_penalty", -2, 2, 0));
  s.frequency_penalty = float(number(body, "frequency_penalty", -2, 2, 0));
  s.repetition_penalty = float(number(body, "repetition_penalty", 0.01, 10, 1));
  s.penalty_last_n = -1;
  s.seed = has(body, "seed") ? uint64_t(integer(body, "seed", INT64_MIN, INT64_MAX, 0)) : std::random_device{}();
  // max_tokens counts answer tokens; absent means "until the context is full".
  const char* max_key = has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = int32_t(integer(body, max_key, 0, 1 << 30, context));
  g.n = int(integer(body, "n", 1, kMaxChoices, 1));
  if (has(body, "stop")) {
    const Json& st = body["stop"];
    if (st.is_string()) {
      p.stop_strings.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 16) {
      for (const Json& x : st) {
        if (!x.is_string()) throw HttpError(400, "'stop' must be a string or an array of strings", "stop");
        p.stop_strings.push_back(x.get<std::string>());
      }
    } else {
      throw HttpError(400, "'stop' must be a string or an array of up to 16 strings", "stop");
    }
    std::erase(p.stop_strings, std::string{});
  }
  if (!boolean(body, "ignore_eos", false)) p.stop_ids = api.ctx.stop_ids;
  if (has(body, "logit_bias")) p.logit_bias = logit_bias(body["logit_bias"], api.ctx.engine->model().config().vocab_size);
  g.stream = boolean(body, "stream", false);
  if (has(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) throw HttpError(400, "'stream_options' must be an object", "stream_options");
    g.include_usage = boolean(so, "include_usage", false);
  }
  return g;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:x}{:04x}", prefix, rng() & 0xffffffffffULL, counter++ & 0xffff);
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Json usage_json(const RequestUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string token_piece(const text::Tokenizer& tok, int32_t id) {
  return id >= 0 && id < tok.vocab_size() && !tok.token_text(id).empty() ? tok.token_bytes(id) : std::string{};
}

Json bytes_json(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

// One token's entry of a chat "logprobs.content" list.
Json chat_logprob(const text::Tokenizer& tok, const TokenLogprob& lp) {
  auto entry = [&](int32_t id, float v) {
    const std::string piece = token_piece(tok, id);
    return Json{{"token", piece}, {"logprob", v}, {"bytes", bytes_json(piece)}};
  };
  Json e = entry(lp.token, lp.logprob);
  e["top_logprobs"] = Json::array();
  for (const auto& [id, v] : lp.top) e["top_logprobs"].push_back(entry(id, v));
  return e;
}

// ---- running a request: the engine's events, written as they come ----

// What an endpoint does with the engine's output.
struct Job {
  virtual ~Job() = default;
  // Streaming: SSE payloads for a token's text (and logprob). Non-streaming: accumulate.
  virtual std::vector<Json> on_text(const std::string& text, const TokenLogprob* lp) = 0;
  virtual std::vector<Json> on_finish(const std::string& text, const std::string& reason,
                                      const RequestUsage& usage) = 0;
  virtual Json response(const std::string& reason, const RequestUsage& usage) = 0;  // non-streaming body
  virtual Json usage_chunk(const RequestUsage& usage) = 0;  // streaming: the last chunk, no choices
  std::shared_ptr<Request> req;
  int index = 0;  // the choice's index (`n`)
  bool stream = false;
};

// An answer's choices (one job each, `n` of them) and how it is written.
struct Reply {
  std::vector<std::shared_ptr<Job>> choices;
  bool stream = false, include_usage = false;
  void cancel() const {
    for (const auto& j : choices) j->req->cancel();
  }
};

// The choices' usage as one: the prompt once, every choice's completion.
RequestUsage combined_usage(const std::vector<RequestUsage>& us) {
  RequestUsage u = us.front();
  for (size_t i = 1; i < us.size(); ++i) u.completion_tokens += us[i].completion_tokens;
  return u;
}

Json shutdown_error() {
  return error_body(HttpError(503, "the request was cancelled: the server is shutting down", {}, "cancelled",
                              "server_error"));
}

// Pulls events until every choice's request finishes, writing as it goes. A failed write means
// the client is gone: the requests are cancelled and free their slots at the engine's next step;
// a choice that fails or is cancelled ends the answer with an error (the others are cancelled).
// Whenever nothing has been written for half a second — no events, or only events whose text
// is held back (stop strings, partial tags) — a keep-alive (an SSE comment, or JSON-neutral
// whitespace) goes out, which is also how a vanished client is noticed.
bool pump(const Reply& reply, httplib::DataSink& sink) {
  auto write = [&](const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    reply.cancel();
    return false;
  };
  auto sse = [&](const Json& j) { return write("data: " + dump(j) + "\n\n"); };
  auto last_write = Clock::now();
  auto keep_alive = [&] {
    if (Clock::now() - last_write <= 500ms) return true;
    last_write = Clock::now();
    return write(reply.stream ? ": keep-alive\n\n" : " ");
  };
  const size_t n = reply.choices.size();
  std::vector<RequestUsage> usages(n);
  std::vector<std::string> reasons(n);
  std::vector<bool> ended(n, false);  // its Finished event was read
  size_t left = n;
  // One event of choice i: false when the answer is over (written, or the client gone).
  auto handle = [&](size_t i, const RequestEvent& ev, bool& over) {
    Job& job = *reply.choices[i];
    if (ev.kind == RequestEvent::Kind::Token) {
      if (!reply.stream) {
        job.on_text(ev.text, ev.logprob ? &*ev.logprob : nullptr);
        return true;
      }
      for (const Json& j : job.on_text(ev.text, ev.logprob ? &*ev.logprob : nullptr)) {
        if (!sse(j)) return false;
        last_write = Clock::now();
      }
      return true;
    }
    usages[i] = job.req->usage();
    reasons[i] = ev.finish_reason;
    ended[i] = true;
    --left;
    const std::vector<Json> tail = job.on_finish(ev.text, ev.finish_reason, usages[i]);
    if (ev.finish_reason == "error" || ev.finish_reason == "cancelled") {
      reply.cancel();
      over = true;
      const Json err = ev.finish_reason == "error"
                           ? error_body(HttpError(500, "generation failed: " + ev.error, {}, {}, "server_error"))
                           : shutdown_error();
      return reply.stream ? sse(err) && write("data: [DONE]\n\n") : write(dump(err));
    }
    if (reply.stream)
      for (const Json& j : tail)
        if (!sse(j)) return false;
    return true;
  };
  RequestEvent ev;
  bool over = false;
  while (left > 0 && !over) {
    bool got = false;  // events waiting: take them all, choice by choice
    for (size_t i = 0; i < n && !over; ++i)
      while (!over && !ended[i] && reply.choices[i]->req->next(ev, 0ms)) {
        got = true;
        if (!keep_alive() || !handle(i, ev, over)) return false;
      }
    if (got || over) continue;
    size_t first = 0;  // none: wait for the first choice still running
    while (ended[first]) ++first;
    if (!reply.choices[first]->req->next(ev, n == 1 ? 100ms : 10ms)) {
      if (!keep_alive()) return false;
      continue;
    }
    if (!keep_alive() || !handle(first, ev, over)) return false;
  }
  if (!over) {
    const RequestUsage total = combined_usage(usages);
    if (reply.stream) {
      if (reply.include_usage && !sse(reply.choices[0]->usage_chunk(total))) return false;  // OpenAI style
      if (!write("data: [DONE]\n\n")) return false;
    } else {
      Json body = reply.choices[0]->response(reasons[0], usages[0]);
      if (n > 1) {
        body["choices"] = Json::array();
        for (size_t i = 0; i < n; ++i)
          body["choices"].push_back(reply.choices[i]->response(reasons[i], usages[i])["choices"][0]);
        body["usage"] = usage_json(total);
      }
      if (!write(dump(body))) return false;
    }
  }
  sink.done();
  return true;
}

void respond(std::shared_ptr<const Reply> reply, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      reply->stream ? "text/event-stream" : "application/json",
      [reply](size_t, httplib::DataSink& sink) { return pump(*reply, sink); },
      [reply](bool) { reply->cancel(); });  // no-op once finished; frees the slots if the client left
}

std::shared_ptr<Request> submit(HttpServer::Api& api, RequestParams params) {
  try {
    return api.ctx.engine->submit(std::move(params));
  } catch (const QueueFull& e) {
    throw HttpError(503, std::string(e.what()) + "; retry later", {}, "queue_full", "server_error");
  }
}

// The answer's `n` choices: a job from make (given the first one, or null for it) and a request
// each, choice i drawing with seed + i. A refused submission cancels those already queued.
template <typename J, typename Make>
std::shared_ptr<const Reply> submit_choices(HttpServer::Api& api, const Generation& g, Make&& make) {
  auto reply = std::make_shared<Reply>();
  reply->stream = g.stream;
  reply->include_usage = g.include_usage;
  J* first = nullptr;
  try {
    for (int i = 0; i < g.n; ++i) {
      std::shared_ptr<J> job = make(first);
      job->index = i;
      job->stream = g.stream;
      RequestParams p = g.params;
      p.sampling.seed += uint64_t(i);
      job->req = submit(api, std::move(p));
      if (!first) first = job.get();
      reply->choices.push_back(std::move(job));
    }
  } catch (...) {
    reply->cancel();
    throw;
  }
  return reply;
}

// ---- /v1/chat/completions ----

struct ChatJob : Job {
  const text::Tokenizer* tok = nullptr;
  OutputParser parser;
  std::string id = random_id("chatcmpl-"), model;
  int64_t created = unix_time();
  bool want_logprobs = false, sent_role = false;
  Json logprobs = Json::array();

  explicit ChatJob(OutputParserOptions o) : parser(std::move(o)) {}

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
    return {{"id", id},     {"object", "chat.completion"}, {"created", created},
            {"model", model}, {"choices", Json::array({std::move(choice)})}, {"usage", usage_json(usage)}};
  }
};

// Messages as the chat template expects them: text parts joined, tool-call arguments as
// objects (templates iterate over them), every field checked.
Json template_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty())
    throw HttpError(400, "'messages' must be a non-empty array", "messages");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    Json m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw HttpError(400, where + " must be an object with a string 'role'", where);
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      throw HttpError(400, fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool", where, role),
                      where + ".role");
    if (role == "developer") m["role"] = "system";
    if (m.contains("content") && m["content"].is_array()) {
      std::string text;
      for (const Json& part : m["content"]) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw HttpError(400, where + ".content: only text parts are supported by this model", where + ".content");
        text += part["text"].get<std::string>();
      }
      m["content"] = text;
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      throw HttpError(400, where + ".content must be a string, an array of text parts or null", where + ".content");
    } else if (!m.contains("content") || m["content"].is_null()) {
      // OpenAI clients send null content with tool_calls; templates test it with `in`.
      m["content"] = "";
    }
    if (m.contains("tool_calls")) {
      if (!m["tool_calls"].is_array()) throw HttpError(400, where + ".tool_calls must be an array", where);
      for (Json& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          throw HttpError(400, where + ".tool_calls entries need a 'function' object", where + ".tool_calls");
        Json& args = call["function"]["arguments"];
        if (args.is_string()) {
          Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
          if (parsed.is_object()) args = std::move(parsed);
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

// tool_choice "required" → every tool's name; {"type": "function", "function": {"name": N}} → N,
// which must be one of the tools.
std::vector<std::string> forced_tool_names(const Json& tc, const Json& tools) {
  if (!tools.is_array() || tools.empty())
    throw HttpError(400, "'tool_choice' \"required\" or a named function needs 'tools'", "tool_choice");
  std::vector<std::string> names;
  for (const Json& t : tools) {
    const Json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      throw HttpError(400, "every tool needs a function with a string 'name'", "tools");
    names.push_back(f["name"]);
  }
  if (tc == "required") return names;
  if (!tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
      !tc["function"]["name"].is_string())
    throw HttpError(400, "'tool_choice' as an object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    "tool_choice");
  const std::string name = tc["function"]["name"];
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw HttpError(400, fmt::format("'tool_choice' names '{}', which is not one of the tools", name), "tool_choice");
  return {name};
}

// response_format → the request's output constraint: text (none), json_object (any object;
// llama-server's form may carry a "schema" there) or json_schema ({"name", "schema", "strict"}).
OutputConstraint output_constraint(const Json& body) {
  if (!has(body, "response_format")) return {};
  const Json& rf = body["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    throw HttpError(400, "'response_format' must be an object with a string 'type'", "response_format");
  const std::string type = rf["type"];
  OutputConstraint c;
  if (type == "text") return c;
  const Json* schema = nullptr;
  if (type == "json_object") {
    if (rf.contains("schema")) schema = &rf["schema"];
  } else if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema"))
      throw HttpError(400, "response_format json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}",
                      "response_format");
    schema = &rf["json_schema"]["schema"];
  } else {
    throw HttpError(400, fmt::format("response_format type '{}' is not one of text, json_object, json_schema", type),
                    "response_format");
  }
  try {
    c.schema = schema ? text::JsonSchema::compile(*schema) : text::JsonSchema::any_object();
  } catch (const Error& e) {
    throw HttpError(400, std::string("response_format: ") + e.what(), "response_format");
  }
  return c;
}

}  // namespace

void handle_chat_completions(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                        "reasoning_effort", "logprobs", "top_logprobs", "stop", "seed", "max_tokens",
                        "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "n", "stream", "stream_options", "user",
                        "response_format", "ignore_eos", "metadata", "store", "logit_bias"});
  if (!api.ctx.chat_template) throw HttpError(400, "this model has no chat template; use /v1/completions", "messages");
  const Json messages = template_messages(body.value("messages", Json()));
  Json tools = has(body, "tools") ? body["tools"] : Json(nullptr);
  if (!tools.is_null() && !tools.is_array()) throw HttpError(400, "'tools' must be an array", "tools");
  std::vector<std::string> forced_tools;  // tool_choice "required" (any of them) or a named function
  if (has(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc == "none") tools = nullptr;  // the model is not told about tools, so it will not call them
    else if (!(tc == "auto" || tc == "required" || tc.is_object()))
      throw HttpError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or an object", "tool_choice");
    if (tc != "auto" && tc != "none") forced_tools = forced_tool_names(tc, tools);
  }
  OutputConstraint constraint = output_constraint(body);
  if (!forced_tools.empty()) {  // the answer begins with a call of one of them, up to its name
    if (constraint.schema)
      throw HttpError(400, "'response_format' and a forced tool call ('tool_choice') do not combine", "tool_choice");
    const auto prefix = api.ctx.chat_template->tool_call_name_prefix();
    if (!prefix) throw HttpError(400, "this model's chat template writes no <tool_call> that could be forced", "tool_choice");
    for (const std::string& name : forced_tools)
      constraint.forced.push_back(api.ctx.tokenizer->encode("<tool_call>" + *prefix + name));
  }
  Json kwargs = has(body, "chat_template_kwargs") ? body["chat_template_kwargs"] : Json::object();
  if (!kwargs.is_object()) throw HttpError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");

  std::string prompt;
  try {
    prompt = api.ctx.chat_template->render(messages, tools, true, kwargs);
  } catch (const Error& e) {
    throw HttpError(400, std::string("the chat template could not render these messages: ") + e.what(), "messages");
  }
  Generation g = parse_generation(body, api, api.ctx.tokenizer->encode(prompt));
  const bool want_logprobs = boolean(body, "logprobs", false);
  const int64_t top = integer(body, "top_logprobs", 0, 20, 0);
  if (has(body, "top_logprobs") && !want_logprobs)
    throw HttpError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
  g.params.top_logprobs = want_logprobs ? int32_t(top) : -1;

  OutputParserOptions popts;
  popts.thinking_enabled = true;  // a disabled-thinking prompt already holds an empty <think></think>
  popts.prompt_opened_thinking = prompt.ends_with("<think>\n");
  if ((constraint.schema || !constraint.forced.empty()) && popts.prompt_opened_thinking) {  // reasoning stays free
    constraint.start_after = api.ctx.tokenizer->token_id("</think>");
    if (constraint.start_after < 0) throw HttpError(400, "response_format: the prompt opens <think> but the vocabulary has no </think>", "response_format");
  }
  g.params.constraint = std::move(constraint);
  if (!tools.is_null()) popts.tools = tools;
  respond(submit_choices<ChatJob>(api, g,
                                   [&](const ChatJob* first) {
                                     auto job = std::make_shared<ChatJob>(popts);
                                     job->tok = api.ctx.tokenizer;
                                     job->model = api.ctx.model_name;
                                     job->want_logprobs = want_logprobs;
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

  Json chunk(const std::string& t, Json finish_reason, Json lp = nullptr) const {
    Json choice = {{"index", index}, {"text", t}, {"logprobs", std::move(lp)}, {"finish_reason", std::move(finish_reason)}};
    return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
            {"choices", Json::array({std::move(choice)})}};
  }
  Json legacy_logprob(const TokenLogprob& lp) const {
    Json top = Json::object();
    for (const auto& [tid, v] : lp.top) top[token_piece(*tok, tid)] = v;
    return {{"tokens", {token_piece(*tok, lp.token)}}, {"token_logprobs", {lp.logprob}}, {"top_logprobs", {top}}};
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
    return {chunk(t, nullptr, want_logprobs && lp ? legacy_logprob(*lp) : Json(nullptr))};
  }
  std::vector<Json> on_finish(const std::string& t, const std::string& reason, const RequestUsage& usage) override {
    text += t;
    Json last = chunk(t, reason);
    last["usage"] = usage_json(usage);
    return {last};
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
    j["usage"] = usage_json(usage);
    return j;
  }
};

}  // namespace

void handle_completions(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"model", "prompt", "logprobs", "stop", "seed", "max_tokens", "temperature", "top_p", "top_k",
                        "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "stream",
                        "stream_options", "user", "ignore_eos", "echo", "best_of", "suffix", "response_format",
                        "logit_bias"});
  if (boolean(body, "echo", false)) throw HttpError(400, "'echo' is not supported", "echo");
  if (has(body, "suffix")) throw HttpError(400, "'suffix' is not supported", "suffix");
  if (has(body, "best_of") && integer(body, "best_of", 1, 1, 1) != 1)
    throw HttpError(400, "only best_of = 1 is supported", "best_of");
  const Json p = body.value("prompt", Json());
  std::vector<int32_t> ids;
  if (p.is_string()) {
    ids = api.ctx.tokenizer->encode(p.get<std::string>());
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    ids = api.ctx.tokenizer->encode(p[0].get<std::string>());
  } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const Json& x) { return x.is_number_integer(); })) {
    const int64_t vocab = api.ctx.engine->model().config().vocab_size;
    for (const Json& x : p) {
      const int64_t t = x.get<int64_t>();
      if (t < 0 || t >= vocab) throw HttpError(400, fmt::format("prompt token {} is outside the vocabulary", t), "prompt");
      ids.push_back(int32_t(t));
    }
  } else {
    throw HttpError(400, "'prompt' must be a string, an array with one string, or an array of token ids", "prompt");
  }
  if (ids.empty()) throw HttpError(400, "the prompt is empty", "prompt");
  Generation g = parse_generation(body, api, std::move(ids));
  g.params.constraint = output_constraint(body);  // as vLLM: structured output for raw completions too
  const int64_t n_logprobs = integer(body, "logprobs", 0, 20, -1);
  g.params.top_logprobs = int32_t(n_logprobs);
  g.params.stop_ids.clear();  // raw completion: only end-of-text stops, not the chat end-of-turn
  if (!boolean(body, "ignore_eos", false))
    for (int32_t id : api.ctx.stop_ids)
      if (id != api.ctx.tokenizer->token_id("<|im_end|>")) g.params.stop_ids.push_back(id);
  respond(submit_choices<CompletionJob>(api, g,
                                         [&](const CompletionJob* first) {
                                           auto job = std::make_shared<CompletionJob>();
                                           job->tok = api.ctx.tokenizer;
                                           job->model = api.ctx.model_name;
                                           job->want_logprobs = n_logprobs >= 0;
                                           if (first) job->id = first->id, job->created = first->created;
                                           return job;
                                         }),
          res);
}

}  // namespace qwen36::server
