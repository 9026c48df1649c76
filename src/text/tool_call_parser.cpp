// Hand-written scanning: model output is untrusted, so every step checks bounds and any
// surprise returns nullopt rather than throwing.
#include "text/tool_call_parser.h"

#include <charconv>
#include <vector>

namespace qwen36 {

namespace {

using jinja::Json;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::optional<Json> parse_json(std::string_view s) {
  Json j = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// The function object of tool `name`, or nullptr.
const Json* find_function(const Json& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const Json* f = &t;
    if (t.contains("function") && t["function"].is_object()) f = &t["function"];
    if (f->contains("name") && (*f)["name"].is_string() && (*f)["name"].get<std::string>() == name) return f;
  }
  return nullptr;
}

std::vector<std::string> schema_types(const Json* function, const std::string& param) {
  std::vector<std::string> out;
  if (!function || !function->contains("parameters")) return out;
  const Json& params = (*function)["parameters"];
  if (!params.is_object() || !params.contains("properties") || !params["properties"].is_object()) return out;
  const Json& props = params["properties"];
  if (!props.contains(param) || !props[param].is_object()) return out;
  const Json& schema = props[param];
  auto add = [&](const Json& t) {
    if (t.is_string()) out.push_back(t.get<std::string>());
  };
  if (schema.contains("type")) {
    if (schema["type"].is_array()) {
      for (const auto& t : schema["type"]) add(t);
    } else {
      add(schema["type"]);
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (schema.contains(key) && schema[key].is_array()) {
      for (const auto& alt : schema[key]) {
        if (alt.is_object() && alt.contains("type")) add(alt["type"]);
      }
    }
  }
  if (out.empty() && schema.contains("enum")) out.push_back("string");
  return out;
}

// Converts a raw XML parameter value to the first schema type it fits; raw string otherwise.
Json typed_value(const std::string& raw, const std::vector<std::string>& types) {
  std::string_view v = trim(raw);
  for (const auto& t : types) {
    if (t == "string") continue;  // tried last: every value fits
    if (t == "integer") {
      int64_t i = 0;
      auto r = std::from_chars(v.data(), v.data() + v.size(), i);
      if (!v.empty() && r.ec == std::errc() && r.ptr == v.data() + v.size()) return i;
      auto j = parse_json(v);  // 3.0 is an integer in JSON Schema
      if (j && j->is_number() && j->get<double>() == static_cast<double>(static_cast<int64_t>(j->get<double>()))) {
        return static_cast<int64_t>(j->get<double>());
      }
    } else if (t == "number") {
      auto j = parse_json(v);
      if (j && j->is_number()) return *j;
    } else if (t == "boolean") {
      if (v == "true" || v == "True") return true;
      if (v == "false" || v == "False") return false;
    } else if (t == "null") {
      if (v == "null" || v == "None") return nullptr;
    } else if (t == "object" || t == "array") {
      auto j = parse_json(v);
      if (j && ((t == "object" && j->is_object()) || (t == "array" && j->is_array()))) return *j;
    }
  }
  return raw;
}

std::optional<ParsedToolCall> parse_json_form(std::string_view body) {
  auto j = parse_json(body);
  if (!j || !j->is_object() || !j->contains("name") || !(*j)["name"].is_string()) return std::nullopt;
  ParsedToolCall call{(*j)["name"].get<std::string>(), Json::object()};
  for (const char* key : {"arguments", "parameters"}) {
    if (!j->contains(key)) continue;
    Json args = (*j)[key];
    if (args.is_string()) {
      auto inner = parse_json(args.get<std::string>());
      if (!inner) return std::nullopt;
      args = *inner;
    }
    if (!args.is_object()) return std::nullopt;
    call.arguments = std::move(args);
    break;
  }
  return call;
}

std::optional<ParsedToolCall> parse_xml_form(std::string_view body, const Json& tools) {
  constexpr std::string_view kFunc = "<function=", kParam = "<parameter=", kParamEnd = "</parameter>",
                             kFuncEnd = "</function>";
  if (!starts_with(body, kFunc)) return std::nullopt;
  size_t gt = body.find('>');
  if (gt == std::string_view::npos) return std::nullopt;
  std::string_view name = trim(body.substr(kFunc.size(), gt - kFunc.size()));
  if (name.empty() || name.find_first_of("<\n") != std::string_view::npos) return std::nullopt;
  ParsedToolCall call{std::string(name), Json::object()};
  const Json* function = find_function(tools, call.name);
  std::string_view rest = body.substr(gt + 1);
  while (true) {
    rest = trim(rest);
    if (rest.empty() || starts_with(rest, kFuncEnd)) break;  // a missing </function> is tolerated
    if (!starts_with(rest, kParam)) return std::nullopt;
    size_t pgt = rest.find('>');
    if (pgt == std::string_view::npos) return std::nullopt;
    std::string key(trim(rest.substr(kParam.size(), pgt - kParam.size())));
    if (key.empty() || key.find_first_of("<\n") != std::string::npos) return std::nullopt;
    rest = rest.substr(pgt + 1);
    // The value runs to </parameter>; if that is missing, to the next parameter or the end.
    size_t end = rest.find(kParamEnd);
    size_t skip = kParamEnd.size();
    if (end == std::string_view::npos) {
      end = std::min(rest.find(kParam), rest.find(kFuncEnd));
      if (end == std::string_view::npos) end = rest.size();
      skip = 0;
    }
    std::string_view value = rest.substr(0, end);
    // The template writes "\n{value}\n"; exactly those newlines are framing.
    if (starts_with(value, "\n")) value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    call.arguments[key] = typed_value(std::string(value), schema_types(function, key));
    rest = rest.substr(end + skip);
  }
  if (starts_with(rest, kFuncEnd) && !trim(rest.substr(kFuncEnd.size())).empty()) return std::nullopt;
  return call;
}

bool has_tools(const Json& tools) { return tools.is_array() && !tools.empty(); }

}  // namespace

std::optional<ParsedToolCall> parse_tool_call(std::string_view body, const Json& tools) {
  try {
    std::string_view b = trim(body);
    std::optional<ParsedToolCall> call;
    if (starts_with(b, "{")) call = parse_json_form(b);
    else if (starts_with(b, "<function=")) call = parse_xml_form(b, tools);
    if (!call || call->name.empty()) return std::nullopt;
    if (has_tools(tools) && !find_function(tools, call->name)) return std::nullopt;  // unknown function
    return call;
  } catch (const std::exception&) {  // e.g. allocation failure on absurd input: treat as text
    return std::nullopt;
  }
}

}  // namespace qwen36
