#pragma once
// defines: ServerConfig, ServeContext (what the routes serve: engine, tokenizer, chat
//          template), HttpServer (the OpenAI-compatible HTTP front end of `qwen36 serve`)
//
// The server listens before the model is loaded (so /health can answer 503 "loading") and
// serves requests once attach() hands it a ready engine. Routes are listed in routes.cpp.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace httplib {
class Server;
}

namespace qwen36::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;        // 0: any free port (tests)
  std::string api_key;    // non-empty: every route but /health and / needs "Authorization: Bearer KEY"
  int http_threads = 32;  // connections served at once (each streaming client holds one)
  // Origins whose browser pages may call the API (CORS): "*" any, else exact origins
  // ("https://app.example:3000"); empty: none (no CORS headers).
  std::vector<std::string> allowed_origins = {"*"};
  size_t stored_responses = 1024;  // Responses API: responses kept for previous_response_id (0: none)
  bool access_log = false;         // a log line a request (method, path, status, client, seconds)
};

struct ServeContext {
  Scheduler* engine = nullptr;
  const text::Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: /v1/chat/completions answers 400
  std::vector<int32_t> stop_ids;                // end-of-turn tokens (<|im_end|>, eos ids)
  std::string model_name = "qwen36";
  std::string model_path;  // as given to -m (llama-server's /props model_path)
  std::string json_whitespace = "limited";  // JSON output's default whitespace (text::whitespace_named)
  nlohmann::ordered_json chat_template_kwargs;  // defaults under every request's chat_template_kwargs
  int64_t reasoning_budget = -1;  // default thinking_token_budget of chat requests (-1: none)
  // Chat answers' reasoning: "auto" / "deepseek" apart (reasoning_content, thinking blocks,
  // reasoning items), "none" left in the text with its tags (llama-server's --reasoning-format).
  std::string reasoning_format = "auto";
};

class HttpServer {
 public:
  explicit HttpServer(ServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket; returns the port (the chosen one when config.port is 0). Throws Error.
  int bind();
  void start();  // serves on a background thread (after bind)
  void stop_accepting();  // no new connections; requests in flight go on
  void stop();            // stop_accepting, then waits for the requests in flight to end

  // The model is ready: requests are served from now on.
  void attach(ServeContext ctx);
  bool ready() const { return ready_.load(); }

  struct Api;  // routes.cpp

 private:
  ServerConfig config_;
  void log_requests();  // ServerConfig::access_log
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Api> api_;
  std::atomic<bool> ready_{false};
  std::thread thread_;
  int port_ = -1;
};

}  // namespace qwen36::server
