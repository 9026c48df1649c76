#include "text/output_parser.h"

#include <algorithm>

#include "text/tool_call_parser.h"

namespace qwen36 {

bool prompt_opens_thinking(std::string_view prompt) {
  const size_t turn = prompt.rfind("<|im_start|>");
  const size_t from = turn == std::string_view::npos ? 0 : turn;
  const size_t open = prompt.rfind("<think>"), close = prompt.rfind("</think>");
  return open != std::string_view::npos && open >= from && (close == std::string_view::npos || close < open);
}

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>", kCallOpen = "<tool_call>",
                           kCallClose = "</tool_call>";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

OutputParser::OutputParser(OutputParserOptions options)
    : opt_(std::move(options)),
      state_(opt_.thinking_enabled && opt_.prompt_opened_thinking ? State::Reasoning : State::Content) {}

std::vector<std::string_view> OutputParser::tags() const {
  switch (state_) {
    case State::Content:
      if (opt_.thinking_enabled) return {kThinkOpen, kThinkClose, kCallOpen};
      return {kCallOpen};
    case State::Reasoning: return {kThinkClose, kCallOpen};
    case State::ToolCall: return {kCallClose, kCallOpen};
  }
  return {};
}

std::vector<OutputDelta> OutputParser::feed(std::string_view text) {
  pending_.append(text);
  process(false);
  return std::exchange(out_, {});
}

std::vector<OutputDelta> OutputParser::finish() {
  process(true);
  if (state_ == State::ToolCall) {
    close_tool_call(true);
  } else {
    on_text(pending_);
    pending_.clear();
  }
  end_segment();
  return std::exchange(out_, {});
}

void OutputParser::process(bool at_end) {
  while (!pending_.empty()) {
    // Earliest tag of the current state.
    size_t best = std::string::npos;
    std::string_view best_tag;
    for (std::string_view tag : tags()) {
      size_t p = pending_.find(tag);
      if (p < best) {
        best = p;
        best_tag = tag;
      }
    }
    if (state_ == State::ToolCall && runaway_tool_call(best, at_end)) continue;
    if (best != std::string::npos) {
      on_text(std::string_view(pending_).substr(0, best));
      std::string tag(best_tag);
      pending_.erase(0, best + tag.size());
      on_tag(tag);
      continue;
    }
    // No tag: keep back the longest tail that could still grow into one.
    size_t keep = 0;
    if (!at_end) {
      for (std::string_view tag : tags()) {
        for (size_t k = std::min(tag.size() - 1, pending_.size()); k > keep; --k) {
          if (pending_.compare(pending_.size() - k, k, tag.substr(0, k)) == 0) {
            keep = k;
            break;
          }
        }
      }
    }
    on_text(std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    break;
  }
}

// A tool call body longer than max_tool_call_bytes is given up at exactly that length (so
// the outcome does not depend on chunking) and shown as text; the rest is parsed as content.
bool OutputParser::runaway_tool_call(size_t tag_pos, bool at_end) {
  size_t room = opt_.max_tool_call_bytes - std::min(opt_.max_tool_call_bytes, tool_buf_.size());
  size_t text_len = tag_pos;
  if (tag_pos == std::string::npos) {
    text_len = pending_.size();
    if (!at_end) {
      // Bytes that may begin a tag are not counted yet.
      for (size_t k = std::min(kCallClose.size() - 1, pending_.size()); k > 0; --k) {
        if (pending_.compare(pending_.size() - k, k, kCallClose.substr(0, k)) == 0 ||
            (k < kCallOpen.size() && pending_.compare(pending_.size() - k, k, kCallOpen.substr(0, k)) == 0)) {
          text_len -= k;
          break;
        }
      }
    }
  }
  if (text_len <= room) return false;
  std::string raw = std::string(kCallOpen) + tool_buf_ + pending_.substr(0, room);
  tool_buf_.clear();
  pending_.erase(0, room);
  state_ = State::Content;
  emit_text_as_content(raw);
  return true;
}

void OutputParser::emit(OutputDelta::Kind kind, std::string text) {
  if (text.empty()) return;
  if (kind == OutputDelta::Kind::Content) result_.content += text;
  else result_.reasoning_content += text;
  // Merge with the previous delta of the same kind from this call: fewer, larger deltas.
  if (!out_.empty() && out_.back().kind == kind) {
    out_.back().text += text;
    return;
  }
  OutputDelta d{kind, std::move(text), {}, 0};
  out_.push_back(std::move(d));
}

void OutputParser::on_text(std::string_view text) {
  if (text.empty()) return;
  if (state_ == State::ToolCall) {
    tool_buf_.append(text);
    return;
  }
  auto kind = state_ == State::Content ? OutputDelta::Kind::Content : OutputDelta::Kind::Reasoning;
  if (!segment_started_) {
    size_t k = 0;
    while (k < text.size() && is_ws(text[k])) ++k;
    text.remove_prefix(k);
    if (text.empty()) return;
  }
  size_t body_end = text.size();
  while (body_end > 0 && is_ws(text[body_end - 1])) --body_end;
  if (body_end == 0) {
    ws_hold_.append(text);
    return;
  }
  std::string chunk = std::move(ws_hold_);
  chunk.append(text.substr(0, body_end));
  ws_hold_.assign(text.substr(body_end));
  segment_started_ = true;
  emit(kind, std::move(chunk));
}

void OutputParser::end_segment() {
  ws_hold_.clear();
  segment_started_ = false;
}

void OutputParser::emit_text_as_content(std::string_view text) {
  State saved = state_;
  state_ = State::Content;
  on_text(text);
  state_ = saved;
}

void OutputParser::on_tag(std::string_view tag) {
  switch (state_) {
    case State::Content:
      // A stray </think> in content is dropped (a control token, never prose); the text
      // around it stays one segment so no words get glued together.
      if (tag == kThinkClose) return;
      end_segment();
      state_ = tag == kThinkOpen ? State::Reasoning : State::ToolCall;
      return;
    case State::Reasoning:
      end_segment();
      // <tool_call> while reasoning: the model skipped </think>; the reasoning is over.
      state_ = tag == kCallOpen ? State::ToolCall : State::Content;
      return;
    case State::ToolCall:
      if (tag == kCallClose) {
        close_tool_call(false);
      } else {
        // A second <tool_call> before the first closed: the first one is text.
        std::string raw = std::string(kCallOpen) + tool_buf_;
        tool_buf_.clear();
        emit_text_as_content(raw);
        end_segment();
      }
      return;
  }
}

void OutputParser::close_tool_call(bool at_end) {
  std::string body = std::move(tool_buf_);
  tool_buf_.clear();
  if (at_end) {
    body += pending_;
    pending_.clear();
  }
  state_ = State::Content;
  // Without </tool_call> (the stream ended), accept only a call whose body is complete;
  // a truncated parameter value must not become a call.
  std::string_view trimmed = body;
  while (!trimmed.empty() && is_ws(trimmed.back())) trimmed.remove_suffix(1);
  bool complete = !at_end || trimmed.ends_with("</function>") || trimmed.ends_with("}");
  if (auto call = complete ? parse_tool_call(body, opt_.tools) : std::nullopt) {
    end_segment();
    size_t index = result_.tool_calls.size();
    jinja::JsonDumpOptions json_style;  // json.dumps defaults, as Python servers produce
    ToolCall tc{opt_.id_prefix + std::to_string(index), call->name,
                jinja::python_json_dumps(jinja::Value::from_json(call->arguments), json_style)};
    result_.tool_calls.push_back(tc);
    OutputDelta d{OutputDelta::Kind::ToolCall, {}, std::move(tc), index};
    out_.push_back(std::move(d));
    return;
  }
  std::string raw = std::string(kCallOpen) + body + (at_end ? "" : std::string(kCallClose));
  emit_text_as_content(raw);
  end_segment();
}

ParsedOutput parse_output(std::string_view text, const OutputParserOptions& options) {
  OutputParser p(options);
  p.feed(text);
  p.finish();
  return p.result();
}

jinja::Json to_openai_message(const ParsedOutput& parsed) {
  jinja::Json m = {{"role", "assistant"}};
  if (parsed.content.empty() && !parsed.tool_calls.empty()) m["content"] = nullptr;
  else m["content"] = parsed.content;
  if (!parsed.reasoning_content.empty()) m["reasoning_content"] = parsed.reasoning_content;
  if (!parsed.tool_calls.empty()) {
    jinja::Json calls = jinja::Json::array();
    for (const auto& c : parsed.tool_calls) {
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

}  // namespace qwen36
