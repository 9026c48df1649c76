// JsonSchema::compile: a schema (the supported subset, json_schema.h) into the tables JsonMatcher
// walks (json_matcher.cpp).
#include "text/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "text/number_range.h"

namespace qwen36::text {

using Json = nlohmann::ordered_json;
using namespace json_detail;

namespace {

constexpr std::string_view kKindNames[] = {"string", "number", "object", "array", "true", "false", "null"};
constexpr uint16_t kLiterals = 0;  // slice of "false", "null", "true"

// `type` names as bits.
enum TypeBits : unsigned {
  kTString = 1, kTNumber = 2, kTInteger = 4, kTBoolean = 8, kTNull = 16, kTObject = 32, kTArray = 64,
  kTAny = 127,
};

bool is_annotation(std::string_view k) {
  return k == "title" || k == "description" || k == "default" || k == "examples" || k == "$schema" ||
         k == "$id" || k == "$comment" || k == "strict" || k == "format";
}

bool is_keyword(std::string_view k) {
  return is_annotation(k) || k == "type" || k == "properties" || k == "required" ||
         k == "additionalProperties" || k == "items" || k == "minItems" || k == "maxItems" || k == "minLength" ||
         k == "maxLength" || k == "pattern" || k == "minimum" || k == "maximum" || k == "exclusiveMinimum" ||
         k == "exclusiveMaximum" || k == "enum" || k == "prefixItems" ||
         k == "const" || k == "anyOf" || k == "oneOf" || k == "allOf" || k == "$ref" || k == "$defs" ||
         k == "definitions";
}

const Json* find(const Json& s, const char* key) {
  auto it = s.find(key);
  return it == s.end() ? nullptr : &*it;
}



}  // namespace

// ---------------------------------------------------------------------------------------------
// Compilation

struct JsonSchema::Compiler {
  JsonSchema& out;
  const Json& root;
  // Compiling a schema yields its node's shape at once (what each value kind parses into, with
  // container specs reserved) and queues the container bodies. A $ref or anyOf alternative needs
  // its target's shape, so it finds the target unfinished only when the reference chain has
  // consumed no input: that is the one recursion that is an error.
  struct Body {
    bool object;  // else array
    uint16_t spec;
    const Json* schema;
    std::string path;
  };
  std::vector<Body> bodies;
  // $ref targets by JSON pointer. A container only needs the target's node index, handed out at
  // once; the shape is compiled when first needed, or at the end.
  struct Def {
    uint16_t node;
    enum State : uint8_t { kPending, kInProgress, kDone } state;
  };
  std::map<std::string, Def> defs;
  uint16_t any_node = kNone;
  std::map<std::string, uint16_t> patterns;  // automata by what they were built from: compiled once each
  std::deque<Json> all_of;  // allOf's merged schemas: queued bodies point into them, so they stay put

  uint16_t new_node() {
    QWEN36_CHECK(out.nodes_.size() < kNone, "schema: too large (more than {} sub-schemas)", kNone);
    out.nodes_.emplace_back();
    return uint16_t(out.nodes_.size() - 1);
  }

  // Appends a sorted, deduplicated slice of candidates; props[i] is texts[i]'s property index.
  uint16_t add_slice(std::vector<std::string> texts, std::vector<uint16_t> props, const std::string& path) {
    std::vector<size_t> order(texts.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return texts[a] < texts[b]; });
    order.erase(std::unique(order.begin(), order.end(), [&](size_t a, size_t b) { return texts[a] == texts[b]; }),
                order.end());
    QWEN36_CHECK(out.candidates_.size() + order.size() < kNone && out.slices_.size() < kNone,
                 "{}: schema too large (more than {} enum values and property names)", path, kNone);
    const auto begin = uint16_t(out.candidates_.size());
    for (size_t i : order) {
      QWEN36_CHECK(texts[i].size() < kNone, "{}: enum value or property name longer than {} bytes", path, kNone);
      out.candidates_.push_back(std::move(texts[i]));
      out.candidate_prop_.push_back(props.empty() ? 0 : props[i]);
    }
    out.slices_.push_back({begin, uint16_t(out.candidates_.size())});
    return uint16_t(out.slices_.size() - 1);
  }

