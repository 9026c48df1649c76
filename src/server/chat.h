#pragma once
// defines: ChatRequest, prepare_chat (a chat request's messages, tools, tool_choice,
//          response_format and template kwargs made into the engine's request and the output
//          parser's options; /v1/chat/completions and /v1/responses share it)

#include <initializer_list>
#include <string>

#include "server/params.h"
#include "text/output_parser.h"

namespace qwen36::server {

struct ChatRequest {
  Generation g;
  OutputParserOptions parser;  // reasoning (the prompt may open <think>) and the tools' calls
  bool want_logprobs = false;
};

// A message's text: a string, or an array of parts {"type": one of part_types, "text": ...}
// joined (a 400 naming `where` for any other part).
std::string joined_text(const Json& content, std::initializer_list<const char*> part_types, const std::string& where);

// The chat form of a tool given flat, as the Responses and Messages APIs give it: its name,
// description (if any) and the parameters schema found under `parameters_key`.
Json chat_tool(const Json& flat, const char* parameters_key);
// tool_choice naming one function, in the chat form.
Json chat_named_choice(const Json& name);

// The prompt text of a chat request (body in /v1/chat/completions form): its messages, the
// tools given, the chat template kwargs (the server's defaults under the request's) and assistant
// prefill (continue_final_message / add_generation_prompt). Every bad value is a 400.
std::string chat_prompt(const HttpServer::Api& api, const Json& body, const Json& tools);

// body: in /v1/chat/completions form, its field names already checked by the endpoint. Every
// bad value is a 400 naming its field.
ChatRequest prepare_chat(HttpServer::Api& api, const Json& body);

}  // namespace qwen36::server
