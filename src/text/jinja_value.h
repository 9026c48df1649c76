#pragma once
// defines: qwen36::jinja::Value (the dynamic value of the Jinja interpreter), Object, Array,
//          Callable, CallArgs, value equality/ordering, Python-style str()/repr() and json.dumps.
//
// Chat templates are Python code in disguise: their output depends on Python's str() of
// values, on json.dumps formatting and on insertion-ordered dicts. Value mirrors those
// semantics (not JSON's), so rendering matches jinja2 byte for byte.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace qwen36::jinja {

class Value;
using Array = std::vector<Value>;
using Json = nlohmann::ordered_json;  // ordered: Python dicts keep insertion order

// jinja2's default Undefined: prints as "", iterates as empty, fails on attribute access.
struct Undefined {
  std::string hint;  // what was looked up, for error messages
};
struct None {};

// Insertion-ordered mapping (Python dict). Namespaces are objects whose attributes `set`
// may assign; nothing else is mutable (transformers renders in an immutable sandbox).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;

  // Argument `index`/`name` if given (positional wins), else nullptr.
  const Value* get(size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

class Value {
 public:
  using Storage = std::variant<Undefined, None, bool, int64_t, double, std::string,
                               std::shared_ptr<Array>, std::shared_ptr<Object>,
                               std::shared_ptr<Callable>>;

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}

  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);
  static Value tuple(Array items);  // a list that prints as Python's (a, b)
  static Value from_json(const Json& j);
  Json to_json() const;  // throws Error for undefined and callables

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<None>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }  // bool excluded
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<Callable>>(v_); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_double() const;  // int, float or bool
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Array& array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  const Object& object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  Object& mutable_object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  bool truthy() const;            // Python bool()
  std::string str() const;        // Python str(); undefined prints as ""
  std::string repr() const;       // Python repr()
  std::string type_name() const;  // Python type name, for error messages

  const Storage& storage() const { return v_; }
  bool is_tuple() const { return tuple_; }

 private:
  Storage v_;
  bool tuple_ = false;
};

bool values_equal(const Value& a, const Value& b);  // Python ==
// Python <; throws Error for unorderable types.
bool value_less(const Value& a, const Value& b);

// Python repr() of a float (shortest round-trip digits, "1.0", "1e-05", "inf").
std::string python_float_repr(double d);

// Python json.dumps with the given options (transformers' tojson defaults ensure_ascii off).
struct JsonDumpOptions {
  std::optional<std::string> indent;  // nullopt: single line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
std::string python_json_dumps(const Value& v, const JsonDumpOptions& options);

// UTF-8 helpers: Python strings index by code point.
std::vector<size_t> utf8_offsets(std::string_view s);  // start of each code point + s.size()

}  // namespace qwen36::jinja
