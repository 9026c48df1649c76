// The request fields the OpenAI endpoints share (server/params.h).
#include "server/params.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <random>

#include "text/regex.h"

namespace qwen36::server {

namespace {

constexpr int64_t kMaxChoices = 16;  // `n`: each choice is a request of its own

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, added to the logits before each draw.
std::vector<std::pair<int32_t, float>> logit_bias(const Json& lb, int64_t vocab) {
  if (!lb.is_object()) throw HttpError(400, "'logit_bias' must be an object mapping token ids to biases", "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, v] : lb.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= vocab)
      throw HttpError(400, fmt::format("logit_bias: '{}' is not a token id of this model (0..{})", key, vocab - 1),
                      "logit_bias");
    if (!v.is_number() || !(std::abs(v.get<double>()) <= 100))
      throw HttpError(400, fmt::format("logit_bias: the bias of token {} must be a number in [-100, 100]", id),
                      "logit_bias");
    out.emplace_back(int32_t(id), v.get<float>());
  }
  return out;
}

}  // namespace

void reject_unknown(const Json& body, std::initializer_list<const char*> known,
                    std::initializer_list<std::span<const char* const>> also) {
  for (const auto& [key, value] : body.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    for (std::span<const char* const> list : also)
      for (const char* k : list) ok = ok || key == k;
    if (!ok) throw HttpError(400, fmt::format("Unrecognized request argument supplied: {}", key), key);
  }
}

bool has(const Json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

double number(const Json& body, const char* key, double lo, double hi, double def) {
  if (!has(body, key)) return def;
  const Json& v = body[key];
  if (!v.is_number()) throw HttpError(400, fmt::format("'{}' must be a number", key), key);
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi))
    throw HttpError(400, fmt::format("'{}' is {}, which is outside [{}, {}]", key, d, lo, hi), key);
  return d;
}

int64_t integer(const Json& body, const char* key, int64_t lo, int64_t hi, int64_t def) {
  if (!has(body, key)) return def;
  const Json& v = body[key];
  if (!v.is_number_integer()) throw HttpError(400, fmt::format("'{}' must be an integer", key), key);
  const int64_t i = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (i < lo || i > hi) throw HttpError(400, fmt::format("'{}' is {}, which is outside [{}, {}]", key, i, lo, hi), key);
  return i;
}

bool boolean(const Json& body, const char* key, bool def) {
  if (!has(body, key)) return def;
  if (!body[key].is_boolean()) throw HttpError(400, fmt::format("'{}' must be a boolean", key), key);
  return body[key].get<bool>();
}


