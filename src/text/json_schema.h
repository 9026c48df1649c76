#pragma once
// defines: JsonSchema (a compiled subset of JSON Schema), JsonMatcher (byte-level incremental
// recogniser of ONE JSON value under a JsonSchema)
//
// Used for structured outputs (response_format): before sampling, the engine walks the
// vocabulary with copies of the matcher and masks the tokens whose bytes it refuses. That is
// ~1e6 copies per mask, so the matcher's state is a fixed-size stack of 8-byte frames (no heap),
// cheap to copy, hash and compare; all schema data lives in the shared, immutable JsonSchema.
//
// Supported keywords: type (a name or an array of names), properties, required,
// additionalProperties (bool or schema), items (a schema; false: none past a tuple's prefix; an
// array: draft 4's tuple), prefixItems (a tuple's first items, by position), minItems, maxItems, minLength,
// maxLength (characters: UTF-8 sequences, an escape counting one), pattern (regex.h: the
// ECMAScript / Python common subset, matched against the decoded characters), format (enforced
// for date, time, date-time, uuid, ipv4, email and hostname, next to a pattern too; other
// formats are annotations), minimum / maximum / exclusiveMinimum / exclusiveMaximum (number_range.h:
// exact decimal bounds; a bounded number is written without exponent), enum, const,
// anyOf / oneOf (only alternatives told apart by the value's first byte; integer and number are
// one kind, number wins), $ref (local JSON pointers: #/$defs/NAME, #/definitions/NAME, #, ...;
// recursion allowed), $defs / definitions, allOf (its entries' keywords merged into one schema:
// those two give must agree, but for properties and required, which are united). Annotations are
// ignored: title, description, default, examples, $schema, $id, $comment, strict. Any other
// keyword (multipleOf, uniqueItems, ...) is an Error naming it and its schema path.
//
// Deliberate choices (as OpenAI / llama.cpp / xgrammar structured outputs):
//  - An object with properties emits keys in the schema's property order: any subsequence that
//    holds every required property. additionalProperties defaults to false there (OpenAI strict
//    mode); when allowed, extra keys come after the declared ones, once no required property is
//    left, and are not checked against the declared names. Keys are matched on their JSON
//    serialisation (nlohmann dump), so a name must be escaped exactly that way.
//  - An object without properties takes any keys (duplicates are not checked); values follow
//    additionalProperties (default: any value).
//  - No `type`: object if properties/required/additionalProperties appear, array if
//    items/minItems/maxItems appear (both if both), else any value.
//  - enum / const: the value must be byte-identical to a value's compact serialisation
//    (e.g. 1.5, "red", {"a":1}); next to them only `type` applies (it filters the values).
//  - Whitespace between tokens follows a Whitespace pattern. Whitespace::Limited, the default:
//    one space, or a newline and up to 20 spaces / tabs — compact or pretty-printed JSON, as
//    llama.cpp's JSON grammar allows (a model under a mask would otherwise spend its tokens on
//    whitespace: the toy code model wrote 64 spaces before the first '{'). Whitespace::Compact:
//    at most one space (vLLM's disable_any_whitespace). Whitespace::Any: any JSON whitespace,
//    runs capped at 64 bytes. Or the caller's own regular expression (Outlines' / vLLM's
//    whitespace_pattern). None is accepted once the top-level value is complete. Numbers are
//    capped at kMaxNumber bytes, nesting at kMaxDepth frames.
//  - Strings: bytes >= 0x80 are accepted without UTF-8 validation; \uXXXX surrogates unchecked.
//    Under a pattern or format the characters go through the pattern's automaton (UTF-8
//    checked), and \u escapes are limited to \u00XX (every character can still be written:
//    raw, or as a short escape, or \u00XX for controls). minLength / maxLength next to a pattern
//    they contradict (pattern needs 5 characters, maxLength 3) can strand the string: not checked.
//
// JsonSchema::text_matching(regex) is the one non-JSON document: raw text the regex matches in
// full (vLLM's `regex` and `choice` outputs); the same matcher walks it.

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/regex.h"

