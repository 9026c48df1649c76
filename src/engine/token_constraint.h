#pragma once
// defines: TokenTrie (a vocabulary's token bytes as a trie, built once per tokenizer),
//          OutputConstraint (what a request asks its output to be), TokenConstraint (one
//          request's JSON-schema or grammar matcher turned into masks over the vocabulary)
//
// Structured output (`response_format` json_object / json_schema): before each draw the
// logits of every token whose bytes cannot continue the text towards a valid document are
// set to −inf, so sampling (any temperature, any filter) and speculative verification draw
// from the target's distribution restricted to what the schema admits.
//
// A mask is a walk of the token trie with the matcher: a subtree is skipped at the first
// byte the matcher refuses, so a state that admits few bytes (after `{`, inside a key) visits
// a few nodes. Inside a free string almost every token is admitted; those states take the
// tokens of plain string bytes from a precomputed set and walk only the tokens that hold a
// quote, a backslash or a control byte. Masks are cached by matcher state: the text inside
// one string value, or between two values at one depth, reuses the same mask.

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/output_matcher.h"
#include "text/grammar.h"
#include "text/json_schema.h"

namespace qwen36 {

class TokenTrie {
 public:
  // bytes[id]: token id's bytes; an empty entry (control and added tokens, ids past the
  // tokenizer's vocabulary) is never admitted by a constraint.
  explicit TokenTrie(std::vector<std::string> bytes);
  int32_t vocab() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }

  // Nodes in preorder: node n's subtree is [n, end), its byte is the last of its path. Node 0
  // is the root (the empty path).
  struct Node {
    uint32_t end = 0;
    uint32_t tokens = 0;  // first entry of its tokens in token_ids (count: next node's − this)
    uint16_t depth = 0;
    uint8_t byte = 0;
  };
  struct Trie {
    std::vector<Node> nodes;
    std::vector<int32_t> token_ids;  // tokens ending at each node, node by node
    uint32_t tokens_end(uint32_t n) const {
      return n + 1 < nodes.size() ? nodes[n + 1].tokens : uint32_t(token_ids.size());
    }
  };
  const Trie& all() const { return all_; }
  // The tokens whose every byte may stand inside a JSON string unescaped, as a bit set, and
  // the trie of the other non-empty tokens.
  const std::vector<uint64_t>& plain_string_tokens() const { return plain_; }
  const Trie& string_breakers() const { return breakers_; }
  size_t max_token_bytes() const { return max_len_; }

 private:
  static Trie build(std::span<const std::string> bytes, std::vector<int32_t> ids);
  std::vector<std::string> bytes_;
  Trie all_, breakers_;
  std::vector<uint64_t> plain_;
  size_t max_len_ = 0;
};

// A request's output constraint (RequestParams::constraint): a JSON document of `schema` (or the
// text of its regex), a sentence of `grammar`, or a beginning that is one of `forced` (token
// sequences; then the text is free: a tool call forced up to its function's name); at most one
// of them, none when all are empty.
struct OutputConstraint {
  std::shared_ptr<const text::JsonSchema> schema;
  std::shared_ptr<const text::Grammar> grammar;
  std::vector<std::vector<int32_t>> forced;
  // The constrained text starts after these tokens, seen in this order (a reasoning model's
  // `</think>`; a tool call's `<tool_call>` when the call is constrained only once it opens);
  // empty: at the first generated token.
  std::vector<int32_t> start_after;
  bool empty() const { return !schema && !grammar && forced.empty(); }
};

class TokenConstraint {
 public:
  // stop_ids: the request's end tokens, admitted once the document is whole. trie: may be null
  // for a forced beginning.
  TokenConstraint(std::shared_ptr<const TokenTrie> trie, const OutputConstraint& c, std::vector<int32_t> stop_ids);

  // Whether the constrained text has begun (start_after seen, or none).
  bool active() const { return active_; }
  // Whether the next draw is masked: the constrained text has begun and is not past its forced
  // beginning (after which it is free).
  bool masks() const { return active_ && (forced_.empty() || !forced_state_.done(forced_)); }
  // Sets the logits of the tokens that cannot come next to −inf (logits may be wider than the
  // trie's vocabulary: the extra ids are refused too). Returns how many tokens remain.
  int64_t apply(std::span<float> logits);
  // The same for the state after `path` (tokens not yet emitted: a speculative round's drafts
  // before this row); false (row untouched) when the path itself is refused.
  bool apply_after(std::span<const int32_t> path, std::span<float> logits);
  // Records an emitted token (a stop id, or any token before the constrained text, changes
  // nothing but the start). False when the token breaks the constraint (never for tokens
  // apply() left finite).
  bool accept(int32_t token);
  // The document is whole and no byte may follow: the request should end.
  bool finished() const { return active_ && forced_.empty() && matcher_.finished(); }

 private:
  using Mask = std::vector<uint64_t>;
  const Mask& mask_of(const OutputMatcher& m);
  // Sets the bits of the tokens in t's subtrees [first, last) (preorder nodes, siblings under one
  // parent) that `from` accepts.
  void walk(const TokenTrie::Trie& t, const OutputMatcher& from, Mask& mask, uint32_t first = 1,
            uint32_t last = UINT32_MAX);
  // The same where `from` only steps an automaton: its state per trie depth, no matcher copies.
  void walk_automaton(const TokenTrie::Trie& t, const OutputMatcher& from, const text::JsonMatcher::Automaton& a,
                      Mask& mask);
  int64_t apply_mask(const Mask& mask, std::span<float> logits) const;
  bool is_stop(int32_t token) const;
  bool feed(OutputMatcher& m, int32_t token) const;  // a token of no bytes is refused

  // A forced beginning: forced_[i] is still possible while alive[i]; pos of its tokens are out.
  struct Forced {
    size_t pos = 0;
    std::vector<bool> alive;
    bool done(const std::vector<std::vector<int32_t>>& alts) const;  // some alive alternative is whole
    bool take(const std::vector<std::vector<int32_t>>& alts, int32_t token);  // false: no alternative left
  };
  int64_t apply_forced(const Forced& f, std::span<float> logits) const;

  struct Hash {
    size_t operator()(const OutputMatcher& m) const { return m.hash(); }
  };
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> stops_;
  std::vector<int32_t> start_after_;
  size_t started_ = 0;  // start_after_ tokens seen so far
  bool active_;
  OutputMatcher matcher_;
  std::vector<std::vector<int32_t>> forced_;
  Forced forced_state_;
  std::vector<OutputMatcher> stack_;  // the walk's states by depth
  std::vector<uint16_t> dfa_stack_;       // walk_automaton's
  // Masks by matcher state, least recently used last; at most kCached of them.
  static constexpr size_t kCached = 64;
  std::list<std::pair<OutputMatcher, Mask>> lru_;
  std::unordered_map<OutputMatcher, std::list<std::pair<OutputMatcher, Mask>>::iterator, Hash> cache_;
};

}  // namespace qwen36
