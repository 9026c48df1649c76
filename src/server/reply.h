#pragma once
// defines: Job (what an endpoint writes of the engine's events), Reply (an answer's choices and
//          how it is written), respond (writes a Reply as the engine produces it: JSON, or SSE),
//          submit / submit_choices (requests to the engine; a full queue is a 503),
//          usage_json, combined_usage

#include <memory>
#include <string>
#include <vector>

#include "server/params.h"

namespace qwen36::server {

// OpenAI's usage object (chat / completions).
Json usage_json(const RequestUsage& u);

// What an endpoint does with the engine's output.
struct Job {
  virtual ~Job() = default;
  // Streaming: SSE payloads for a token's text (and logprob). Non-streaming: accumulate.
  virtual std::vector<Json> on_text(const std::string& text, const TokenLogprob* lp) = 0;
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
  void cancel() const {
    for (const auto& j : choices) j->req->cancel();
  }
};

// The choices' usage as one: the prompt once, every choice's completion.
RequestUsage combined_usage(const std::vector<RequestUsage>& us);

// Pulls the choices' events until every one finishes, writing as it goes (server/reply.cpp).
void respond(std::shared_ptr<const Reply> reply, httplib::Response& res);

std::shared_ptr<Request> submit(HttpServer::Api& api, RequestParams params);

// One job's answer whose stream is named events (the Responses and Messages APIs): its request
// submitted, then respond.
void respond_events(std::shared_ptr<Job> job, RequestParams params, HttpServer::Api& api, httplib::Response& res);

// The answer's `n` choices: a job from make (given the first one, or null for it) and a request
// each, choice i drawing with seed + i. A refused submission cancels those already queued.
template <typename J, typename Make>
std::shared_ptr<const Reply> submit_choices(HttpServer::Api& api, const Generation& g, Make&& make) {
  auto reply = std::make_shared<Reply>();
  reply->stream = g.stream;
  reply->include_usage = g.include_usage;
  J* first = nullptr;
  try {
    for (int i = 0; i < g.n; ++i) {
      std::shared_ptr<J> job = make(first);
      job->index = i;
      job->stream = g.stream;
      RequestParams p = g.params;
      p.sampling.seed += uint64_t(i);
      job->req = submit(api, std::move(p));
      if (!first) first = job.get();
      reply->choices.push_back(std::move(job));
    }
  } catch (...) {
    reply->cancel();
    throw;
  }
  return reply;
}

}  // namespace qwen36::server
