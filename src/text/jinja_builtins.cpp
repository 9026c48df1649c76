// Built-ins of the template language with Python/jinja2 semantics.
#include "text/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "core/error.h"

namespace qwen36::jinja {

void fail_undefined(const Value& v) {
  const std::string& hint = v.undefined_hint();
  if (hint.empty()) fail("value is undefined");
  fail("{} is undefined", hint);
}

namespace {

// ---- UTF-8 code points -----------------------------------------------------------------

std::vector<std::string> code_points(const std::string& s) {
  auto off = utf8_offsets(s);
  std::vector<std::string> out;
  out.reserve(off.size());
  for (size_t i = 0; i + 1 < off.size(); ++i) out.push_back(s.substr(off[i], off[i + 1] - off[i]));
  return out;
}

// Python's str.isspace() set, in UTF-8.
bool is_py_space(const std::string& cp) {
  static const std::set<std::string> spaces = {
      " ", "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", "\xc2\x85", "\xc2\xa0",
      "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84",
      "\xe2\x80\x85", "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a",
      "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
  return spaces.count(cp) > 0;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto cps = code_points(s);
  std::vector<std::string> set;
  bool whitespace = !chars || chars->is_none() || chars->is_undefined();
  if (!whitespace) {
    if (!chars->is_string()) fail("strip arg must be None or str");
    set = code_points(chars->as_string());
  }
  auto strip_it = [&](const std::string& cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    // Runs of whitespace separate; no empty strings.
    auto cps = code_points(s);
    std::string curr;
    bool in_word = false;
    size_t i = 0;
    for (; i < cps.size(); ++i) {
      if (is_py_space(cps[i])) {
        if (in_word) {
          out.push_back(curr);
          curr.clear();
          in_word = false;
        }
      } else {
        if (!in_word && maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
        in_word = true;
        curr += cps[i];
      }
    }
    if (in_word) out.push_back(curr);
    if (i < cps.size()) {
      std::string rest;
      for (; i < cps.size(); ++i) rest += cps[i];
      out.push_back(py_strip(rest, nullptr, false, true));
    }
    return out;
  }
  if (!sep->is_string()) fail("must be str or None, not {}", sep->type_name());
  const std::string& d = sep->as_string();
  if (d.empty()) fail("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.push_back(s.substr(pos, f - pos));
    pos = f + d.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    auto cps = code_points(s);
    int64_t n = 0;
    for (const auto& cp : cps) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// ASCII-only case mapping (templates only case-map role names and keywords).
std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>((c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c);
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>((c >= 'a' && c <= 'z') ? c - 'a' + 'A' : c);
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = prev_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}
std::string py_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
  return out;
}

Value arg_or(const CallArgs& a, size_t i, std::string_view name, const Value& fallback) {
  const Value* v = a.get(i, name);
  return v ? *v : fallback;
}

const std::string& str_arg(const CallArgs& a, size_t i, std::string_view name, const char* what) {
  const Value* v = a.get(i, name);
  if (!v || !v->is_string()) fail("{}: expected a string argument '{}'", what, name);
  return v->as_string();
}

int64_t int_arg(const CallArgs& a, size_t i, std::string_view name, int64_t fallback) {
  const Value* v = a.get(i, name);
  if (!v || v->is_none()) return fallback;
  if (v->is_int()) return v->as_int();
  if (v->is_bool()) return v->as_bool();
  fail("expected an integer argument '{}', got {}", name, v->type_name());
}

// start/end arguments of startswith/endswith/find/count, as code point indices.
bool prefix_match(const std::string& s, const Value& prefix, bool at_end) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail("startswith/endswith arg must be str or a tuple of str, not {}", p.type_name());
    const std::string& x = p.as_string();
    if (x.size() > s.size()) return false;
    return at_end ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (prefix.is_array()) {
    return std::any_of(prefix.array().begin(), prefix.array().end(), one);
  }
  return one(prefix);
}

std::string substr_cp(const std::string& s, const CallArgs& a, size_t first_index) {
  const Value* start = a.get(first_index, "start");
  const Value* end = a.get(first_index + 1, "end");
  if (!start && !end) return s;
  auto off = utf8_offsets(s);
  auto n = static_cast<int64_t>(off.size() - 1);
  auto clamp = [&](const Value* v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  int64_t b = clamp(start, 0), e = clamp(end, n);
  if (e < b) return "";
  return s.substr(off[static_cast<size_t>(b)], off[static_cast<size_t>(e)] - off[static_cast<size_t>(b)]);
}

Value bound(const std::string& name, std::function<Value(const CallArgs&)> fn) {
  return Value::function(name, std::move(fn));
}

Value string_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    bool end = name == "endswith";
    return bound(name, [s, end](const CallArgs& a) {
      const Value* p = a.get(0, "prefix");
      if (!p) fail("startswith/endswith needs an argument");
      return Value(prefix_match(substr_cp(s, a, 1), *p, end));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return bound(name, [s, l, r](const CallArgs& a) { return Value(py_strip(s, a.get(0, "chars"), l, r)); });
  }
  if (name == "split") {
    return bound(name, [s](const CallArgs& a) {
      Array out;
      for (auto& p : py_split(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1))) out.emplace_back(std::move(p));
      return Value(std::move(out));
    });
  }
  if (name == "rsplit") {
    return bound(name, [s](const CallArgs& a) {
      int64_t maxsplit = int_arg(a, 1, "maxsplit", -1);
      const Value* sep = a.get(0, "sep");
      if (maxsplit < 0 || !sep || sep->is_none()) {
        if (maxsplit >= 0) fail("rsplit with maxsplit and no separator is not supported");
        Array out;
        for (auto& p : py_split(s, sep, -1)) out.emplace_back(std::move(p));
        return Value(std::move(out));
      }
      if (!sep->is_string() || sep->as_string().empty()) fail("rsplit: bad separator");
      const std::string& d = sep->as_string();
      std::vector<std::string> parts;
      size_t end = s.size();
      while (static_cast<int64_t>(parts.size()) < maxsplit) {
        if (end < d.size()) break;
        size_t f = s.rfind(d, end - d.size());
        if (f == std::string::npos) break;
        parts.push_back(s.substr(f + d.size(), end - f - d.size()));
        end = f;
      }
      parts.push_back(s.substr(0, end));
      Array out;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) out.emplace_back(*it);
      return Value(std::move(out));
    });
  }
  if (name == "replace") {
    return bound(name, [s](const CallArgs& a) {
      return Value(py_replace(s, str_arg(a, 0, "old", "replace"), str_arg(a, 1, "new", "replace"),
                              int_arg(a, 2, "count", -1)));
    });
  }
  if (name == "upper") return bound(name, [s](const CallArgs&) { return Value(ascii_upper(s)); });
  if (name == "lower") return bound(name, [s](const CallArgs&) { return Value(ascii_lower(s)); });
  if (name == "title") return bound(name, [s](const CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize") return bound(name, [s](const CallArgs&) { return Value(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    bool reverse = name[0] == 'r';
    bool raise = name.find("index") != std::string::npos;
    return bound(name, [s, reverse, raise](const CallArgs& a) {
      const std::string& sub = str_arg(a, 0, "sub", "find");
      if (a.get(1, "start")) fail("find with start/end is not supported");
      size_t f = reverse ? s.rfind(sub) : s.find(sub);
      if (f == std::string::npos) {
        if (raise) fail("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(utf8_offsets(s.substr(0, f)).size() - 1));
    });
  }
  if (name == "count") {
    return bound(name, [s](const CallArgs& a) {
      const std::string& sub = str_arg(a, 0, "sub", "count");
      std::string hay = substr_cp(s, a, 1);
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_offsets(hay).size()));
      int64_t n = 0;
      for (size_t p = hay.find(sub); p != std::string::npos; p = hay.find(sub, p + sub.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return bound(name, [s](const CallArgs& a) {
      const Value* it = a.get(0, "iterable");
      if (!it) fail("join needs an argument");
      std::string out;
      bool first = true;
      for (const auto& e : iterate(*it)) {
        if (!e.is_string()) fail("sequence item: expected str instance, {} found", e.type_name());
        if (!first) out += s;
        first = false;
        out += e.as_string();
      }
      return Value(std::move(out));
    });
  }
  if (name == "splitlines") {
    return bound(name, [s](const CallArgs&) {
      Array out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t f = s.find_first_of("\r\n", pos);
        if (f == std::string::npos) {
          out.emplace_back(s.substr(pos));
          break;
        }
        out.emplace_back(s.substr(pos, f - pos));
        pos = f + ((s[f] == '\r' && f + 1 < s.size() && s[f + 1] == '\n') ? 2 : 1);
      }
      return Value(std::move(out));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool suffix = name == "removesuffix";
    return bound(name, [s, suffix](const CallArgs& a) {
      const std::string& x = str_arg(a, 0, "affix", "removeprefix");
      if (prefix_match(s, Value(x), suffix)) return Value(suffix ? s.substr(0, s.size() - x.size()) : s.substr(x.size()));
      return Value(s);
    });
  }
  auto predicate = [&](auto pred) {
    return bound(name, [s, pred](const CallArgs&) {
      return Value(!s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return pred(c); }));
    });
  };
  if (name == "isdigit") return predicate([](char c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return predicate([](char c) { return is_alpha(c); });
  if (name == "isalnum") return predicate([](char c) { return is_alpha(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return predicate([](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); });
  if (name == "islower") return predicate([](char c) { return !(c >= 'A' && c <= 'Z'); });
  if (name == "isupper") return predicate([](char c) { return !(c >= 'a' && c <= 'z'); });
  return Value(Undefined{"'str object' has no attribute '" + name + "'"});
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "get") {
    return bound(name, [d](const CallArgs& a) {
      const Value* k = a.get(0, "key");
      if (!k) fail("get needs a key");
      if (k->is_string()) {
        if (const Value* v = d.object().find(k->as_string())) return *v;
      }
      return arg_or(a, 1, "default", Value(None{}));
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
    return bound(name, [d, which](const CallArgs&) {
      Array out;
      for (const auto& [k, v] : d.object().items) {
        if (which == 0) {
          Array pair{Value(k), v};
          out.push_back(Value::tuple(std::move(pair)));
        }
        else if (which == 1) out.emplace_back(k);
        else out.push_back(v);
      }
      return Value(std::move(out));
    });
  }
  return Value(Undefined{});
}

int64_t normalize_index(int64_t i, size_t n) { return i < 0 ? i + static_cast<int64_t>(n) : i; }

}  // namespace

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_string()) {
    Value m = string_method(obj.as_string(), name);
    if (!m.is_undefined()) return m;
    return Value(Undefined{"'str object' has no attribute '" + name + "'"});
  }
  if (obj.is_object()) {
    if (!obj.object().is_namespace) {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
    }
    if (const Value* v = obj.object().find(name)) return *v;
    return Value(Undefined{"'dict object' has no attribute '" + name + "'"});
  }
  return Value(Undefined{"'" + obj.type_name() + " object' has no attribute '" + name + "'"});
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_object() && key.is_string()) {
    if (const Value* v = obj.object().find(key.as_string())) return *v;
    return get_attribute(obj, key.as_string());
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t raw = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_array()) {
      int64_t i = normalize_index(raw, obj.array().size());
      if (i >= 0 && i < static_cast<int64_t>(obj.array().size())) return obj.array()[static_cast<size_t>(i)];
    } else {
      auto off = utf8_offsets(obj.as_string());
      int64_t i = normalize_index(raw, off.size() - 1);
      if (i >= 0 && i < static_cast<int64_t>(off.size() - 1)) {
        auto u = static_cast<size_t>(i);
        return Value(obj.as_string().substr(off[u], off[u + 1] - off[u]));
      }
    }
    return Value(Undefined{obj.type_name() + " index out of range"});
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value(Undefined{"'" + obj.type_name() + " object' has no item " + key.repr()});
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto idx = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int()) fail("slice {} must be an integer", what);
    return v.as_int();
  };
  int64_t st = idx(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  std::vector<std::string> cps;
  size_t n;
  if (obj.is_string()) {
    cps = code_points(obj.as_string());
    n = cps.size();
  } else if (obj.is_array()) {
    n = obj.array().size();
  } else {
    fail("'{}' object is not subscriptable", obj.type_name());
  }
  // Python's slice index adjustment.
  auto len = static_cast<int64_t>(n);
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) {
      i += len;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= len) {
      i = st < 0 ? len - 1 : len;
    }
    return i;
  };
  int64_t b = adjust(idx(start, "start"), st < 0 ? len - 1 : 0);
  int64_t e = adjust(idx(stop, "stop"), st < 0 ? -1 : len);
  std::vector<size_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picks) out += cps[i];
    return Value(std::move(out));
  }
  Array out;
  for (size_t i : picks) out.push_back(obj.array()[i]);
  return Value(std::move(out));
}

Array iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_array()) return v.array();
  if (v.is_object()) {
    Array keys;
    for (const auto& kv : v.object().items) keys.emplace_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    Array out;
    for (auto& cp : code_points(v.as_string())) out.emplace_back(std::move(cp));
    return out;
  }
  fail("'{}' object is not iterable", v.type_name());
}

namespace {

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not {}", item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_object()) return item.is_string() && container.object().find(item.as_string()) != nullptr;
  if (container.is_array()) {
    return std::any_of(container.array().begin(), container.array().end(),
                       [&](const Value& e) { return values_equal(e, item); });
  }
  if (container.is_undefined()) return false;
  fail("argument of type '{}' is not iterable", container.type_name());
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value(values_equal(a, b));
  if (op == "!=") return Value(!values_equal(a, b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  if (op == "~") return Value(a.str() + b.str());
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (op == "<") return Value(value_less(a, b));
  if (op == ">") return Value(value_less(b, a));
  if (op == "<=") return Value(!value_less(b, a));
  if (op == ">=") return Value(!value_less(a, b));
  bool nums = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  bool ints = nums && !a.is_float() && !b.is_float();
  auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_array() && b.is_array()) {
      Array out = a.array();
      out.insert(out.end(), b.array().begin(), b.array().end());
      return Value(std::move(out));
    }
    if (ints) return Value(as_i(a) + as_i(b));
    if (nums) return Value(a.as_double() + b.as_double());
  } else if (op == "-") {
    if (ints) return Value(as_i(a) - as_i(b));
    if (nums) return Value(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) return Value(as_i(a) * as_i(b));
    if (nums) return Value(a.as_double() * b.as_double());
    const Value* seq = a.is_string() || a.is_array() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_array()) && (count->is_int() || count->is_bool())) {
      int64_t n = std::max<int64_t>(0, as_i(*count));
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return Value(std::move(out));
      }
      Array out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->array().begin(), seq->array().end());
      return Value(std::move(out));
    }
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0.0) fail("division by zero");
      return Value(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (nums && b.as_double() == 0.0) fail("integer division or modulo by zero");
    if (ints) {
      int64_t q = floor_div(as_i(a), as_i(b));
      return Value(op == "//" ? q : as_i(a) - q * as_i(b));
    }
    if (nums) {
      double q = std::floor(a.as_double() / b.as_double());
      return Value(op == "//" ? q : a.as_double() - q * b.as_double());
    }
  } else if (op == "**") {
    if (ints && as_i(b) >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < as_i(b); ++i) r *= as_i(a);
      return Value(r);
    }
    if (nums) return Value(std::pow(a.as_double(), b.as_double()));
  }
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

