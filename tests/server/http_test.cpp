// The OpenAI, Responses and Anthropic endpoints over real HTTP (the fixture: http_fixture.h).
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <regex>

#include "server/response_store.h"
#include "text/tool_call_grammar.h"
#include "http_fixture.h"

namespace qwen36::server {
namespace {

using namespace http_test;

TEST_F(HttpTest, HealthModelsAndAuth) {
  Served s({}, "sekret");
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 401);
  EXPECT_EQ(Json::parse(m->body)["error"]["type"], "authentication_error");
  auto bad = c.Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 401);
  auto ok = c.Get("/v1/models", {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(Json::parse(ok->body)["data"][0]["max_model_len"], 512);
  const std::string name = Json::parse(ok->body)["data"][0]["id"];
  auto one = c.Get(("/v1/models/" + name).c_str(), {{"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(Json::parse(one->body)["id"], name);
  auto none = c.Get("/v1/models/gpt-x", {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(none->status, 404);
  EXPECT_EQ(Json::parse(none->body)["error"]["code"], "model_not_found");
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("/v1/chat/completions"), std::string::npos);
}

// The access log: a line a request once its answer is written; probes only at debug level.
TEST_F(HttpTest, AccessLogLines) {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  const auto before = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  {
    ServerConfig sc;
    sc.port = 0;
    sc.access_log = true;
    HttpServer http(sc);
    const int port = http.bind();
    http.start();
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(5);
    ASSERT_TRUE(c.Get("/health"));
    ASSERT_TRUE(c.Get("/nowhere"));
    http.stop();
  }
  spdlog::set_default_logger(before);
  const std::string log = captured.str();
  EXPECT_NE(log.find("127.0.0.1 GET /nowhere 404"), std::string::npos) << log;
  EXPECT_EQ(log.find("GET /health"), std::string::npos) << "probes are logged at debug level: " << log;
}

TEST_F(HttpTest, HealthIs503UntilAttached) {
  ServerConfig sc;
  sc.port = 0;
  HttpServer http(sc);
  const int port = http.bind();
  http.start();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  auto chat = c.Post("/v1/chat/completions", "{}", "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 503);
  http.stop();
}

TEST_F(HttpTest, ChatNonStreamingAndStreamingAgree) {
  Served s;
  auto c = s.client();
  Json req = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello there"}}}},
              {"max_tokens", 10}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  int status = 0;
  Json a = post_json(c, "/v1/chat/completions", req, &status);
  ASSERT_EQ(status, 200) << a.dump();
  EXPECT_EQ(a["object"], "chat.completion");
  EXPECT_EQ(a["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(a["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(a["usage"]["completion_tokens"], 10);
  EXPECT_EQ(a["choices"][0]["logprobs"]["content"].size(), 10u);
  EXPECT_EQ(a["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  const auto events = post_sse(c, "/v1/chat/completions", req);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content, reasoning;
  int tokens_with_logprobs = 0;
  Json finish, usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json j = Json::parse(events[i]);  // throws (fails) on a garbled frame
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    if (j["choices"].empty()) {
      usage = j["usage"];
      continue;
    }
    const Json& ch = j["choices"][0];
    content += ch["delta"].value("content", "");
    reasoning += ch["delta"].value("reasoning_content", "");
    if (!ch["logprobs"].is_null()) tokens_with_logprobs += int(ch["logprobs"]["content"].size());
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 10);
  EXPECT_EQ(tokens_with_logprobs, 10);
  const Json& msg = a["choices"][0]["message"];
  EXPECT_EQ(content, msg.contains("content") && msg["content"].is_string() ? msg["content"].get<std::string>() : "");
  EXPECT_EQ(reasoning, msg.value("reasoning_content", ""));
}

TEST_F(HttpTest, BadRequestsGetOpenAIErrors) {
  SchedulerOptions so;
  so.context = 64;
  Served s(so);
  auto c = s.client();
  auto expect_error = [&](const std::string& path, const std::string& body, int want, const std::string& param) {
    auto r = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, want) << body << " → " << r->body;
    Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
  };
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  expect_error("/v1/chat/completions", "{not json", 400, "");
  expect_error("/v1/chat/completions", "[1,2]", 400, "");
  expect_error("/v1/chat/completions", "{}", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages":[]})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"x"}]})", 400, "messages[0].role");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"max_tokens":-1})", 400, "max_tokens");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"max_tokens":"ten"})", 400, "max_tokens");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"temperature":1e30})", 400, "temperature");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"top_p":-0.5})", 400, "top_p");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"top_logprobs":50,"logprobs":true})", 400, "top_logprobs");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"n":17})", 400, "n");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"n":0})", 400, "n");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"frobnicate":1})", 400, "frobnicate");
  expect_error("/v1/chat/completions", "{" + msgs + R"(,"stop":5})", 400, "stop");
  const std::string long_text(2000, 'a');
  auto r = c.Post("/v1/chat/completions", Json{{"messages", {{{"role", "user"}, {"content", long_text}}}}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Json::parse(r->body)["error"]["code"], "context_length_exceeded");
  expect_error("/v1/completions", R"({"prompt":[1,-5]})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt":{"a":1}})", 400, "prompt");
  expect_error("/v1/nothing", "{}", 404, "");
  auto g = c.Get("/v1/chat/completions");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 405);
  // Still serving after all that.
  int status = 0;
  post_json(c, "/v1/completions", {{"prompt", "ok"}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 200);
}