// Sampling, limits, stop and streaming fields shared by both endpoints. Defaults are OpenAI's
// (temperature 1, no top-k / top-p / min-p filtering).
Generation parse_generation(const Json& body, const HttpServer::Api& api, std::vector<int32_t> prompt,
                            bool end_of_turn) {
  const int64_t context = api.ctx.engine->options().context;
  if (int64_t(prompt.size()) >= context)
    throw HttpError(400,
                    fmt::format("This model's maximum context length is {} tokens, but the prompt has {} tokens "
                                "(at least one must remain for the answer)",
                                context, prompt.size()),
                    "messages", "context_length_exceeded");
  Generation g;
  RequestParams& p = g.params;
  p.prompt = std::move(prompt);
  SamplingParams& s = p.sampling;
  s.temperature = float(number(body, "temperature", 0, 2, 1));
  s.top_p = float(number(body, "top_p", 1e-6, 1, 1));
  s.top_k = int32_t(integer(body, "top_k", -1, 1 << 20, 0));
  if (s.top_k < 0) s.top_k = 0;  // -1 means off, as in vLLM
  s.min_p = float(number(body, "min_p", 0, 1, 0));
  s.typical_p = float(number(body, "typical_p", 1e-6, 1, 1));
  s.top_n_sigma = float(number(body, "top_n_sigma", 0, 100, 0));
  s.presence_penalty = float(number(body, "presence_penalty", -2, 2, 0));
  s.frequency_penalty = float(number(body, "frequency_penalty", -2, 2, 0));
  s.repetition_penalty = float(number(body, "repetition_penalty", 0.01, 10, 1));
  s.penalty_last_n = -1;
  s.seed = has(body, "seed") ? uint64_t(integer(body, "seed", INT64_MIN, INT64_MAX, 0)) : std::random_device{}();
  // max_tokens counts answer tokens; absent means "until the context is full".
  const char* max_key = has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = int32_t(integer(body, max_key, 0, 1 << 30, context));
  g.n = int(integer(body, "n", 1, kMaxChoices, 1));
  if (has(body, "stop")) {
    const Json& st = body["stop"];
    if (st.is_string()) {
      p.stop_strings.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 16) {
      for (const Json& x : st) {
        if (!x.is_string()) throw HttpError(400, "'stop' must be a string or an array of strings", "stop");
        p.stop_strings.push_back(x.get<std::string>());
      }
    } else {
      throw HttpError(400, "'stop' must be a string or an array of up to 16 strings", "stop");
    }
    std::erase(p.stop_strings, std::string{});
  }
  if (!boolean(body, "ignore_eos", false)) {
    const int32_t im_end = api.ctx.tokenizer->token_id("<|im_end|>");
    for (int32_t id : api.ctx.stop_ids)
      if (end_of_turn || id != im_end) p.stop_ids.push_back(id);
  }
  // vLLM's stop_token_ids, min_tokens and include_stop_str_in_output.
  if (has(body, "stop_token_ids")) {
    const Json& ids = body["stop_token_ids"];
    const int64_t vocab = api.ctx.engine->model().config().vocab_size;
    if (!ids.is_array()) throw HttpError(400, "'stop_token_ids' must be an array of token ids", "stop_token_ids");
    for (const Json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
        throw HttpError(400, fmt::format("stop_token_ids: {} is not a token id of this model (0..{})", id.dump(),
                                         vocab - 1), "stop_token_ids");
      p.stop_ids.push_back(id.get<int32_t>());
    }
  }
  p.min_tokens = int32_t(integer(body, "min_tokens", 0, 1 << 30, 0));
  if (p.min_tokens > p.max_tokens)
    throw HttpError(400, fmt::format("min_tokens ({}) must not exceed {} ({})", p.min_tokens, max_key, p.max_tokens),
                    "min_tokens");
  p.include_stop_string = boolean(body, "include_stop_str_in_output", false);
  p.prompt_logprobs = int32_t(integer(body, "prompt_logprobs", 0, 20, -1));
  p.priority = int32_t(integer(body, "priority", INT32_MIN, INT32_MAX, 0));
  if (p.prompt_logprobs >= 0 && boolean(body, "stream", false))
    throw HttpError(400, "prompt_logprobs is not supported with stream", "prompt_logprobs");
  if (has(body, "logit_bias")) p.logit_bias = logit_bias(body["logit_bias"], api.ctx.engine->model().config().vocab_size);
  g.stream = boolean(body, "stream", false);
  if (has(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) throw HttpError(400, "'stream_options' must be an object", "stream_options");
    g.include_usage = boolean(so, "include_usage", false);
  }
  return g;
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:x}{:04x}", prefix, rng() & 0xffffffffffULL, counter++ & 0xffff);
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

using text::JsonSchema;
using text::Whitespace;

// fn's compiled constraint; its Error becomes a 400 naming the field.
template <typename Fn>
auto compiled(const char* field, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    throw HttpError(400, fmt::format("{}: {}", field, e.what()), field);
  }
}

// A schema given as an object, or as its JSON text (SGLang, vLLM's guided_json).
std::shared_ptr<const JsonSchema> schema_field(const Json& v, const char* field, Whitespace ws) {
  return compiled(field, [&] {
    if (!v.is_string()) return JsonSchema::compile(v, ws);
    Json parsed = Json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) fail("the schema text is not valid JSON");
    return JsonSchema::compile(parsed, ws);
  });
}

// The whitespace JSON output may hold between tokens: vLLM's structured_outputs
// disable_any_whitespace (at most one space) or whitespace_pattern, its older
// guided_whitespace_pattern, else the server's default. A pattern string lives in the body.
Whitespace json_whitespace(const Json& body, Whitespace server_default) {
  const Json* so = has(body, "structured_outputs") && body["structured_outputs"].is_object()
                       ? &body["structured_outputs"] : nullptr;
  const bool compact = so && boolean(*so, "disable_any_whitespace", false);
  const char* field = nullptr;
  const Json* pattern = nullptr;
  if (so && has(*so, "whitespace_pattern")) {
    field = "structured_outputs.whitespace_pattern";
    pattern = &(*so)["whitespace_pattern"];
  } else if (has(body, "guided_whitespace_pattern")) {
    field = "guided_whitespace_pattern";
    pattern = &body["guided_whitespace_pattern"];
  }
  if (!pattern) return compact ? Whitespace::Compact : server_default;
  if (!pattern->is_string())
    throw HttpError(400, fmt::format("'{}' must be a string (a regular expression)", field), field);
  if (compact)
    throw HttpError(400, "disable_any_whitespace and whitespace_pattern both set the whitespace: give one", field);
  const Whitespace ws{pattern->get_ref<const std::string&>()};
  compiled(field, [&] { return JsonSchema::any_value(ws); });  // checks the pattern, whatever constrains the output
  return ws;
}

