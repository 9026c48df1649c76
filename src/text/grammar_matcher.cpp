// GrammarMatcher: every parse of the text so far as a stack of grammar positions (grammar.h).
//
// A stack node is (pos, parent, sub): pos is the element to match next in some alternative, parent
// the node to go on with when that alternative ends (kNil: the sentence ends), sub the state of a
// character class's automaton part way through a character. Nodes are interned, so
// stacks share their tails and a stack is one id. The matcher keeps the stacks whose next element
// is a byte range ("heads"); a byte advances each head past its range and expands what follows
// (entering rules, leaving finished alternatives) down to the next byte ranges — or to the end of
// the sentence. That expansion depends only on the head and the byte, so it is cached.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "text/grammar.h"

namespace qwen36::text {

namespace {
constexpr uint32_t kNil = 0xFFFFFFFF;
}

struct GrammarMatcher::Arena {
  struct Node {
    uint32_t pos, parent;
    uint32_t sub;  // a class's automaton state, or an embedded JSON value's state (json_states)
    bool operator==(const Node&) const = default;
  };
  struct NodeHash {
    size_t operator()(const Node& n) const {
      return size_t((uint64_t(n.pos) << 32 | n.parent) * 0x9E3779B97F4A7C15ull ^ n.sub);
    }
  };
  const Grammar& g;
  std::vector<Node> nodes;
  std::unordered_map<Node, uint32_t, NodeHash> ids;
  struct Step {
    std::vector<uint32_t> heads;  // sorted
    bool accept = false;
  };
  std::vector<Step> steps;
  std::unordered_map<uint64_t, uint32_t> step_of;  // head << 8 | byte -> steps index
  struct JsonHash {
    size_t operator()(const JsonMatcher& m) const { return m.hash(); }
  };
  std::vector<JsonMatcher> json_states;
  std::unordered_map<JsonMatcher, uint32_t, JsonHash> json_ids;

  uint32_t json_state(const JsonMatcher& m) {
    auto [it, fresh] = json_ids.emplace(m, uint32_t(json_states.size()));
    if (fresh) json_states.push_back(m);
    return it->second;
  }

  explicit Arena(const Grammar& grammar) : g(grammar) {}

  uint32_t intern(uint32_t pos, uint32_t parent, uint32_t sub = 0) {
    const Node key{pos, parent, sub};
    auto [it, fresh] = ids.emplace(key, uint32_t(nodes.size()));
    if (fresh) nodes.push_back(key);
    return it->second;
  }

  // The heads reached from position pos with continuation parent, and whether the sentence can
  // end there. Tail references reuse the parent, so right recursion does not grow the stack.
  void expand(uint32_t pos, uint32_t parent, Step& out, std::unordered_set<uint64_t>& seen) {
    if (!seen.insert(uint64_t(pos) << 32 | parent).second) return;
    const Grammar::Elem& e = g.elems()[pos];
    switch (e.kind) {
      case Grammar::Elem::kBytes: out.heads.push_back(intern(pos, parent)); return;
      case Grammar::Elem::kClass: out.heads.push_back(intern(pos, parent, ByteDfa::start())); return;
      case Grammar::Elem::kJson: out.heads.push_back(intern(pos, parent, json_state(JsonMatcher(g.json(e.ref))))); return;
      case Grammar::Elem::kText: {  // raw text the automaton matches: it may be empty, or go on
        const ByteDfa& dfa = g.text(e.ref);
        if (dfa.extendable(ByteDfa::start())) out.heads.push_back(intern(pos, parent, ByteDfa::start()));
        if (dfa.accepting(ByteDfa::start())) expand(pos + 1, parent, out, seen);
        return;
      }
      case Grammar::Elem::kEnd:
        if (parent == kNil) {
          out.accept = true;
        } else {
          const Node p = nodes[parent];
          expand(p.pos, p.parent, out, seen);
        }
        return;
      case Grammar::Elem::kRule: {
        const uint32_t next = g.elems()[pos + 1].kind == Grammar::Elem::kEnd ? parent : intern(pos + 1, parent);
        for (uint32_t alt : g.alternatives(e.ref)) expand(alt, next, out, seen);
        return;
      }
    }
  }

  static void finish(Step& s) {
    std::sort(s.heads.begin(), s.heads.end());
    s.heads.erase(std::unique(s.heads.begin(), s.heads.end()), s.heads.end());
  }

  Step start() {
    Step s;
    std::unordered_set<uint64_t> seen;
    for (uint32_t alt : g.alternatives(g.root())) expand(alt, kNil, s, seen);
    finish(s);
    return s;
  }