  uint16_t add_object(ObjectSpec o) {
    QWEN36_CHECK(out.objects_.size() < kNone, "schema: too large (more than {} objects)", kNone);
    out.objects_.push_back(std::move(o));
    return uint16_t(out.objects_.size() - 1);
  }

  uint16_t add_array(const ArraySpec& a) {
    QWEN36_CHECK(out.arrays_.size() < kNone, "schema: too large (more than {} arrays)", kNone);
    out.arrays_.push_back(a);
    return uint16_t(out.arrays_.size() - 1);
  }

  // The node accepting any value (made on first use: it refers to itself).
  uint16_t any() {
    if (any_node != kNone) return any_node;
    any_node = new_node();
    Node n;
    n.by_kind[kString] = {Parse::String, 0};
    n.by_kind[kNumber] = {Parse::Number, 0};
    ObjectSpec o;  // no declared properties, any keys and values
    o.next_required = {0};
    o.additional = any_node;
    n.by_kind[kObject] = {Parse::Object, add_object(std::move(o))};
    n.by_kind[kArray] = {Parse::Array, add_array({any_node, 0, std::numeric_limits<uint32_t>::max(), {}})};
    n.by_kind[kTrue] = n.by_kind[kFalse] = n.by_kind[kNull] = {Parse::Enum, kLiterals};
    out.nodes_[any_node] = n;
    return any_node;
  }

  static std::string def_path(const std::string& pointer) {
    std::string p = "schema" + pointer;
    std::replace(p.begin(), p.end(), '/', '.');
    return p;
  }

  static std::string pointer_of(const Json& ref, const std::string& path) {
    QWEN36_CHECK(ref.is_string() && ref.get_ref<const std::string&>().starts_with("#"),
                 "{}: '$ref' must be a local reference starting with '#', got {}", path, ref.dump());
    return ref.get<std::string>().substr(1);
  }

  const Json& target(const std::string& pointer, const std::string& path) {
    try {
      Json::json_pointer p(pointer);
      if (root.contains(p)) return root.at(p);
    } catch (const Json::exception&) {
    }
    fail("{}: '$ref' target '#{}' does not exist", path, pointer);
  }

  uint16_t def_node(const std::string& pointer, const std::string& path) {
    if (auto it = defs.find(pointer); it != defs.end()) return it->second.node;
    target(pointer, path);  // report a dangling $ref where it is written
    const uint16_t node = new_node();
    defs.emplace(pointer, Def{node, Def::kPending});
    return node;
  }

  Node def_content(const std::string& pointer, const std::string& path) {
    const uint16_t node = def_node(pointer, path);
    Def& d = defs.at(pointer);  // std::map: stays valid while defs grows
    if (d.state == Def::kDone) return out.nodes_[node];
    QWEN36_CHECK(d.state == Def::kPending, "{}: '$ref' to '#{}' loops back to itself without consuming input",
                 path, pointer);
    d.state = Def::kInProgress;
    const Node n = content(target(pointer, path), def_path(pointer));
    d.state = Def::kDone;
    out.nodes_[node] = n;
    return n;
  }

  uint16_t compile_root() {
    const uint16_t r = def_node("", "schema");
    def_content("", "schema");
    // Queued container bodies, and $ref targets only named by containers so far.
    for (bool again = true; again;) {
      again = false;
      while (!bodies.empty()) {
        const Body b = std::move(bodies.back());
        bodies.pop_back();
        if (b.object) fill_object(b.spec, *b.schema, b.path);
        else fill_array(b.spec, *b.schema, b.path);
      }
      for (auto& [pointer, d] : defs) {
        if (d.state != Def::kPending) continue;
        def_content(pointer, def_path(pointer));
        again = true;
      }
    }
    return r;
  }

  static void check_keywords(const Json& s, const std::string& path) {
    for (const auto& [k, v] : s.items()) QWEN36_CHECK(is_keyword(k), "{}: keyword '{}' is not supported", path, k);
  }

  // $ref and anyOf take no constraining siblings (their combination is not supported).
  static void check_alone(const Json& s, const char* keyword, const std::string& path) {
    for (const auto& [k, v] : s.items())
      QWEN36_CHECK(k == keyword || is_annotation(k) || k == "$defs" || k == "definitions",
                   "{}: keyword '{}' next to '{}' is not supported", path, k, keyword);
  }

