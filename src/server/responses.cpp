// /v1/responses: OpenAI's Responses API over the chat machinery. The request's input items
// become chat messages (function calls and their outputs included), its tools, tool_choice,
// text.format and reasoning the chat fields; the answer is a response object whose output holds
// reasoning, message and function_call items, or the stream of typed events that builds it.
// Responses are stored (unless store: false) in the server's ResponseStore, in memory: a request
// may continue one by previous_response_id, and GET / DELETE /v1/responses/{id} read or forget it.
#include "server/chat.h"
#include "server/reply.h"

namespace qwen36::server {

namespace {

// The request's input as items: a string is one user message.
Json input_items(const Json& body) {
  if (!has(body, "input")) throw HttpError(400, "'input' is required", "input");
  const Json& input = body["input"];
  if (input.is_string()) return Json::array({{{"type", "message"}, {"role", "user"}, {"content", input}}});
  if (!input.is_array() || input.empty()) throw HttpError(400, "'input' must be a string or a non-empty array", "input");
  return input;
}

// instructions + the conversation's items → chat messages.
Json chat_messages(const Json& body, const Json& input) {
  Json messages = Json::array();
  if (has(body, "instructions")) {
    if (!body["instructions"].is_string()) throw HttpError(400, "'instructions' must be a string", "instructions");
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = fmt::format("input[{}]", i);
    const Json& item = input[i];
    if (!item.is_object()) throw HttpError(400, where + " must be an object", where);
    const std::string type = item.value("type", "message");
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) throw HttpError(400, where + " needs a 'role'", where);
      const Json& content = item.value("content", Json(""));
      messages.push_back(
          {{"role", item["role"]}, {"content", joined_text(content, {"input_text", "output_text"}, where + ".content")}});
    } else if (type == "function_call") {
      if (!item.contains("call_id") || !item.contains("name") || !item.contains("arguments"))
        throw HttpError(400, where + ": a function_call needs call_id, name and arguments", where);
      const Json call = {{"id", item["call_id"]}, {"type", "function"},
                         {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      if (messages.empty() || messages.back()["role"] != "assistant")  // calls of one turn share a message
        messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array()}});
      if (!messages.back().contains("tool_calls")) messages.back()["tool_calls"] = Json::array();
      messages.back()["tool_calls"].push_back(call);
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item.contains("output"))
        throw HttpError(400, where + ": a function_call_output needs call_id and output", where);
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item["call_id"]},
                          {"content", joined_text(item["output"], {"input_text", "output_text"}, where + ".output")}});
    } else if (type != "reasoning") {  // earlier reasoning: Qwen templates drop it from past turns
      throw HttpError(400, fmt::format("{}: input items of type '{}' are not supported", where, type), where);
    }
  }
  return messages;
}