  const Step& step(uint32_t head, uint8_t byte) {
    const uint64_t key = uint64_t(head) << 8 | byte;
    if (auto it = step_of.find(key); it != step_of.end()) return steps[it->second];
    Step s;
    const Node n = nodes[head];
    const Grammar::Elem& e = g.elems()[n.pos];
    bool past = false;  // the byte completes the element
    if (e.kind == Grammar::Elem::kBytes) {
      past = byte >= e.lo && byte <= e.hi;
    } else if (e.kind == Grammar::Elem::kClass) {  // UTF-8 is prefix-free: an accepting state ends the character
      const ByteDfa& dfa = g.character_class(e.ref);
      const uint16_t sub = dfa.next(uint16_t(n.sub), byte);
      if (sub != ByteDfa::kDead && dfa.accepting(sub)) past = true;
      else if (sub != ByteDfa::kDead) s.heads.push_back(intern(n.pos, n.parent, sub));
    } else if (e.kind == Grammar::Elem::kText) {  // the text may end here, or go on
      const ByteDfa& dfa = g.text(e.ref);
      const uint16_t sub = dfa.next(uint16_t(n.sub), byte);
      if (sub != ByteDfa::kDead) {
        if (dfa.extendable(sub)) s.heads.push_back(intern(n.pos, n.parent, sub));
        past = dfa.accepting(sub);
      }
    } else {  // kJson: a whole value may end here (and a number, say, may also go on)
      JsonMatcher m = json_states[n.sub];
      if (m.feed(byte)) {
        if (!m.finished()) s.heads.push_back(intern(n.pos, n.parent, json_state(m)));
        past = m.complete();
      }
    }
    if (past) {
      std::unordered_set<uint64_t> seen;
      expand(n.pos + 1, n.parent, s, seen);
    }
    finish(s);
    step_of.emplace(key, uint32_t(steps.size()));
    steps.push_back(std::move(s));
    return steps.back();
  }
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), arena_(std::make_shared<Arena>(*grammar_)) {
  const Arena::Step s = arena_->start();
  QWEN36_CHECK(s.heads.size() <= size_t(kMaxParses), "grammar: more than {} parses of the empty text", kMaxParses);
  std::copy(s.heads.begin(), s.heads.end(), heads_.begin());
  count_ = uint8_t(s.heads.size());
  accept_ = s.accept;
}

GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher& other) {
  if (arena_ != other.arena_) {  // copies of one matcher share it: no refcount traffic in the walk
    grammar_ = other.grammar_;
    arena_ = other.arena_;
  }
  count_ = other.count_;
  accept_ = other.accept_;
  std::memcpy(heads_.data(), other.heads_.data(), count_ * sizeof(uint32_t));
  return *this;
}

bool GrammarMatcher::feed(uint8_t byte) {
  std::array<uint32_t, kMaxParses> next;
  int n = 0;
  bool accept = false;
  for (int k = 0; k < count_; ++k) {
    const Arena::Step& s = arena_->step(heads_[size_t(k)], byte);
    accept |= s.accept;
    for (uint32_t h : s.heads) {
      // Merge into the sorted set.
      const auto end = next.begin() + n;
      const auto at = std::lower_bound(next.begin(), end, h);
      if (at != end && *at == h) continue;
      QWEN36_CHECK(n < kMaxParses, "grammar: more than {} parses alive at once (the grammar is too ambiguous)",
                   kMaxParses);
      std::copy_backward(at, end, end + 1);
      *at = h;
      ++n;
    }
  }
  if (n == 0 && !accept) return false;
  std::memcpy(heads_.data(), next.data(), size_t(n) * sizeof(uint32_t));
  count_ = uint8_t(n);
  accept_ = accept;
  return true;
}

bool GrammarMatcher::feed(std::string_view bytes) {
  const GrammarMatcher saved = *this;
  for (char c : bytes) {
    if (feed(uint8_t(c))) continue;
    *this = saved;
    return false;
  }
  return true;
}

size_t GrammarMatcher::hash() const {
  uint64_t h = uint64_t(reinterpret_cast<uintptr_t>(arena_.get())) ^ (uint64_t(count_) << 1 | accept_);
  for (int k = 0; k < count_; ++k) {
    h = (h ^ heads_[size_t(k)]) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return size_t(h);
}

bool GrammarMatcher::operator==(const GrammarMatcher& other) const {
  return arena_ == other.arena_ && count_ == other.count_ && accept_ == other.accept_ &&
         std::memcmp(heads_.data(), other.heads_.data(), count_ * sizeof(uint32_t)) == 0;
}

}  // namespace qwen36::text