// response_format: json_schema (chat) and json_object (completions) answers are documents of
// their schema, or prefixes of one when max_tokens cuts them; logit_bias; bad ones get a 400.
TEST_F(HttpTest, StructuredOutputAndLogitBias) {
  Served s;
  auto c = s.client(120);
  const Json schema = Json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"},
    "n": {"type": "integer"}, "tag": {"enum": ["red", "green"]}}, "required": ["ok", "n", "tag"]})");
  Json req = {{"messages", {{{"role", "user"}, {"content", "Give me a status"}}}},
              {"chat_template_kwargs", {{"enable_thinking", false}}},
              {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "status"}, {"schema", schema}}}}},
              {"max_tokens", 300}, {"temperature", 0}};
  int status = 0;
  Json a = post_json(c, "/v1/chat/completions", req, &status);
  ASSERT_EQ(status, 200) << a.dump();
  EXPECT_EQ(a["choices"][0]["finish_reason"], "stop") << a.dump();
  const Json doc = Json::parse(a["choices"][0]["message"].value("content", ""), nullptr, false);
  ASSERT_TRUE(doc.is_object()) << a.dump();
  EXPECT_TRUE(doc["ok"].is_boolean() && doc["n"].is_number_integer()) << doc.dump();
  EXPECT_TRUE(doc["tag"] == "red" || doc["tag"] == "green") << doc.dump();

  for (int seed = 0; seed < 3; ++seed) {
    Json j = post_json(c, "/v1/completions",
                       {{"prompt", "JSON:"}, {"max_tokens", 24}, {"temperature", 1.0}, {"seed", seed},
                        {"response_format", {{"type", "json_object"}}}},
                       &status);
    ASSERT_EQ(status, 200) << j.dump();
    const std::string text = j["choices"][0]["text"];
    text::JsonMatcher m(text::JsonSchema::any_object());
    EXPECT_TRUE(m.feed(text)) << text;
    if (j["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(Json::parse(text, nullptr, false).is_object()) << text;
    }
  }

  auto expect_400 = [&](const Json& format, const std::string& says) {
    Json body = req;
    body["response_format"] = format;
    Json e = post_json(c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 400) << e.dump();
    EXPECT_EQ(e["error"]["param"], "response_format") << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << e.dump();
  };
  // logit_bias: +100 on one token makes every draw that token; bad maps are 400s.
  const int32_t piece = g_shared->tok->encode(" ok", false)[0];
  Json lb = post_json(c, "/v1/completions",
                      {{"prompt", "x"}, {"max_tokens", 4}, {"temperature", 0.8}, {"logit_bias", {{std::to_string(piece), 100}}}},
                      &status);
  ASSERT_EQ(status, 200) << lb.dump();
  EXPECT_EQ(lb["choices"][0]["text"], " ok ok ok ok");
  for (const Json& bad : {Json{{"abc", 1}}, Json{{"-1", 1}}, Json{{std::to_string(piece), 101}}, Json::array()}) {
    Json e = post_json(c, "/v1/completions", {{"prompt", "x"}, {"logit_bias", bad}}, &status);
    EXPECT_EQ(status, 400) << e.dump();
    EXPECT_EQ(e["error"]["param"], "logit_bias") << e.dump();
  }
  expect_400({{"type", "xml"}}, "xml");
  expect_400({{"type", "json_schema"}}, "json_schema");
  expect_400({{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}, {"pattern", "(a+"}}}}}},
             "missing ')'");
  expect_400({{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "integer"}, {"multipleOf", 2}}}}}},
             "'multipleOf' is not supported");
}

