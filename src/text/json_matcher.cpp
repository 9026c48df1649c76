// JsonMatcher: the byte-level recogniser of a compiled JsonSchema (json_schema.cpp compiles it).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "text/code_points.h"
#include "text/json_schema.h"

namespace qwen36::text {

using namespace json_detail;

namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return hex_digit(c) >= 0; }
uint32_t hex_value(uint8_t c) { return uint32_t(hex_digit(c)); }

}  // namespace

// The state is a stack of frames. What a frame's fields hold, by kind:
//   kRoot    state: kBeforeValue / kAfterValue (then nothing more is accepted)
//   kObject  state: object state; x: object spec; y: next declared property that may appear
//            (n after an extra key); z: node of the value after the current key
//   kArray   state: array state; x: array spec; y | z << 16: items so far
//   kString  state: escape state; x: kValueString or kExtraKey (then closing it ends a key);
//            y: the value's StringSpec (0: any length), z: characters so far (counted under a spec)
//   kPattern a string under a pattern: state: PatternEscape; x: its StringSpec; y: automaton state;
//            z: characters so far (counted when the spec limits the length)
//   kText    the whole document of JsonSchema::text_matching, frame 1: x: pattern; y: automaton state
//   kRange   a bounded number: x: pattern; y: automaton state
//   kKey     key matched against declared names: state: escape state (tracked only while the
//            key may also be an extra key); x: bytes matched; [y, z): candidates still alive
//   kNumber  state: number state; x: bytes so far; y: 1 if integer
//   kEnum    enum value or literal: x: bytes matched; [y, z): candidates still alive
// A parent is set to "after the value" when it pushes the child, so ending a child is just a pop.
// Every failing path returns before writing, so feed() undoes a refused byte by restoring depth_
// and ws_ alone (a number or enum value may have popped before its parent refused the byte).

namespace {

enum FrameKind : uint8_t {
  kRoot, kObjectFrame, kArrayFrame, kStringFrame, kKeyFrame, kNumberFrame, kEnumFrame, kPatternFrame, kTextFrame,
  kRangeFrame
};
enum ContainerState : uint8_t { kOpen, kBeforeKey, kAfterKey, kBeforeValue, kAfterValue };
enum StringRole : uint16_t { kValueString, kExtraKey };
enum Escape : int { kReject = -1, kClose = -2, kPlain = 0, kBackslash, kHex1, kHex2, kHex3, kHex4 };
// Inside a pattern string: after a backslash, after \u, \u0, \u00, and after \u00 plus a hex digit
// (kPatHex | the digit).
enum PatternEscape : uint8_t { kPatPlain, kPatBackslash, kPatU, kPatU0, kPatU00, kPatHex = 0x10 };
enum NumberState : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigit };

// The escape state after byte c inside a string, kClose at its closing quote, or kReject.
int string_next(int esc, uint8_t c) {
  switch (esc) {
    case kPlain:
      if (c == '"') return kClose;
      if (c == '\\') return kBackslash;
      return c < 0x20 ? kReject : kPlain;
    case kBackslash:
      if (c == 'u') return kHex1;
      return c != 0 && std::string_view("\"\\/bfnrt").find(char(c)) != std::string_view::npos ? kPlain : kReject;
    default: return !is_hex(c) ? kReject : esc == kHex4 ? kPlain : esc + 1;
  }
}

bool number_accepting(uint8_t state) {
  return state == kZero || state == kInt || state == kFrac || state == kExpDigit;
}

// The number state after byte c, or -1 if c cannot continue the number.
int number_next(uint8_t state, bool integer, uint8_t c) {
  if (is_digit(c)) {
    switch (state) {
      case kMinus: return c == '0' ? kZero : kInt;
      case kZero: return -1;  // no leading zeros
      case kInt: return kInt;
      case kDot:
      case kFrac: return kFrac;
      default: return kExpDigit;
    }
  }
  if (integer) return -1;
  if (c == '.') return state == kZero || state == kInt ? kDot : -1;
  if (c == 'e' || c == 'E') return state == kZero || state == kInt || state == kFrac ? kExp : -1;
  if (c == '+' || c == '-') return state == kExp ? kExpSign : -1;
  return -1;
}