// ---- filters ---------------------------------------------------------------------------

namespace {

// Attribute path "a.b.0" as used by map/selectattr/sort/join(attribute=...).
Value get_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (cur.is_undefined()) return cur;
    cur = numeric ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

CallArgs shift_args(const CallArgs& a, size_t n) {
  CallArgs out;
  for (size_t i = n; i < a.positional.size(); ++i) out.positional.push_back(a.positional[i]);
  out.named = a.named;
  return out;
}

Array select_items(const Value& input, const CallArgs& a, bool by_attr, bool keep_when) {
  Array out;
  std::string attr;
  size_t test_at = 0;
  if (by_attr) {
    attr = str_arg(a, 0, "attribute", "selectattr");
    test_at = 1;
  }
  const Value* test = a.get(test_at, "");
  CallArgs test_args = shift_args(a, test_at + 1);
  for (const auto& item : iterate(input)) {
    Value v = by_attr ? get_path(item, attr) : item;
    bool ok = test ? call_test(test->str(), v, test_args) : v.truthy();
    if (ok == keep_when) out.push_back(item);
  }
  return out;
}

// transformers replaces jinja2's tojson with json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False): note the positional order differs from jinja2's.
Value tojson(const Value& input, const CallArgs& a) {
  JsonDumpOptions o;
  if (const Value* e = a.get(0, "ensure_ascii")) o.ensure_ascii = e->truthy();
  const Value* indent = a.get(1, "indent");
  if (indent && !indent->is_none()) {
    if (indent->is_string()) o.indent = indent->as_string();
    else o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent->as_int())), ' ');
    o.item_separator = ",";
  }
  if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_array() || sep->array().size() != 2) fail("tojson: separators must be a pair");
    o.item_separator = sep->array()[0].str();
    o.key_separator = sep->array()[1].str();
  }
  if (const Value* s = a.get(3, "sort_keys")) o.sort_keys = s->truthy();
  return Value(python_json_dumps(input, o));
}