// The Responses request as a chat-completions body (the fields prepare_chat reads); `input`: the
// whole conversation's items.
Json chat_body(const Json& body, const Json& input) {
  Json chat = {{"messages", chat_messages(body, input)}};
  for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                          "repetition_penalty", "stream", "parallel_tool_calls"})
    if (has(body, key)) chat[key] = body[key];
  if (has(body, "max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
  if (has(body, "tools")) {
    if (!body["tools"].is_array()) throw HttpError(400, "'tools' must be an array", "tools");
    chat["tools"] = Json::array();
    for (const Json& t : body["tools"]) {
      if (!t.is_object() || t.value("type", "") != "function")
        throw HttpError(400, "only function tools are supported by this server", "tools");
      chat["tools"].push_back(chat_tool(t, "parameters"));
    }
  }
  if (has(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    const bool named = tc.is_object() && tc.value("type", "") == "function";
    chat["tool_choice"] = named ? chat_named_choice(tc.value("name", Json())) : tc;
  }
  if (has(body, "text") && body["text"].is_object() && body["text"].contains("format")) {
    const Json& f = body["text"]["format"];
    if (!f.is_object()) throw HttpError(400, "'text.format' must be an object", "text");
    if (f.value("type", "") == "json_schema")
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", f.value("name", "")}, {"schema", f.value("schema", Json())}}}};
    else
      chat["response_format"] = f;
  }
  if (has(body, "reasoning")) {
    const Json& r = body["reasoning"];
    if (!r.is_object()) throw HttpError(400, "'reasoning' must be an object", "reasoning");
    if (r.value("effort", Json()) == "none") chat["chat_template_kwargs"] = {{"enable_thinking", false}};
  }
  return chat;
}

// The answer as the Responses API has it: output items built from the parser's deltas; when
// streaming, the events that open, fill and close them.
struct ResponsesJob : Job {
  const Json request;  // echoed fields of the response object
  OutputParser parser;
  std::string id = random_id("resp_"), model;
  int64_t created = unix_time();
  Json output = Json::array();
  enum class Open { None, Reasoning, Message } open = Open::None;
  std::string text;  // the open item's text
  int sequence = 0;
  bool started = false;
  // Stored when it ends (unless null: store false): its previous response and its input items.
  ResponseStore* store = nullptr;
  std::string previous;
  Json input;

  ResponsesJob(Json body, OutputParserOptions o) : request(std::move(body)), parser(std::move(o)) {}

  Json object(const std::string& status, const RequestUsage* usage, const std::string& reason) const {
    Json r = {{"id", id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details", reason == "length" ? Json{{"reason", "max_output_tokens"}} : Json(nullptr)},
              {"model", model},
              {"output", output},
              {"parallel_tool_calls", request.value("parallel_tool_calls", true)},
              {"tool_choice", request.value("tool_choice", Json("auto"))},
              {"tools", request.value("tools", Json::array())},
              {"store", store != nullptr},
              {"previous_response_id", previous.empty() ? Json(nullptr) : Json(previous)}};
    for (const char* key : {"instructions", "temperature", "top_p", "max_output_tokens", "text", "metadata"})
      if (has(request, key)) r[key] = request[key];
    r["usage"] = usage ? Json{{"input_tokens", usage->prompt_tokens},
                              {"input_tokens_details", {{"cached_tokens", usage->cached_tokens}}},
                              {"output_tokens", usage->completion_tokens},
                              {"output_tokens_details", {{"reasoning_tokens", 0}}},
                              {"total_tokens", usage->prompt_tokens + usage->completion_tokens}}
                       : Json(nullptr);
    return r;
  }
  Json event(const char* type, Json fields = Json::object()) {
    Json e = {{"type", type}, {"sequence_number", sequence++}};
    for (auto& [k, v] : fields.items()) e[k] = v;
    return e;
  }
  std::string item_id() const { return output.back()["id"]; }
  Json position() const { return {{"item_id", item_id()}, {"output_index", output.size() - 1}}; }

  void start(std::vector<Json>& out) {
    if (started) return;
    started = true;
    out.push_back(event("response.created", {{"response", object("in_progress", nullptr, "")}}));
    out.push_back(event("response.in_progress", {{"response", object("in_progress", nullptr, "")}}));
  }
  // Closes the open reasoning or message item (incomplete: cut by max_output_tokens).
  void close(std::vector<Json>& out, const char* status = "completed") {
    if (open == Open::None) return;
    Json& item = output.back();
    item["status"] = status;
    Json at = position();
    if (open == Open::Reasoning) {
      item["content"] = Json::array({{{"type", "reasoning_text"}, {"text", text}}});
      at["content_index"] = 0, at["text"] = text;
      out.push_back(event("response.reasoning_text.done", at));
    } else {
      const Json part = {{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}};
      item["content"] = Json::array({part});
      at["content_index"] = 0;
      Json done = at;
      done["text"] = text;
      out.push_back(event("response.output_text.done", done));
      at["part"] = part;
      out.push_back(event("response.content_part.done", at));
    }
    out.push_back(event("response.output_item.done", {{"output_index", output.size() - 1}, {"item", item}}));
    open = Open::None;
    text.clear();
  }
  void add(const OutputDelta& d, std::vector<Json>& out) {
    const Open want = d.kind == OutputDelta::Kind::Reasoning ? Open::Reasoning
                      : d.kind == OutputDelta::Kind::Content ? Open::Message
                                                             : Open::None;
    if (open != want) close(out);
    if (d.kind == OutputDelta::Kind::ToolCall) {
      Json item = {{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", d.tool_call.id},
                   {"name", d.tool_call.name}, {"arguments", ""}, {"status", "in_progress"}};
      output.push_back(item);
      out.push_back(event("response.output_item.added", {{"output_index", output.size() - 1}, {"item", item}}));
      Json at = position();
      at["delta"] = d.tool_call.arguments;
      out.push_back(event("response.function_call_arguments.delta", at));
      at.erase("delta");
      at["arguments"] = d.tool_call.arguments;
      out.push_back(event("response.function_call_arguments.done", at));
      output.back()["arguments"] = d.tool_call.arguments;
      output.back()["status"] = "completed";
      out.push_back(event("response.output_item.done", {{"output_index", output.size() - 1}, {"item", output.back()}}));
      return;
    }
    if (open == Open::None) {  // a new reasoning or message item
      open = want;
      Json item = want == Open::Reasoning
                      ? Json{{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", Json::array()}}
                      : Json{{"type", "message"}, {"id", random_id("msg_")}, {"role", "assistant"}};
      item["status"] = "in_progress";
      item["content"] = Json::array();
      output.push_back(item);
      out.push_back(event("response.output_item.added", {{"output_index", output.size() - 1}, {"item", item}}));
      if (want == Open::Message) {
        Json at = position();
        at["content_index"] = 0;
        at["part"] = {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}};
        out.push_back(event("response.content_part.added", at));
      }
    }
    text += d.text;
    Json at = position();
    at["content_index"] = 0, at["delta"] = d.text;
    out.push_back(event(want == Open::Reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", at));
  }
  std::vector<Json> on_text(const std::string& t, const TokenLogprob*) override {
    std::vector<Json> out;
    start(out);
    for (const OutputDelta& d : parser.feed(t)) add(d, out);
    return out;
  }
  std::vector<Json> on_finish(const std::string& t, const std::string& reason, const RequestUsage& usage) override {
    std::vector<Json> out = on_text(t, nullptr);
    for (const OutputDelta& d : parser.finish()) add(d, out);
    const bool whole = reason != "length";
    close(out, whole ? "completed" : "incomplete");
    const Json done = object(whole ? "completed" : "incomplete", &usage, reason);
    out.push_back(event(whole ? "response.completed" : "response.incomplete", {{"response", done}}));
    if (store && (reason == "stop" || reason == "length")) store->put(id, {previous, input, output, done});
    return out;
  }
  Json response(const std::string& reason, const RequestUsage& usage) override {
    return object(reason == "length" ? "incomplete" : "completed", &usage, reason);
  }
  Json usage_chunk(const RequestUsage&) override { return Json::object(); }  // never asked: no include_usage
};

}  // namespace

void handle_responses(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                        "reasoning", "max_output_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                        "presence_penalty", "frequency_penalty", "repetition_penalty", "stream", "store", "metadata",
                        "user", "include", "truncation", "service_tier", "prompt_cache_key", "previous_response_id",
                        "background"});
  if (boolean(body, "background", false)) throw HttpError(400, "background responses are not supported", "background");
  if (!api.ctx.chat_template) throw HttpError(400, "this model has no chat template", "input");
  const Json input = input_items(body);
  Json conversation = input;
  std::string previous;
  if (has(body, "previous_response_id")) {
    if (!body["previous_response_id"].is_string())
      throw HttpError(400, "'previous_response_id' must be a string", "previous_response_id");
    previous = body["previous_response_id"];
    std::optional<Json> before = api.responses.conversation(previous);
    if (!before)
      throw HttpError(400, fmt::format("Previous response with id '{}' not found (never stored, stored with store: "
                                       "false, deleted, or forgotten: the server keeps the last {})",
                                       previous, api.config.stored_responses),
                      "previous_response_id");
    conversation = std::move(*before);
    for (const Json& item : input) conversation.push_back(item);
  }
  const ChatRequest c = prepare_chat(api, chat_body(body, conversation));
  auto job = std::make_shared<ResponsesJob>(body, c.parser);
  job->model = api.ctx.model_name;
  if (boolean(body, "store", true)) job->store = &api.responses;
  job->previous = previous;
  job->input = input;
  job->stream = c.g.stream;
  respond_events(std::move(job), c.g.params, api, res);
}

// GET /v1/responses/{id}: a stored response object.
void handle_get_response(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  const auto e = api.responses.get(id);
  if (!e) throw HttpError(404, fmt::format("Response with id '{}' not found.", id), "response_id", "not_found");
  res.set_content(dump(e->object), "application/json");
}

// DELETE /v1/responses/{id}: forgets it (a conversation that goes through it can no longer go on).
void handle_delete_response(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!api.responses.erase(id))
    throw HttpError(404, fmt::format("Response with id '{}' not found.", id), "response_id", "not_found");
  res.set_content(dump(Json{{"id", id}, {"object", "response"}, {"deleted", true}}), "application/json");
}

}  // namespace qwen36::server