// Candidates [lo, hi) are sorted and share their first `pos` bytes, so those whose next byte is
// c form one sub-range (a candidate that ends at pos sorts first).
std::pair<uint16_t, uint16_t> narrow(const std::vector<std::string>& cands, uint16_t lo, uint16_t hi, size_t pos,
                                     uint8_t c) {
  auto at = [&](uint16_t i) { return pos < cands[i].size() ? int(uint8_t(cands[i][pos])) : -1; };
  auto first = [&](uint16_t a, uint16_t b, auto below) {  // first index in [a, b) not below
    while (a < b) {
      const uint16_t mid = uint16_t((a + b) / 2);
      if (below(at(mid))) a = uint16_t(mid + 1);
      else b = mid;
    }
    return a;
  };
  const uint16_t l = first(lo, hi, [&](int b) { return b < c; });
  return {l, first(l, hi, [&](int b) { return b <= c; })};
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  QWEN36_CHECK(schema_ != nullptr, "JsonMatcher: no schema");
  frames_.fill(Frame{});
  frames_[0] = {kRoot, kBeforeValue, 0, 0, 0};
  if (schema_->text_ != kNone) {  // not JSON: the text is the value
    frames_[0].state = kAfterValue;
    frames_[1] = {kTextFrame, 0, schema_->text_, ByteDfa::start(), 0};
    depth_ = 2;
  }
}

JsonMatcher::JsonMatcher(const JsonMatcher& other)
    : schema_(other.schema_), depth_(other.depth_), ws_(other.ws_) {
  std::memcpy(frames_.data(), other.frames_.data(), depth_ * sizeof(Frame));
}

JsonMatcher& JsonMatcher::operator=(const JsonMatcher& other) {
  if (schema_ != other.schema_) schema_ = other.schema_;  // the refcount is shared between threads
  depth_ = other.depth_;
  ws_ = other.ws_;
  std::memcpy(frames_.data(), other.frames_.data(), depth_ * sizeof(Frame));
  return *this;
}

bool JsonMatcher::feed(uint8_t byte) {
  const uint8_t depth = depth_;
  const uint16_t ws = ws_;
  // A token may follow whitespace only where the pattern could end (Whitespace patterns match
  // the empty text, so ws_ 0 always can). Whitespace that continues the run goes on below.
  if (ws != ByteDfa::start() && !is_ws(byte) && !schema_->whitespace_.accepting(ws)) return false;
  ws_ = ByteDfa::start();  // any byte but whitespace between tokens ends the run
  if (step(byte, ws)) return true;
  depth_ = depth;
  ws_ = ws;
  return false;
}

bool JsonMatcher::feed(std::string_view bytes) {
  const uint8_t depth = depth_;
  const uint16_t ws = ws_;
  std::array<Frame, kMaxDepth> saved;
  std::memcpy(saved.data(), frames_.data(), depth * sizeof(Frame));
  for (char c : bytes) {
    if (feed(uint8_t(c))) continue;
    depth_ = depth;
    ws_ = ws;
    std::memcpy(frames_.data(), saved.data(), depth * sizeof(Frame));
    return false;
  }
  return true;
}

bool JsonMatcher::complete() const {
  if (frames_[0].state != kAfterValue || depth_ > 2) return false;
  if (depth_ == 1) return true;
  const Frame& f = frames_[1];  // a top-level scalar that may end here
  if (f.kind == kNumberFrame) return number_accepting(f.state);
  if (f.kind == kTextFrame || f.kind == kRangeFrame) return schema_->patterns_[f.x].accepting(f.y);
  return f.kind == kEnumFrame && schema_->candidates_[f.y].size() == f.x;
}

bool JsonMatcher::finished() const {
  if (depth_ == 1) return frames_[0].state == kAfterValue;
  // A complete enum value with no longer candidate has already been popped; a full-length number
  // takes no more bytes.
  const Frame& f = frames_[1];
  if (depth_ == 2 && (f.kind == kTextFrame || f.kind == kRangeFrame))
    return schema_->patterns_[f.x].accepting(f.y) && !schema_->patterns_[f.x].extendable(f.y);
  return depth_ == 2 && f.kind == kNumberFrame && number_accepting(f.state) && f.x >= kMaxNumber;
}