namespace qwen36::text {

// Compiled schema tables (internal; shared by JsonSchema and JsonMatcher).
namespace json_detail {

constexpr uint16_t kNone = 0xFFFF;  // no node (e.g. additionalProperties false)
// Value kinds, told apart by the value's first byte.
enum Kind : uint8_t { kString, kNumber, kObject, kArray, kTrue, kFalse, kNull, kNumKinds };
// How a value of one kind is parsed.
enum class Parse : uint8_t { None, String, Number, Integer, Enum, Object, Array, Range };
struct Target {
  Parse parse = Parse::None;
  uint16_t ref = 0;  // Enum: slice, Object: object spec, Array: array spec, Range: pattern
  bool operator==(const Target&) const = default;
};
struct Node {  // a schema, as what it accepts for each kind
  std::array<Target, kNumKinds> by_kind{};
};
struct Slice {  // a range of candidates, sorted
  uint16_t begin, end;
};
struct ObjectSpec {
  uint16_t n = 0;                       // declared properties, in schema order
  uint16_t keys = 0;                    // slice of their serialised names (quotes included)
  std::vector<uint16_t> values;         // node of each property's value
  std::vector<uint16_t> next_required;  // [i]: first required property >= i, or n; size n + 1
  uint16_t additional = kNone;          // node of extra keys' values
};
struct ArraySpec {
  uint16_t items;  // the node of items past the prefix
  uint32_t min_items, max_items;
  std::vector<uint16_t> prefix;  // prefixItems: the nodes of the first items, by position
  uint16_t item(uint32_t index) const { return index < prefix.size() ? prefix[index] : items; }
};
struct StringSpec {  // minLength / maxLength, in characters (UTF-8 sequences; an escape is one)
  uint16_t min_length, max_length;
  uint16_t pattern = kNone;  // the automaton the characters must match, or none
  bool counted() const;      // a length limit applies
};
constexpr uint16_t kMaxStringLength = 0xFFFE;  // a longer maxLength counts as unbounded there
inline bool StringSpec::counted() const { return min_length > 0 || max_length < kMaxStringLength; }

// The kind of value a byte starts, or -1.
inline int kind_of(uint8_t c) {
  switch (c) {
    case '"': return kString;
    case '{': return kObject;
    case '[': return kArray;
    case 't': return kTrue;
    case 'f': return kFalse;
    case 'n': return kNull;
    default: return c == '-' || (c >= '0' && c <= '9') ? kNumber : -1;
  }
}

}  // namespace json_detail

// What may stand between two JSON tokens: a regular expression (regex.h) whose matches are made
// of ' ', '\t', '\n' and '\r' only and include the empty text (whitespace is never required).
// Compiling a schema checks both: an Error names the pattern.
struct Whitespace {
  std::string_view pattern;
  static const Whitespace Limited, Compact, Any;
};
inline constexpr Whitespace Whitespace::Limited{"(?: |\\n[ \\t]{0,20})?"};
inline constexpr Whitespace Whitespace::Compact{" ?"};
inline constexpr Whitespace Whitespace::Any{"[ \\t\\n\\r]{0,64}"};
// "limited", "compact" or "any": that built-in Whitespace; other text: a pattern (`text` must
// outlive the result). The command-line form of --json-whitespace.
Whitespace whitespace_named(std::string_view text);

// The regular expression (full match of a string's characters) of an enforced `format`: date,
// time, date-time, uuid, ipv4, email, hostname; null for the others (annotations).
const char* format_pattern(std::string_view format);

// A compiled schema: immutable, shared by many matchers.
class JsonSchema {
 public:
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema,
                                                   Whitespace ws = Whitespace::Limited);  // throws Error
  static std::shared_ptr<const JsonSchema> any_object(Whitespace ws = Whitespace::Limited);  // OpenAI json_object mode
  static std::shared_ptr<const JsonSchema> any_value(Whitespace ws = Whitespace::Limited);
  // Not JSON: raw text that `regex` matches in full (RegexMode::Full). Throws Error.
  static std::shared_ptr<const JsonSchema> text_matching(std::string_view regex);