  // allOf: one schema holding every keyword of the parent and of each entry (a $ref entry, or a
  // $ref beside allOf, by its target's keywords; nested allOf merged too). Keywords that two of
  // them give must agree, except `properties` (united; a name given twice must be defined the
  // same) and `required` (united); the parent's annotations win. (Pydantic writes
  // {"allOf": [{"$ref": ...}], "description": ...} for a described model field.)
  const Json& merge_all_of(const Json& s, const std::string& path) {
    Json all = Json::object();
    std::function<void(const Json&, const std::string&, int)> add = [&](const Json& part, const std::string& where,
                                                                          int depth) {
      QWEN36_CHECK(depth <= 16, "{}: 'allOf' / '$ref' nest more than 16 deep", where);
      if (part.is_boolean()) {
        QWEN36_CHECK(part.get<bool>(), "{}: schema 'false' matches nothing", where);
        return;
      }
      QWEN36_CHECK(part.is_object(), "{}: a schema must be an object or a boolean, got {}", where, part.dump());
      check_keywords(part, where);
      for (const auto& [k, v] : part.items()) {
        if (k == "allOf") {
          QWEN36_CHECK(v.is_array() && !v.empty(), "{}: 'allOf' must be a non-empty array", where);
          for (size_t i = 0; i < v.size(); ++i) add(v[i], fmt::format("{}.allOf[{}]", where, i), depth + 1);
        } else if (k == "$ref") {
          const std::string pointer = pointer_of(v, where);
          add(target(pointer, where), def_path(pointer), depth + 1);
        } else if (k == "$defs" || k == "definitions") {
          continue;  // references resolve against the document's root
        } else if (k == "properties") {
          QWEN36_CHECK(v.is_object(), "{}: 'properties' must be an object", where);
          Json& props = all["properties"];
          if (props.is_null()) props = Json::object();
          for (const auto& [name, sub] : v.items()) {
            QWEN36_CHECK(!props.contains(name) || props[name] == sub,
                         "{}: 'allOf' defines property '{}' twice, differently (not supported)", where, name);
            props[name] = sub;
          }
        } else if (k == "required") {
          QWEN36_CHECK(v.is_array(), "{}: 'required' must be an array", where);
          Json& req = all["required"];
          if (req.is_null()) req = Json::array();
          for (const Json& name : v)
            if (std::find(req.begin(), req.end(), name) == req.end()) req.push_back(name);
        } else if (!all.contains(k)) {
          all[k] = v;
        } else {
          QWEN36_CHECK(is_annotation(k) || all[k] == v,
                       "{}: 'allOf' gives '{}' twice with different values (not supported)", where, k);
        }
      }
    };
    add(s, path, 0);
    all_of.push_back(std::move(all));
    return all_of.back();
  }

  // A sub-schema's node; a bare $ref yields its target's node without compiling it yet.
  uint16_t child(const Json& s, const std::string& path) {
    if (s.is_object() && s.contains("$ref") && !s.contains("allOf")) {
      check_keywords(s, path);
      check_alone(s, "$ref", path);
      return def_node(pointer_of(s["$ref"], path), path);
    }
    if (s.is_boolean() && s.get<bool>()) return any();
    const uint16_t node = new_node();
    const Node n = content(s, path);
    out.nodes_[node] = n;
    return node;
  }

  Node content(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      QWEN36_CHECK(s.get<bool>(), "{}: schema 'false' matches nothing", path);
      return out.nodes_[any()];
    }
    QWEN36_CHECK(s.is_object(), "{}: a schema must be an object or a boolean, got {}", path, s.dump());
    check_keywords(s, path);
    if (s.contains("allOf")) return content(merge_all_of(s, path), path);
    if (const Json* ref = find(s, "$ref")) {
      check_alone(s, "$ref", path);
      return def_content(pointer_of(*ref, path), path);
    }
    QWEN36_CHECK(!(s.contains("anyOf") && s.contains("oneOf")), "{}: 'anyOf' next to 'oneOf' is not supported",
                 path);
    for (const char* kw : {"anyOf", "oneOf"})
      if (const Json* alts = find(s, kw)) return alternatives(s, *alts, kw, path);