bool JsonMatcher::in_free_string() const {
  const Frame& f = frames_[depth_ - 1];
  return f.kind == kStringFrame && f.state == kPlain && (f.x != kValueString || f.y == 0);  // counted: not free
}

JsonMatcher::Automaton JsonMatcher::automaton() const {
  const Frame& f = frames_[depth_ - 1];
  if (f.kind == kTextFrame) return {&schema_->patterns_[f.x], f.y, false};
  if (f.kind != kPatternFrame || f.state != kPatPlain) return {};
  const StringSpec& spec = schema_->strings_[f.x];
  if (spec.counted()) return {};
  return {&schema_->patterns_[spec.pattern], f.y, true};
}

size_t JsonMatcher::hash() const {
  uint64_t h = uint64_t(reinterpret_cast<uintptr_t>(schema_.get())) ^ (uint64_t(depth_) << 16 | ws_);
  for (int i = 0; i < depth_; ++i) {
    uint64_t w;
    std::memcpy(&w, &frames_[i], sizeof(w));
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return size_t(h);
}

bool JsonMatcher::operator==(const JsonMatcher& other) const {
  return schema_ == other.schema_ && depth_ == other.depth_ && ws_ == other.ws_ &&
         std::memcmp(frames_.data(), other.frames_.data(), depth_ * sizeof(Frame)) == 0;
}

bool JsonMatcher::push(const Frame& f) {
  if (depth_ >= kMaxDepth) return false;
  frames_[depth_++] = f;
  return true;
}

bool JsonMatcher::step(uint8_t c, uint16_t ws_run) {
  for (;;) {
    Frame& f = frames_[depth_ - 1];
    switch (f.kind) {
      case kNumberFrame: {
        const int next = f.x < kMaxNumber ? number_next(f.state, f.y, c) : -1;
        // Past an unfinished state ("1.", "1e+") one more byte must fit under the cap, else it is a dead end.
        if (next >= 0 && (number_accepting(uint8_t(next)) || f.x + 1 < kMaxNumber)) {
          f.state = uint8_t(next);
          ++f.x;
          return true;
        }
        if (!number_accepting(f.state)) return false;
        --depth_;  // the number ended before c: its container takes c
        continue;
      }
      case kEnumFrame: {
        const auto& cands = schema_->candidates_;
        const auto [lo, hi] = narrow(cands, f.y, f.z, f.x, c);
        if (lo < hi) {
          // The only candidate left is matched in full: the value is complete.
          if (hi - lo == 1 && cands[lo].size() == f.x + 1u) --depth_;
          else f = {kEnumFrame, 0, uint16_t(f.x + 1), lo, hi};
          return true;
        }
        if (cands[f.y].size() != f.x) return false;
        --depth_;  // a shorter candidate (1 of 1, 10) ended before c
        continue;
      }
      case kStringFrame: return string_byte(f, c);
      case kPatternFrame: return pattern_byte(f, c);
      case kTextFrame:
      case kRangeFrame: {
        const ByteDfa& dfa = schema_->patterns_[f.x];
        const uint16_t next = dfa.next(f.y, c);
        if (next != ByteDfa::kDead) {
          f.y = next;
          return true;
        }
        if (f.kind == kTextFrame || !dfa.accepting(f.y)) return false;
        --depth_;  // the number ended before c: its container takes c
        continue;
      }
      case kKeyFrame: return key_byte(f, c);
      default: return container_byte(f, c, ws_run);
    }
  }
}

bool JsonMatcher::container_byte(Frame& f, uint8_t c, uint16_t ws_run) {
  if (is_ws(c)) {
    if (f.kind == kRoot && f.state == kAfterValue) return false;
    const uint16_t next = schema_->whitespace_.next(ws_run, c);
    if (next == ByteDfa::kDead) return false;
    ws_ = next;
    return true;
  }
  const JsonSchema& s = *schema_;
  if (f.kind == kRoot) {
    if (f.state != kBeforeValue || !start_value(s.root_, c)) return false;
    f.state = kAfterValue;
    return true;
  }
  if (f.kind == kArrayFrame) {
    const ArraySpec& a = s.arrays_[f.x];
    uint32_t count = f.y | uint32_t(f.z) << 16;
    if ((c == ']' && f.state != kBeforeValue) || (c == ',' && f.state == kAfterValue)) {
      if (c == ',' ? count >= a.max_items : count < a.min_items) return false;
      if (c == ',') f.state = kBeforeValue;
      else --depth_;
      return true;
    }
    if (f.state == kAfterValue || count >= a.max_items || !start_value(a.item(count), c)) return false;
    count += count < std::numeric_limits<uint32_t>::max();
    f = {kArrayFrame, kAfterValue, f.x, uint16_t(count), uint16_t(count >> 16)};
    return true;
  }
  const ObjectSpec& o = s.objects_[f.x];
  const bool can_close = o.next_required[f.y] == o.n;
  switch (f.state) {
    case kOpen:
    case kBeforeKey:
      if (c == '}' && f.state == kOpen && can_close) {
        --depth_;
        return true;
      }
      if (c != '"') return false;
      if (f.y < o.n) return push({kKeyFrame, kPlain, 1, s.slices_[o.keys].begin, s.slices_[o.keys].end});
      return can_close && o.additional != kNone && push({kStringFrame, kPlain, kExtraKey, 0, 0});
    case kAfterKey:
      if (c != ':') return false;
      f.state = kBeforeValue;
      return true;
    case kBeforeValue:
      if (!start_value(f.z, c)) return false;
      f.state = kAfterValue;
      return true;
    default:  // kAfterValue
      if (c == '}' && can_close) {
        --depth_;
        return true;
      }
      // Refuse a comma that no key could follow: a mask must not lead into a dead end.
      if (c != ',' || (f.y >= o.n && o.additional == kNone)) return false;
      f.state = kBeforeKey;
      return true;
  }
}

bool JsonMatcher::string_byte(Frame& f, uint8_t c) {
  const int esc = string_next(f.state, c);
  if (esc == kReject) return false;
  const StringSpec& limit = schema_->strings_[f.x == kValueString ? f.y : 0];
  if (esc == kClose && f.z < limit.min_length) return false;
  if (esc != kClose) {
    // A character starts at a byte outside an escape that is no UTF-8 continuation byte.
    const bool starts = f.y != 0 && f.x == kValueString && f.state == kPlain && (c & 0xC0) != 0x80;
    if (starts && f.z >= limit.max_length) return false;
    f.state = uint8_t(esc);
    f.z = uint16_t(f.z + starts);
    return true;
  }
  --depth_;
  if (f.x == kExtraKey) {
    const ObjectSpec& o = schema_->objects_[frames_[depth_ - 1].x];
    close_key(o.n, o.additional);  // no declared property may follow an extra one
  }
  return true;
}

// The characters a pattern string's bytes stand for go through its automaton: raw bytes as they
// are, an escape as the character it decodes to once it is whole.
bool JsonMatcher::pattern_byte(Frame& f, uint8_t c) {
  const StringSpec& spec = schema_->strings_[f.x];
  const ByteDfa& dfa = schema_->patterns_[spec.pattern];
  uint8_t chars[2];  // the decoded character's UTF-8 bytes
  int n = 0;
  uint8_t next = kPatPlain;
  switch (f.state) {
    case kPatPlain:
      if (c == '"') {
        if (!dfa.accepting(f.y) || f.z < spec.min_length) return false;
        --depth_;
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') {
        chars[n++] = c;
      } else {
        // An escape writes a character up to U+00FF: refuse it where none of those continues.
        if (!dfa.continues_with(f.y, 0, 0xFF)) return false;
        next = kPatBackslash;
      }
      break;
    case kPatBackslash: {
      constexpr std::string_view kLetters = "\"\\/bfnrt", kChars = "\"\\/\b\f\n\r\t";
      const size_t k = kLetters.find(char(c));
      if (c == 'u') next = kPatU;
      else if (c != 0 && k != std::string_view::npos) chars[n++] = uint8_t(kChars[k]);
      else return false;
      break;
    }
    case kPatU:
    case kPatU0:
      if (c != '0') return false;  // \u00XX only
      next = uint8_t(f.state + 1);
      break;
    case kPatU00:
      if (!is_hex(c) || !dfa.continues_with(f.y, hex_value(c) << 4, hex_value(c) << 4 | 15)) return false;
      next = uint8_t(kPatHex | hex_value(c));
      break;
    default: {
      if (!is_hex(c)) return false;
      const uint32_t cp = uint32_t(f.state & 0xF) << 4 | hex_value(c);
      if (cp < 0x80) {
        chars[n++] = uint8_t(cp);
      } else {
        chars[n++] = uint8_t(0xC0 | cp >> 6);
        chars[n++] = uint8_t(0x80 | (cp & 0x3F));
      }
    }
  }
  uint16_t state = f.y;
  for (int k = 0; k < n; ++k)
    if ((state = dfa.next(state, chars[k])) == ByteDfa::kDead) return false;
  // As in string_byte: a character starts at a raw byte that is no continuation, or a backslash.
  const bool starts = spec.counted() && f.state == kPatPlain && (c & 0xC0) != 0x80;
  if (starts && f.z >= spec.max_length) return false;
  f.state = next;
  f.y = state;
  f.z = uint16_t(f.z + starts);
  return true;
}

void JsonMatcher::close_key(uint16_t next, uint16_t value_node) {
  Frame& parent = frames_[depth_ - 1];
  parent.state = kAfterKey;
  parent.y = next;
  parent.z = value_node;
}

bool JsonMatcher::key_byte(Frame& f, uint8_t c) {
  const JsonSchema& s = *schema_;
  const Frame& parent = frames_[depth_ - 2];
  const ObjectSpec& o = s.objects_[parent.x];
  // Declared keys may skip optional properties up to the next required one.
  const uint16_t next = parent.y, last = std::min<uint16_t>(o.next_required[next], uint16_t(o.n - 1));
  const bool may_be_extra = o.additional != kNone && o.next_required[next] == o.n;
  const auto [lo, hi] = narrow(s.candidates_, f.y, f.z, f.x, c);
  // The range is sorted by name, not by property order: look for a candidate in the window.
  for (uint16_t i = lo; i < hi; ++i) {
    const uint16_t prop = s.candidate_prop_[i];
    if (prop < next || prop > last) continue;
    if (s.candidates_[i].size() == f.x + 1u) {  // its closing quote: no other candidate is alive
      --depth_;
      close_key(uint16_t(prop + 1), o.values[prop]);
      return true;
    }
    f = {kKeyFrame, uint8_t(may_be_extra ? string_next(f.state, c) : kPlain), uint16_t(f.x + 1), lo, hi};
    return true;
  }
  if (!may_be_extra) return false;
  const int esc = string_next(f.state, c);
  if (esc == kReject) return false;
  if (esc == kClose) {
    --depth_;
    close_key(o.n, o.additional);
    return true;
  }
  f = {kStringFrame, uint8_t(esc), kExtraKey, 0, 0};  // no declared name fits: a free extra key
  return true;
}

bool JsonMatcher::start_value(uint16_t node, uint8_t c) {
  const int kind = kind_of(c);
  if (kind < 0) return false;
  const Target t = schema_->nodes_[node].by_kind[kind];
  switch (t.parse) {
    case Parse::None: return false;
    case Parse::String:
      if (schema_->strings_[t.ref].pattern != kNone)
        return push({kPatternFrame, kPatPlain, t.ref, ByteDfa::start(), 0});
      return push({kStringFrame, kPlain, kValueString, t.ref, 0});
    case Parse::Number:
    case Parse::Integer: {
      const uint8_t state = c == '-' ? kMinus : c == '0' ? kZero : kInt;
      return push({kNumberFrame, state, 1, t.parse == Parse::Integer, 0});
    }
    case Parse::Enum: {
      const Slice slice = schema_->slices_[t.ref];
      const auto [lo, hi] = narrow(schema_->candidates_, slice.begin, slice.end, 0, c);
      if (lo == hi) return false;
      if (hi - lo == 1 && schema_->candidates_[lo].size() == 1) return true;  // a one-byte value: done
      return push({kEnumFrame, 0, 1, lo, hi});
    }
    case Parse::Range: {
      const uint16_t next = schema_->patterns_[t.ref].next(ByteDfa::start(), c);
      return next != ByteDfa::kDead && push({kRangeFrame, 0, t.ref, next, 0});
    }
    case Parse::Object: return push({kObjectFrame, kOpen, t.ref, 0, 0});
    case Parse::Array: return push({kArrayFrame, kOpen, t.ref, 0, 0});
  }
  return false;
}

}  // namespace qwen36::text
