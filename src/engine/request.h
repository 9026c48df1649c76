#pragma once
// defines: RequestParams (what a client asks the engine for), RequestEvent, RequestUsage,
//          Request (the handle shared by the submitting thread and the engine thread),
//          StopTextFilter (holds back text that could still become a stop string)
//
// The engine thread pushes events into a Request; the submitter (an HTTP handler, a test)
// pulls them with a timeout, so no caller ever blocks forever on the engine.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_constraint.h"

namespace qwen36 {

struct RequestParams {
  std::vector<int32_t> prompt;
  SamplingParams sampling = SamplingParams::greedy();
  int32_t max_tokens = 256;
  std::vector<int32_t> stop_ids;          // end generation; the stop token is not emitted
  std::vector<std::string> stop_strings;  // end generation; the text from the match on is dropped
  bool include_stop_string = false;       // ... or kept up to the match's end (vLLM's include_stop_str_in_output)
  int32_t min_tokens = 0;  // until this many tokens are out, stop ids are masked and stop strings not looked for
  int32_t top_logprobs = -1;              // -1: no logprobs; 0..20: the sampled token's + that many alternatives
  // -1: none; 0..20: every prompt token's logprob after the first (Prompt events, before the first
  // token) with that many alternatives. The prompt is then read afresh (no prefix reuse), in chunks
  // of at most Scheduler::kPromptLogprobRows; max_tokens 0 reads it and generates nothing.
  int32_t prompt_logprobs = -1;
  // Admission order: a waiting request with a lower value is admitted first, equal ones first
  // come first (vLLM's priority scheduling; a running request is not preempted).
  int32_t priority = 0;
  // The reasoning's length cap (vLLM's thinking_token_budget, Anthropic's budget_tokens): the
  // reasoning opens with the prompt (reasoning_start -1) or at the model's `reasoning_start`
  // token (<think>), and once `reasoning_budget` tokens were drawn in it, `reasoning_end`
  // (</think>) is the next one. -1: no cap.
  int32_t reasoning_budget = -1;
  int32_t reasoning_start = -1, reasoning_end = -1;
  OutputConstraint constraint;            // structured output (a JSON schema), or none
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to those tokens' logits before each draw
};

// Caps p's reasoning at `budget` tokens (< 0: no cap). It is open from the prompt on when
// `prompt_opened`, else from the model's `think` token; `end_think` closes it. Without the tokens
// that needs (an id < 0) nothing is capped.
void cap_reasoning(RequestParams& p, int64_t budget, bool prompt_opened, int32_t think, int32_t end_think);

// Log-probabilities from the model's raw distribution (before sampling filters), like vLLM.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  int32_t rank = 0;  // 1: the most likely token (ties share the better rank)
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct RequestEvent {
  // Prompt: a prompt token (from the second on) with its logprob (RequestParams::prompt_logprobs).
  enum class Kind { Token, Prompt, Finished };
  Kind kind = Kind::Token;
  int32_t token = -1;
  std::string text;  // newly safe text (whole UTF-8 characters, not part of a possible stop string)
  std::optional<TokenLogprob> logprob;
  std::string finish_reason;  // Finished: "stop", "length", "cancelled" or "error"
  std::string error;          // Finished with "error"
  std::string stop_string;    // Finished with "stop" by a stop string: that string
};

struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens whose state came from the prefix cache
  int32_t completion_tokens = 0;
  double ttft_seconds = 0;    // submit → first token
  double total_seconds = 0;   // submit → finish
};

class Request {
 public:
  explicit Request(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Asks the engine to stop this request; it finishes with "cancelled" within one step and
  // its state slot becomes free.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Waits up to `timeout` for the next event; false when none came.
  bool next(RequestEvent& ev, std::chrono::milliseconds timeout);
  bool finished() const;
  RequestUsage usage() const;  // final after the Finished event

  // Engine side.
  void push(RequestEvent ev, const RequestUsage* usage = nullptr);

 private:
  const uint64_t id_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  RequestUsage usage_;
  bool finished_ = false;
};

// Everything a request produced, gathered by wait_for_result (tests, non-streaming callers).
struct RequestResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // RequestParams::prompt_logprobs
  std::string finish_reason;  // "timeout" when the deadline passed first
  std::string error;
  RequestUsage usage;
};
RequestResult wait_for_result(Request& r, std::chrono::milliseconds deadline);

// Token bytes in, displayable text out. Holds back an unfinished UTF-8 character and any
// tail that is the start of a stop string; once a stop string appears, returns the text
// before it and reports matched() (and which: stop()).
class StopTextFilter {
 public:
  // include: a match's text is emitted, up to the stop string's end. armed false: no stop string
  // is looked for until arm() (min_tokens), so the text passes through.
  explicit StopTextFilter(std::vector<std::string> stops = {}, bool include = false, bool armed = true)
      : stops_(std::move(stops)), include_(include), armed_(armed) {}
  void arm() { armed_ = true; }
  std::string push(std::string_view bytes);
  std::string flush();  // end of output: whatever is held (unless a stop string matched)
  bool matched() const { return matched_; }
  const std::string& stop() const { return stop_; }  // the stop string that matched (the earliest)

 private:
  std::vector<std::string> stops_;
  std::string held_, stop_;
  bool include_ = false, armed_ = true;
  bool matched_ = false;
};

}  // namespace qwen36