Value length_of(const Value& v) {
  if (v.is_string()) return Value(static_cast<int64_t>(utf8_offsets(v.as_string()).size() - 1));
  if (v.is_array()) return Value(static_cast<int64_t>(v.array().size()));
  if (v.is_object()) return Value(static_cast<int64_t>(v.object().items.size()));
  if (v.is_undefined()) return Value(int64_t{0});
  fail("object of type '{}' has no len()", v.type_name());
}

Value to_int(const Value& v, const Value& dflt) {
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(int64_t{v.as_bool()});
  if (v.is_float()) return Value(static_cast<int64_t>(v.as_double()));
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), nullptr, true, true);
    try {
      size_t used = 0;
      int64_t i = std::stoll(s, &used);
      if (used == s.size()) return Value(i);
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Value to_float(const Value& v, const Value& dflt) {
  if (v.is_float()) return v;
  if (v.is_int() || v.is_bool()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      size_t used = 0;
      std::string s = py_strip(v.as_string(), nullptr, true, true);
      double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return dflt;
}

Array sorted(Array items, bool reverse, const std::string& attr, bool case_sensitive) {
  auto key = [&](const Value& v) {
    Value k = attr.empty() ? v : get_path(v, attr);
    if (!case_sensitive && k.is_string()) return Value(ascii_lower(k.as_string()));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? value_less(key(y), key(x)) : value_less(key(x), key(y));
  });
  return items;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

Value call_filter(const std::string& name, const Value& in, const CallArgs& a) {
  static const Value kNone{None{}};
  static const Value kEmpty{std::string()};
  if (name == "default" || name == "d") {
    bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
    if (in.is_undefined() || (boolean && !in.truthy())) return arg_or(a, 0, "default_value", kEmpty);
    return in;
  }
  if (name == "tojson") return tojson(in, a);
  if (name == "length" || name == "count") return length_of(in);
  if (name == "string") return Value(in.str());
  if (name == "list") return Value(iterate(in));
  if (name == "safe") return in;
  if (name == "escape" || name == "e") return Value(html_escape(in.str()));
  if (in.is_undefined() && name != "items") fail_undefined(in);
  if (name == "trim") return Value(py_strip(in.str(), a.get(0, "chars"), true, true));
  if (name == "upper") return Value(ascii_upper(in.str()));
  if (name == "lower") return Value(ascii_lower(in.str()));
  if (name == "title") return Value(py_title(in.str()));
  if (name == "capitalize") return Value(py_capitalize(in.str()));
  if (name == "replace") {
    return Value(py_replace(in.str(), arg_or(a, 0, "old", kEmpty).str(), arg_or(a, 1, "new", kEmpty).str(),
                            int_arg(a, 2, "count", -1)));
  }
  if (name == "items") {
    if (in.is_undefined()) return Value(Array{});
    if (!in.is_object()) fail("items filter expects a mapping, got {}", in.type_name());
    Array out;
    for (const auto& [k, v] : in.object().items) {
      Array pair{Value(k), v};
      out.push_back(Value::tuple(std::move(pair)));
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    Array items = iterate(in);
    if (items.empty()) return Value(Undefined{"no " + name + " item, sequence was empty"});
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    std::string sep = arg_or(a, 0, "d", kEmpty).str();
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& e : iterate(in)) {
      if (!first) out += sep;
      first = false;
      out += (attr ? get_path(e, attr->str()) : e).str();
    }
    return Value(std::move(out));
  }
  if (name == "reverse") {
    if (in.is_string()) return get_slice(in, Value(), Value(), Value(int64_t{-1}));
    Array items = iterate(in);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "map") {
    Array out;
    if (const Value* attr = a.get(99, "attribute")) {
      const Value* dflt = a.get(99, "default");
      for (const auto& e : iterate(in)) {
        Value v = get_path(e, attr->str());
        out.push_back(v.is_undefined() && dflt ? *dflt : v);
      }
      return Value(std::move(out));
    }
    std::string filter = str_arg(a, 0, "filter", "map");
    CallArgs rest = shift_args(a, 1);
    for (const auto& e : iterate(in)) out.push_back(call_filter(filter, e, rest));
    return Value(std::move(out));
  }
  if (name == "select") return Value(select_items(in, a, false, true));
  if (name == "reject") return Value(select_items(in, a, false, false));
  if (name == "selectattr") return Value(select_items(in, a, true, true));
  if (name == "rejectattr") return Value(select_items(in, a, true, false));
  if (name == "unique") {
    Array out;
    for (const auto& e : iterate(in)) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& x) { return values_equal(x, e); })) out.push_back(e);
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    const Value* attr = a.get(2, "attribute");
    return Value(sorted(iterate(in), arg_or(a, 0, "reverse", Value(false)).truthy(), attr ? attr->str() : "",
                        arg_or(a, 1, "case_sensitive", Value(false)).truthy()));
  }
  if (name == "dictsort") {
    if (!in.is_object()) fail("dictsort expects a mapping");
    Array pairs;
    for (const auto& [k, v] : in.object().items) {
      Array pair{Value(k), v};
      pairs.push_back(Value::tuple(std::move(pair)));
    }
    return Value(sorted(std::move(pairs), arg_or(a, 2, "reverse", Value(false)).truthy(), "0",
                        arg_or(a, 0, "case_sensitive", Value(false)).truthy()));
  }
  if (name == "int") return to_int(in, arg_or(a, 0, "default", Value(int64_t{0})));
  if (name == "float") return to_float(in, arg_or(a, 0, "default", Value(0.0)));
  if (name == "abs") {
    if (in.is_int()) return Value(in.as_int() < 0 ? -in.as_int() : in.as_int());
    return Value(std::fabs(in.as_double()));
  }
  if (name == "round") {
    int64_t precision = int_arg(a, 0, "precision", 0);
    double scale = std::pow(10.0, static_cast<double>(precision));
    std::string method = arg_or(a, 1, "method", Value("common")).str();
    double x = in.as_double() * scale;
    // Python's round() rounds half to even, as nearbyint does in the default mode.
    double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value(r / scale);
  }
  if (name == "sum" || name == "min" || name == "max") {
    Array items = iterate(in);
    if (name == "sum") {
      Value total = arg_or(a, 1, "start", Value(int64_t{0}));
      for (const auto& e : items) total = binary_op("+", total, e);
      return total;
    }
    if (items.empty()) return Value(Undefined{"empty sequence"});
    Value best = items[0];
    for (const auto& e : items) {
      if (name == "min" ? value_less(e, best) : value_less(best, e)) best = e;
    }
    return best;
  }
  if (name == "indent") {
    Value w = arg_or(a, 0, "width", Value(int64_t{4}));
    std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(w.as_int()), ' ');
    bool first = arg_or(a, 1, "first", Value(false)).truthy();
    bool blank = arg_or(a, 2, "blank", Value(false)).truthy();
    std::string s = in.str(), out;
    size_t pos = 0;
    bool first_line = true;
    while (true) {
      size_t nl = s.find('\n', pos);
      std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      bool indent_it = first_line ? first : (blank || !line.empty());
      out += (indent_it ? pad : "") + line;
      if (nl == std::string::npos) break;
      out += '\n';
      pos = nl + 1;
      first_line = false;
    }
    return Value(std::move(out));
  }
  if (name == "wordcount") return Value(static_cast<int64_t>(py_split(in.str(), nullptr, -1).size()));
  if (name == "attr") return get_attribute(in, str_arg(a, 0, "name", "attr"));
  fail("no filter named '{}'", name);
}

