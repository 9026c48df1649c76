#include "engine/token_constraint.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string_view>

#include "core/error.h"

namespace qwen36 {

namespace {

// Bytes that end, escape or break a JSON string: a token holding one of them leaves a free
// string's state or is refused there.
bool breaks_string(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return c == '"' || c == '\\' || uint8_t(c) < 0x20; });
}

void set_bit(std::vector<uint64_t>& mask, int32_t id) { mask[size_t(id) >> 6] |= uint64_t(1) << (id & 63); }
bool bit(const std::vector<uint64_t>& mask, int64_t id) { return (mask[size_t(id) >> 6] >> (id & 63)) & 1; }

}  // namespace

TokenTrie::TokenTrie(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  plain_.assign((bytes_.size() + 63) / 64, 0);
  std::vector<int32_t> all, breakers;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& s = bytes_[id];
    if (s.empty()) continue;
    QWEN36_CHECK(s.size() < std::numeric_limits<uint16_t>::max(), "token {} has {} bytes", id, s.size());
    max_len_ = std::max(max_len_, s.size());
    all.push_back(int32_t(id));
    if (breaks_string(s))
      breakers.push_back(int32_t(id));
    else
      set_bit(plain_, int32_t(id));
  }
  all_ = build(bytes_, std::move(all));
  breakers_ = build(bytes_, std::move(breakers));
}

// Sorted by bytes, the tokens' paths come in preorder: each token adds the nodes past its
// common prefix with the one before, and closes (sets `end` of) the nodes deeper than that.
TokenTrie::Trie TokenTrie::build(std::span<const std::string> bytes, std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return bytes[size_t(a)] != bytes[size_t(b)] ? bytes[size_t(a)] < bytes[size_t(b)] : a < b;
  });
  Trie t;
  t.nodes.push_back({});
  std::vector<uint32_t> open = {0};  // the current path's nodes by depth
  std::string_view prev;
  for (int32_t id : ids) {
    const std::string_view s = bytes[size_t(id)];
    if (s != prev) {  // equal bytes (duplicate entries) share the last node
      const size_t lcp = size_t(std::mismatch(s.begin(), s.end(), prev.begin(), prev.end()).first - s.begin());
      while (open.size() > lcp + 1) {
        t.nodes[open.back()].end = uint32_t(t.nodes.size());
        open.pop_back();
      }
      for (size_t d = lcp; d < s.size(); ++d) {
        open.push_back(uint32_t(t.nodes.size()));
        t.nodes.push_back({0, uint32_t(t.token_ids.size()), uint16_t(d + 1), uint8_t(s[d])});
      }
      prev = s;
    }
    t.token_ids.push_back(id);
  }
  for (; !open.empty(); open.pop_back()) t.nodes[open.back()].end = uint32_t(t.nodes.size());
  return t;
}

TokenConstraint::TokenConstraint(std::shared_ptr<const TokenTrie> trie, const OutputConstraint& c,
                                 std::vector<int32_t> stop_ids)
    : trie_(std::move(trie)),
      stops_(std::move(stop_ids)),
      start_after_(c.start_after),
      active_(c.start_after.empty()),
      matcher_(c.grammar ? OutputMatcher(text::GrammarMatcher(c.grammar))
                         : OutputMatcher(text::JsonMatcher(c.schema ? c.schema : text::JsonSchema::any_value()))),
      forced_(c.forced) {
  QWEN36_CHECK(int(c.schema != nullptr) + int(c.grammar != nullptr) + int(!forced_.empty()) == 1,
               "an output constraint is a schema, a grammar or a forced beginning");
  // A forced beginning alone leaves matcher_ on any_value, never fed.
  forced_state_.alive.assign(forced_.size(), true);
  if (!forced_.empty()) return;
  QWEN36_CHECK(trie_ != nullptr, "structured output needs the tokenizer's vocabulary");
  stack_.assign(trie_->max_token_bytes() + 1, matcher_);
}

bool TokenConstraint::Forced::done(const std::vector<std::vector<int32_t>>& alts) const {
  for (size_t i = 0; i < alts.size(); ++i)
    if (alive[i] && alts[i].size() <= pos) return true;
  return false;
}

bool TokenConstraint::Forced::take(const std::vector<std::vector<int32_t>>& alts, int32_t token) {
  if (done(alts)) return true;
  bool any = false;
  for (size_t i = 0; i < alts.size(); ++i) any |= (alive[i] = alive[i] && alts[i][pos] == token);
  ++pos;
  return any;
}

int64_t TokenConstraint::apply_forced(const Forced& f, std::span<float> logits) const {
  if (f.done(forced_)) return int64_t(logits.size());
  std::vector<std::pair<int32_t, float>> next;  // each alive alternative's next token, with its logit
  for (size_t i = 0; i < forced_.size(); ++i) {
    const int32_t t = f.alive[i] ? forced_[i][f.pos] : -1;
    const bool seen = std::any_of(next.begin(), next.end(), [&](const auto& e) { return e.first == t; });
    if (t >= 0 && size_t(t) < logits.size() && !seen) next.emplace_back(t, logits[size_t(t)]);
  }
  std::fill(logits.begin(), logits.end(), -std::numeric_limits<float>::infinity());
  for (const auto& [t, v] : next) logits[size_t(t)] = v;
  return int64_t(next.size());
}

