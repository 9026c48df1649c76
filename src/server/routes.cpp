// The route table of `qwen36 serve`, and the small routes. Every handler runs inside
// `guarded`, which turns exceptions into error bodies (OpenAI's shape, or Anthropic's on its
// routes) so a bad request can never take the server down.
#include <spdlog/spdlog.h>

#include "server/api.h"
#include "server/chat.h"

namespace qwen36::server {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json error_body(const HttpError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
            {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}}}};
}

Json anthropic_error_body(const HttpError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

Json parse_body(const httplib::Request& req) {
  Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw HttpError(400, "the request body is not valid JSON", {}, "invalid_json");
  if (!body.is_object()) throw HttpError(400, "the request body must be a JSON object", {}, "invalid_json");
  return body;
}

namespace {

using Api = HttpServer::Api;
using Handler = void (*)(Api&, const httplib::Request&, httplib::Response&);

void reply(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void require_ready(const Api& api) {
  if (!api.ready->load()) throw HttpError(503, "the model is still loading", {}, "loading", "server_error");
}

// ---- the small routes ----

void health(Api& api, const httplib::Request&, httplib::Response& res) {
  const bool ok = api.ready->load();
  reply(res, ok ? 200 : 503, {{"status", ok ? "ok" : "loading"}});
}

Json model_object(const Api& api) {
  return {{"id", api.ctx.model_name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "qwen36"},
          {"max_model_len", api.ctx.engine->options().context}};
}

void models(Api& api, const httplib::Request&, httplib::Response& res) {
  require_ready(api);
  reply(res, 200, {{"object", "list"}, {"data", Json::array({model_object(api)})}});
}

// GET /v1/models/{id}: the one model, by its name.
void model(Api& api, const httplib::Request& req, httplib::Response& res) {
  require_ready(api);
  const std::string id = req.matches[1];
  if (id != api.ctx.model_name)
    throw HttpError(404, fmt::format("The model '{}' does not exist (this server has '{}')", id, api.ctx.model_name),
                    "model", "model_not_found");
  reply(res, 200, model_object(api));
}

// llama-server's form ({"content", "with_pieces"}) and vLLM's ({"prompt"} or chat {"messages",
// ...}, "return_token_strs"); the answer carries both servers' fields.
void tokenize(Api& api, const httplib::Request& req, httplib::Response& res) {
  require_ready(api);
  const Json body = parse_body(req);
  std::string text;
  if (has(body, "messages")) {
    const Json tools = has(body, "tools") ? body["tools"] : Json(nullptr);
    if (!tools.is_null() && !tools.is_array()) throw HttpError(400, "'tools' must be an array", "tools");
    text = chat_prompt(api, body, tools);
  } else {
    const char* key = body.contains("content") ? "content" : body.contains("prompt") ? "prompt" : "text";
    if (!body.contains(key) || !body[key].is_string())
      throw HttpError(400, "'content' (or 'prompt') must be a string, or 'messages' a conversation", key);
    text = body[key].get<std::string>();
  }
  const bool pieces = boolean(body, "with_pieces", false), strs = boolean(body, "return_token_strs", false);
  boolean(body, "add_special", false), boolean(body, "add_special_tokens", true);  // no BOS is added by this model
  const std::vector<int32_t> ids = api.ctx.tokenizer->encode(text);
  Json tokens = Json::array(), token_strs = Json::array();
  for (int32_t id : ids) {
    if (pieces)
      tokens.push_back({{"id", id}, {"piece", api.ctx.tokenizer->token_bytes(id)}});
    else
      tokens.push_back(id);
    if (strs) token_strs.push_back(api.ctx.tokenizer->token_text(id));
  }
  Json out = {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", api.ctx.engine->options().context}};
  if (strs) out["token_strs"] = token_strs;
  reply(res, 200, out);
}

void detokenize(Api& api, const httplib::Request& req, httplib::Response& res) {
  require_ready(api);
  const Json body = parse_body(req);
  const Json toks = body.value("tokens", Json());
  if (!toks.is_array()) throw HttpError(400, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const Json& t : toks) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= api.ctx.tokenizer->vocab_size())
      throw HttpError(400, "'tokens' holds a value that is not a token id of this tokenizer", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  std::string text;
  try {
    text = api.ctx.tokenizer->decode(ids);
  } catch (const Error& e) {
    throw HttpError(400, e.what(), "tokens");
  }
  reply(res, 200, {{"content", text}, {"prompt", text}});  // llama-server's name, vLLM's
}

void metrics(Api& api, const httplib::Request&, httplib::Response& res) {
  require_ready(api);
  res.set_content(render_metrics(api), "text/plain; version=0.0.4");
}

// A generating endpoint (openai.cpp, responses.cpp, anthropic.cpp): answers once the model is loaded.
template <Handler H>
void when_ready(Api& api, const httplib::Request& req, httplib::Response& res) {
  require_ready(api);
  H(api, req, res);
}

void web_page(Api&, const httplib::Request&, httplib::Response& res) {
  res.set_content(kWebPage, "text/html; charset=utf-8");
}

struct Route {
  const char* method;
  const char* path;
  Handler handler;
  bool needs_key;               // with --api-key
  bool anthropic_errors = false;  // error bodies in Anthropic's shape
};

// The whole API at a glance.
constexpr Route kRoutes[] = {
    {"GET", "/", web_page, false},
    {"GET", "/health", health, false},
    {"GET", "/v1/health", health, false},
    {"GET", "/v1/models", models, true},
    {"GET", R"(/v1/models/(.+))", model, true},
    {"POST", "/v1/chat/completions", when_ready<handle_chat_completions>, true},
    {"POST", "/v1/completions", when_ready<handle_completions>, true},
    {"POST", "/v1/responses", when_ready<handle_responses>, true},
    {"GET", R"(/v1/responses/([A-Za-z0-9_-]+))", handle_get_response, true},
    {"DELETE", R"(/v1/responses/([A-Za-z0-9_-]+))", handle_delete_response, true},
    {"POST", "/v1/messages", when_ready<handle_messages>, true, true},  // Anthropic's Messages API
    {"POST", "/v1/messages/count_tokens", when_ready<handle_count_tokens>, true, true},
    {"POST", "/completion", when_ready<handle_completion>, true},  // llama-server's own API (native.cpp)
    {"POST", "/completions", when_ready<handle_completion>, true},
    {"GET", "/props", when_ready<handle_props>, false},
    {"POST", "/apply-template", when_ready<handle_apply_template>, true},
    {"POST", "/tokenize", tokenize, true},
    {"POST", "/detokenize", detokenize, true},
    {"GET", "/metrics", metrics, true},
};

bool same_secret(const std::string& got, const std::string& want) {
  unsigned diff = unsigned(got.size() ^ want.size());  // compare without an early exit
  for (size_t i = 0; i < got.size(); ++i) diff |= unsigned(got[i] ^ want[i % want.size()]);
  return diff == 0;
}

// "Authorization: Bearer KEY" (OpenAI clients) or "x-api-key: KEY" (Anthropic clients).
bool key_ok(const Api& api, const httplib::Request& req) {
  if (api.config.api_key.empty()) return true;
  return same_secret(req.get_header_value("Authorization"), "Bearer " + api.config.api_key) ||
         same_secret(req.get_header_value("x-api-key"), api.config.api_key);
}

// Runs a handler; any exception becomes an error body (4xx for the client's mistakes).
void guarded(Api& api, const Route& r, const httplib::Request& req, httplib::Response& res) {
  ++api.http_requests;
  auto fail_with = [&](const HttpError& e) {
    ++api.http_errors;
    reply(res, e.status, r.anthropic_errors ? anthropic_error_body(e) : error_body(e));
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  };
  try {
    if (r.needs_key && !key_ok(api, req))
      throw HttpError(401, "Incorrect API key provided", {}, "invalid_api_key", "authentication_error");
    r.handler(api, req, res);
  } catch (const HttpError& e) {
    fail_with(e);
  } catch (const Error& e) {  // engine validation (bad prompt tokens, sampling values ...)
    fail_with(HttpError(400, e.what()));
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", r.method, r.path, e.what());
    fail_with(HttpError(500, std::string("internal error: ") + e.what(), {}, {}, "server_error"));
  }
}

}  // namespace

namespace {

// The value of Access-Control-Allow-Origin for this request, or "" (not a browser's cross-origin
// call, or an origin not allowed).
std::string allowed_origin(const Api& api, const httplib::Request& req) {
  const std::string origin = req.get_header_value("Origin");
  if (origin.empty()) return "";
  for (const std::string& o : api.config.allowed_origins)
    if (o == "*" || o == origin) return o == "*" ? "*" : origin;
  return "";
}

// CORS, so that a web page of an allowed origin can call the API from the browser (as vLLM's
// --allowed-origins and llama-server do): the header on every answer, and preflight OPTIONS
// requests answered without the API key (a browser sends none with them).
void register_cors(httplib::Server& http, Api& api) {
  http.set_post_routing_handler([&api](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = allowed_origin(api, req);
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    if (origin != "*") res.set_header("Vary", "Origin");
  });
  http.Options(R"(/.*)", [&api](const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    if (allowed_origin(api, req).empty()) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers",
                   asked.empty() ? "Authorization, Content-Type, x-api-key, anthropic-version" : asked);
    res.set_header("Access-Control-Max-Age", "600");
  });
}

}  // namespace

void register_routes(httplib::Server& http, Api& api) {
  register_cors(http, api);
  for (const Route& r : kRoutes) {
    auto h = [&api, &r](const httplib::Request& req, httplib::Response& res) { guarded(api, r, req, res); };
    const std::string_view method = r.method;
    if (method == "GET")
      http.Get(r.path, h);
    else if (method == "DELETE")
      http.Delete(r.path, h);
    else
      http.Post(r.path, h);
  }
  // Unknown paths and methods get a JSON 404 / 405 too.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler already answered
    const bool known = std::any_of(std::begin(kRoutes), std::end(kRoutes), [&](const Route& r) { return req.path == r.path; });
    const int status = res.status == 404 && known ? 405 : res.status;
    const std::string msg = status == 404   ? "no route " + req.method + " " + req.path
                            : status == 405 ? "method " + req.method + " is not allowed on " + req.path
                                            : "the request could not be served";
    reply(res, status, error_body(HttpError(status, msg, {}, status == 404 ? "not_found" : "")));
  });
}

}  // namespace qwen36::server
