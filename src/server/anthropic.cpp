// /v1/messages: Anthropic's Messages API over the chat machinery, for clients written against
// it. Messages with text, tool_use and tool_result blocks become chat messages, tools
// (input_schema), tool_choice (auto / any / tool / none) and thinking their chat fields; the
// answer is a message whose content holds thinking, text and tool_use blocks, or the stream of
// events that builds it. As the API has it, the model thinks only when `thinking` is enabled,
// for at most its budget_tokens (then the reasoning is closed and the answer follows).
#include "server/chat.h"
#include "server/reply.h"

namespace qwen36::server {

namespace {

// system + messages → chat messages: tool_use blocks become the assistant's tool_calls, each
// tool_result block a tool message (before the user's text of the same turn).
Json chat_messages(const Json& body) {
  Json out = Json::array();
  if (has(body, "system"))
    out.push_back({{"role", "system"}, {"content", joined_text(body["system"], {"text"}, "system")}});
  if (!has(body, "messages") || !body["messages"].is_array() || body["messages"].empty())
    throw HttpError(400, "'messages' must be a non-empty array", "messages");
  const Json& messages = body["messages"];
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    const Json& m = messages[i];
    const std::string role = m.is_object() ? m.value("role", "") : "";
    if (role != "user" && role != "assistant") throw HttpError(400, where + ".role must be user or assistant", where);
    const Json content = m.value("content", Json(""));
    if (content.is_string()) {
      out.push_back({{"role", role}, {"content", content}});
      continue;
    }
    if (!content.is_array()) throw HttpError(400, where + ".content must be a string or an array of blocks", where);
    Json msg = {{"role", role}, {"content", ""}};
    for (const Json& b : content) {
      const std::string type = b.is_object() ? b.value("type", "") : "";
      if (type == "text" && b.contains("text") && b["text"].is_string()) {
        msg["content"] = msg["content"].get<std::string>() + b["text"].get<std::string>();
      } else if (type == "tool_use" && role == "assistant") {
        if (!msg.contains("tool_calls")) msg["tool_calls"] = Json::array();
        const Json function = {{"name", b.value("name", "")}, {"arguments", b.value("input", Json::object())}};
        msg["tool_calls"].push_back({{"id", b.value("id", "")}, {"type", "function"}, {"function", function}});
      } else if (type == "tool_result" && role == "user") {
        out.push_back({{"role", "tool"},
                       {"tool_call_id", b.value("tool_use_id", "")},
                       {"content", joined_text(b.value("content", Json("")), {"text"}, where + ".tool_result")}});
      } else if (type != "thinking" && type != "redacted_thinking") {  // earlier thinking: templates drop it
        throw HttpError(400, fmt::format("{}: content blocks of type '{}' are not supported", where, type), where);
      }
    }
    if (role == "assistant" || !msg["content"].get<std::string>().empty()) out.push_back(std::move(msg));
  }
  return out;
}

// The Messages request as a chat-completions body (the fields prepare_chat reads).
Json chat_body(const Json& body) {
  if (!has(body, "max_tokens")) throw HttpError(400, "'max_tokens' is required", "max_tokens");
  Json chat = {{"messages", chat_messages(body)}, {"max_tokens", body["max_tokens"]}};
  for (const char* key : {"temperature", "top_p", "top_k", "stream"})
    if (has(body, key)) chat[key] = body[key];
  if (has(body, "stop_sequences")) chat["stop"] = body["stop_sequences"];
  if (has(body, "tools")) {
    if (!body["tools"].is_array()) throw HttpError(400, "'tools' must be an array", "tools");
    chat["tools"] = Json::array();
    for (const Json& t : body["tools"]) {
      if (!t.is_object() || !t.contains("input_schema") || (t.contains("type") && t["type"] != "custom"))
        throw HttpError(400, "only client tools with an input_schema are supported by this server", "tools");
      chat["tools"].push_back(chat_tool(t, "input_schema"));
    }
  }
  if (has(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    const std::string type = tc.is_object() ? tc.value("type", "") : "";
    if (type == "auto" || type == "none") chat["tool_choice"] = type;
    else if (type == "any") chat["tool_choice"] = "required";
    else if (type == "tool") chat["tool_choice"] = chat_named_choice(tc.value("name", Json()));
    else throw HttpError(400, "'tool_choice' must be {\"type\": auto | any | tool | none}", "tool_choice");
    if (tc.contains("disable_parallel_tool_use")) {
      if (!tc["disable_parallel_tool_use"].is_boolean())
        throw HttpError(400, "'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice");
      chat["parallel_tool_calls"] = !tc["disable_parallel_tool_use"].get<bool>();
    }
  }
  const Json thinking = has(body, "thinking") ? body["thinking"] : Json::object();
  if (!thinking.is_object()) throw HttpError(400, "'thinking' must be an object", "thinking");
  const bool thinks = thinking.value("type", "disabled") == "enabled";
  chat["chat_template_kwargs"] = {{"enable_thinking", thinks}};
  if (thinks && thinking.contains("budget_tokens")) chat["thinking_token_budget"] = thinking["budget_tokens"];
  return chat;
}

// The answer as the Messages API has it: content blocks built from the parser's deltas; when
// streaming, the events that start, fill and stop them.
struct MessagesJob : Job {
  OutputParser parser;
  std::string id = random_id("msg_"), model;
  int32_t input_tokens = 0;
  Json content = Json::array();
  bool block_open = false, started = false;

  explicit MessagesJob(OutputParserOptions o) : parser(std::move(o)) {}

  static Json event(const char* type, Json fields = Json::object()) {
    Json e = {{"type", type}};
    for (auto& [k, v] : fields.items()) e[k] = v;
    return e;
  }
  std::string stop_reason(const std::string& reason) const {
    if (reason == "length") return "max_tokens";
    if (!stop_string.empty()) return "stop_sequence";
    for (const Json& b : content)
      if (b["type"] == "tool_use") return "tool_use";
    return "end_turn";
  }
  Json usage(int32_t output_tokens, int32_t cached) const {
    return {{"input_tokens", input_tokens}, {"output_tokens", output_tokens}, {"cache_read_input_tokens", cached}};
  }
  Json message(const std::string& reason, const RequestUsage* u) const {
    return {{"id", id},
            {"type", "message"},
            {"role", "assistant"},
            {"content", content},
            {"model", model},
            {"stop_reason", u ? Json(stop_reason(reason)) : Json(nullptr)},
            {"stop_sequence", u && !stop_string.empty() ? Json(stop_string) : Json(nullptr)},
            {"usage", usage(u ? u->completion_tokens : 0, u ? u->cached_tokens : 0)}};
  }
  void stop_block(std::vector<Json>& out) {
    if (!block_open) return;
    out.push_back(event("content_block_stop", {{"index", content.size() - 1}}));
    block_open = false;
  }
  void add(const OutputDelta& d, std::vector<Json>& out) {
    const char* kind = d.kind == OutputDelta::Kind::Reasoning ? "thinking"
                       : d.kind == OutputDelta::Kind::Content ? "text"
                                                              : "tool_use";
    if (d.kind == OutputDelta::Kind::ToolCall) {
      stop_block(out);
      Json input = Json::parse(d.tool_call.arguments, nullptr, false);
      if (!input.is_object()) input = Json::object();
      content.push_back(
          {{"type", "tool_use"}, {"id", "toolu_" + d.tool_call.id}, {"name", d.tool_call.name}, {"input", input}});
      Json start = content.back();
      start["input"] = Json::object();
      out.push_back(event("content_block_start", {{"index", content.size() - 1}, {"content_block", start}}));
      const Json delta = {{"type", "input_json_delta"}, {"partial_json", input.dump()}};
      out.push_back(event("content_block_delta", {{"index", content.size() - 1}, {"delta", delta}}));
      out.push_back(event("content_block_stop", {{"index", content.size() - 1}}));
      return;
    }
    if (block_open && content.back()["type"] != kind) stop_block(out);
    const char* field = d.kind == OutputDelta::Kind::Reasoning ? "thinking" : "text";
    if (!block_open) {
      Json block = {{"type", kind}, {field, ""}};
      if (d.kind == OutputDelta::Kind::Reasoning) block["signature"] = "";
      content.push_back(block);
      out.push_back(event("content_block_start", {{"index", content.size() - 1}, {"content_block", block}}));
      block_open = true;
    }
    content.back()[field] = content.back()[field].get<std::string>() + d.text;
    out.push_back(event("content_block_delta",
                        {{"index", content.size() - 1},
                         {"delta", {{"type", d.kind == OutputDelta::Kind::Reasoning ? "thinking_delta" : "text_delta"},
                                    {field, d.text}}}}));
  }
  std::vector<Json> on_text(const std::string& t, const TokenLogprob*) override {
    std::vector<Json> out;
    if (!started) {
      started = true;
      out.push_back(event("message_start", {{"message", message("", nullptr)}}));
    }
    for (const OutputDelta& d : parser.feed(t)) add(d, out);
    return out;
  }
  std::vector<Json> on_finish(const std::string& t, const std::string& reason, const RequestUsage& u) override {
    std::vector<Json> out = on_text(t, nullptr);
    for (const OutputDelta& d : parser.finish()) add(d, out);
    stop_block(out);
    const Json stop_sequence = stop_string.empty() ? Json(nullptr) : Json(stop_string);
    out.push_back(event("message_delta", {{"delta", {{"stop_reason", stop_reason(reason)}, {"stop_sequence", stop_sequence}}},
                                          {"usage", {{"output_tokens", u.completion_tokens}}}}));
    out.push_back(event("message_stop"));
    return out;
  }
  Json response(const std::string& reason, const RequestUsage& u) override { return message(reason, &u); }
  Json usage_chunk(const RequestUsage&) override { return Json::object(); }  // never asked: no include_usage
  Json error(const HttpError& e) const override { return anthropic_error_body(e); }
};

}  // namespace

void handle_count_tokens(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  Json body = parse_body(req);
  reject_unknown(body, {"model", "messages", "system", "tools", "tool_choice", "thinking"});
  if (!api.ctx.chat_template) throw HttpError(400, "this model has no chat template", "messages");
  body["max_tokens"] = 1;  // the prompt alone is counted
  const ChatRequest c = prepare_chat(api, chat_body(body));
  res.set_content(dump(Json{{"input_tokens", c.g.params.prompt.size()}}), "application/json");
}

void handle_messages(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
                        "stop_sequences", "stream", "tools", "tool_choice", "thinking", "metadata", "service_tier"});
  if (!api.ctx.chat_template) throw HttpError(400, "this model has no chat template", "messages");
  const ChatRequest c = prepare_chat(api, chat_body(body));
  auto job = std::make_shared<MessagesJob>(c.parser);
  job->model = body.value("model", api.ctx.model_name);
  job->input_tokens = int32_t(c.g.params.prompt.size());
  job->stream = c.g.stream;
  respond_events(std::move(job), c.g.params, api, res);
}

}  // namespace qwen36::server
