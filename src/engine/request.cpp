#include "engine/request.h"

#include <algorithm>

namespace qwen36 {

void cap_reasoning(RequestParams& p, int64_t budget, bool prompt_opened, int32_t think, int32_t end_think) {
  if (budget < 0 || end_think < 0 || (!prompt_opened && think < 0)) return;
  p.reasoning_budget = int32_t(budget);
  p.reasoning_start = prompt_opened ? -1 : think;
  p.reasoning_end = end_think;
}

bool Request::next(RequestEvent& ev, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
  ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool Request::finished() const {
  std::lock_guard lock(mu_);
  return finished_;
}

RequestUsage Request::usage() const {
  std::lock_guard lock(mu_);
  return usage_;
}

void Request::push(RequestEvent ev, const RequestUsage* usage) {
  {
    std::lock_guard lock(mu_);
    if (finished_) return;  // nothing follows the Finished event
    if (usage) usage_ = *usage;
    if (ev.kind == RequestEvent::Kind::Finished) finished_ = true;
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

RequestResult wait_for_result(Request& r, std::chrono::milliseconds deadline) {
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + deadline;
  RequestResult res;
  RequestEvent ev;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now());
    if (left.count() <= 0 || !r.next(ev, left)) {
      res.finish_reason = "timeout";
      break;
    }
    res.text += ev.text;
    if (ev.kind == RequestEvent::Kind::Finished) {
      res.finish_reason = ev.finish_reason;
      res.error = ev.error;
      break;
    }
    if (ev.kind == RequestEvent::Kind::Prompt) {
      res.prompt_logprobs.push_back(*ev.logprob);
      continue;
    }
    res.tokens.push_back(ev.token);
    if (ev.logprob) res.logprobs.push_back(*ev.logprob);
  }
  res.usage = r.usage();
  return res;
}

namespace {

// Bytes at the end of s that start a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? back : 0;
  }
  return 0;
}

}  // namespace

std::string StopTextFilter::push(std::string_view bytes) {
  if (matched_) return {};
  held_.append(bytes);
  if (!armed_) {  // only a character cut at the end waits
    const size_t keep = incomplete_utf8_tail(held_);
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }
  // A stop string anywhere in the held text ends the output there. Held text never contains
  // emitted text, and everything that might start a stop string is held, so no match is missed.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (const size_t at = s.empty() ? std::string::npos : held_.find(s); at < first) {
      first = at;
      stop_ = s;
    }
  }
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, include_ ? first + stop_.size() : first);
    held_.clear();
    return out;
  }
  size_t keep = incomplete_utf8_tail(held_);
  for (const std::string& s : stops_) {  // longest tail that is a proper prefix of a stop string
    if (s.empty()) continue;
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopTextFilter::flush() {
  std::string out;
  if (!matched_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace qwen36
