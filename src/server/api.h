#pragma once
// defines: HttpServer::Api (state shared by the route handlers), HttpError (an OpenAI-style
//          error answer), the handler functions of routes.cpp / openai.cpp / responses.cpp /
//          anthropic.cpp / native.cpp / metrics.cpp

#include <httplib.h>

#include <atomic>
#include <string>

#include "core/error.h"
#include "server/response_store.h"
#include "server/server.h"
#include "text/jinja_value.h"

namespace qwen36::server {

using Json = nlohmann::ordered_json;

// Thrown by handlers; answered as {"error":{"message","type","param","code"}} with `status`.
class HttpError : public Error {
 public:
  HttpError(int status_, const std::string& message, std::string param_ = {}, std::string code_ = {},
            std::string type_ = "invalid_request_error")
      : Error(message), status(status_), type(std::move(type_)), param(std::move(param_)), code(std::move(code_)) {}
  int status;
  std::string type, param, code;
};

struct HttpServer::Api {
  ServerConfig config;
  ServeContext ctx;
  ResponseStore responses;  // its capacity: config.stored_responses
  std::atomic<bool>* ready = nullptr;
  std::atomic<uint64_t> http_requests{0}, http_errors{0};
};

// JSON text; invalid UTF-8 from the model (a token cut mid-character) becomes U+FFFD.
std::string dump(const Json& j);
Json error_body(const HttpError& e);
// {"type": "error", "error": {"type", "message"}}: the Messages API's shape.
Json anthropic_error_body(const HttpError& e);
// The body as a JSON object, or HttpError 400.
Json parse_body(const httplib::Request& req);

// openai.cpp
void handle_chat_completions(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
void handle_completions(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
// responses.cpp
void handle_responses(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
void handle_get_response(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
void handle_delete_response(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
// anthropic.cpp
void handle_messages(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
void handle_count_tokens(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
// native.cpp: llama-server's own API
void handle_completion(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
void handle_props(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
void handle_apply_template(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res);
// metrics.cpp
std::string render_metrics(const HttpServer::Api& api);
// web_page.cpp
extern const char* const kWebPage;

}  // namespace qwen36::server