 private:
  friend class JsonMatcher;
  struct Compiler;
  JsonSchema() = default;

  std::vector<json_detail::Node> nodes_;
  std::vector<std::string> candidates_;   // enum values and key names, serialised
  std::vector<uint16_t> candidate_prop_;  // for key names: the property index
  std::vector<json_detail::Slice> slices_;  // slice 0: the literals false, null, true
  std::vector<json_detail::ObjectSpec> objects_;
  std::vector<json_detail::ArraySpec> arrays_;
  std::vector<json_detail::StringSpec> strings_;  // [0]: unbounded
  std::vector<ByteDfa> patterns_;
  uint16_t root_ = 0;
  uint16_t text_ = json_detail::kNone;  // text_matching: the pattern of the whole document
  ByteDfa whitespace_;  // the Whitespace pattern
};

// Recognises the prefixes of one JSON value valid under a schema, one byte at a time.
class JsonMatcher {
 public:
  static constexpr int kMaxDepth = 32;       // frames: the top level, containers, keys, scalars
  static constexpr int kMaxWhitespace = 64;  // Whitespace::Any's run of whitespace bytes between tokens
  static constexpr int kMaxIndent = 20;      // Whitespace::Limited's spaces / tabs after a newline
  static constexpr int kMaxNumber = 32;      // bytes of one number

  explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);
  // Copies only the live frames; assigning between matchers of one schema touches no refcount.
  JsonMatcher(const JsonMatcher& other);
  JsonMatcher& operator=(const JsonMatcher& other);

  // Consumes the byte if it can continue a valid document; false (and the state unchanged)
  // otherwise.
  bool feed(uint8_t byte);
  // All or nothing: false leaves the state unchanged.
  bool feed(std::string_view bytes);
  // The bytes so far are a whole valid value (the document may end here).
  bool complete() const;
  // complete() and no further byte can be accepted.
  bool finished() const;
  // Inside a string with unconstrained content, not after a backslash: any byte but '"', '\\'
  // and controls < 0x20 is accepted there and leaves an equal state.
  bool in_free_string() const;
  // Where the next bytes only step an automaton — inside a string under a pattern (outside an
  // escape, no length counted) or in text_matching's text — that automaton and its state, so a
  // vocabulary walk can step it directly; null otherwise. In a JSON string ('json_string') the
  // bytes '"', '\\' and controls below 0x20 must still go through feed().
  struct Automaton {
    const ByteDfa* dfa = nullptr;
    uint16_t state = 0;
    bool json_string = false;
  };
  Automaton automaton() const;
  // After bytes that only stepped the automaton (none of the json_string exceptions): its state.
  void set_automaton_state(uint16_t state) { frames_[depth_ - 1].y = state; }
  size_t hash() const;                              // of the live state
  bool operator==(const JsonMatcher& other) const;  // same live state and schema object

 private:
  struct Frame {  // exactly 8 bytes, every byte defined, so frames compare and hash as words
    uint8_t kind, state;
    uint16_t x, y, z;  // meaning depends on kind, see json_schema.cpp
  };
  static_assert(sizeof(Frame) == 8);

  bool step(uint8_t c, uint16_t ws_run);
  bool container_byte(Frame& f, uint8_t c, uint16_t ws_run);
  bool string_byte(Frame& f, uint8_t c);
  bool pattern_byte(Frame& f, uint8_t c);
  bool key_byte(Frame& f, uint8_t c);
  bool start_value(uint16_t node, uint8_t c);
  bool push(const Frame& f);
  void close_key(uint16_t next, uint16_t value_node);

  std::shared_ptr<const JsonSchema> schema_;
  uint8_t depth_ = 1;  // live frames; frames_[0] is the top level
  uint16_t ws_ = 0;    // the whitespace automaton's state in the current run between tokens
  std::array<Frame, kMaxDepth> frames_;
};

}  // namespace qwen36::text