    const unsigned types = type_bits(s, path);
    if (s.contains("enum") || s.contains("const")) return enum_node(s, types, path);
    Node n;
    if (types & kTString) n.by_kind[kString] = {Parse::String, string_spec(s, path)};
    if (types & (kTNumber | kTInteger)) {
      const bool integer = !(types & kTNumber);
      const uint16_t range = number_bounds(s, integer, path);
      n.by_kind[kNumber] = range != kNone ? Target{Parse::Range, range}
                                          : Target{integer ? Parse::Integer : Parse::Number, 0};
    }
    if (types & kTBoolean) n.by_kind[kTrue] = n.by_kind[kFalse] = {Parse::Enum, kLiterals};
    if (types & kTNull) n.by_kind[kNull] = {Parse::Enum, kLiterals};
    if (types & kTObject) {
      n.by_kind[kObject] = {Parse::Object, add_object({})};
      bodies.push_back({true, n.by_kind[kObject].ref, &s, path});
    }
    if (types & kTArray) {
      n.by_kind[kArray] = {Parse::Array, add_array({})};
      bodies.push_back({false, n.by_kind[kArray].ref, &s, path});
    }
    return n;
  }

  static unsigned type_bits(const Json& s, const std::string& path) {
    const Json* type = find(s, "type");
    if (!type) {
      unsigned bits = 0;
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) bits |= kTObject;
      if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems"))
        bits |= kTArray;
      return bits ? bits : kTAny;
    }
    QWEN36_CHECK(!type->is_array() || !type->empty(), "{}: 'type' is an empty array", path);
    unsigned bits = 0;
    for (const Json& t : type->is_array() ? *type : Json::array({*type})) {
      static constexpr std::pair<std::string_view, unsigned> kNames[] = {
          {"string", kTString}, {"number", kTNumber}, {"integer", kTInteger}, {"boolean", kTBoolean},
          {"null", kTNull},     {"object", kTObject}, {"array", kTArray}};
      const auto* it = std::find_if(std::begin(kNames), std::end(kNames),
                                    [&](const auto& kv) { return t.is_string() && t.get<std::string>() == kv.first; });
      QWEN36_CHECK(it != std::end(kNames), "{}: unknown type {}", path, t.dump());
      bits |= it->second;
    }
    return bits;
  }

  static bool has_type(const Json& v, unsigned types) {
    if (v.is_string()) return types & kTString;
    if (v.is_boolean()) return types & kTBoolean;
    if (v.is_null()) return types & kTNull;
    if (v.is_object()) return types & kTObject;
    if (v.is_array()) return types & kTArray;
    const bool integral = v.is_number_integer() || std::trunc(v.get<double>()) == v.get<double>();
    return (types & kTNumber) || ((types & kTInteger) && integral);
  }

  // enum / const: the value's bytes must equal one serialised value (only `type` filters them).
  Node enum_node(const Json& s, unsigned types, const std::string& path) {
    std::vector<Json> values;
    if (const Json* e = find(s, "enum")) {
      QWEN36_CHECK(e->is_array() && !e->empty(), "{}: 'enum' must be a non-empty array", path);
      values.assign(e->begin(), e->end());
    }
    if (const Json* c = find(s, "const")) {
      if (values.empty() && !s.contains("enum")) values.push_back(*c);
      else std::erase_if(values, [&](const Json& v) { return v != *c; });
    }
    std::vector<std::string> texts;
    for (const Json& v : values)
      if (has_type(v, types)) texts.push_back(v.dump());
    QWEN36_CHECK(!texts.empty(), "{}: no 'enum'/'const' value matches 'type'", path);
    Node n;
    const uint16_t slice = add_slice(std::move(texts), {}, path);
    for (uint16_t i = out.slices_[slice].begin; i < out.slices_[slice].end; ++i)
      n.by_kind[kind_of(uint8_t(out.candidates_[i][0]))] = {Parse::Enum, slice};
    return n;
  }

  // anyOf / oneOf: merged into one node, which needs each kind claimed by one alternative.
  Node alternatives(const Json& s, const Json& alts, const char* keyword, const std::string& path) {
    check_alone(s, keyword, path);
    QWEN36_CHECK(alts.is_array() && !alts.empty(), "{}: '{}' must be a non-empty array", path, keyword);
    Node merged;
    std::array<size_t, kNumKinds> owner{};
    for (size_t i = 0; i < alts.size(); ++i) {
      const Node a = content(alts[i], fmt::format("{}.{}[{}]", path, keyword, i));
      for (int k = 0; k < kNumKinds; ++k) {
        Target& m = merged.by_kind[k];
        const Target& t = a.by_kind[k];
        if (t.parse == Parse::None || t == m) continue;
        if (m.parse == Parse::None) {
          m = t;
          owner[k] = i;
        } else if ((m.parse == Parse::Number || m.parse == Parse::Integer) &&
                   (t.parse == Parse::Number || t.parse == Parse::Integer)) {
          m.parse = Parse::Number;  // integer | number accepts any number
        } else {
          fail("{}: '{}' alternatives {} and {} both accept {} values (only alternatives told apart by the "
               "first byte are supported)",
               path, keyword, owner[k], i, kKindNames[k]);
        }
      }
    }
    return merged;
  }

  void fill_object(uint16_t spec, const Json& s, const std::string& path) {
    ObjectSpec o;
    std::vector<std::string> names, keys;
    if (const Json* props = find(s, "properties")) {
      QWEN36_CHECK(props->is_object(), "{}: 'properties' must be an object", path);
      QWEN36_CHECK(props->size() < kNone, "{}: too many properties", path);
      for (const auto& [name, sub] : props->items()) {
        names.push_back(name);
        keys.push_back(Json(name).dump());
        o.values.push_back(child(sub, path + ".properties." + name));
      }
    }
    o.n = uint16_t(names.size());
    std::vector<bool> required(o.n);
    if (const Json* req = find(s, "required")) {
      QWEN36_CHECK(req->is_array(), "{}: 'required' must be an array", path);
      for (const Json& r : *req) {
        QWEN36_CHECK(r.is_string(), "{}: 'required' holds {}, not a property name", path, r.dump());
        auto it = std::find(names.begin(), names.end(), r.get<std::string>());
        QWEN36_CHECK(it != names.end(), "{}: required property {} is not in 'properties'", path, r.dump());
        required[it - names.begin()] = true;
      }
    }
    o.next_required.assign(o.n + 1, o.n);
    for (int i = o.n - 1; i >= 0; --i) o.next_required[i] = required[i] ? uint16_t(i) : o.next_required[i + 1];
    // Without properties, any keys (like no schema); with them, only those (OpenAI strict mode).
    const Json* extra = find(s, "additionalProperties");
    if (!extra) o.additional = o.n == 0 ? any() : kNone;
    else if (extra->is_boolean()) o.additional = extra->get<bool>() ? any() : kNone;
    else o.additional = child(*extra, path + ".additionalProperties");
    std::vector<uint16_t> props(o.n);
    std::iota(props.begin(), props.end(), 0);
    o.keys = add_slice(std::move(keys), std::move(props), path);
    out.objects_[spec] = std::move(o);
  }

  uint16_t automaton(const std::string& key, const std::string& where, const std::function<ByteDfa()>& build) {
    if (auto it = patterns.find(key); it != patterns.end()) return it->second;
    QWEN36_CHECK(out.patterns_.size() < kNone, "schema: too large (more than {} patterns)", kNone);
    out.patterns_.push_back(with_context(where, build));
    return patterns[key] = uint16_t(out.patterns_.size() - 1);
  }
  uint16_t pattern(const std::string& regex, RegexMode mode, const std::string& where) {
    return automaton((mode == RegexMode::Full ? "full:" : "search:") + regex, where,
                     [&] { return ByteDfa::compile(regex, mode); });
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum: the bounded numbers' automaton, or
  // kNone without bounds. Draft 4's boolean exclusive* make minimum / maximum exclusive.
  uint16_t number_bounds(const Json& s, bool integer, const std::string& path) {
    auto number = [&](const char* keyword, bool exclusive) -> std::optional<NumberBound> {
      const Json* v = find(s, keyword);
      if (!v || v->is_boolean()) return std::nullopt;
      QWEN36_CHECK(v->is_number(), "{}: '{}' must be a number, got {}", path, keyword, v->dump());
      return NumberBound{v->dump(), exclusive};
    };
    auto flag = [&](const char* keyword) {
      const Json* v = find(s, keyword);
      return v && v->is_boolean() && v->get<bool>();
    };
    const auto lo = number("minimum", flag("exclusiveMinimum")), hi = number("maximum", flag("exclusiveMaximum"));
    const auto xlo = number("exclusiveMinimum", true), xhi = number("exclusiveMaximum", true);
    if (!lo && !hi && !xlo && !xhi) return kNone;
    std::string key = integer ? "integer" : "number";
    for (const auto& b : {lo, hi, xlo, xhi}) key += b ? "|" + b->value : "|-";
    return automaton(key, path, [&] {
      if (!lo && !hi) return number_range(xlo, xhi, integer);
      ByteDfa d = number_range(lo, hi, integer);
      if (xlo || xhi) d = ByteDfa::intersect(d, number_range(xlo, xhi, integer));
      QWEN36_CHECK(!d.empty(), "no {} lies within the bounds", integer ? "integer" : "number");
      return d;
    });
  }

  // minLength / maxLength (characters), pattern, an enforced format: a spec of the table, 0 (the
  // unbounded one) without them.
  uint16_t string_spec(const Json& s, const std::string& path) {
    uint16_t dfa = kNone;
    const Json* p = find(s, "pattern");
    QWEN36_CHECK(!p || p->is_string(), "{}: 'pattern' must be a string", path);
    const Json* f = find(s, "format");
    const char* format = f && f->is_string() ? format_pattern(f->get<std::string>()) : nullptr;
    if (p && format) {  // both: the strings they both match
      const std::string& regex = p->get_ref<const std::string&>();
      dfa = automaton("search:" + regex + "\nformat:" + format, path, [&] {
        ByteDfa both =
            ByteDfa::intersect(ByteDfa::compile(regex, RegexMode::Search), ByteDfa::compile(format, RegexMode::Full));
        QWEN36_CHECK(!both.empty(), "no string matches both 'pattern' and 'format'");
        return both;
      });
    } else if (p) {
      dfa = pattern(p->get<std::string>(), RegexMode::Search, path + ": 'pattern'");
    } else if (format) {
      dfa = pattern(format, RegexMode::Full, path + ": 'format'");
    }
    if (!s.contains("minLength") && !s.contains("maxLength") && dfa == kNone) return 0;
    const uint32_t lo = count(s, "minLength", 0, path), hi = count(s, "maxLength", kMaxStringLength, path);
    QWEN36_CHECK(lo <= hi, "{}: 'minLength' is above 'maxLength'", path);
    QWEN36_CHECK(lo <= kMaxStringLength, "{}: 'minLength' above {} is not supported", path, kMaxStringLength);
    QWEN36_CHECK(out.strings_.size() < kNone, "schema: too large (more than {} string limits)", kNone);
    out.strings_.push_back({uint16_t(lo), uint16_t(std::min<uint32_t>(hi, kMaxStringLength)), dfa});
    return uint16_t(out.strings_.size() - 1);
  }

  static uint32_t count(const Json& s, const char* keyword, uint32_t absent, const std::string& path) {
    const Json* v = find(s, keyword);
    if (!v) return absent;
    QWEN36_CHECK(v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0),
                 "{}: '{}' must be a non-negative integer, got {}", path, keyword, v->dump());
    return uint32_t(std::min<uint64_t>(v->get<uint64_t>(), std::numeric_limits<uint32_t>::max()));
  }

  void fill_array(uint16_t spec, const Json& s, const std::string& path) {
    ArraySpec a{any(), count(s, "minItems", 0, path), count(s, "maxItems", std::numeric_limits<uint32_t>::max(), path),
                {}};
    // A tuple: prefixItems (2020-12), or items as an array (draft 4-2019).
    const Json* items = find(s, "items");
    const bool old_tuple = items && items->is_array();
    if (const Json* prefix = old_tuple ? items : find(s, "prefixItems")) {
      const char* name = old_tuple ? "items" : "prefixItems";
      QWEN36_CHECK(prefix->is_array(), "{}: '{}' must be an array", path, name);
      for (size_t i = 0; i < prefix->size(); ++i)
        a.prefix.push_back(child((*prefix)[i], fmt::format("{}.{}[{}]", path, name, i)));
    }
    if (items && !old_tuple) {
      if (items->is_boolean() && !items->get<bool>())  // no items past the prefix
        a.max_items = std::min<uint32_t>(a.max_items, uint32_t(a.prefix.size()));
      else
        a.items = child(*items, path + ".items");
    }
    QWEN36_CHECK(a.min_items <= a.max_items, "{}: 'minItems' is above the items allowed", path);
    out.arrays_[spec] = std::move(a);
  }
};

