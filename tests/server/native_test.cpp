// llama-server's own API (server/native.cpp) over real HTTP: /completion's fields, defaults,
// answer and stream shapes, its sampler list, the samplers it lacks refused unless off; /props
// and /apply-template. The fixture: http_fixture.h.
#include "http_fixture.h"

namespace qwen36::server {
namespace {

using namespace http_test;

TEST_F(HttpTest, NativeCompletionAnswersInLlamaServersShape) {
  Served s;
  auto c = s.client();
  int status = 0;
  const Json r = post_json(c, "/completion",
                           {{"prompt", "The capital of France is"}, {"n_predict", 6}, {"temperature", 0},
                            {"n_probs", 2}, {"return_tokens", true}},
                           &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["stop"], true);
  EXPECT_EQ(r["stop_type"], "limit");
  EXPECT_EQ(r["tokens_predicted"], 6);
  EXPECT_EQ(r["tokens"].size(), 6u);
  EXPECT_EQ(r["tokens_evaluated"], int(g_shared->tok->encode("The capital of France is").size()));
  EXPECT_EQ(r["prompt"], "The capital of France is");
  EXPECT_EQ(r["generation_settings"]["n_ctx"], 512);
  EXPECT_EQ(r["generation_settings"]["top_k"], 40);  // llama-server's defaults
  EXPECT_EQ(r["generation_settings"]["samplers"].back(), "temperature");
  EXPECT_EQ(r["truncated"], false);
  EXPECT_EQ(r["timings"]["predicted_n"], 6);
  EXPECT_GT(r["timings"]["predicted_per_second"].get<double>(), 0);
  // The text is the tokens' and each probability entry names the drawn token, the most likely
  // first among its alternatives (greedy).
  const std::vector<int32_t> ids = r["tokens"];
  EXPECT_EQ(r["content"], g_shared->tok->decode(ids));
  ASSERT_EQ(r["completion_probabilities"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    const Json& p = r["completion_probabilities"][i];
    EXPECT_EQ(p["id"], ids[i]);
    ASSERT_EQ(p["top_logprobs"].size(), 2u);
    EXPECT_EQ(p["top_logprobs"][0]["id"], ids[i]);
    EXPECT_LE(p["logprob"].get<double>(), 0);
  }
  // Greedy /completion is the OpenAI route's greedy answer.
  const Json o = post_json(c, "/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(o["choices"][0]["text"], r["content"]);
  EXPECT_EQ(o["timings"]["predicted_n"], 6);
}

TEST_F(HttpTest, NativeCompletionStreamsWithoutDone) {
  Served s;
  auto c = s.client();
  const Json body = {{"prompt", "Once upon a time"}, {"n_predict", 8}, {"temperature", 0}, {"stream", true}};
  const std::vector<std::string> events = post_sse(c, "/completion", body);
  ASSERT_GE(events.size(), 2u);
  std::string text;
  size_t tokens = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json e = Json::parse(events[i]);
    EXPECT_EQ(e["stop"], false);
    text += e["content"].get<std::string>();
    tokens += e["tokens"].size();
  }
  const Json last = Json::parse(events.back());  // no "[DONE]": the stop: true object ends it
  EXPECT_EQ(last["stop"], true);
  EXPECT_EQ(last["tokens_predicted"], 8);
  EXPECT_EQ(tokens, 8u);
  Json whole = body;
  whole["stream"] = false;
  EXPECT_EQ(post_json(c, "/completion", whole)["content"], text);
}

TEST_F(HttpTest, NativeCompletionStopWordsPromptsAndFields) {
  Served s;
  auto c = s.client();
  // A stop word: the answer ends before it, stop_type "word" (a grammar keeps the random model's
  // answer to whole ASCII characters, so any two of them make a stop word).
  const Json ascii = {{"prompt", "1, 2, 3,"}, {"n_predict", 12}, {"temperature", 0}, {"grammar", "root ::= [a-z ]+"}};
  const std::string text = post_json(c, "/completion", ascii)["content"];
  ASSERT_GE(text.size(), 3u);
  const std::string word = text.substr(1, 2);
  Json with_stop = ascii;
  with_stop["stop"] = {word};
  const Json stopped = post_json(c, "/completion", with_stop);
  EXPECT_EQ(stopped["stop_type"], "word");
  EXPECT_EQ(stopped["stopping_word"], word);
  EXPECT_EQ(stopped["content"], text.substr(0, text.find(word)));
  // Token ids mixed with text make one prompt; a list of prompts gives an array of answers.
  const std::vector<int32_t> ids = g_shared->tok->encode("1, 2");
  Json mixed = Json::array();
  for (int32_t id : ids) mixed.push_back(id);
  mixed.push_back(", 3,");
  const Json m = post_json(c, "/completion", {{"prompt", mixed}, {"n_predict", 12}, {"temperature", 0}});
  EXPECT_EQ(m["prompt"], "1, 2, 3,");
  const Json many = post_json(c, "/completion", {{"prompt", {"1, 2, 3,", "a b c"}}, {"n_predict", 3}, {"temperature", 0},
                                                 {"response_fields", {"content", "generation_settings/n_predict"}}});
  ASSERT_TRUE(many.is_array());
  ASSERT_EQ(many.size(), 2u);
  EXPECT_EQ(many[0].size(), 2u);  // only the fields asked for, n_predict brought to the top
  EXPECT_EQ(many[0]["n_predict"], 3);
  const Json one = post_json(c, "/completion", {{"prompt", "1, 2, 3,"}, {"n_predict", 3}, {"temperature", 0}});
  EXPECT_EQ(many[0]["content"], one["content"]);
  // logit_bias false bans a token: the greedy answer's first token never comes.
  const int32_t first = post_json(c, "/completion", {{"prompt", "1, 2, 3,"}, {"n_predict", 1}, {"temperature", 0},
                                                     {"return_tokens", true}})["tokens"][0];
  const Json banned = post_json(c, "/completion", {{"prompt", "1, 2, 3,"}, {"n_predict", 1}, {"temperature", 0},
                                                   {"return_tokens", true}, {"logit_bias", {{first, false}}}});
  EXPECT_NE(banned["tokens"][0], first);
}

TEST_F(HttpTest, NativeSamplersAndUnsupportedOnes) {
  Served s;
  auto c = s.client();
  auto status_of = [&](const Json& extra) {
    Json body = {{"prompt", "hello"}, {"n_predict", 2}};
    body.update(extra);
    int status = 0;
    const Json r = post_json(c, "/completion", body, &status);
    return std::make_pair(status, r);
  };
  // Off settings of samplers qwen36 lacks are what clients send by default: accepted.
  EXPECT_EQ(status_of({{"mirostat", 0}, {"dry_multiplier", 0}, {"xtc_probability", 0}, {"dynatemp_range", 0},
                       {"min_keep", 0}, {"cache_prompt", true}, {"n_keep", -1}, {"id_slot", -1}}).first, 200);
  for (const Json& on : {Json{{"mirostat", 2}}, Json{{"dry_multiplier", 0.8}}, Json{{"xtc_probability", 0.5}},
                         Json{{"dynatemp_range", 0.5}}, Json{{"min_keep", 5}}, Json{{"post_sampling_probs", true}},
                         Json{{"id_slot", 1}}, Json{{"lora", {{{"id", 0}, {"scale", 1}}}}}, Json{{"typo_field", 1}}}) {
    const auto [status, r] = status_of(on);
    EXPECT_EQ(status, 400) << on.dump();
    EXPECT_EQ(r["error"]["param"], on.begin().key()) << r.dump();
  }
  // The sampler list: a sampler left out is off; the order must be one qwen36 applies.
  const auto k_only = status_of({{"samplers", {"top_k", "temperature"}}});
  ASSERT_EQ(k_only.first, 200);
  EXPECT_EQ(k_only.second["generation_settings"]["top_p"], 1.0);
  EXPECT_EQ(k_only.second["generation_settings"]["min_p"], 0.0);
  EXPECT_EQ(status_of({{"samplers", "kt"}}).first, 200);
  const auto first = status_of({{"samplers", {"temperature", "top_k", "top_p"}}});  // vLLM's order
  ASSERT_EQ(first.first, 200);
  EXPECT_EQ(first.second["generation_settings"]["samplers"][1], "temperature");
  EXPECT_EQ(status_of({{"samplers", {"top_p", "temperature", "min_p"}}}).first, 400);  // temperature between
  EXPECT_EQ(status_of({{"samplers", {"top_p", "top_k"}}}).first, 400);                 // out of order
  EXPECT_EQ(status_of({{"samplers", {"min_p", "top_p"}}}).first, 200);                 // these two commute
  EXPECT_EQ(status_of({{"samplers", {"infill"}}}).first, 400);
}

TEST_F(HttpTest, PropsAndApplyTemplate) {
  Served s;
  auto c = s.client();
  auto p = c.Get("/props");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->status, 200);
  const Json props = Json::parse(p->body);
  EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 512);
  EXPECT_EQ(props["total_slots"], 4);
  EXPECT_EQ(props["default_generation_settings"]["params"]["temperature"], 0.8f);
  EXPECT_NE(props["chat_template"].get<std::string>().find("im_start"), std::string::npos);
  const Json messages = {{{"role", "user"}, {"content", "hi"}}};
  const Json t = post_json(c, "/apply-template", {{"messages", messages}});
  EXPECT_EQ(t["prompt"], g_shared->tmpl->render(messages, nullptr, true, Json::object()));
  // The template's prompt sent to /completion is the chat route's prompt.
  const Json n = post_json(c, "/completion", {{"prompt", t["prompt"]}, {"n_predict", 5}, {"temperature", 0}});
  const Json chat = post_json(c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 5}, {"temperature", 0}});
  EXPECT_EQ(n["tokens_evaluated"], chat["usage"]["prompt_tokens"]);
  int status = 0;
  post_json(c, "/apply-template", {{"messages", "hi"}}, &status);
  EXPECT_EQ(status, 400);
}

}  // namespace
}  // namespace qwen36::server