std::shared_ptr<const JsonSchema> regex_field(const Json& v, const char* field) {
  if (!v.is_string()) throw HttpError(400, fmt::format("'{}' must be a string (a regular expression)", field), field);
  return compiled(field, [&] { return JsonSchema::text_matching(v.get<std::string>()); });
}

// One of the listed strings, exactly (vLLM's choice).
std::shared_ptr<const JsonSchema> choice_field(const Json& v, const char* field) {
  if (!v.is_array() || v.empty())
    throw HttpError(400, fmt::format("'{}' must be a non-empty array of strings", field), field);
  std::string alternatives;
  for (const Json& c : v) {
    if (!c.is_string()) throw HttpError(400, fmt::format("'{}' must be a non-empty array of strings", field), field);
    alternatives += (alternatives.empty() ? "(?:" : "|") + text::regex_escape(c.get<std::string>());
  }
  return compiled(field, [&] { return JsonSchema::text_matching(alternatives + ")"); });
}

// A GBNF grammar (llama.cpp's syntax, which xgrammar's EBNF for vLLM / SGLang shares).
std::shared_ptr<const text::Grammar> grammar_field(const Json& v, const char* field) {
  if (!v.is_string()) throw HttpError(400, fmt::format("'{}' must be a string (a GBNF grammar)", field), field);
  return compiled(field, [&] { return text::Grammar::parse(v.get<std::string>()); });
}

std::shared_ptr<const JsonSchema> response_format(const Json& rf, Whitespace ws) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    throw HttpError(400, "'response_format' must be an object with a string 'type'", "response_format");
  const std::string type = rf["type"];
  if (type == "text") return nullptr;
  if (type == "json_object")
    return rf.contains("schema") ? schema_field(rf["schema"], "response_format", ws) : JsonSchema::any_object(ws);
  if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema"))
      throw HttpError(400, "response_format json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}",
                      "response_format");
    return schema_field(rf["json_schema"]["schema"], "response_format", ws);
  }
  throw HttpError(400, fmt::format("response_format type '{}' is not one of text, json_object, json_schema", type),
                  "response_format");
}

// vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}, one of them.
OutputConstraint structured_outputs(const Json& so, Whitespace ws) {
  if (!so.is_object()) throw HttpError(400, "'structured_outputs' must be an object", "structured_outputs");
  OutputConstraint out;
  int given = 0;
  for (const auto& [key, v] : so.items()) {
    if (v.is_null() || key == "disable_any_whitespace" || key == "disable_additional_properties" ||
        key == "whitespace_pattern")
      continue;
    ++given;
    if (key == "json") out.schema = schema_field(v, "structured_outputs.json", ws);
    else if (key == "regex") out.schema = regex_field(v, "structured_outputs.regex");
    else if (key == "choice") out.schema = choice_field(v, "structured_outputs.choice");
    else if (key == "json_object") out.schema = v == true ? JsonSchema::any_object(ws) : nullptr;
    else if (key == "grammar") out.grammar = grammar_field(v, "structured_outputs.grammar");
    else if (key == "structural_tag")
      throw HttpError(400, "structured_outputs: structural tags are not supported", "structured_outputs");
    else throw HttpError(400, fmt::format("structured_outputs: unknown field '{}'", key), "structured_outputs");
  }
  if (given > 1)
    throw HttpError(400, "structured_outputs: give one of json, regex, choice, json_object", "structured_outputs");
  return out;
}

}  // namespace

OutputConstraint output_constraint(const Json& body, Whitespace json_ws) {
  static constexpr const char* kFields[] = {"response_format", "structured_outputs", "guided_json", "guided_regex",
                                            "guided_choice",   "regex",              "json_schema", "guided_grammar",
                                            "grammar",         "ebnf"};
  const char* field = nullptr;
  for (const char* f : kFields) {
    if (!has(body, f) || (std::string_view(f) == "response_format" && body[f].value("type", "") == "text")) continue;
    if (field)
      throw HttpError(400, fmt::format("'{}' and '{}' both constrain the output: give one", field, f), f);
    field = f;
  }
  OutputConstraint c;
  const Whitespace ws = json_whitespace(body, json_ws);
  if (!field) return c;
  const std::string_view f = field;
  const Json& v = body[field];
  if (f == "response_format") c.schema = response_format(v, ws);
  else if (f == "structured_outputs") c = structured_outputs(v, ws);
  else if (f == "guided_json" || f == "json_schema") c.schema = schema_field(v, field, ws);
  else if (f == "guided_regex" || f == "regex") c.schema = regex_field(v, field);
  else if (f == "guided_choice") c.schema = choice_field(v, field);
  else c.grammar = grammar_field(v, field);  // grammar, guided_grammar, ebnf
  return c;
}

}  // namespace qwen36::server