namespace {

ByteDfa whitespace_automaton(std::string_view pattern) {
  ByteDfa dfa;
  try {
    dfa = ByteDfa::compile(pattern, RegexMode::Full);
  } catch (const Error& e) {
    fail("whitespace pattern '{}': {}", pattern, e.what());
  }
  QWEN36_CHECK(dfa.accepting(ByteDfa::start()), "whitespace pattern '{}' must match the empty text", pattern);
  for (size_t state = 0; state < dfa.states(); ++state)
    for (int c = 0; c < 256; ++c)
      QWEN36_CHECK(dfa.next(uint16_t(state), uint8_t(c)) == ByteDfa::kDead || c == ' ' || c == '\t' || c == '\n' ||
                       c == '\r',
                   "whitespace pattern '{}' matches byte 0x{:02x}, which is not JSON whitespace", pattern, c);
  return dfa;
}

}  // namespace

Whitespace whitespace_named(std::string_view text) {
  if (text == "limited") return Whitespace::Limited;
  if (text == "compact") return Whitespace::Compact;
  if (text == "any") return Whitespace::Any;
  return Whitespace{text};
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const Json& schema, Whitespace ws) {
  std::shared_ptr<JsonSchema> s(new JsonSchema());
  s->whitespace_ = whitespace_automaton(ws.pattern);
  s->candidates_ = {"false", "null", "true"};  // slice kLiterals
  s->candidate_prop_ = {0, 0, 0};
  s->strings_ = {{0, kMaxStringLength}};  // spec 0: any length, not counted
  s->slices_ = {{0, 3}};
  try {
    s->root_ = Compiler{*s, schema, {}, {}, kNone, {}, {}}.compile_root();
  } catch (const Json::exception& e) {  // e.g. a name that is not UTF-8 cannot be serialised
    fail("schema: {}", e.what());
  }
  return s;
}

