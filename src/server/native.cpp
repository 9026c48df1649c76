// llama-server's own API beside the OpenAI one, for clients written against it: POST /completion
// (its fields, its sampling defaults and chain order, its answer and stream shapes), GET /props,
// POST /apply-template. A llama.cpp sampler qwen36 lacks (DRY, XTC, mirostat, dynamic
// temperature) is accepted at the setting that disables it, since clients send every field with
// its default, and refused otherwise.
#include <algorithm>
#include <cmath>

#include "server/chat.h"
#include "server/reply.h"

namespace qwen36::server {

namespace {

constexpr const char* kCompletionFields[] = {
    "prompt", "n_predict", "max_tokens", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p",
    "min_p", "typical_p", "top_n_sigma", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
    "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta", "stop", "seed", "ignore_eos",
    "logit_bias", "n_probs", "min_keep", "stream", "cache_prompt", "return_tokens", "samplers", "timings_per_token",
    "post_sampling_probs", "id_slot", "n_keep", "n_indent", "t_max_predict_ms", "grammar", "json_schema",
    "response_fields", "lora", "image_data", "model"};

constexpr size_t kMaxPrompts = 64;

// llama-server's sampling defaults.
SamplingParams native_defaults() {
  SamplingParams s;  // temperature 0.8, top_k 40, top_p 0.95, min_p 0.05
  s.repetition_penalty = 1.0f;
  s.penalty_last_n = 64;
  s.temperature_last = true;  // its chain applies the temperature after the filters
  return s;
}

void refuse_unless(bool ok, const char* key, const std::string& why) {
  if (!ok) throw HttpError(400, fmt::format("'{}': {}", key, why), key);
}

// The samplers llama-server names (its long names and one-letter codes) in the order qwen36
// applies them; "penalties" is the repetition / presence / frequency penalties, "dry" and "xtc"
// are accepted only disabled (checked with their parameters).
struct ChainEntry {
  const char* name;
  char code;
};
constexpr ChainEntry kChain[] = {{"penalties", 'e'}, {"dry", 'd'},   {"top_n_sigma", 's'}, {"top_k", 'k'},
                                 {"typ_p", 'y'},     {"top_p", 'p'}, {"min_p", 'm'},       {"xtc", 'x'}};

int chain_index(const std::string& name) {
  const std::string n = name == "typical_p" || name == "typical" ? "typ_p" : name;
  for (size_t i = 0; i < std::size(kChain); ++i)
    if (n == kChain[i].name) return int(i);
  return -1;
}

// `samplers`: which samplers run and in what order; one left out is off. The filters' order must
// be qwen36's (top_p and min_p may swap: they cut the same distribution), the penalties before
// the temperature, and the temperature after every filter it changes — typ_p, top_p, min_p
// (llama.cpp's default) — or before them all (vLLM's order).
void apply_samplers(const Json& v, SamplingParams& s) {
  std::vector<std::string> names;
  if (v.is_string()) {
    for (char c : v.get<std::string>()) {
      const auto* e = std::find_if(std::begin(kChain), std::end(kChain), [&](const ChainEntry& x) { return x.code == c; });
      refuse_unless(c == 't' || e != std::end(kChain), "samplers",
                    fmt::format("'{}' is not a sampler code this server knows (e d s k y p m x t)", c));
      names.push_back(c == 't' ? "temperature" : e->name);
    }
  } else {
    refuse_unless(v.is_array(), "samplers", "must be an array of sampler names or a string of their codes");
    for (const Json& n : v) {
      refuse_unless(n.is_string(), "samplers", "must be an array of sampler names");
      names.push_back(n == "temp" ? "temperature" : n.get<std::string>());
    }
  }
  const int top_p = chain_index("top_p"), min_p = chain_index("min_p");
  auto tempered = [&](int i) { return i == chain_index("typ_p") || i == top_p || i == min_p; };
  std::vector<bool> on(std::size(kChain), false);
  bool temperature = false;
  int last = -1, tempered_before = 0, tempered_after = 0;
  for (const std::string& n : names) {
    if (n == "temperature") {
      refuse_unless(!temperature, "samplers", "names the temperature twice");
      temperature = true;
      continue;
    }
    const int i = chain_index(n);
    refuse_unless(i >= 0, "samplers", fmt::format("'{}' is not a sampler this server has (penalties, dry, top_n_sigma, "
                                                  "top_k, typ_p, top_p, min_p, xtc, temperature)", n));
    refuse_unless(!on[size_t(i)] && (i > last || (i == top_p && last == min_p)), "samplers",
                  fmt::format("'{}' comes out of order: this server applies penalties, top_n_sigma, top_k, typ_p, "
                              "top_p / min_p in that order", n));
    refuse_unless(i != chain_index("penalties") || !temperature, "samplers",
                  "the penalties must come before the temperature");
    if (tempered(i)) ++(temperature ? tempered_after : tempered_before);
    on[size_t(i)] = true;
    last = std::max(last, i);
  }
  refuse_unless(tempered_before == 0 || tempered_after == 0, "samplers",
                "the temperature must come after typ_p, top_p and min_p (llama.cpp's order) or before them all");
  if (tempered_after > 0) s.temperature_last = false;  // vLLM's order: the filters see the tempered distribution
  if (!temperature && s.temperature > 0) s.temperature = 1.0f;  // no temperature sampler: drawn as the model gives
  if (!on[size_t(chain_index("penalties"))]) s.repetition_penalty = 1, s.presence_penalty = 0, s.frequency_penalty = 0;
  if (!on[size_t(chain_index("top_n_sigma"))]) s.top_n_sigma = 0;
  if (!on[size_t(chain_index("top_k"))]) s.top_k = 0;
  if (!on[size_t(chain_index("typ_p"))]) s.typical_p = 1;
  if (!on[size_t(top_p)]) s.top_p = 1;
  if (!on[size_t(min_p)]) s.min_p = 0;
}

// llama.cpp's samplers and options qwen36 does not have: accepted where they are off.
void refuse_unsupported(const Json& body) {
  auto off = [&](const char* key, double neutral, const char* what) {
    refuse_unless(number(body, key, -1e30, 1e30, neutral) == neutral, key,
                  fmt::format("{} is not supported (only {}, which leaves it off)", what, neutral));
  };
  off("dynatemp_range", 0, "dynamic temperature");
  off("dry_multiplier", 0, "DRY sampling");
  off("mirostat", 0, "Mirostat sampling");
  off("n_indent", 0, "a minimum line indentation");
  off("t_max_predict_ms", 0, "a time limit");
  if (number(body, "xtc_probability", 0, 1, 0) > 0)
    refuse_unless(number(body, "xtc_threshold", -1e30, 1e30, 0.1) > 0.5, "xtc_probability",
                  "XTC sampling is not supported (only probability 0, or a threshold above 0.5, which leave it off)");
  refuse_unless(integer(body, "min_keep", 0, INT32_MAX, 0) <= 1, "min_keep",
                "more than 1 is not supported (the filters always keep the most likely token)");
  refuse_unless(!boolean(body, "post_sampling_probs", false), "post_sampling_probs",
                "not supported: n_probs gives the model's own probabilities, before the sampling filters");
  refuse_unless(!boolean(body, "timings_per_token", false), "timings_per_token",
                "not supported: the timings come with the last answer");
  refuse_unless(integer(body, "id_slot", -1, INT32_MAX, -1) == -1, "id_slot",
                "choosing a slot is not supported (-1: any; the prefix cache finds the best one)");
  for (const char* key : {"lora", "image_data"})
    refuse_unless(!has(body, key) || (body[key].is_array() && body[key].empty()), key,
                  key == std::string("lora") ? "per-request adapters are not supported (serve --lora merges adapters at load)"
                                              : "this model reads text only");
  integer(body, "n_keep", -1, INT32_MAX, 0);  // the context is never shifted: a prompt must fit
  boolean(body, "cache_prompt", true);        // the prefix cache always serves
}

// llama-server's logit_bias: [[token, bias], ...] or {"token": bias}, a token given by id or as
// text (each of its tokens), a bias false for "never".
std::vector<std::pair<int32_t, float>> native_logit_bias(const Json& lb, const text::Tokenizer& tok, int64_t vocab) {
  std::vector<std::pair<int32_t, float>> out;
  auto add = [&](const Json& token, const Json& bias) {
    refuse_unless(bias.is_number() || bias == false, "logit_bias", "a bias must be a number or false");
    const float b = bias == false ? -INFINITY : bias.get<float>();
    refuse_unless(std::isfinite(b) || b == -INFINITY, "logit_bias", "a bias must be finite");
    if (token.is_number_integer()) {
      const int64_t id = token.get<int64_t>();
      refuse_unless(id >= 0 && id < vocab, "logit_bias", fmt::format("{} is not a token id of this model", id));
      out.emplace_back(int32_t(id), b);
    } else if (token.is_string()) {
      for (int32_t id : tok.encode(token.get<std::string>())) out.emplace_back(id, b);
    } else {
      throw HttpError(400, "'logit_bias': a token must be an id or a text", "logit_bias");
    }
  };
  if (lb.is_array()) {
    for (const Json& pair : lb) {
      refuse_unless(pair.is_array() && pair.size() == 2, "logit_bias", "entries are [token, bias] pairs");
      add(pair[0], pair[1]);
    }
  } else if (lb.is_object()) {
    for (const auto& [key, bias] : lb.items()) {
      const bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      add(digits && key.size() < 10 ? Json(std::stoll(key)) : Json(key), bias);
    }
  } else {
    throw HttpError(400, "'logit_bias': must be an array of [token, bias] pairs or an object", "logit_bias");
  }
  return out;
}

// One prompt: a text, token ids, or both mixed (joined in order).
std::vector<int32_t> prompt_tokens(const HttpServer::Api& api, const Json& p) {
  const int64_t vocab = api.ctx.engine->model().config().vocab_size;
  std::vector<int32_t> ids;
  auto add = [&](const Json& x) {
    if (x.is_string()) {
      for (int32_t id : api.ctx.tokenizer->encode(x.get<std::string>())) ids.push_back(id);
    } else {
      refuse_unless(x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab, "prompt",
                    fmt::format("{} is not a token id of this model (0..{})", x.dump(), vocab - 1));
      ids.push_back(x.get<int32_t>());
    }
  };
  if (p.is_array())
    for (const Json& x : p) add(x);
  else
    add(p);
  refuse_unless(!ids.empty(), "prompt", "is empty");
  return ids;
}

// The prompts of a request: one (a text, ids, or a mix with at least one id), or several (a list
// whose entries are texts or lists).
std::vector<Json> prompt_list(const Json& p) {
  refuse_unless(p.is_string() || p.is_array(), "prompt", "must be a text, token ids, or a list of prompts");
  if (p.is_string()) return {p};
  const bool one = std::any_of(p.begin(), p.end(), [](const Json& x) { return x.is_number(); });
  if (one) return {p};
  refuse_unless(!p.empty() && p.size() <= kMaxPrompts, "prompt",
                fmt::format("a list of prompts holds 1 to {} of them", kMaxPrompts));
  for (const Json& x : p) refuse_unless(x.is_string() || x.is_array(), "prompt", "list entries are texts or token lists");
  return std::vector<Json>(p.begin(), p.end());
}

// The request's settings as llama-server reports them (generation_settings, /props).
Json settings_json(const HttpServer::Api& api, const RequestParams& p, int64_t n_predict, int n_probs, bool stream) {
  const SamplingParams& s = p.sampling;
  Json stop = Json::array();
  for (const std::string& st : p.stop_strings) stop.push_back(st);
  Json samplers = Json::array({"penalties", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p"});
  if (s.temperature_last) samplers.push_back("temperature");
  else samplers.insert(samplers.begin() + 1, "temperature");
  return {{"n_ctx", api.ctx.engine->options().context},
          {"n_predict", n_predict},
          {"temperature", s.temperature},
          {"top_k", s.top_k},
          {"top_p", s.top_p},
          {"min_p", s.min_p},
          {"typical_p", s.typical_p},
          {"top_n_sigma", s.top_n_sigma > 0 ? s.top_n_sigma : -1.0f},
          {"repeat_penalty", s.repetition_penalty},
          {"repeat_last_n", s.penalty_last_n},
          {"presence_penalty", s.presence_penalty},
          {"frequency_penalty", s.frequency_penalty},
          {"seed", s.seed},
          {"stop", stop},
          {"ignore_eos", p.stop_ids.empty()},
          {"n_probs", n_probs},
          {"stream", stream},
          {"samplers", samplers},
          {"model", api.ctx.model_name}};
}

struct NativeRequest {
  std::vector<Generation> gens;  // one per prompt
  std::vector<std::string> prompt_texts;
  Json settings;
  int n_probs = 0;
  bool return_tokens = false;
  Json response_fields;  // null: every field
};

NativeRequest parse_native(const HttpServer::Api& api, const Json& body) {
  reject_unknown(body, {}, {kCompletionFields});
  refuse_unsupported(body);
  NativeRequest r;
  const char* n_key = has(body, "n_predict") ? "n_predict" : "max_tokens";
  const int64_t n_predict = integer(body, n_key, -1, 1 << 30, -1);
  r.n_probs = int(integer(body, "n_probs", 0, 20, 0));
  r.return_tokens = boolean(body, "return_tokens", false);
  if (has(body, "response_fields")) {
    r.response_fields = body["response_fields"];
    refuse_unless(r.response_fields.is_array() &&
                      std::all_of(r.response_fields.begin(), r.response_fields.end(), [](const Json& f) { return f.is_string(); }),
                  "response_fields", "must be an array of field names");
  }
  const int64_t seed = integer(body, "seed", -1, UINT32_MAX, -1);
  // The fields parse_generation reads under the same names, llama-server's defaults where they differ.
  Json common = Json::object();
  for (const char* key : {"stop", "ignore_eos", "stream"})
    if (has(body, key)) common[key] = body[key];
  if (seed >= 0) common["seed"] = seed;
  if (n_predict >= 0) common["max_tokens"] = n_predict;
  SamplingParams s = native_defaults();
  s.temperature = std::max(0.0f, float(number(body, "temperature", -1e30, 100, s.temperature)));  // ≤ 0: greedy
  s.top_k = std::max<int32_t>(0, int32_t(integer(body, "top_k", INT32_MIN, INT32_MAX, s.top_k)));  // ≤ 0: off
  s.top_p = float(number(body, "top_p", 0, 1, s.top_p));
  if (s.top_p <= 0) s.top_p = 1e-6f;  // keeps the most likely token alone
  s.min_p = float(number(body, "min_p", 0, 1, s.min_p));
  s.typical_p = float(number(body, "typical_p", 0, 1, s.typical_p));
  if (s.typical_p <= 0) s.typical_p = 1e-6f;
  s.top_n_sigma = std::max(0.0f, float(number(body, "top_n_sigma", -1e30, 100, -1)));  // ≤ 0: off
  s.repetition_penalty = float(number(body, "repeat_penalty", 0.01, 10, s.repetition_penalty));
  s.penalty_last_n = int32_t(integer(body, "repeat_last_n", -1, INT32_MAX, s.penalty_last_n));
  s.presence_penalty = float(number(body, "presence_penalty", -2, 2, 0));
  s.frequency_penalty = float(number(body, "frequency_penalty", -2, 2, 0));
  if (s.penalty_last_n == 0) s.repetition_penalty = 1, s.presence_penalty = 0, s.frequency_penalty = 0;
  if (has(body, "samplers")) apply_samplers(body["samplers"], s);
  const OutputConstraint constraint = output_constraint(body, text::whitespace_named(api.ctx.json_whitespace));
  std::vector<std::pair<int32_t, float>> bias;
  if (has(body, "logit_bias"))
    bias = native_logit_bias(body["logit_bias"], *api.ctx.tokenizer, api.ctx.engine->model().config().vocab_size);
  const std::vector<Json> prompts = prompt_list(body.value("prompt", Json()));
  for (const Json& p : prompts) {
    std::vector<int32_t> ids = prompt_tokens(api, p);
    r.prompt_texts.push_back(api.ctx.tokenizer->decode(ids));
    // A raw completion stops at end-of-text only, not at the chat's end of turn.
    Generation g = parse_generation(common, api, std::move(ids), /*end_of_turn=*/false);
    const uint64_t drawn_seed = g.params.sampling.seed;
    g.params.sampling = s;
    g.params.sampling.seed = drawn_seed;
    g.params.constraint = constraint;
    g.params.logit_bias = bias;
    g.params.top_logprobs = r.n_probs > 0 ? int32_t(r.n_probs) : -1;
    r.gens.push_back(std::move(g));
  }
  refuse_unless(r.gens.size() == 1 || !r.gens.front().stream, "stream", "several prompts cannot be streamed");
  r.settings = settings_json(api, r.gens.front().params, n_predict, r.n_probs, r.gens.front().stream);
  return r;
}

// body's fields named in `fields`; "a/b" takes b out of object a, to the top as "b".
Json selected(const Json& body, const Json& fields) {
  Json out = Json::object();
  for (const Json& f : fields) {
    const std::string path = f;
    const size_t slash = path.find('/');
    if (slash == std::string::npos) {
      if (body.contains(path)) out[path] = body[path];
    } else {
      const std::string outer = path.substr(0, slash), inner = path.substr(slash + 1);
      if (body.contains(outer) && body[outer].is_object() && body[outer].contains(inner)) out[inner] = body[outer][inner];
    }
  }
  return out;
}

// One prompt's answer in llama-server's /completion shape.
struct NativeJob : Job {
  const text::Tokenizer* tok = nullptr;
  std::string model, prompt_text, content;
  Json settings, response_fields;
  int64_t context = 0;
  int n_probs = 0;
  bool return_tokens = false;
  std::vector<int32_t> tokens, unsent;  // the answer's ids; streaming: those not yet in a chunk
  Json probs = Json::array();           // completion_probabilities

  void on_token(int32_t id) override {
    tokens.push_back(id);
    unsent.push_back(id);
  }
  Json prob(int32_t id, float logprob) const {
    const std::string piece = tok->piece(id);
    return {{"id", id}, {"token", piece}, {"logprob", logprob}, {"bytes", bytes_json(piece)}};
  }
  Json prob_entry(const TokenLogprob& lp) const {
    Json e = prob(lp.token, lp.logprob);
    e["top_logprobs"] = Json::array();
    for (size_t i = 0; i < lp.top.size() && int(i) < n_probs; ++i) e["top_logprobs"].push_back(prob(lp.top[i].first, lp.top[i].second));
    return e;
  }
  Json chunk(const std::string& text) {
    Json c = {{"index", index}, {"content", text}, {"tokens", unsent}, {"stop", false}};
    unsent.clear();
    return c;
  }
  std::vector<Json> on_text(const std::string& text, const TokenLogprob* lp) override {
    Json entry = n_probs > 0 && lp ? prob_entry(*lp) : Json(nullptr);
    content += text;
    if (!stream) {
      if (!entry.is_null()) probs.push_back(std::move(entry));
      return {};
    }
    Json c = chunk(text);
    if (!entry.is_null()) c["completion_probabilities"] = Json::array({std::move(entry)});
    return {std::move(c)};
  }
  std::vector<Json> on_finish(const std::string& text, const std::string& reason, const RequestUsage& usage) override {
    std::vector<Json> out;
    if (!text.empty() || !unsent.empty()) out.push_back(chunk(text));  // the text held back until the end
    content += text;
    Json last = response(reason, usage);
    last["content"] = "";
    last["tokens"] = Json::array();
    out.push_back(std::move(last));
    return out;
  }
  Json usage_chunk(const RequestUsage&) override { return Json::object(); }  // never asked: no include_usage
  Json response(const std::string& reason, const RequestUsage& usage) override {
    const bool limit = reason == "length";
    Json j = {{"index", index},
              {"content", content},
              {"tokens", return_tokens ? Json(tokens) : Json::array()},
              {"stop", true},
              {"model", model},
              {"tokens_predicted", usage.completion_tokens},
              {"tokens_evaluated", usage.prompt_tokens},
              {"generation_settings", settings},
              {"prompt", prompt_text},
              {"has_new_line", content.find('\n') != std::string::npos},
              {"truncated", limit && usage.prompt_tokens + usage.completion_tokens >= context},
              {"stop_type", limit ? "limit" : reason != "stop" ? "none" : stop_string.empty() ? "eos" : "word"},
              {"stopping_word", stop_string},
              {"tokens_cached", usage.prompt_tokens + usage.completion_tokens},
              {"timings", timings_json(usage)}};
    if (n_probs > 0) j["completion_probabilities"] = probs;
    return response_fields.is_null() || stream ? j : selected(j, response_fields);
  }
};

}  // namespace

void handle_completion(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const NativeRequest r = parse_native(api, parse_body(req));
  auto reply = submit_prompts<NativeJob>(api, r.gens, [&](const NativeJob*, size_t prompt) {
    auto job = std::make_shared<NativeJob>();
    job->tok = api.ctx.tokenizer;
    job->model = api.ctx.model_name;
    job->prompt_text = r.prompt_texts[prompt];
    job->settings = r.settings;
    job->response_fields = r.response_fields;
    job->context = api.ctx.engine->options().context;
    job->n_probs = r.n_probs;
    job->return_tokens = r.return_tokens;
    return job;
  });
  reply->done_line = false;               // llama-server's stream ends with its stop: true object
  reply->array_body = r.gens.size() > 1;  // several prompts: an array of answers
  respond(std::move(reply), res);
}

void handle_props(HttpServer::Api& api, const httplib::Request&, httplib::Response& res) {
  RequestParams defaults;
  defaults.sampling = native_defaults();
  defaults.stop_ids = api.ctx.stop_ids;
  const SchedulerOptions& o = api.ctx.engine->options();
  Json props = {{"default_generation_settings",
                 {{"id", 0},
                  {"n_ctx", o.context},
                  {"speculative", o.spec.method != SpecMethod::None},
                  {"is_processing", false},
                  {"params", settings_json(api, defaults, -1, 0, false)}}},
                {"total_slots", o.slots},
                {"model_path", api.ctx.model_path},
                {"model_alias", api.ctx.model_name},
                {"modalities", {{"vision", false}, {"audio", false}}},
                {"build_info", "qwen36"}};
  if (api.ctx.chat_template) {
    props["chat_template"] = api.ctx.chat_template->source();
    const Json& special = api.ctx.chat_template->special_tokens();
    for (const char* key : {"bos_token", "eos_token"})
      if (special.contains(key) && special[key].is_string()) props[key] = special[key];
  }
  res.set_content(dump(props), "application/json");
}

void handle_apply_template(HttpServer::Api& api, const httplib::Request& req, httplib::Response& res) {
  const Json body = parse_body(req);
  reject_unknown(body, {"messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                        "model"});
  const Json tools = has(body, "tools") ? body["tools"] : Json(nullptr);
  if (!tools.is_null() && !tools.is_array()) throw HttpError(400, "'tools' must be an array", "tools");
  res.set_content(dump({{"prompt", chat_prompt(api, body, tools)}}), "application/json");
}

}  // namespace qwen36::server
