// Writing an answer as the engine produces it (server/reply.h).
#include "server/reply.h"

#include <algorithm>
#include <chrono>

namespace qwen36::server {

Json bytes_json(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

Json usage_json(const RequestUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

Json timings_json(const RequestUsage& u) {
  const double prompt_ms = u.ttft_seconds * 1e3, predicted_ms = std::max(0.0, u.total_seconds - u.ttft_seconds) * 1e3;
  const int32_t read = u.prompt_tokens - u.cached_tokens;
  auto per_token = [](double ms, int32_t n) { return n > 0 ? ms / n : 0.0; };
  auto per_second = [](double ms, int32_t n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
  return {{"cache_n", u.cached_tokens},
          {"prompt_n", read},
          {"prompt_ms", prompt_ms},
          {"prompt_per_token_ms", per_token(prompt_ms, read)},
          {"prompt_per_second", per_second(prompt_ms, read)},
          {"predicted_n", u.completion_tokens},
          {"predicted_ms", predicted_ms},
          {"predicted_per_token_ms", per_token(predicted_ms, u.completion_tokens)},
          {"predicted_per_second", per_second(predicted_ms, u.completion_tokens)}};
}

RequestUsage combined_usage(const std::vector<RequestUsage>& us, int per_prompt) {
  RequestUsage u = us.front();
  for (size_t i = 1; i < us.size(); ++i) {
    u.completion_tokens += us[i].completion_tokens;
    if (i % size_t(per_prompt) == 0) u.prompt_tokens += us[i].prompt_tokens, u.cached_tokens += us[i].cached_tokens;
  }
  return u;
}

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

HttpError shutdown_error() {
  return HttpError(503, "the request was cancelled: the server is shutting down", {}, "cancelled", "server_error");
}

// Pulls events until every choice's request finishes, writing as it goes. A failed write means
// the client is gone: the requests are cancelled and free their slots at the engine's next step;
// a choice that fails or is cancelled ends the answer with an error (the others are cancelled).
// Whenever nothing has been written for half a second — no events, or only events whose text
// is held back (stop strings, partial tags) — a keep-alive (an SSE comment, or JSON-neutral
// whitespace) goes out, which is also how a vanished client is noticed.
bool pump(const Reply& reply, httplib::DataSink& sink) {
  auto write = [&](const std::string& s) {
    if (sink.write(s.data(), s.size())) return true;
    reply.cancel();
    return false;
  };
  auto sse = [&](const Json& j) {
    const bool named = reply.event_lines && j.contains("type");  // "event: TYPE" (Responses / Messages APIs)
    const std::string event = named ? "event: " + j["type"].get<std::string>() + "\n" : "";
    return write(event + "data: " + dump(j) + "\n\n");
  };
  auto done_marker = [&] { return reply.event_lines || !reply.done_line || write("data: [DONE]\n\n"); };
  auto last_write = Clock::now();
  auto keep_alive = [&] {
    if (Clock::now() - last_write <= 500ms) return true;
    last_write = Clock::now();
    return write(reply.stream ? ": keep-alive\n\n" : " ");
  };
  const size_t n = reply.choices.size();
  std::vector<RequestUsage> usages(n);
  std::vector<std::string> reasons(n);
  std::vector<bool> ended(n, false);  // its Finished event was read
  auto first_running = [&] { return size_t(std::find(ended.begin(), ended.end(), false) - ended.begin()); };
  // One event of choice i: false when the answer is over (written, or the client gone).
  auto handle = [&](size_t i, const RequestEvent& ev, bool& over) {
    Job& job = *reply.choices[i];
    if (ev.kind == RequestEvent::Kind::Prompt) {
      job.on_prompt_logprob(*ev.logprob);
      return true;
    }
    if (ev.kind == RequestEvent::Kind::Token) {
      job.on_token(ev.token);
      if (!reply.stream) {
        job.on_text(ev.text, ev.logprob ? &*ev.logprob : nullptr);
        return true;
      }
      for (const Json& j : job.on_text(ev.text, ev.logprob ? &*ev.logprob : nullptr)) {
        if (!sse(j)) return false;
        last_write = Clock::now();
      }
      return true;
    }
    usages[i] = job.req->usage();
    reasons[i] = ev.finish_reason;
    ended[i] = true;
    job.stop_string = ev.stop_string;
    const std::vector<Json> tail = job.on_finish(ev.text, ev.finish_reason, usages[i]);
    if (ev.finish_reason == "error" || ev.finish_reason == "cancelled") {
      reply.cancel();
      over = true;
      const Json err = job.error(ev.finish_reason == "error"
                                     ? HttpError(500, "generation failed: " + ev.error, {}, {}, "server_error")
                                     : shutdown_error());
      return reply.stream ? sse(err) && done_marker() : write(dump(err));
    }
    if (reply.stream)
      for (const Json& j : tail)
        if (!sse(j)) return false;
    return true;
  };
  RequestEvent ev;
  bool over = false;
  while (!over && first_running() < n) {
    bool got = false;  // events waiting: take them all, choice by choice
    for (size_t i = 0; i < n && !over; ++i)
      while (!over && !ended[i] && reply.choices[i]->req->next(ev, 0ms)) {
        got = true;
        if (!keep_alive() || !handle(i, ev, over)) return false;
      }
    if (got || over) continue;
    const size_t first = first_running();  // none: wait for it
    if (!reply.choices[first]->req->next(ev, n == 1 ? 100ms : 10ms)) {
      if (!keep_alive()) return false;
      continue;
    }
    if (!keep_alive() || !handle(first, ev, over)) return false;
  }
  if (!over) {
    const RequestUsage total = combined_usage(usages, reply.per_prompt);
    if (reply.stream) {
      if (reply.include_usage && !sse(reply.choices[0]->usage_chunk(total))) return false;  // OpenAI style
      if (!done_marker()) return false;
    } else {
      Json body = reply.choices[0]->response(reasons[0], usages[0]);
      if (reply.array_body) {  // each choice's whole body
        Json all = Json::array({std::move(body)});
        for (size_t i = 1; i < n; ++i) all.push_back(reply.choices[i]->response(reasons[i], usages[i]));
        body = std::move(all);
      } else if (n > 1) {  // choice 0's body with every choice and the usage over all
        Json choices = Json::array({body["choices"][0]});
        for (size_t i = 1; i < n; ++i) choices.push_back(reply.choices[i]->response(reasons[i], usages[i])["choices"][0]);
        body["choices"] = std::move(choices);
        body["usage"] = usage_json(total);
        body.erase("timings");  // llama-server's timings are one answer's
      }
      if (!write(dump(body))) return false;
    }
  }
  sink.done();
  return true;
}

}  // namespace

void respond(std::shared_ptr<const Reply> reply, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      reply->stream ? "text/event-stream" : "application/json",
      [reply](size_t, httplib::DataSink& sink) { return pump(*reply, sink); },
      [reply](bool) { reply->cancel(); });  // no-op once finished; frees the slots if the client left
}

void respond_events(std::shared_ptr<Job> job, RequestParams params, HttpServer::Api& api, httplib::Response& res) {
  job->req = submit(api, std::move(params));
  auto reply = std::make_shared<Reply>();
  reply->stream = job->stream;
  reply->event_lines = true;
  reply->choices.push_back(std::move(job));
  respond(std::move(reply), res);
}

std::shared_ptr<Request> submit(HttpServer::Api& api, RequestParams params) {
  try {
    return api.ctx.engine->submit(std::move(params));
  } catch (const QueueFull& e) {
    throw HttpError(503, std::string(e.what()) + "; retry later", {}, "queue_full", "server_error");
  }
}

}  // namespace qwen36::server