bool TokenConstraint::feed(OutputMatcher& m, int32_t token) const {
  return token >= 0 && token < trie_->vocab() && !trie_->bytes(token).empty() && m.feed(trie_->bytes(token));
}

bool TokenConstraint::is_stop(int32_t token) const {
  return std::find(stops_.begin(), stops_.end(), token) != stops_.end();
}

void TokenConstraint::walk(const TokenTrie::Trie& t, const OutputMatcher& from, Mask& mask, uint32_t first,
                           uint32_t last) {
  const std::vector<TokenTrie::Node>& nodes = t.nodes;
  last = std::min<uint32_t>(last, uint32_t(nodes.size()));
  if (first >= last) return;
  stack_[nodes[first].depth - 1u] = from;
  for (uint32_t n = first; n < last;) {
    const TokenTrie::Node& node = nodes[n];
    OutputMatcher& m = stack_[node.depth];
    m = stack_[node.depth - 1];
    if (!m.feed(node.byte)) {  // no token below this path can come next
      n = node.end;
      continue;
    }
    for (uint32_t i = node.tokens, e = t.tokens_end(n); i < e; ++i) set_bit(mask, t.token_ids[i]);
    ++n;
  }
}

void TokenConstraint::walk_automaton(const TokenTrie::Trie& t, const OutputMatcher& from,
                                     const text::JsonMatcher::Automaton& a, Mask& mask) {
  const std::vector<TokenTrie::Node>& nodes = t.nodes;
  dfa_stack_.resize(stack_.size());
  dfa_stack_[0] = a.state;
  for (uint32_t n = 1; n < nodes.size();) {
    const TokenTrie::Node& node = nodes[n];
    const uint16_t parent = dfa_stack_[node.depth - 1];
    if (a.json_string && (node.byte == '"' || node.byte == '\\' || node.byte < 0x20)) {
      // The byte ends the string or starts an escape: the matcher walks this subtree.
      OutputMatcher m = from;
      m.set_automaton_state(parent);
      walk(t, m, mask, n, node.end);
      n = node.end;
      continue;
    }
    const uint16_t s = a.dfa->next(parent, node.byte);
    if (s == text::ByteDfa::kDead) {
      n = node.end;
      continue;
    }
    dfa_stack_[node.depth] = s;
    for (uint32_t i = node.tokens, e = t.tokens_end(n); i < e; ++i) set_bit(mask, t.token_ids[i]);
    ++n;
  }
}

const TokenConstraint::Mask& TokenConstraint::mask_of(const OutputMatcher& m) {
  if (auto it = cache_.find(m); it != cache_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  Mask mask;
  if (m.in_free_string()) {  // plain string bytes keep the state: those tokens all stay
    mask = trie_->plain_string_tokens();
    walk(trie_->string_breakers(), m, mask);
  } else {
    mask.assign((size_t(trie_->vocab()) + 63) / 64, 0);
    if (const text::JsonMatcher::Automaton a = m.automaton(); a.dfa) walk_automaton(trie_->all(), m, a, mask);
    else walk(trie_->all(), m, mask);
  }
  if (m.complete())
    for (int32_t s : stops_)
      if (s >= 0 && s < trie_->vocab()) set_bit(mask, s);
  lru_.emplace_front(m, std::move(mask));
  cache_.emplace(m, lru_.begin());
  if (lru_.size() > kCached) {
    cache_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return lru_.front().second;
}

int64_t TokenConstraint::apply_mask(const Mask& mask, std::span<float> logits) const {
  const int64_t vocab = trie_->vocab();
  int64_t kept = 0;
  for (int64_t i = 0; i < int64_t(logits.size()); ++i) {
    if (i < vocab && bit(mask, i))
      ++kept;
    else
      logits[size_t(i)] = -std::numeric_limits<float>::infinity();
  }
  return kept;
}

int64_t TokenConstraint::apply(std::span<float> logits) {
  if (!active_) return int64_t(logits.size());
  if (!forced_.empty()) return apply_forced(forced_state_, logits);
  return apply_mask(mask_of(matcher_), logits);
}

bool TokenConstraint::apply_after(std::span<const int32_t> path, std::span<float> logits) {
  bool active = active_;
  size_t started = started_;
  OutputMatcher m = matcher_;
  Forced f = forced_state_;
  for (int32_t token : path) {
    if (!active) {
      started += token == start_after_[started];
      active = started == start_after_.size();
      continue;
    }
    if (!forced_.empty() ? !f.take(forced_, token) : is_stop(token) || !feed(m, token)) return false;
  }
  if (!active) return true;
  if (forced_.empty())
    apply_mask(mask_of(m), logits);
  else
    apply_forced(f, logits);
  return true;
}

bool TokenConstraint::accept(int32_t token) {
  if (!active_) {
    started_ += token == start_after_[started_];
    active_ = started_ == start_after_.size();
    return true;
  }
  if (!forced_.empty()) return forced_state_.take(forced_, token);
  if (is_stop(token)) return matcher_.complete();
  return feed(matcher_, token);
}

}  // namespace qwen36
