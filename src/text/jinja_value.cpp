// Value semantics copy Python's, because chat templates are tested against jinja2.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace qwen36::jinja {

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : named) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.v_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::tuple(Array items) {
  Value v(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::from_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return Value(None{});
    case Json::value_t::boolean: return Value(j.get<bool>());
    case Json::value_t::number_integer: return Value(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case Json::value_t::number_float: return Value(j.get<double>());
    case Json::value_t::string: return Value(j.get<std::string>());
    case Json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case Json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.items.emplace_back(it.key(), from_json(it.value()));
      return Value(std::move(o));
    }
    default: fail("unsupported JSON value in template input");
  }
}

Json Value::to_json() const {
  if (is_none()) return nullptr;
  if (is_bool()) return as_bool();
  if (is_int()) return as_int();
  if (is_float()) return as_double();
  if (is_string()) return as_string();
  if (is_array()) {
    Json j = Json::array();
    for (const auto& e : array()) j.push_back(e.to_json());
    return j;
  }
  if (is_object()) {
    Json j = Json::object();
    for (const auto& [k, v] : object().items) j[k] = v.to_json();
    return j;
  }
  fail("cannot convert {} to JSON", type_name());
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v_);
  if (is_int()) return static_cast<double>(as_int());
  if (is_bool()) return as_bool() ? 1.0 : 0.0;
  fail("expected a number, got {}", type_name());
}

bool Value::truthy() const {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, std::string>) return !x.empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Array>>) return !x->empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Object>>) return !x->items.empty();
        else return true;
      },
      v_);
}

std::string Value::type_name() const {
  if (is_undefined()) return "undefined";
  if (is_none()) return "NoneType";
  if (is_bool()) return "bool";
  if (is_int()) return "int";
  if (is_float()) return "float";
  if (is_string()) return "str";
  if (is_array()) return "list";
  if (is_object()) return object().is_namespace ? "Namespace" : "dict";
  return "function";
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out the way Python's repr does:
  // positional for exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, res.ptr);
  bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  size_t e = s.find('e');
  int exp = std::stoi(s.substr(e + 1));
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return negative ? "-" + out : out;
}

namespace {

std::string python_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::repr() const {
  if (is_string()) return python_string_repr(as_string());
  if (is_array()) {
    std::string out = tuple_ ? "(" : "[";
    bool first = true;
    for (const auto& e : array()) {
      if (!first) out += ", ";
      first = false;
      out += e.repr();
    }
    if (tuple_ && array().size() == 1) out += ",";
    return out + (tuple_ ? ")" : "]");
  }
  if (is_object()) {
    if (object().is_namespace) return "<Namespace>";
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : object().items) {
      if (!first) out += ", ";
      first = false;
      out += python_string_repr(k) + ": " + v.repr();
    }
    return out + "}";
  }
  return str();
}

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return as_bool() ? "True" : "False";
  if (is_int()) return std::to_string(as_int());
  if (is_float()) return python_float_repr(as_double());
  if (is_string()) return as_string();
  if (is_callable()) return "<function " + callable().name + ">";
  return repr();
}

bool values_equal(const Value& a, const Value& b) {
  bool a_num = a.is_number() || a.is_bool();
  bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
    return as_i(a) == as_i(b);
  }
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  if (a.is_none() && b.is_none()) return true;
  if (a.is_undefined() && b.is_undefined()) return true;
  if (a.is_array() && b.is_array()) {
    const auto& x = a.array();
    const auto& y = b.array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!values_equal(x[i], y[i])) return false;
    }
    return true;
  }
  if (a.is_object() && b.is_object()) {
    const auto& x = a.object();
    const auto& y = b.object();
    if (x.is_namespace || y.is_namespace) return &x == &y;
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const Value* other = y.find(k);
      if (!other || !values_equal(v, *other)) return false;
    }
    return true;
  }
  if (a.is_callable() && b.is_callable()) return &a.callable() == &b.callable();
  return false;
}

bool value_less(const Value& a, const Value& b) {
  bool a_num = a.is_number() || a.is_bool();
  bool b_num = b.is_number() || b.is_bool();
  if (a_num && b_num) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // code point order
  if (a.is_array() && b.is_array()) {
    const auto& x = a.array();
    const auto& y = b.array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return value_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

namespace {

// Decodes one UTF-8 sequence at s[i]; invalid bytes decode as themselves (one byte each).
uint32_t decode_utf8(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
  if (i + static_cast<size_t>(len) > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1fu) : len == 3 ? (c & 0x0fu) : (c & 0x07u);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3fu);
  i += static_cast<size_t>(len);
  return cp;
}

void dump_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') { out += "\\\""; ++i; continue; }
    if (c == '\\') { out += "\\\\"; ++i; continue; }
    if (c == '\n') { out += "\\n"; ++i; continue; }
    if (c == '\r') { out += "\\r"; ++i; continue; }
    if (c == '\t') { out += "\\t"; ++i; continue; }
    if (c == '\b') { out += "\\b"; ++i; continue; }
    if (c == '\f') { out += "\\f"; ++i; continue; }
    char b[16];
    if (c < 0x20) {
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      out += b;
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    uint32_t cp = decode_utf8(s, i);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
    } else {
      std::snprintf(b, sizeof(b), "\\u%04x", cp);
    }
    out += b;
  }
  out += '"';
}

void dump(const Value& v, const JsonDumpOptions& o, int depth, std::string& out) {
  auto newline = [&](int d) {
    out += '\n';
    for (int k = 0; k < d; ++k) out += *o.indent;
  };
  if (v.is_none()) { out += "null"; return; }
  if (v.is_bool()) { out += v.as_bool() ? "true" : "false"; return; }
  if (v.is_int()) { out += std::to_string(v.as_int()); return; }
  if (v.is_float()) {
    double d = v.as_double();
    if (std::isnan(d)) out += "NaN";
    else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
    else out += python_float_repr(d);
    return;
  }
  if (v.is_string()) { dump_string(v.as_string(), o.ensure_ascii, out); return; }
  if (v.is_array()) {
    const auto& a = v.array();
    if (a.empty()) { out += "[]"; return; }
    out += '[';
    for (size_t i = 0; i < a.size(); ++i) {
      if (i > 0) out += o.item_separator;
      if (o.indent) newline(depth + 1);
      dump(a[i], o, depth + 1, out);
    }
    if (o.indent) newline(depth);
    out += ']';
    return;
  }
  if (v.is_object() && !v.object().is_namespace) {
    auto items = v.object().items;
    if (items.empty()) { out += "{}"; return; }
    if (o.sort_keys) {
      std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    }
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += o.item_separator;
      if (o.indent) newline(depth + 1);
      dump_string(items[i].first, o.ensure_ascii, out);
      out += o.key_separator;
      dump(items[i].second, o, depth + 1, out);
    }
    if (o.indent) newline(depth);
    out += '}';
    return;
  }
  fail("Object of type {} is not JSON serializable", v.type_name());
}

}  // namespace

std::string python_json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump(v, options, 0, out);
  return out;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    decode_utf8(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

}  // namespace qwen36::jinja
