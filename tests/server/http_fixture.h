#pragma once
// The HTTP tests' fixture (http_test.cpp, native_test.cpp): the server over real HTTP on
// 127.0.0.1 (ephemeral port) with the built-in random model and the Qwen3 tokenizer (the tests
// skip when scripts/fetch-tokenizer.sh has not fetched it), and client helpers. Every client
// call has a timeout, so a broken server fails the test instead of hanging it.
#include <httplib.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "engine/scheduler.h"
#include "model/presets.h"
#include "model/random_weights.h"
#include "server/server.h"

namespace qwen36::server::http_test {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// $QWEN36_TOKENIZER (a directory) overrides the fetched copy in the source tree.
inline const fs::path kTokenizerDir = std::getenv("QWEN36_TOKENIZER")
                                          ? fs::path(std::getenv("QWEN36_TOKENIZER"))
                                          : fs::path(QWEN36_TEST_DATA) / ".." / ".." / ".models" / "qwen3-tokenizer";

// One model and tokenizer for the suite; each test starts its own engine + server.
struct Shared {
  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::unique_ptr<Model> model;
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  std::shared_ptr<const TokenTrie> vocab;  // structured output
};
inline Shared* g_shared = nullptr;

class Served {
 public:
  explicit Served(SchedulerOptions so = {}, std::string api_key = {}, std::vector<std::string> origins = {"*"},
                  Json chat_template_kwargs = Json::object()) {
    so.context = so.context == 4096 ? 512 : so.context;
    so.token_text = [](int32_t id) { return g_shared->tok->piece(id); };
    so.vocab = g_shared->vocab;
    engine = std::make_unique<Scheduler>(*g_shared->model, so);
    engine->start();
    ServerConfig sc;
    sc.port = 0;
    sc.api_key = std::move(api_key);
    sc.allowed_origins = std::move(origins);
    sc.http_threads = 24;
    http = std::make_unique<HttpServer>(sc);
    port = http->bind();
    http->start();
    ServeContext ctx;
    ctx.engine = engine.get();
    ctx.tokenizer = g_shared->tok.get();
    ctx.chat_template = g_shared->tmpl.get();
    ctx.stop_ids = {g_shared->tok->token_id("<|im_end|>"), g_shared->tok->token_id("<|endoftext|>")};
    ctx.chat_template_kwargs = std::move(chat_template_kwargs);
    http->attach(ctx);
  }
  ~Served() {
    engine->stop();
    http->stop();
  }
  httplib::Client client(int timeout_s = 30) const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(5);
    c.set_read_timeout(timeout_s);
    c.set_write_timeout(5);
    return c;
  }
  std::unique_ptr<Scheduler> engine;
  std::unique_ptr<HttpServer> http;
  int port = 0;
};

class HttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kTokenizerDir / "tokenizer.json")) return;
    g_shared = new Shared;
    g_shared->model = std::make_unique<Model>(make_random_weights(model_preset("tiny-dense"), DType::BF16, 36),
                                              *g_shared->backend);
    g_shared->tok = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(kTokenizerDir.string()));
    g_shared->tmpl = std::make_unique<ChatTemplate>(
        ChatTemplate::from_tokenizer_config_file((kTokenizerDir / "tokenizer_config.json").string()));
    g_shared->vocab =
        std::make_shared<const TokenTrie>(g_shared->tok->document_bytes(g_shared->model->config().vocab_size));
  }
  static void TearDownTestSuite() {
    delete g_shared;
    g_shared = nullptr;
  }
  void SetUp() override {
    if (!g_shared) GTEST_SKIP() << "no Qwen3 tokenizer at " << kTokenizerDir << " (run scripts/fetch-tokenizer.sh)";
  }
};

inline Json post_json(httplib::Client& c, const std::string& path, const Json& body, int* status = nullptr,
               const httplib::Headers& h = {}) {
  auto r = c.Post(path.c_str(), h, body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << path << ": no response (" << httplib::to_string(r.error()) << ")";
    return {};
  }
  if (status) *status = r->status;
  return Json::parse(r->body, nullptr, false);
}

// POSTs and reads an SSE stream; returns the `data:` payloads (an `event:` line before one must
// name its JSON's type). stop_after > 0 hangs up after
// that many events (a client that goes away).
inline std::vector<std::string> post_sse(httplib::Client& c, const std::string& path, const Json& body, int stop_after = 0) {
  std::vector<std::string> events;
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    for (size_t i; (i = buf.find("\n\n")) != std::string::npos;) {
      std::string ev = buf.substr(0, i);
      buf.erase(0, i + 2);
      if (ev.rfind("event: ", 0) == 0 && ev.find('\n') != std::string::npos) {  // a named event (/v1/responses)
        const std::string name = ev.substr(7, ev.find('\n') - 7);
        ev.erase(0, ev.find('\n') + 1);
        EXPECT_NE(ev.find("\"type\":\"" + name + "\""), std::string::npos) << "event " << name << " names its type";
      }
      if (ev.rfind("data: ", 0) == 0) events.push_back(ev.substr(6));
      else EXPECT_EQ(ev.rfind(":", 0), 0u) << "not an SSE data or comment line: " << ev;
    }
    return stop_after == 0 || int(events.size()) < stop_after;
  };
  auto r = c.send(req);
  if (stop_after == 0) {
    EXPECT_TRUE(r) << "stream failed: " << httplib::to_string(r.error());
    if (r) {
      EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    }
    EXPECT_TRUE(buf.empty()) << "trailing bytes: " << buf;
  }
  return events;
}

inline Json completion_request(int i, bool stream) {
  return {{"prompt", fmt::format("Request number {}: tell me about {}", i, i * 7919)},
          {"max_tokens", 12 + i % 5},
          {"temperature", 0},
          {"logprobs", 0},
          {"stream", stream}};
}

// Stats are refreshed at the end of an engine step, just after the answer went out: wait
// (bounded) for the step that finished the last request.
inline bool wait_idle(const Scheduler& e) {
  for (int i = 0; i < 200; ++i) {
    if (e.stats().running == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

inline std::vector<std::string> logprob_tokens(const Json& choice) { return choice["logprobs"]["tokens"]; }

}  // namespace qwen36::server::http_test
