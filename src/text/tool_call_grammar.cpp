// tool_call_grammar: a forced tool call as a grammar with embedded JSON values (tool_call_grammar.h).
#include "text/tool_call_grammar.h"

#include <algorithm>

#include "core/error.h"

namespace qwen36::text {

namespace {

using Json = nlohmann::ordered_json;

// Builds the grammar text, and the JSON values it embeds (%0, %1, ...).
struct Writer {
  std::string text;
  std::vector<Grammar::Embedded> values;

  std::string json(const Json& schema, const std::string& where) {
    values.push_back({with_context(where, [&] { return JsonSchema::compile(schema); }), nullptr});
    return fmt::format("%{}", values.size() - 1);
  }
  std::string raw_text(ByteDfa dfa) {
    values.push_back({nullptr, std::make_shared<const ByteDfa>(std::move(dfa))});
    return fmt::format("%{}", values.size() - 1);
  }
  void rule(const std::string& name, const std::string& body) { text += fmt::format("{} ::= {}\n", name, body); }
};

std::vector<std::string> type_names(const Json& schema) {
  std::vector<std::string> out;
  if (!schema.is_object() || !schema.contains("type")) return out;
  const Json& t = schema["type"];
  for (const Json& x : t.is_array() ? t : Json::array({t}))
    if (x.is_string()) out.push_back(x.get<std::string>());
  return out;
}

// How the template writes a value that is not a mapping or a list: Python's str().
std::string python_str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  return v.dump();
}

// A raw XML string: any text without the closing tag (the parser ends the value at the first one),
// held to the schema's pattern, format and (up to kMaxCheckedLength characters) length when it has
// them.
ByteDfa raw_value(const ChatTemplate::ToolCallForm& f) {
  const size_t tag = f.after_value.find_first_not_of(" \t\r\n");
  return ByteDfa::avoiding(tag == std::string::npos ? f.after_value : f.after_value.substr(tag));
}

constexpr uint32_t kMaxCheckedLength = 256;

std::string xml_string(Writer& w, const ChatTemplate::ToolCallForm& f, const Json& schema, const std::string& where) {
  const Json* pattern = schema.contains("pattern") ? &schema["pattern"] : nullptr;
  const char* format = schema.contains("format") && schema["format"].is_string()
                           ? format_pattern(schema["format"].get<std::string>())
                           : nullptr;
  auto length = [&](const char* key, uint32_t absent) {
    const Json* v = schema.contains(key) ? &schema[key] : nullptr;
    return v && v->is_number_unsigned() && v->get<uint64_t>() <= kMaxCheckedLength ? uint32_t(v->get<uint64_t>()) : absent;
  };
  const uint32_t lo = length("minLength", 0), hi = length("maxLength", UINT32_MAX);
  if (!pattern && !format && lo == 0 && hi == UINT32_MAX) return "raw";
  return with_context(where, [&] {
    ByteDfa d = raw_value(f);
    if (pattern) {
      QWEN36_CHECK(pattern->is_string(), "'pattern' must be a string");
      d = ByteDfa::intersect(d, ByteDfa::compile(pattern->get<std::string>(), RegexMode::Search));
    }
    if (format) d = ByteDfa::intersect(d, ByteDfa::compile(format, RegexMode::Full));
    if (lo > 0 || hi != UINT32_MAX) {
      const std::string bounds = hi == UINT32_MAX ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, hi);
      d = ByteDfa::intersect(d, ByteDfa::compile("(?:.|\n)" + bounds, RegexMode::Full));
    }
    QWEN36_CHECK(!d.empty(), "no string fits the parameter's pattern, format and length together");
    return w.raw_text(std::move(d));
  });
}

// An XML-form parameter's value, as the template writes it.
std::string xml_value(Writer& w, const ChatTemplate::ToolCallForm& f, const Json& schema, const std::string& where) {
  if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    std::string alts;
    for (const Json& v : schema["enum"]) {
      if (v.is_object() || v.is_array()) return "raw";
      alts += alts.empty() ? "(" : " | ";
      alts += gbnf_literal(python_str(v));
    }
    return alts + ")";
  }
  const std::vector<std::string> types = type_names(schema);
  auto only = [&](std::initializer_list<const char*> allowed) {
    return !types.empty() && std::all_of(types.begin(), types.end(), [&](const std::string& t) {
      return std::any_of(allowed.begin(), allowed.end(), [&](const char* a) { return t == a; });
    });
  };
  if (schema.is_object() && (schema.contains("anyOf") || schema.contains("oneOf") || schema.contains("$ref")))
    return "raw";
  if (only({"boolean"})) return R"(("True" | "False" | "true" | "false"))";
  if (only({"null"})) return R"(("None" | "null"))";
  if (only({"integer", "number", "object", "array"})) return w.json(schema, where);
  if (only({"string"})) return xml_string(w, f, schema, where);
  return "raw";  // mixes that include strings
}

std::string xml_arguments(Writer& w, const ChatTemplate::ToolCallForm& f, const Json& params, const std::string& fn) {
  const Json props = params.is_object() && params.contains("properties") && params["properties"].is_object()
                         ? params["properties"]
                         : Json::object();
  if (props.empty())  // any parameters
    return fmt::format("({} [^>\\n<]+ {} raw {})*", gbnf_literal(f.before_key), gbnf_literal(f.after_key),
                       gbnf_literal(f.after_value));
  std::vector<std::string> required;
  if (params.contains("required") && params["required"].is_array())
    for (const Json& r : params["required"])
      if (r.is_string()) required.push_back(r.get<std::string>());
  std::string seq;
  for (const auto& [key, schema] : props.items()) {
    const std::string value = xml_value(w, f, schema, fn + "." + key);
    const bool must = std::find(required.begin(), required.end(), key) != required.end();
    seq += fmt::format("{}({} {} {}){}", seq.empty() ? "" : " ", gbnf_literal(f.before_key + key + f.after_key), value,
                       gbnf_literal(f.after_value), must ? "" : "?");
  }
  return seq;
}

}  // namespace

std::shared_ptr<const Grammar> tool_call_grammar(const ChatTemplate::ToolCallForm& form,
                                                 const std::vector<Json>& functions, bool several, bool opened) {
  QWEN36_CHECK(!functions.empty(), "a forced tool call needs a function");
  Writer w;
  // Up to two newlines may come first: a reasoning model writes "</think>\n\n" before its answer.
  const std::string first = opened ? "opened" : R"("\n"{0,2} call)";
  w.rule("root", several ? first + R"( ("\n" call)*)" : first);
  std::string calls;
  for (size_t k = 0; k < functions.size(); ++k) {
    const Json& fn = functions[k];
    const std::string name = fn.value("name", "");
    const Json params = fn.contains("parameters") ? fn["parameters"] : Json{{"type", "object"}};
    const std::string where = "tools: function '" + name + "' parameters";
    const std::string args = form.json ? w.json(params, where) : xml_arguments(w, form, params, where);
    w.rule(fmt::format("fn{}", k), fmt::format("{} {} {}", gbnf_literal(name + form.after_name), args,
                                              gbnf_literal(form.after_args)));
    calls += fmt::format("{}fn{}", calls.empty() ? "" : " | ", k);
  }
  w.rule("call", "\"<tool_call>\" opened");
  w.rule("opened", fmt::format("{} ({})", gbnf_literal(form.before_name), calls));
  if (!form.json) w.rule("raw", w.raw_text(raw_value(form)));  // the XML form's untyped values
  return Grammar::parse(w.text, std::move(w.values));
}

}  // namespace qwen36::text
