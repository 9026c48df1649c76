#pragma once
// defines: the built-in behaviour of the Jinja interpreter -- attribute and item lookup,
//          operators, filters, tests, str/dict methods and global functions.
//
// Every function here throws qwen36::Error with a message but no line; the evaluator adds
// the template line.

#include <string>

#include "text/jinja_value.h"

namespace qwen36::jinja {

// jinja2 semantics: obj.name prefers attributes (methods) then keys; obj[key] the reverse.
// Missing entries give Undefined; lookups on Undefined itself throw.
Value get_attribute(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Array iterate(const Value& v);  // list of a for-loop's items (dict: keys; str: characters)
Value binary_op(const std::string& op, const Value& a, const Value& b);

Value call_filter(const std::string& name, const Value& input, const CallArgs& args);
bool call_test(const std::string& name, const Value& v, const CallArgs& args);

// raise_exception, strftime_now, namespace, range, dict (what transformers' environment has).
void add_globals(Object& globals);

// Throws the error jinja2 gives for using an undefined value.
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace qwen36::jinja
