// A chat request made ready for the engine (server/chat.h).
#include "server/chat.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "text/tool_call_grammar.h"

namespace qwen36::server {

std::string joined_text(const Json& content, std::initializer_list<const char*> part_types, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) throw HttpError(400, where + " must be a string or an array of text parts", where);
  std::string text;
  for (const Json& part : content) {
    const std::string type = part.is_object() ? part.value("type", "") : "";
    const bool known = std::any_of(part_types.begin(), part_types.end(), [&](const char* t) { return type == t; });
    if (!known || !part.contains("text") || !part["text"].is_string())
      throw HttpError(400, fmt::format("{}: parts of type '{}' are not supported by this model", where, type), where);
    text += part["text"].get<std::string>();
  }
  return text;
}

Json chat_tool(const Json& flat, const char* parameters_key) {
  Json f = {{"name", flat.value("name", Json())}, {"parameters", flat.value(parameters_key, Json::object())}};
  if (flat.contains("description")) f["description"] = flat["description"];
  return {{"type", "function"}, {"function", std::move(f)}};
}

Json chat_named_choice(const Json& name) { return {{"type", "function"}, {"function", {{"name", name}}}}; }

namespace {

// Messages as the chat template expects them: text parts joined, tool-call arguments as
// objects (templates iterate over them), every field checked.
Json template_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty())
    throw HttpError(400, "'messages' must be a non-empty array", "messages");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    Json m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw HttpError(400, where + " must be an object with a string 'role'", where);
    const std::string role = m["role"];
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      throw HttpError(400, fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool", where, role),
                      where + ".role");
    if (role == "developer") m["role"] = "system";
    if (m.contains("content") && m["content"].is_array()) {
      m["content"] = joined_text(m["content"], {"text"}, where + ".content");
    } else if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null()) {
      throw HttpError(400, where + ".content must be a string, an array of text parts or null", where + ".content");
    } else if (!m.contains("content") || m["content"].is_null()) {
      // OpenAI clients send null content with tool_calls; templates test it with `in`.
      m["content"] = "";
    }
    if (m.contains("tool_calls")) {
      if (!m["tool_calls"].is_array()) throw HttpError(400, where + ".tool_calls must be an array", where);
      for (Json& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          throw HttpError(400, where + ".tool_calls entries need a 'function' object", where + ".tool_calls");
        Json& args = call["function"]["arguments"];
        if (args.is_string()) {
          Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
          if (parsed.is_object()) args = std::move(parsed);
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

// tool_choice "required" → every tool's name; {"type": "function", "function": {"name": N}} → N,
// which must be one of the tools.
// The tools' function objects.
std::vector<Json> tool_functions(const Json& tools) {
  std::vector<Json> functions;
  if (!tools.is_array()) return functions;
  for (const Json& t : tools) {
    const Json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
      throw HttpError(400, "every tool needs a function with a string 'name'", "tools");
    functions.push_back(f);
  }
  return functions;
}

// The function objects tool_choice "required" or {"function": {"name"}} allows.
std::vector<Json> forced_functions(const Json& tc, const Json& tools) {
  if (!tools.is_array() || tools.empty())
    throw HttpError(400, "'tool_choice' \"required\" or a named function needs 'tools'", "tool_choice");
  const std::vector<Json> functions = tool_functions(tools);
  if (tc == "required") return functions;
  if (!tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
      !tc["function"]["name"].is_string())
    throw HttpError(400, "'tool_choice' as an object is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    "tool_choice");
  const std::string name = tc["function"]["name"];
  for (const Json& f : functions)
    if (f["name"] == name) return {f};
  throw HttpError(400, fmt::format("'tool_choice' names '{}', which is not one of the tools", name), "tool_choice");
}

// The answer is a call of one of the functions: the whole call in the template's own form with
// the arguments held to the function's schema (text/tool_call_grammar.h) when the template's form
// is known and the schemas are in the supported subset; else the call's beginning up to the
// function's name, after which the model writes the arguments freely.
OutputConstraint forced_call(const HttpServer::Api& api, const std::vector<Json>& functions, bool several) {
  OutputConstraint c;
  if (const auto form = api.ctx.chat_template->tool_call_form()) {
    try {
      c.grammar = text::tool_call_grammar(*form, functions, several);
      return c;
    } catch (const Error& e) {
      spdlog::info("tool_choice: the call's arguments are not constrained: {}", e.what());
    }
  }
  const auto prefix = api.ctx.chat_template->tool_call_name_prefix();
  if (!prefix) throw HttpError(400, "this model's chat template writes no <tool_call> that could be forced", "tool_choice");
  for (const Json& f : functions)
    c.forced.push_back(api.ctx.tokenizer->encode("<tool_call>" + *prefix + f["name"].get<std::string>()));
  return c;
}

// tool_choice "auto": the answer is free until the model opens a call with its <tool_call> token;
// from there the call is held to the functions' schemas (as llama-server's lazy grammars do).
// Nothing when the template's form is unknown, the vocabulary has no single <tool_call> token, or
// a schema is outside the supported subset.
OutputConstraint calls_once_opened(const HttpServer::Api& api, const std::vector<Json>& functions, bool several) {
  OutputConstraint c;
  const int32_t open = api.ctx.tokenizer->token_id("<tool_call>");
  const auto form = open >= 0 && !functions.empty() ? api.ctx.chat_template->tool_call_form() : std::nullopt;
  if (!form) return c;
  try {
    c.grammar = text::tool_call_grammar(*form, functions, several, /*opened=*/true);
    c.start_after = {open};
  } catch (const Error& e) {
    spdlog::info("tools: calls are not constrained: {}", e.what());
  }
  return c;
}

// The prompt of a conversation whose last message, the assistant's, is continued (assistant
// prefill): the template renders it whole, without a generation prompt, and the text is cut
// right after the message's content, before the template's end of turn. The content is found as
// the template wrote it (its last occurrence); an empty one is found through a placeholder.
std::string continued_prompt(const ChatTemplate& tmpl, Json messages, const Json& tools, const Json& kwargs) {
  static constexpr std::string_view kPlaceholder = "\x01qwen36-continue\x01";
  Json& last = messages.back();
  if (last.contains("tool_calls") && !last["tool_calls"].empty())
    throw HttpError(400, "the final assistant message has tool_calls: it cannot be continued", "messages");
  const std::string content = last["content"];
  if (content.empty()) last["content"] = kPlaceholder;
  const std::string text = tmpl.render(messages, tools, false, kwargs);
  const std::string_view find = content.empty() ? kPlaceholder : std::string_view(content);
  const size_t at = text.rfind(find);
  if (at == std::string::npos)
    throw HttpError(400, "the chat template does not write the final assistant message's text as given, so it "
                    "cannot be continued", "messages");
  return text.substr(0, content.empty() ? at : at + find.size());
}

}  // namespace

std::string chat_prompt(const HttpServer::Api& api, const Json& body, const Json& tools) {
  if (!api.ctx.chat_template) throw HttpError(400, "this model has no chat template; use /v1/completions", "messages");
  const Json messages = template_messages(body.value("messages", Json()));
  // The server's default kwargs (--default-chat-template-kwargs), the request's own over them.
  Json kwargs = api.ctx.chat_template_kwargs.is_object() ? api.ctx.chat_template_kwargs : Json::object();
  if (has(body, "chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object())
      throw HttpError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
    kwargs.update(body["chat_template_kwargs"]);
  }
  // A conversation that ends with the assistant's message continues it (llama-server's assistant
  // prefill, Anthropic's prefill), unless add_generation_prompt asks for a new turn; vLLM's
  // continue_final_message / add_generation_prompt say it explicitly.
  const bool assistant_last = messages.back()["role"] == "assistant";
  const bool generation_prompt = boolean(body, "add_generation_prompt", !assistant_last);
  const bool continue_final = boolean(body, "continue_final_message", assistant_last && !generation_prompt);
  if (continue_final && generation_prompt)
    throw HttpError(400, "continue_final_message and add_generation_prompt cannot both be true",
                    "continue_final_message");
  if (continue_final && !assistant_last)
    throw HttpError(400, "continue_final_message needs the last message to be the assistant's",
                    "continue_final_message");
  try {
    return continue_final ? continued_prompt(*api.ctx.chat_template, messages, tools, kwargs)
                          : api.ctx.chat_template->render(messages, tools, generation_prompt, kwargs);
  } catch (const HttpError&) {
    throw;
  } catch (const Error& e) {
    throw HttpError(400, std::string("the chat template could not render these messages: ") + e.what(), "messages");
  }
}

ChatRequest prepare_chat(HttpServer::Api& api, const Json& body) {
  ChatRequest out;
  if (!api.ctx.chat_template) throw HttpError(400, "this model has no chat template; use /v1/completions", "messages");
  Json tools = has(body, "tools") ? body["tools"] : Json(nullptr);
  if (!tools.is_null() && !tools.is_array()) throw HttpError(400, "'tools' must be an array", "tools");
  std::vector<Json> forced_tools;  // tool_choice "required" (any of them) or a named function
  if (has(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc == "none") tools = nullptr;  // the model is not told about tools, so it will not call them
    else if (!(tc == "auto" || tc == "required" || tc.is_object()))
      throw HttpError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or an object", "tool_choice");
    if (tc != "auto" && tc != "none") forced_tools = forced_functions(tc, tools);
  }
  OutputConstraint constraint = output_constraint(body, text::whitespace_named(api.ctx.json_whitespace));
  if (!forced_tools.empty()) {
    if (!constraint.empty())
      throw HttpError(400, "structured output ('response_format' or the like) and a forced tool call ('tool_choice') "
                      "do not combine", "tool_choice");
    const bool several = body["tool_choice"] == "required" && boolean(body, "parallel_tool_calls", true);
    constraint = forced_call(api, forced_tools, several);
  } else if (constraint.empty() && !tools.is_null()) {
    constraint = calls_once_opened(api, tool_functions(tools), boolean(body, "parallel_tool_calls", true));
  }
  const std::string prompt = chat_prompt(api, body, tools);
  out.g = parse_generation(body, api, api.ctx.tokenizer->encode(prompt));
  Generation& g = out.g;
  const bool want_logprobs = out.want_logprobs = boolean(body, "logprobs", false);
  const int64_t top = integer(body, "top_logprobs", 0, 20, 0);
  if (has(body, "top_logprobs") && !want_logprobs)
    throw HttpError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
  g.params.top_logprobs = want_logprobs ? int32_t(top) : -1;

  // llama-server's reasoning_format: "none" leaves the reasoning and its tags in the text.
  const std::string format = has(body, "reasoning_format") && body["reasoning_format"].is_string()
                                 ? body["reasoning_format"].get<std::string>()
                                 : has(body, "reasoning_format") ? "?" : api.ctx.reasoning_format;
  if (format != "auto" && format != "deepseek" && format != "none")
    throw HttpError(400, "'reasoning_format' must be \"auto\", \"deepseek\" (reasoning_content) or \"none\" (the "
                    "reasoning left in the content)", "reasoning_format");
  const bool opened = prompt_opens_thinking(prompt);
  OutputParserOptions& popts = out.parser;
  // A disabled-thinking prompt already holds an empty <think></think>.
  popts.thinking_enabled = format != "none";
  popts.prompt_opened_thinking = opened && popts.thinking_enabled;
  if (!constraint.empty() && opened) {  // reasoning stays free
    const int32_t end_think = api.ctx.tokenizer->token_id("</think>");
    constraint.start_after.insert(constraint.start_after.begin(), end_think);
    if (end_think < 0)
      throw HttpError(400, "the prompt opens <think> but the vocabulary has no </think>", "response_format");
  }
  g.params.constraint = std::move(constraint);
  // vLLM's thinking_token_budget (the server's --reasoning-budget by default): a cap on the
  // reasoning the prompt opens, or the model opens with <think>.
  cap_reasoning(g.params, integer(body, "thinking_token_budget", 0, 1 << 30, api.ctx.reasoning_budget), opened,
                api.ctx.tokenizer->token_id("<think>"),
                api.ctx.tokenizer->token_id("</think>"));
  if (!tools.is_null()) popts.tools = tools;
  return out;
}

}  // namespace qwen36::server
