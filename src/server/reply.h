#pragma once
// defines: Job (what an endpoint writes of the engine's events), Reply (an answer's choices and
//          how it is written), respond (writes a Reply as the engine produces it: JSON, or SSE),
//          submit / submit_choices (requests to the engine; a full queue is a 503),
//          usage_json, combined_usage

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "server/params.h"

namespace qwen36::server {

// A token's bytes as a JSON array of numbers (logprobs' "bytes": a piece may be part of a UTF-8
// character).
Json bytes_json(const std::string& s);

// OpenAI's usage object (chat / completions).
Json usage_json(const RequestUsage& u);
// llama-server's "timings": prompt tokens read (cache_n of them from the prefix cache) and answer
// tokens, with their milliseconds and rates; prompt_ms runs from submission to the first token.
Json timings_json(const RequestUsage& u);

// What an endpoint does with the engine's output.
struct Job {
  virtual ~Job() = default;
  // Streaming: SSE payloads for a token's text (and logprob). Non-streaming: accumulate.
  virtual std::vector<Json> on_text(const std::string& text, const TokenLogprob* lp) = 0;
  // The answer's next token id, just before its on_text (whose text may hold back part of it).
  virtual void on_token(int32_t /*id*/) {}
  // A prompt token's logprob (RequestParams::prompt_logprobs), before the first on_text.
  virtual void on_prompt_logprob(const TokenLogprob&) {}
  virtual std::vector<Json> on_finish(const std::string& text, const std::string& reason,
                                      const RequestUsage& usage) = 0;
  virtual Json response(const std::string& reason, const RequestUsage& usage) = 0;  // non-streaming body
  virtual Json usage_chunk(const RequestUsage& usage) = 0;  // streaming: the last chunk, no choices
  // An error's body (or stream event): OpenAI's shape unless the API has its own.
  virtual Json error(const HttpError& e) const { return error_body(e); }
  std::shared_ptr<Request> req;
  std::string stop_string;  // set before on_finish: the stop string that ended the text, if one did
  int index = 0;  // the choice's index (`n`)
  bool stream = false;
};

// An answer's choices (one job each, `n` of them) and how it is written.
struct Reply {
  std::vector<std::shared_ptr<Job>> choices;
  bool stream = false, include_usage = false;
  bool event_lines = false;  // Responses API: "event: TYPE" before each data line, and no [DONE]
  bool done_line = true;     // a stream ends with "data: [DONE]" (OpenAI; not llama-server's /completion)
  bool array_body = false;   // not streaming, several choices: a JSON array of their bodies (llama-server)
  int per_prompt = 1;        // choices of each prompt (`n`), in prompt order
  void cancel() const {
    for (const auto& j : choices) j->req->cancel();
  }
};

// The choices' usage as one: each prompt once (its first choice's, `per_prompt` choices apart),
// every choice's completion.
RequestUsage combined_usage(const std::vector<RequestUsage>& us, int per_prompt = 1);

// Pulls the choices' events until every one finishes, writing as it goes (server/reply.cpp).
void respond(std::shared_ptr<const Reply> reply, httplib::Response& res);

std::shared_ptr<Request> submit(HttpServer::Api& api, RequestParams params);

// One job's answer whose stream is named events (the Responses and Messages APIs): its request
// submitted, then respond.
void respond_events(std::shared_ptr<Job> job, RequestParams params, HttpServer::Api& api, httplib::Response& res);

// The answer's choices: for each prompt's generation `n` of them, choice p·n + i drawing with
// seed + i, a job from make(the first job or null, p) and a request each (several prompts: the
// completions route's prompt list). A refused submission cancels those already queued.
template <typename J, typename Make>
std::shared_ptr<Reply> submit_prompts(HttpServer::Api& api, std::span<const Generation> gens, Make&& make) {
  auto reply = std::make_shared<Reply>();
  reply->stream = gens.front().stream;
  reply->include_usage = gens.front().include_usage;
  reply->per_prompt = gens.front().n;
  J* first = nullptr;
  try {
    for (size_t prompt = 0; prompt < gens.size(); ++prompt) {
      const Generation& g = gens[prompt];
      for (int i = 0; i < g.n; ++i) {
        std::shared_ptr<J> job = make(first, prompt);
        job->index = int(prompt) * g.n + i;
        job->stream = g.stream;
        RequestParams p = g.params;
        p.sampling.seed += uint64_t(i);
        job->req = submit(api, std::move(p));
        if (!first) first = job.get();
        reply->choices.push_back(std::move(job));
      }
    }
  } catch (...) {
    reply->cancel();
    throw;
  }
  return reply;
}

// One prompt's `n` choices.
template <typename J, typename Make>
std::shared_ptr<Reply> submit_choices(HttpServer::Api& api, const Generation& g, Make&& make) {
  return submit_prompts<J>(api, std::span(&g, 1), [&](const J* first, size_t) { return make(first); });
}

}  // namespace qwen36::server