// Regex, choice and grammar outputs (vLLM's structured_outputs and guided_* fields, SGLang's regex
// and json_schema text, llama-server's grammar), a schema pattern; one constraining field at most.
TEST_F(HttpTest, RegexAndChoiceOutputs) {
  Served s;
  auto c = s.client(120);
  int status = 0;
  const std::vector<std::string> choices = {"yes", "no", "not sure"};
  for (int seed = 0; seed < 3; ++seed) {
    Json j = post_json(c, "/v1/completions",
                       {{"prompt", "Answer:"}, {"max_tokens", 10}, {"temperature", 1.0}, {"seed", seed},
                        {"structured_outputs", {{"choice", choices}}}},
                       &status);
    ASSERT_EQ(status, 200) << j.dump();
    EXPECT_NE(std::find(choices.begin(), choices.end(), j["choices"][0]["text"]), choices.end()) << j.dump();
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << "the choice is whole: nothing may follow";
  }
  const Json chat = {{"messages", {{{"role", "user"}, {"content", "A code, please"}}}},
                     {"chat_template_kwargs", {{"enable_thinking", false}}}, {"max_tokens", 40}, {"temperature", 0.7}};
  for (const char* field : {"guided_regex", "regex"}) {
    Json body = chat;
    body[field] = "[0-9]{3}-[a-z]{2}";
    Json a = post_json(c, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << a.dump();
    const std::string text = a["choices"][0]["message"].value("content", "");
    EXPECT_TRUE(std::regex_match(text, std::regex("[0-9]{3}-[a-z]{2}"))) << field << ": " << text;
  }
  const char* kGrammar = R"(root ::= "The answer is " ("yes" | "no" | "not " [a-z]{2,8}) ".")";
  for (const char* field : {"grammar", "guided_grammar"}) {
    Json body = chat;
    body[field] = kGrammar;
    Json g = post_json(c, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << g.dump();
    const std::string text = g["choices"][0]["message"].value("content", "");
    EXPECT_TRUE(std::regex_match(text, std::regex("The answer is (yes|no|not [a-z]{2,8})\\."))) << field << ": " << text;
    EXPECT_EQ(g["choices"][0]["finish_reason"], "stop") << g.dump();
  }
  Json so = chat;
  so["structured_outputs"] = {{"grammar", kGrammar}};
  ASSERT_EQ((post_json(c, "/v1/chat/completions", so, &status), status), 200);
  // The toy model spends tokens on whitespace where it may: a fixed seed and room to finish.
  const char* kCodeSchema = R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-c]{2,4}$"},
    "n": {"type": "integer", "minimum": 10, "exclusiveMaximum": 20}}, "required": ["code", "n"]})";
  auto code_document = [&](const char* field, const Json& value, const Json& extra) {
    Json body = chat;
    body[field] = value;
    body["seed"] = 7;
    body["max_tokens"] = 120;
    body.update(extra);
    Json a = post_json(c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << a.dump();
    const std::string text = a["choices"][0]["message"].value("content", "");
    const Json doc = Json::parse(text, nullptr, false);
    EXPECT_TRUE(doc.is_object()) << a.dump();
    if (!doc.is_object()) return std::string();
    EXPECT_TRUE(std::regex_match(doc.value("code", ""), std::regex("[a-c]{2,4}"))) << doc.dump();
    EXPECT_TRUE(doc["n"].is_number_integer() && doc["n"] >= 10 && doc["n"] < 20) << doc.dump();
    return text;
  };
  code_document("json_schema", kCodeSchema, Json::object());  // SGLang: the schema as text
  // Whitespace: vLLM's disable_any_whitespace (at most one space), a pattern of the caller's.
  const std::string compact = code_document(
      "structured_outputs", {{"json", Json::parse(kCodeSchema)}, {"disable_any_whitespace", true}}, Json::object());
  EXPECT_EQ(compact.find_first_of("\n\t\r"), std::string::npos) << compact;
  EXPECT_EQ(compact.find("  "), std::string::npos) << compact;
  const std::string bare = code_document("guided_json", kCodeSchema, {{"guided_whitespace_pattern", ""}});
  EXPECT_EQ(bare.find_first_of(" \n\t\r"), std::string::npos) << bare;

  auto expect_400 = [&](const Json& extra, const std::string& param, const std::string& says) {
    Json body = chat;
    body.update(extra);
    Json e = post_json(c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 400) << e.dump();
    EXPECT_EQ(e["error"]["param"], param) << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << e.dump();
  };
  expect_400({{"grammar", "root ::= root \"a\" | \"b\""}}, "grammar", "left recursion");
  expect_400({{"structured_outputs", {{"structural_tag", "{}"}}}}, "structured_outputs", "structural tags");
  expect_400({{"guided_regex", "(a"}}, "guided_regex", "missing ')'");
  expect_400({{"guided_regex", "a"}, {"guided_choice", {"a"}}}, "guided_choice", "both constrain");
  expect_400({{"structured_outputs", {{"regex", "a"}, {"choice", {"a"}}}}}, "structured_outputs", "give one");
  expect_400({{"guided_choice", Json::array()}}, "guided_choice", "non-empty array");
  expect_400({{"json_schema", "{not json"}}, "json_schema", "not valid JSON");
  expect_400({{"structured_outputs", {{"json_object", true}, {"whitespace_pattern", "[ x]?"}}}},
             "structured_outputs.whitespace_pattern", "byte 0x78");
  expect_400({{"guided_json", kCodeSchema}, {"guided_whitespace_pattern", " +"}}, "guided_whitespace_pattern",
             "must match the empty text");
  expect_400({{"structured_outputs", {{"json_object", true}, {"whitespace_pattern", ""}, {"disable_any_whitespace", true}}}},
             "structured_outputs.whitespace_pattern", "give one");
}

