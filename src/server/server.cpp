#include "server/server.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "server/api.h"

namespace qwen36::server {

void register_routes(httplib::Server& http, HttpServer::Api& api);  // routes.cpp

HttpServer::HttpServer(ServerConfig config) : config_(std::move(config)), http_(std::make_unique<httplib::Server>()),
                                              api_(std::make_unique<Api>()) {
  QWEN36_CHECK(config_.port >= 0 && config_.port <= 65535, "port {} is out of range", config_.port);
  QWEN36_CHECK(config_.http_threads > 0 && config_.http_threads <= 4096, "http threads {} out of range",
               config_.http_threads);
  api_->config = config_;
  api_->responses.set_capacity(config_.stored_responses);
  api_->ready = &ready_;
  const size_t threads = size_t(config_.http_threads);
  // Each streaming client holds a worker for its whole answer, so the pool is sized for the
  // clients the engine can run plus those it queues.
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(size_t{32} << 20);
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_keep_alive_timeout(5);
  register_routes(*http_, *api_);
  if (config_.access_log) log_requests();
}

// A line a request when its answer is written (a stream: when it ends), so its time is the
// whole answer's; health and metrics probes only at debug level. A worker thread serves a
// request from routing to logging, so the start time waits in a thread_local.
void HttpServer::log_requests() {
  using Clock = std::chrono::steady_clock;
  static thread_local Clock::time_point started;
  http_->set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    started = Clock::now();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->set_logger([](const httplib::Request& req, const httplib::Response& res) {
    const double s = std::chrono::duration<double>(Clock::now() - started).count();
    const bool probe = req.path == "/health" || req.path == "/v1/health" || req.path == "/metrics";
    spdlog::log(probe ? spdlog::level::debug : spdlog::level::info, "{} {} {} {} {:.3f} s", req.remote_addr, req.method,
                req.path, res.status, s);
  });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  if (config_.port == 0) {
    port_ = http_->bind_to_any_port(config_.host);
  } else {
    port_ = http_->bind_to_port(config_.host, config_.port) ? config_.port : -1;
  }
  QWEN36_CHECK(port_ > 0, "cannot listen on {}:{} (in use, or not a local address?)", config_.host, config_.port);
  return port_;
}

void HttpServer::start() {
  QWEN36_CHECK(port_ > 0, "bind() the server before start()");
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  // stop() is a no-op until the accept loop runs, so wait for it (bounded) before returning.
  for (int i = 0; i < 500 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void HttpServer::stop_accepting() {
  if (http_) http_->stop();
}

void HttpServer::stop() {
  stop_accepting();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::attach(ServeContext ctx) {
  QWEN36_CHECK(ctx.engine && ctx.tokenizer, "the server needs an engine and a tokenizer");
  api_->ctx = std::move(ctx);
  ready_.store(true);
}

}  // namespace qwen36::server