const char* format_pattern(std::string_view format) {
  static constexpr const char* kDate = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
  // RFC 3339 full-time: the offset is required.
  static constexpr const char* kTime =
      "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
  static const std::string kDateTime = std::string(kDate) + "[Tt]" + kTime;
  static constexpr const char* kLabel = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
  static const std::string kHostname = std::string(kLabel) + "(\\." + kLabel + ")*";
  static const std::string kEmail = "[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@" + kHostname;
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return kDateTime.c_str();
  if (format == "uuid") return "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}";
  if (format == "ipv4") return "((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
  if (format == "email") return kEmail.c_str();
  if (format == "hostname") return kHostname.c_str();
  return nullptr;
}

std::shared_ptr<const JsonSchema> JsonSchema::text_matching(std::string_view regex) {
  std::shared_ptr<JsonSchema> s(new JsonSchema());
  s->patterns_.push_back(ByteDfa::compile(regex, RegexMode::Full));
  s->text_ = 0;
  return s;
}

namespace {

// The schema under each built-in Whitespace, compiled once; any other pattern each time.
std::shared_ptr<const JsonSchema> with_whitespace(const Json& schema, Whitespace ws,
                                                  const std::array<std::shared_ptr<const JsonSchema>, 3>& built_in) {
  const Whitespace kBuiltIn[] = {Whitespace::Limited, Whitespace::Compact, Whitespace::Any};
  for (size_t i = 0; i < built_in.size(); ++i)
    if (ws.pattern == kBuiltIn[i].pattern) return built_in[i];
  return JsonSchema::compile(schema, ws);
}

std::array<std::shared_ptr<const JsonSchema>, 3> built_in(const Json& schema) {
  return {JsonSchema::compile(schema, Whitespace::Limited), JsonSchema::compile(schema, Whitespace::Compact),
          JsonSchema::compile(schema, Whitespace::Any)};
}

}  // namespace

std::shared_ptr<const JsonSchema> JsonSchema::any_object(Whitespace ws) {
  static const Json kSchema = {{"type", "object"}};
  static const auto schemas = built_in(kSchema);
  return with_whitespace(kSchema, ws, schemas);
}

std::shared_ptr<const JsonSchema> JsonSchema::any_value(Whitespace ws) {
  static const Json kSchema = true;
  static const auto schemas = built_in(kSchema);
  return with_whitespace(kSchema, ws, schemas);
}

}  // namespace qwen36::text