// ---- tests -----------------------------------------------------------------------------

bool call_test(const std::string& name, const Value& v, const CallArgs& a) {
  auto arg = [&]() -> const Value& {
    const Value* x = a.get(0, "other");
    if (!x) fail("test '{}' needs an argument", name);
    return *x;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object();
  if (name == "number") return v.is_number() || v.is_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "odd" || name == "even") {
    if (!v.is_int()) fail("test '{}' expects an integer", name);
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t d = arg().as_int();
    if (d == 0) fail("integer division or modulo by zero");
    return v.as_int() % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg());
  if (name == "ne" || name == "!=") return !values_equal(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return value_less(v, arg());
  if (name == "gt" || name == "greaterthan" || name == ">") return value_less(arg(), v);
  if (name == "le" || name == "<=") return !value_less(arg(), v);
  if (name == "ge" || name == ">=") return !value_less(v, arg());
  if (name == "in") return binary_op("in", v, arg()).truthy();
  if (name == "sameas") {
    const Value& o = arg();
    if (v.storage().index() != o.storage().index()) return false;
    if (v.is_array()) return &v.array() == &o.array();
    if (v.is_object()) return &v.object() == &o.object();
    return values_equal(v, o);
  }
  if (name == "lower") return v.is_string() && ascii_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && ascii_upper(v.as_string()) == v.as_string();
  fail("no test named '{}'", name);
}

// ---- globals ---------------------------------------------------------------------------

void add_globals(Object& g) {
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& a) -> Value {
          const Value* m = a.get(0, "message");
          fail("raise_exception: {}", m ? m->str() : std::string());
        }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& a) {
          // transformers formats the local time; so do we.
          std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          std::string fmt = str_arg(a, 0, "format", "strftime_now");
          size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  g.set("namespace", Value::function("namespace", [](const CallArgs& a) {
          Object ns;
          ns.is_namespace = true;
          for (const auto& p : a.positional) {
            if (!p.is_object()) fail("namespace() positional argument must be a mapping");
            for (const auto& [k, v] : p.object().items) ns.set(k, v);
          }
          for (const auto& [k, v] : a.named) ns.set(k, v);
          return Value(std::move(ns));
        }));
  g.set("dict", Value::function("dict", [](const CallArgs& a) {
          Object d;
          for (const auto& p : a.positional) {
            if (!p.is_object()) fail("dict() positional argument must be a mapping");
            for (const auto& [k, v] : p.object().items) d.set(k, v);
          }
          for (const auto& [k, v] : a.named) d.set(k, v);
          return Value(std::move(d));
        }));
  g.set("range", Value::function("range", [](const CallArgs& a) {
          int64_t start = 0, stop = 0, step = 1;
          auto n = a.positional.size();
          if (n == 1) {
            stop = int_arg(a, 0, "stop", 0);
          } else if (n >= 2) {
            start = int_arg(a, 0, "start", 0);
            stop = int_arg(a, 1, "stop", 0);
            step = int_arg(a, 2, "step", 1);
          } else {
            fail("range expected at least 1 argument");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          Array out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() > 10'000'000) fail("range too large");
            out.emplace_back(i);
          }
          return Value(std::move(out));
        }));
}

}  // namespace qwen36::jinja