// tool_choice "required" / a named function: the answer is a call of (that) tool in the template's
// own form, its arguments held to the function's schema: here a day from 1 to 7, so the random
// model's call parses into exactly that (and with "required" and no parallel calls, one call).
TEST_F(HttpTest, ToolChoiceForcesTheCall) {
  Served s;
  auto c = s.client(60);
  auto tool = [](const char* name) {
    const Json params = Json::parse(R"({"type": "object", "properties": {"day": {"type": "integer", "minimum": 1,
      "maximum": 7}}, "required": ["day"]})");
    return Json{{"type", "function"}, {"function", {{"name", name}, {"parameters", params}}}};
  };
  Json req = {{"messages", {{{"role", "user"}, {"content", "What time is it?"}}}},
              {"chat_template_kwargs", {{"enable_thinking", false}}},
              {"tools", {tool("get_weather"), tool("get_time")}},
              {"max_tokens", 80}, {"temperature", 0.9}, {"seed", 3}};
  int status = 0;
  auto expect_call = [&](const Json& answer, const std::string& name_prefix) {
    const Json& choice = answer["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << answer.dump();
    const Json& calls = choice["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), 1u) << answer.dump();
    EXPECT_EQ(calls[0]["function"]["name"].get<std::string>().rfind(name_prefix, 0), 0u) << answer.dump();
    const Json args = Json::parse(calls[0]["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args.size() == 1 && args["day"].is_number_integer() && args["day"] >= 1 && args["day"] <= 7)
        << answer.dump();
  };
  for (const char* name : {"get_weather", "get_time"}) {
    req["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    Json a = post_json(c, "/v1/chat/completions", req, &status);
    ASSERT_EQ(status, 200) << a.dump();
    expect_call(a, name);
  }
  req["tool_choice"] = "required";
  req["parallel_tool_calls"] = false;
  Json r = post_json(c, "/v1/chat/completions", req, &status);
  ASSERT_EQ(status, 200) << r.dump();
  expect_call(r, "get_");
  // tool_choice "auto": free until the model opens a call with <tool_call> (forced here by a
  // logit_bias), then held to the schema like a forced call.
  Json auto_req = req;
  auto_req.erase("tool_choice");
  auto_req["logit_bias"] = {{std::to_string(g_shared->tok->token_id("<tool_call>")), 100}};
  Json lazy = post_json(c, "/v1/chat/completions", auto_req, &status);
  ASSERT_EQ(status, 200) << lazy.dump();
  expect_call(lazy, "get_");
  // The call may open with the single <tool_call> token a model writes it with (an added token
  // that is not special), not only with its spelling in pieces.
  const auto form = g_shared->tmpl->tool_call_form();
  ASSERT_TRUE(form);
  OutputConstraint oc;
  oc.grammar = text::tool_call_grammar(*form, {tool("get_time")["function"]}, false);
  TokenConstraint mask(g_shared->vocab, oc, {});
  std::vector<float> logits(size_t(g_shared->model->config().vocab_size), 0.0f);
  mask.apply(logits);
  const int32_t open = g_shared->tok->token_id("<tool_call>");
  ASSERT_GE(open, 0);
  EXPECT_TRUE(std::isfinite(logits[size_t(open)]));
  EXPECT_TRUE(std::isfinite(logits[size_t(g_shared->tok->encode("<", false)[0])]));
  auto expect_400 = [&](Json body, const std::string& says) {
    Json e = post_json(c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 400) << e.dump();
    EXPECT_NE(e["error"]["message"].get<std::string>().find(says), std::string::npos) << e.dump();
  };
  Json bad = req;
  bad["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  expect_400(bad, "nope");
  bad = req;
  bad.erase("tools");
  expect_400(bad, "needs 'tools'");
  bad = req;
  bad["response_format"] = {{"type", "json_object"}};
  expect_400(bad, "do not combine");
}

// n > 1: choice i is the request alone with seed + i; streamed, the choices' chunks carry their
// index, each ends with its finish_reason, and the usage chunk counts every choice.
TEST_F(HttpTest, SeveralChoices) {
  Served s;
  auto c = s.client();
  Json req = {{"messages", {{{"role", "user"}, {"content", "Pick a number"}}}}, {"chat_template_kwargs", {{"enable_thinking", false}}},
              {"max_tokens", 6}, {"temperature", 1.0}, {"seed", 11}, {"n", 3}};
  int status = 0;
  Json a = post_json(c, "/v1/chat/completions", req, &status);
  ASSERT_EQ(status, 200) << a.dump();
  ASSERT_EQ(a["choices"].size(), 3u);
  int tokens = 0;
  std::vector<int> each;
  std::vector<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    Json one = req;
    one["n"] = 1;
    one["seed"] = 11 + i;
    Json b = post_json(c, "/v1/chat/completions", one, &status);
    ASSERT_EQ(status, 200) << b.dump();
    EXPECT_EQ(a["choices"][i]["index"], i);
    EXPECT_EQ(a["choices"][i]["message"], b["choices"][0]["message"]) << "choice " << i;
    tokens += b["usage"]["completion_tokens"].get<int>();
    each.push_back(b["usage"]["completion_tokens"].get<int>());
    texts.push_back(b["choices"][0]["message"].value("content", ""));
  }
  EXPECT_EQ(a["usage"]["completion_tokens"], tokens);
  EXPECT_EQ(a["usage"]["total_tokens"], a["usage"]["prompt_tokens"].get<int>() + tokens);

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  req["n"] = 2;
  const auto events = post_sse(c, "/v1/chat/completions", req);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content[2];
  int finished = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const Json j = Json::parse(events[i]);
    ASSERT_EQ(j["choices"].size(), 1u) << events[i];
    const int index = j["choices"][0]["index"];
    ASSERT_TRUE(index == 0 || index == 1) << events[i];
    content[index] += j["choices"][0]["delta"].value("content", "");
    finished += !j["choices"][0]["finish_reason"].is_null();
  }
  EXPECT_EQ(finished, 2);
  EXPECT_EQ(content[0], texts[0]);
  EXPECT_EQ(content[1], texts[1]);
  const Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty()) << usage.dump();
  EXPECT_EQ(usage["usage"]["completion_tokens"], each[0] + each[1]);
}

// /v1/responses: the response object (a message item holding the text, usage), the same text
// from its event stream, and the fields it refuses.
TEST_F(HttpTest, ResponsesApi) {
  Served s;
  auto c = s.client();
  Json req = {{"input", Json::array({{{"role", "user"}, {"content", "Hello"}}})}, {"instructions", "Be brief."},
              {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 8}, {"temperature", 1.0}, {"seed", 4}};
  int status = 0;
  Json r = post_json(c, "/v1/responses", req, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "incomplete") << "8 tokens of a random model: cut by max_output_tokens";
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["usage"]["output_tokens"], 8);
  std::string text;
  for (const Json& item : r["output"])
    if (item["type"] == "message")
      for (const Json& part : item["content"]) text += part["text"].get<std::string>();
  req["stream"] = true;
  std::string streamed, last;
  for (const std::string& e : post_sse(c, "/v1/responses", req)) {
    const Json j = Json::parse(e);
    if (j["type"] == "response.output_text.delta") streamed += j["delta"].get<std::string>();
    last = j["type"];
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(last, "response.incomplete");
  for (const char* bad : {R"({"input": "x", "previous_response_id": "resp_1"})", R"({"input": 5})",
                          R"({"input": [{"type": "image_generation_call"}]})", R"({"input": "x", "frobnicate": 1})"}) {
    Json e = post_json(c, "/v1/responses", Json::parse(bad), &status);
    EXPECT_EQ(status, 400) << bad << " → " << e.dump();
  }
}

TEST(ResponseStore, ChainsAndForgetsTheLeastRecentlyUsed) {
  ResponseStore store(3);
  auto entry = [](const std::string& prev, const std::string& in, const std::string& out) {
    return ResponseStore::Entry{prev, Json::array({in}), Json::array({out}), Json::object()};
  };
  store.put("a", entry("", "q1", "a1"));
  store.put("b", entry("a", "q2", "a2"));
  store.put("x", entry("", "x", "y"));
  EXPECT_EQ(*store.conversation("b"), Json::array({"q1", "a1", "q2", "a2"}));
  store.put("c", entry("b", "q3", "a3"));  // four held: the least recently used goes
  EXPECT_EQ(store.size(), 3u);
  EXPECT_FALSE(store.get("x")) << "b's conversation renewed a and b";
  EXPECT_EQ(store.conversation("c")->size(), 6u);
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.conversation("c")) << "a link of its chain is gone";
  EXPECT_TRUE(store.get("c"));
  store.set_capacity(0);
  EXPECT_EQ(store.size(), 0u);
  store.put("d", entry("", "q", "a"));
  EXPECT_FALSE(store.get("d")) << "capacity 0 keeps nothing";
}

// Stored responses: previous_response_id continues a conversation exactly as sending it whole
// would; GET reads a response, DELETE forgets it; store false keeps nothing.
TEST_F(HttpTest, ResponsesPreviousResponseId) {
  Served s;
  auto c = s.client();
  int status = 0;
  const Json base = {{"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 6}, {"temperature", 0},
                     {"instructions", "Be brief."}};
  Json first = base;
  first["input"] = "Hello";
  const Json r1 = post_json(c, "/v1/responses", first, &status);
  ASSERT_EQ(status, 200) << r1.dump();
  EXPECT_EQ(r1["store"], true);
  const std::string id = r1["id"];
  auto got = c.Get(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(Json::parse(got->body)["output"], r1["output"]);

  Json next = base;
  next["previous_response_id"] = id;
  next["input"] = "And again?";
  const Json r2 = post_json(c, "/v1/responses", next, &status);
  ASSERT_EQ(status, 200) << r2.dump();
  EXPECT_EQ(r2["previous_response_id"], id);
  Json whole = base;  // the same conversation, sent whole (and not stored)
  whole["store"] = false;
  whole["input"] = Json::array({{{"role", "user"}, {"content", "Hello"}}});
  for (const Json& item : r1["output"]) whole["input"].push_back(item);
  whole["input"].push_back({{"role", "user"}, {"content", "And again?"}});
  const Json r3 = post_json(c, "/v1/responses", whole, &status);
  ASSERT_EQ(status, 200) << r3.dump();
  EXPECT_EQ(r3["store"], false);
  EXPECT_EQ(r2["usage"]["input_tokens"], r3["usage"]["input_tokens"]);
  EXPECT_EQ(r2["output"][0]["content"], r3["output"][0]["content"]);
  EXPECT_EQ(c.Get(("/v1/responses/" + r3["id"].get<std::string>()).c_str())->status, 404) << "store false";

  auto del = c.Delete(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 200);
  EXPECT_EQ(Json::parse(del->body)["deleted"], true);
  EXPECT_EQ(c.Delete(("/v1/responses/" + id).c_str())->status, 404);
  next["previous_response_id"] = r2["id"];  // its chain went through the deleted one
  const Json gone = post_json(c, "/v1/responses", next, &status);
  EXPECT_EQ(status, 400) << gone.dump();
  EXPECT_EQ(gone["error"]["param"], "previous_response_id");
}

TEST_F(HttpTest, QueueCapAnswers503) {
  SchedulerOptions so;
  so.max_queue = 0;  // every request is over the cap
  Served s(so);
  auto c = s.client();
  int status = 0;
  Json j = post_json(c, "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 503);
  EXPECT_EQ(j["error"]["code"], "queue_full");
}

TEST_F(HttpTest, ConcurrentStreamsEqualSingleRequestRuns) {
  SchedulerOptions so;
  so.slots = 4;
  Served s(so);
  constexpr int kClients = 8;  // more clients than slots: some queue, all join running batches
  std::vector<std::vector<std::string>> alone(kClients), together(kClients);
  {
    auto c = s.client();
    for (int i = 0; i < kClients; ++i) {
      int status = 0;
      Json j = post_json(c, "/v1/completions", completion_request(i, false), &status);
      ASSERT_EQ(status, 200) << j.dump();
      alone[size_t(i)] = logprob_tokens(j["choices"][0]);
      ASSERT_EQ(alone[size_t(i)].size(), size_t(12 + i % 5));
    }
  }
  std::vector<std::thread> clients;
  std::vector<std::string> finish(kClients);
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      auto c = s.client();
      const auto events = post_sse(c, "/v1/completions", completion_request(i, true));
      for (const std::string& e : events) {
        if (e == "[DONE]") continue;
        Json j = Json::parse(e, nullptr, false);
        if (j.is_discarded()) {
          together[size_t(i)].push_back("<garbled>");
          continue;
        }
        const Json& ch = j["choices"][0];
        if (!ch["logprobs"].is_null()) together[size_t(i)].push_back(ch["logprobs"]["tokens"][0]);
        if (!ch["finish_reason"].is_null()) finish[size_t(i)] = ch["finish_reason"];
      }
      if (events.empty() || events.back() != "[DONE]") finish[size_t(i)] = "incomplete";
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(finish[size_t(i)], "length") << i;
    EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << i;
  }
  EXPECT_TRUE(wait_idle(*s.engine));
}

TEST_F(HttpTest, ClientDisconnectCancelsTheRequest) {
  SchedulerOptions so;
  so.slots = 1;
  Served s(so);
  auto c = s.client();
  Json req = {{"prompt", "go on forever"}, {"max_tokens", 100000}, {"ignore_eos", true}, {"stream", true}};
  post_sse(c, "/v1/completions", req, /*stop_after=*/3);  // hang up after three events
  // The engine notices at the next token it cannot deliver; wait (bounded) for the cancel.
  for (int i = 0; i < 100 && s.engine->stats().requests_cancelled == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const SchedulerStats st = s.engine->stats();
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_LT(st.generated_tokens, 400u);  // stopped long before the context end
  // The slot is free again: a new request is served.
  int status = 0;
  post_json(c, "/v1/completions", {{"prompt", "next"}, {"max_tokens", 2}}, &status);
  EXPECT_EQ(status, 200);
}

// vLLM's min_tokens, stop_token_ids and include_stop_str_in_output, with one token made certain
// by logit_bias: X is drawn every step unless masked.
TEST_F(HttpTest, MinTokensStopTokenIdsAndIncludedStopStrings) {
  Served s;
  auto c = s.client();
  int status = 0;
  const std::vector<int32_t> hello = g_shared->tok->encode("Hello");
  ASSERT_EQ(hello.size(), 1u);
  const int32_t x = hello[0];
  const Json base = {{"prompt", "Say:"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true},
                     {"logit_bias", {{std::to_string(x), 100}}}};
  auto complete = [&](const Json& extra) {
    Json body = base;
    body.update(extra);
    Json r = post_json(c, "/v1/completions", body, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return r;
  };
  Json r = complete({{"stop_token_ids", {x}}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 0) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  r = complete({{"stop_token_ids", {x}}, {"min_tokens", 3}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 3) << "X masked for three draws, then drawn: the stop";
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>().find("Hello"), std::string::npos) << r.dump();

  EXPECT_EQ(complete({{"stop", "Hello"}})["choices"][0]["text"], "");
  EXPECT_EQ(complete({{"stop", "Hello"}, {"include_stop_str_in_output", true}})["choices"][0]["text"], "Hello");
  r = complete({{"stop", "Hello"}, {"include_stop_str_in_output", true}, {"min_tokens", 2}});
  EXPECT_EQ(r["choices"][0]["text"], "HelloHello") << "the first token's text is not looked at";

  for (const auto& [extra, param] : std::vector<std::pair<Json, std::string>>{
           {{{"min_tokens", 9}}, "min_tokens"},
           {{{"stop_token_ids", {-1}}}, "stop_token_ids"},
           {{{"stop_token_ids", 5}}, "stop_token_ids"},
           {{{"include_stop_str_in_output", "yes"}}, "include_stop_str_in_output"}}) {
    Json body = base;
    body.update(extra);
    const Json e = post_json(c, "/v1/completions", body, &status);
    EXPECT_EQ(status, 400) << e.dump();
    EXPECT_EQ(e["error"]["param"], param) << e.dump();
  }
}

// echo (lm-evaluation-harness's loglikelihood requests): the prompt leads the text, its tokens the
// logprobs (the first one null), scored as the answer's own tokens were when generated.
TEST_F(HttpTest, EchoScoresThePrompt) {
  Served s;
  auto c = s.client();
  int status = 0;
  const Json gen = post_json(c, "/v1/completions",
                             {{"prompt", "The cat sat on"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 1},
                              {"ignore_eos", true}}, &status);
  ASSERT_EQ(status, 200) << gen.dump();
  const std::string answer = gen["choices"][0]["text"];
  const Json score = post_json(c, "/v1/completions",
                               {{"prompt", "The cat sat on" + answer}, {"max_tokens", 0}, {"logprobs", 1}, {"echo", true}},
                               &status);
  ASSERT_EQ(status, 200) << score.dump();
  const Json& choice = score["choices"][0];
  EXPECT_EQ(choice["text"], "The cat sat on" + answer);
  EXPECT_EQ(choice["finish_reason"], "length");
  const Json& lp = choice["logprobs"];
  const size_t n = g_shared->tok->encode("The cat sat on" + answer).size();
  ASSERT_EQ(lp["tokens"].size(), n) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < n; ++i) EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
  // With an answer too: the prompt's scores, then the answer's.
  const Json more = post_json(c, "/v1/completions",
                              {{"prompt", "The cat sat on" + answer}, {"max_tokens", 2}, {"logprobs", 1},
                               {"echo", true}, {"temperature", 0}, {"ignore_eos", true}}, &status);
  ASSERT_EQ(status, 200) << more.dump();
  const Json& lp2 = more["choices"][0]["logprobs"];
  ASSERT_EQ(lp2["tokens"].size(), n + 2) << lp2.dump();
  for (size_t i = 1; i < n; ++i)
    EXPECT_NEAR(lp2["token_logprobs"][i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-5) << i;
  EXPECT_EQ(more["choices"][0]["text"].get<std::string>().rfind("The cat sat on" + answer, 0), 0u);

  // vLLM's prompt_logprobs: the same scores by token id, with ranks and the top alternatives.
  const std::vector<int32_t> ids = g_shared->tok->encode("The cat sat on" + answer);
  const Json v = post_json(c, "/v1/completions",
                           {{"prompt", "The cat sat on" + answer}, {"max_tokens", 0}, {"prompt_logprobs", 2}}, &status);
  ASSERT_EQ(status, 200) << v.dump();
  const Json& plp = v["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(plp.size(), n) << v.dump();
  EXPECT_TRUE(plp[0].is_null());
  for (size_t i = 1; i < n; ++i) {
    const Json& mine = plp[i][std::to_string(ids[i])];
    EXPECT_NEAR(mine["logprob"].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-6) << i;
    EXPECT_GE(mine["rank"].get<int>(), 1);
    EXPECT_TRUE(plp[i].size() == 2 || plp[i].size() == 3) << plp[i].dump();
    int ranked = 0;
    for (const auto& [id, e] : plp[i].items()) ranked += e["rank"].get<int>() <= 2;
    EXPECT_GE(ranked, 2) << plp[i].dump();
  }
  const Json chat = post_json(c, "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 1},
                               {"prompt_logprobs", 0}}, &status);
  ASSERT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(chat["prompt_logprobs"].size(), chat["usage"]["prompt_tokens"].get<size_t>());
  post_json(c, "/v1/completions", {{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}}, &status);
  EXPECT_EQ(status, 400);

  // Streamed, with an answer: the prompt's chunk first.
  const auto events = post_sse(c, "/v1/completions",
                               {{"prompt", "The cat"}, {"max_tokens", 2}, {"echo", true}, {"stream", true},
                                {"temperature", 0}});
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(Json::parse(events[0])["choices"][0]["text"], "The cat") << events[0];
}

// A list of prompts (OpenAI's batch form): `n` choices each, indexed prompt·n + i, each as the
// prompt alone would have it; usage counts every prompt once.
TEST_F(HttpTest, CompletionsPromptList) {
  Served s;
  auto c = s.client();
  int status = 0;
  const Json greedy = {{"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}};
  auto complete = [&](const Json& prompt, int n) {
    Json body = greedy;
    body["prompt"] = prompt;
    body["n"] = n;
    Json r = post_json(c, "/v1/completions", body, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return r;
  };
  const std::vector<int32_t> ids = g_shared->tok->encode("def main():");
  const Json both = complete(Json::array({"import os", Json(ids)}), 2);
  ASSERT_EQ(both["choices"].size(), 4u) << both.dump();
  const Json a = complete("import os", 1), b = complete(Json(ids), 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(both["choices"][i]["index"], i);
    EXPECT_EQ(both["choices"][i]["text"], (i < 2 ? a : b)["choices"][0]["text"]) << i;
  }
  EXPECT_EQ(both["usage"]["prompt_tokens"], a["usage"]["prompt_tokens"].get<int>() + int(ids.size()));
  EXPECT_EQ(both["usage"]["completion_tokens"], 4 * 5);
  for (const Json& bad : {Json::array(), Json::array({"a", 5}), Json::array({Json::array()}), Json(3)}) {
    Json body = greedy;
    body["prompt"] = bad;
    const Json e = post_json(c, "/v1/completions", body, &status);
    EXPECT_EQ(status, 400) << bad.dump() << " → " << e.dump();
  }
}

// A conversation that ends with the assistant's message continues it (assistant prefill): the
// prompt is the template's rendering cut right after that message's text, so the answer equals a
// raw completion of that text.
TEST_F(HttpTest, AssistantPrefillContinuesTheMessage) {
  Served s;
  auto c = s.client();
  int status = 0;
  const Json messages = {{{"role", "user"}, {"content", "Add two numbers"}},
                         {{"role", "assistant"}, {"content", "def add(a, b):"}}};
  const std::string rendered = g_shared->tmpl->render(messages, nullptr, false, Json::object());
  const size_t at = rendered.rfind("def add(a, b):");
  ASSERT_NE(at, std::string::npos) << rendered;
  const std::string prefix = rendered.substr(0, at + std::string("def add(a, b):").size());
  ASSERT_LT(prefix.size(), rendered.size()) << "the template ends the turn after the message";

  const Json greedy = {{"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
  Json chat = greedy;
  chat["messages"] = messages;
  const Json a = post_json(c, "/v1/chat/completions", chat, &status);
  ASSERT_EQ(status, 200) << a.dump();
  Json raw = greedy;
  raw["prompt"] = prefix;
  const Json b = post_json(c, "/v1/completions", raw, &status);
  ASSERT_EQ(status, 200) << b.dump();
  EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
  const Json& msg = a["choices"][0]["message"];
  EXPECT_EQ(msg.value("reasoning_content", "") + msg.value("content", ""), b["choices"][0]["text"]) << a.dump();

  // vLLM's explicit fields: the same by continue_final_message; a new turn by add_generation_prompt.
  Json explicit_continue = chat;
  explicit_continue["continue_final_message"] = true;
  explicit_continue["add_generation_prompt"] = false;
  EXPECT_EQ(post_json(c, "/v1/chat/completions", explicit_continue, &status)["usage"]["prompt_tokens"],
            a["usage"]["prompt_tokens"]);
  Json new_turn = chat;
  new_turn["add_generation_prompt"] = true;
  const Json t = post_json(c, "/v1/chat/completions", new_turn, &status);
  ASSERT_EQ(status, 200) << t.dump();
  EXPECT_EQ(t["usage"]["prompt_tokens"],
            g_shared->tok->encode(g_shared->tmpl->render(messages, nullptr, true, Json::object())).size());

  // An empty assistant message: the turn opened as the template opens it, nothing after.
  Json empty = chat;
  empty["messages"][1]["content"] = "";
  const Json e = post_json(c, "/v1/chat/completions", empty, &status);
  ASSERT_EQ(status, 200) << e.dump();
  EXPECT_LT(e["usage"]["prompt_tokens"].get<int>(), a["usage"]["prompt_tokens"].get<int>());

  auto expect_400 = [&](Json body, const std::string& says) {
    const Json r = post_json(c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 400) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(says), std::string::npos) << r.dump();
  };
  Json both = chat;
  both["continue_final_message"] = true;
  both["add_generation_prompt"] = true;
  expect_400(both, "cannot both be true");
  Json user_last = chat;
  user_last["messages"] = {messages[0]};
  user_last["continue_final_message"] = true;
  user_last["add_generation_prompt"] = false;
  expect_400(user_last, "needs the last message to be the assistant's");
  // A prefill that opens <think>: the answer is reasoning, unless reasoning_format "none" leaves
  // it in the content.
  Json thinking = chat;
  thinking["messages"][1]["content"] = "<think>\nLet me see.";
  const Json apart = post_json(c, "/v1/chat/completions", thinking, &status);
  ASSERT_EQ(status, 200) << apart.dump();
  const Json& am = apart["choices"][0]["message"];
  ASSERT_TRUE(am.contains("reasoning_content")) << apart.dump();
  thinking["reasoning_format"] = "none";
  const Json inline_ = post_json(c, "/v1/chat/completions", thinking, &status);
  ASSERT_EQ(status, 200) << inline_.dump();
  const Json& im = inline_["choices"][0]["message"];
  EXPECT_FALSE(im.contains("reasoning_content")) << inline_.dump();
  EXPECT_EQ(im["content"], am["reasoning_content"].get<std::string>() +
                               (am.value("content", "").empty() ? "" : "</think>" + am.value("content", "")))
      << apart.dump() << inline_.dump();
  thinking["reasoning_format"] = "deepseek-legacy";
  expect_400(thinking, "'reasoning_format' must be");

  Json with_call = chat;
  with_call["messages"][1]["tool_calls"] = {
      {{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}};
  expect_400(with_call, "cannot be continued");
}

// thinking_token_budget (vLLM) on chat, budget_tokens on messages: a cap the model's <think>
// opens; with logit_bias making <think> certain, the reasoning is cut at the budget.
TEST_F(HttpTest, ThinkingTokenBudget) {
  Served s;
  auto c = s.client();
  int status = 0;
  const int32_t think = g_shared->tok->token_id("<think>");
  ASSERT_GE(think, 0);
  Json body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 10}, {"temperature", 0},
               {"logit_bias", {{std::to_string(think), 100}}}, {"thinking_token_budget", 3}, {"logprobs", true}};
  const Json r = post_json(c, "/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  std::vector<std::string> toks;
  for (const Json& t : r["choices"][0]["logprobs"]["content"]) toks.push_back(t["token"]);
  ASSERT_GE(toks.size(), 5u) << r.dump();
  EXPECT_EQ(toks[0], "<think>");
  EXPECT_EQ(toks[4], "</think>") << "three reasoning tokens, then the end: " << r.dump();
  body["thinking_token_budget"] = -1;
  post_json(c, "/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
}

// The server's default chat_template_kwargs, under each request's own.
TEST_F(HttpTest, DefaultChatTemplateKwargs) {
  const Json ask = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 1}};
  auto prompt_tokens = [&](Served& s, const Json& extra) {
    auto c = s.client();
    Json body = ask;
    body.update(extra);
    int status = 0;
    const Json r = post_json(c, "/v1/chat/completions", body, &status);
    EXPECT_EQ(status, 200) << r.dump();
    return r["usage"]["prompt_tokens"].get<int>();
  };
  const Json off = {{"chat_template_kwargs", {{"enable_thinking", false}}}};
  const Json on = {{"chat_template_kwargs", {{"enable_thinking", true}}}};
  int plain_default = 0, plain_off = 0;
  {
    Served s;
    plain_default = prompt_tokens(s, Json::object());
    plain_off = prompt_tokens(s, off);
  }
  ASSERT_NE(plain_default, plain_off) << "the template writes an empty think block when thinking is off";
  Served s({}, {}, {"*"}, {{"enable_thinking", false}});
  EXPECT_EQ(prompt_tokens(s, Json::object()), plain_off);
  EXPECT_EQ(prompt_tokens(s, on), plain_default) << "the request's own kwargs win";
}

// CORS: an allowed origin's page may call the API; its preflight needs no key.
TEST_F(HttpTest, CorsForAllowedOrigins) {
  {
    Served s({}, "k3y");
    auto c = s.client();
    auto pre = c.Options("/v1/chat/completions", {{"Origin", "https://ui.example"},
                                                  {"Access-Control-Request-Method", "POST"},
                                                  {"Access-Control-Request-Headers", "authorization, content-type"}});
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "*");
    EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
    auto models = c.Get("/v1/models", {{"Origin", "https://ui.example"}, {"Authorization", "Bearer k3y"}});
    ASSERT_TRUE(models);
    EXPECT_EQ(models->status, 200);
    EXPECT_EQ(models->get_header_value("Access-Control-Allow-Origin"), "*");
    auto plain = c.Get("/v1/models", {{"Authorization", "Bearer k3y"}});
    EXPECT_FALSE(plain->has_header("Access-Control-Allow-Origin")) << "no Origin: not a cross-origin call";
  }
  Served s({}, {}, {"https://ui.example"});
  auto c = s.client();
  auto ok = c.Get("/health", {{"Origin", "https://ui.example"}});
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "https://ui.example");
  EXPECT_EQ(ok->get_header_value("Vary"), "Origin");
  auto other = c.Get("/health", {{"Origin", "https://evil.example"}});
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  auto pre = c.Options("/v1/models", {{"Origin", "https://evil.example"}});
  EXPECT_FALSE(pre->has_header("Access-Control-Allow-Methods"));
}

TEST_F(HttpTest, TokenizeDetokenizeAndMetrics) {
  Served s;
  auto c = s.client();
  int status = 0;
  Json t = post_json(c, "/tokenize", {{"content", "Hello world"}}, &status);
  ASSERT_EQ(status, 200);
  ASSERT_EQ(t["tokens"].size(), 2u);
  EXPECT_EQ(t["count"], 2);
  EXPECT_EQ(t["max_model_len"], 512);
  Json d = post_json(c, "/detokenize", {{"tokens", t["tokens"]}}, &status);
  EXPECT_EQ(d["content"], "Hello world");
  EXPECT_EQ(d["prompt"], "Hello world");
  // vLLM's forms: a prompt with its tokens' strings, a conversation through the chat template.
  const Json v = post_json(c, "/tokenize", {{"prompt", "Hello world"}, {"return_token_strs", true}}, &status);
  EXPECT_EQ(v["tokens"], t["tokens"]);
  EXPECT_EQ(v["token_strs"].size(), 2u);
  const Json messages = {{{"role", "user"}, {"content", "Hello world"}}};
  const Json chat = post_json(c, "/tokenize", {{"messages", messages}, {"add_generation_prompt", true}}, &status);
  EXPECT_EQ(chat["count"], g_shared->tok->encode(g_shared->tmpl->render(messages, nullptr, true, Json::object())).size());
  post_json(c, "/tokenize", {{"prompt", 5}}, &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/detokenize", {{"tokens", {-1}}}, &status);
  EXPECT_EQ(status, 400);
  post_json(c, "/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 3}}, &status);
  EXPECT_TRUE(wait_idle(*s.engine));
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  for (const char* name : {"qwen36_requests_running 0", "qwen36_generation_tokens_total 3",
                           "qwen36_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1", "qwen36_prefix_cache_hit_rate",
                           "qwen36_state_slots_busy", "# TYPE qwen36_inter_token_latency_seconds histogram"})
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
}

}  // namespace
}  // namespace qwen36::server
